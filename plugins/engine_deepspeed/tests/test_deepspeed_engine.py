"""The DeepSpeed engine on 2 CPU ranks over gloo: resume, frozen roles and export.

(Its numbers against the FSDP engine are checked by tests/test_engine_equivalence.py; its
contract by the conformance suite.) Each ``_scenario_*`` runs inside the spawned ranks and
returns plain values; one spawn serves several tests (the machine has 2 cores).
"""

from __future__ import annotations

import pytest
import torch
from ds_context import ds_context

from polyrl.batch import Batch
from polyrl.models.tiny import build_tiny_model
from polyrl_engine_kit.launch import run_on_ranks
from polyrl_engine_kit.testing import ragged_batch

WORLD = 2
PROMPT_W, RESP_W = 5, 6
LR = 5e-3


def _batch(seed: int) -> Batch:
    """8 ragged rows: left-padded prompts, right-padded responses."""
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(1, PROMPT_W + 1, (8,), generator=generator)
    response = torch.randint(1, RESP_W + 1, (8,), generator=generator)
    return ragged_batch(prompt.tolist(), response.tolist(), PROMPT_W, RESP_W, generator)


def _ctx(rank: int, path: str, stage: int, role: str = "actor", dtype: str = "bfloat16"):
    engine = {
        "use_dynamic_bsz": True,
        "ppo_max_token_len_per_gpu": 24,
        "optim": {
            "lr": LR,
            "lr_warmup_steps": 2,
            "lr_scheduler_type": "cosine",
            "min_lr_ratio": 0.1,
        },
    }
    return ds_context(
        path,
        model={"dtype": dtype},
        engine=engine,
        deepspeed={"zero_stage": stage},
        rank=rank,
        world_size=WORLD,
        role=role,
        total_training_steps=8,
    )


def noisy_loss(micro: Batch, log_prob: torch.Tensor, entropy: torch.Tensor | None):
    """Token-mean NLL with random token weights: resuming must restore the RNG states too."""
    mask = micro["response_mask"].float() * torch.rand(log_prob.shape)
    return -(log_prob * mask).sum() / micro.meta["mini_batch_response_tokens"], {}


def _weights(engine) -> dict[str, torch.Tensor]:
    return {name: tensor.cpu().clone() for name, tensor in engine.named_weights()}


# ---- scenarios (run inside each rank) ---------------------------------------------------------
def _scenario_resume(rank: int, world: int, path: str, ckpt_root: str) -> dict:
    from polyrl.errors import PolyrlError
    from polyrl_engine_deepspeed.engine import DeepSpeedEngine

    batches = [_batch(seed).chunk(world)[rank] for seed in range(4)]
    out: dict = {}
    for stage in (2, 3):
        ckpt = f"{ckpt_root}/zero{stage}"
        first = DeepSpeedEngine(_ctx(rank, path, stage))
        for batch in batches[:2]:
            first.train_step(batch, noisy_loss)
        first.save_checkpoint(ckpt)
        lrs_1 = [first.train_step(b, noisy_loss)["actor/lr"] for b in batches[2:]]
        w1 = _weights(first)
        del first
        torch.manual_seed(1234)  # a different RNG state: load_checkpoint must restore it
        second = DeepSpeedEngine(_ctx(rank, path, stage))
        second.load_checkpoint(ckpt)
        step = second.global_step
        lrs_2 = [second.train_step(b, noisy_loss)["actor/lr"] for b in batches[2:]]
        out[stage] = {"w1": w1, "w2": _weights(second), "lrs_1": lrs_1, "lrs_2": lrs_2}
        out[stage]["step"] = step
        del second
    other = DeepSpeedEngine(_ctx(rank, path, 2))
    try:
        other.load_checkpoint(f"{ckpt_root}/zero3")
    except PolyrlError as exc:
        out["wrong_stage"] = str(exc)
    return out


