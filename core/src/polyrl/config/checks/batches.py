"""Batch arithmetic: prompts, responses and mini-batches split evenly over the actor's ranks.

Prompts and responses are split over every rank of the pool (each generates its share), but
mini-batches over the *data-parallel* ranks only, as in verl: the tensor-, pipeline-, context-
and sequence-parallel peers of one model copy share its rows.
"""

from __future__ import annotations

from polyrl.config.checks.checker import Checker
from polyrl.config.checks.placement import role_world
from polyrl.config.checks.ranges import at_least


def check_batches(checker: Checker) -> None:
    c = checker
    nnodes = c.number("trainer.nnodes", at_least(1), ">= 1", integer=True)
    per_node = c.number("trainer.n_gpus_per_node", at_least(1), ">= 1", integer=True)
    train = c.number("data.train_batch_size", at_least(1), ">= 1", integer=True)
    n = c.get("actor_rollout_ref.rollout.n")
    if not (nnodes and per_node and train and isinstance(n, int) and n >= 1):
        return
    found = role_world(c.cfg, "actor")
    if found is None:  # a pool without a usable size: reported by the placement check
        return
    world, where = found
    if train % world:
        c.add(
            f"data.train_batch_size {train} is not divisible by the {where}: prompts are split "
            f"across ranks before generation; make the batch a multiple of {world}"
        )
    if (train * n) % world:
        c.add(
            f"data.train_batch_size {train} x rollout.n {n} = {train * n} responses are not "
            f"divisible by the {where}"
        )
    split = model_parallel_size(c, "actor_rollout_ref.actor")
    if split > 1 and world % split == 0:
        world, where = (
            world // split,
            f"data-parallel size {world // split} (= {where} / {split} model-parallel peers)",
        )
    check_ppo_batches(c, "actor_rollout_ref.actor", train, n, world, where)


# The keys that split one model copy over ranks, per training strategy (verl's names; the
# engine plugins declare them). Their product divides the pool into data-parallel ranks.
MODEL_PARALLEL_KEYS = {
    "megatron": (
        "megatron.tensor_model_parallel_size",
        "megatron.pipeline_model_parallel_size",
        "megatron.context_parallel_size",
    ),
    "fsdp": ("ulysses_sequence_parallel_size",),
    "fsdp2": ("ulysses_sequence_parallel_size",),
}


def model_parallel_size(c: Checker, role: str) -> int:
    """How many ranks hold one copy of ``role``'s model (1 when the keys are absent)."""
    size = 1
    for key in MODEL_PARALLEL_KEYS.get(str(c.get(f"{role}.strategy")), ()):
        value = c.get(f"{role}.{key}")
        size *= value if isinstance(value, int) and value >= 1 else 1
    return size


def check_ppo_batches(c: Checker, role: str, train: int, n: int, world: int, where: str) -> None:
    """Mini-batches of the role whose keys are under ``role`` (the actor's, or a critic's from
    its algorithm's check): whole, split evenly over the ``world`` ranks and micro-batches."""
    mini = c.number(f"{role}.ppo_mini_batch_size", at_least(1), ">= 1 (prompts)", integer=True)
    micro = c.number(f"{role}.ppo_micro_batch_size_per_gpu", at_least(1), ">= 1", integer=True)
    if not mini:
        return
    if train < mini:
        c.add(
            f"data.train_batch_size {train} < {role}.ppo_mini_batch_size {mini}: a step needs at "
            f"least one mini-batch; lower {role}.ppo_mini_batch_size to <= {train}"
        )
    elif train % mini:
        c.add(
            f"data.train_batch_size {train} is not divisible by {role}.ppo_mini_batch_size "
            f"{mini}: every mini-batch must be full"
        )
    responses = mini * n
    if responses % world:
        c.add(
            f"{role}.ppo_mini_batch_size {mini} x rollout.n {n} = {responses} responses per "
            f"mini-batch are not divisible by the {where}"
        )
        return
    per_gpu = responses // world
    if micro and c.get(f"{role}.use_dynamic_bsz") is not True and per_gpu % micro:
        c.add(
            f"per-GPU mini-batch {per_gpu} (= {role}.ppo_mini_batch_size {mini} x rollout.n {n} "
            f"/ world {world}) is not divisible by {role}.ppo_micro_batch_size_per_gpu {micro}; "
            f"pick a divisor of {per_gpu} or set {role}.use_dynamic_bsz=true"
        )