def _scenario_frozen_and_export(rank: int, world: int, path: str, export_dir: str) -> dict:
    from deepspeed.comm import comm as deepspeed_comm

    from polyrl_engine_deepspeed.engine import DeepSpeedEngine

    batch = _batch(7).chunk(world)[rank]
    actor = DeepSpeedEngine(_ctx(rank, path, 3, dtype="float32"))
    out = {"actor": actor.compute_log_prob(batch)[0], "weights": _weights(actor)}
    out["mask"] = batch["response_mask"]
    out["shm_op_built"] = deepspeed_comm.cdb.shm_comm_op is not None
    actor.export_hf(export_dir)
    del actor
    for stage in (2, 3):
        ref = DeepSpeedEngine(_ctx(rank, path, stage, role="ref", dtype="float32"))
        out[f"ref{stage}"] = ref.compute_log_prob(batch)[0]
        log_prob, _, squares = ref.compute_log_prob_and_sum_pi_squared(batch, temperature=0.7)
        out[f"ref{stage}_sum_pi_squared"] = (
            log_prob,
            squares,
            ref.compute_log_prob(batch, temperature=0.7)[0],
        )
        out[f"ref{stage}_zero"] = int(ref.engine.zero_optimization_stage())
        try:
            ref.train_step(batch, noisy_loss)
        except Exception as exc:  # noqa: BLE001 - the message is what the test checks
            out[f"ref{stage}_train"] = f"{type(exc).__name__}: {exc}"
        del ref
    return out


# ---- tests ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny") / "m"))


@pytest.fixture(scope="module")
def resume(model_path, tmp_path_factory) -> list[dict]:
    root = str(tmp_path_factory.mktemp("ckpt"))
    return run_on_ranks(_scenario_resume, WORLD, model_path, root, timeout_s=600)


@pytest.fixture(scope="module")
def frozen(model_path, tmp_path_factory) -> tuple[list[dict], str]:
    export_dir = str(tmp_path_factory.mktemp("export") / "hf")
    results = run_on_ranks(_scenario_frozen_and_export, WORLD, model_path, export_dir)
    return results, export_dir


@pytest.mark.parametrize("stage", [2, 3])
def test_resume_is_bitwise_identical(resume: list[dict], stage: int) -> None:
    """bf16 with fp32 master weights, token-budget micro-batches, warm-up then cosine, random
    loss weights: training on from a checkpoint repeats the uninterrupted run exactly."""
    for rank in resume:
        run = rank[stage]
        assert run["step"] == 2
        assert run["lrs_1"] == run["lrs_2"] and run["lrs_1"][0] != run["lrs_1"][1]
        for name, tensor in run["w1"].items():
            assert torch.equal(tensor, run["w2"][name]), name


def test_loading_another_zero_stage_is_one_clear_error(resume: list[dict]) -> None:
    message = resume[0]["wrong_stage"]
    assert "'zero_stage': 3" in message and "'zero_stage': 2" in message
    assert "ds_to_universal" in message and "\n" not in message


def test_frozen_roles_score_like_the_actor_and_refuse_to_train(frozen) -> None:
    results, _ = frozen
    for rank in results:
        for stage in (2, 3):
            torch.testing.assert_close(rank[f"ref{stage}"], rank["actor"], rtol=0, atol=1e-6)
            assert "non-trainable engine (role 'ref')" in rank[f"ref{stage}_train"]
        # ZeRO-1/2 only partition what training needs; ZeRO-3 also partitions a frozen model
        assert rank["ref2_zero"] == 0 and rank["ref3_zero"] == 3


def test_joining_on_cpu_compiles_no_shared_memory_op(frozen) -> None:
    """DeepSpeed's CPU allreduce op serves inference only; building it cost every first run."""
    results, _ = frozen
    assert [rank["shm_op_built"] for rank in results] == [False] * WORLD


def test_sum_pi_squared_comes_with_the_same_log_probs(frozen) -> None:
    """verl's ``sum_pi_squared`` from the kit's scoring (checked against a model's logits in
    polyrl-engine-fsdp's tests): the same pass's log-probs are compute_log_prob's, and ZeRO-2
    and ZeRO-3 agree."""
    results, _ = frozen
    for rank in results:
        mask = rank["mask"].bool()
        for stage in (2, 3):
            log_prob, squares, plain = rank[f"ref{stage}_sum_pi_squared"]
            assert torch.equal(log_prob, plain)
            assert (squares[mask] > 0).all() and (squares[mask] <= 1).all()
            assert (squares[~mask] == 0).all()
        torch.testing.assert_close(
            rank["ref2_sum_pi_squared"][1], rank["ref3_sum_pi_squared"][1], rtol=0, atol=1e-6
        )


def test_zero3_export_loads_with_transformers(frozen) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    results, export_dir = frozen
    model = AutoModelForCausalLM.from_pretrained(export_dir, dtype=torch.float32)
    AutoTokenizer.from_pretrained(export_dir)
    state = model.state_dict()
    weights = results[0]["weights"]
    assert state.keys() == weights.keys()
    for name, tensor in weights.items():
        assert torch.equal(state[name], tensor), name
