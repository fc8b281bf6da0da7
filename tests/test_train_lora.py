"""LoRA RL end to end: ``recipe=grpo_lora``'s keys on ``recipe=tiny`` (FSDP2 + peft, HF rollout).

- ``polyrl validate`` says what LoRA changes and refuses, one line each, what cannot work: an
  engine without LoRA (DeepSpeed, Megatron), a reference outside the actor's pool, bad values.
- Weight sync carries the adapters: on one worker (actor, reference and rollout colocated, no
  Ray) a rollout left with stale weights shows a large sampler/trainer probability gap
  (``training/rollout_probs_diff_max``, the metric the run logs), a synced one none; the
  reference (the actor's model with adapters off) scores exactly like the base model.
- A run (one worker in its own process, ``polyrl_train``) learns, the gap stays near zero at
  every step, checkpoints hold adapters only, the export is the adapter folder, and a resume
  continues bitwise.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from test_train_tiny import final_weights, polyrl_train, read_records, split_records

from polyrl.batch import Batch
from polyrl.config.loader import load_config, to_container
from polyrl.interfaces import SamplingParams
from polyrl.plan import assemble
from polyrl.step.stages import MODEL_INPUT_KEYS, rollout_mismatch_metrics

# What recipe=grpo_lora sets on top of recipe=tiny (its KL settings are tiny's already).
LORA_KEYS = (
    "actor_rollout_ref.model.lora_rank",
    "actor_rollout_ref.model.lora_alpha",
    "actor_rollout_ref.model.target_modules",
    "actor_rollout_ref.model.lora_dropout",
    "actor_rollout_ref.actor.optim.lr",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
)
VAL_REWARD = "val-core/polyrl/tiny_digits/reward/mean@1"
GAP = "training/rollout_probs_diff_max"
# The largest sampler/trainer gap of a correct sync: float32 on both sides, different kernels
# (KV-cached decoding vs one forward pass); measured ~1e-8. A stale sync shows a gap over 100x
# larger (the tiny model's 400-token vocabulary keeps single probabilities, and gaps, small).
SYNCED_GAP = 1e-5


def recipe_overrides() -> list[str]:
    """recipe=grpo_lora's settings as command-line overrides of recipe=tiny (``polyrl_train``
    runs recipe=tiny)."""
    cfg = load_config(["recipe=grpo_lora"])
    return [f"{key}={OmegaConf.select(cfg, key)}" for key in LORA_KEYS]


def test_validate_describes_lora_and_refuses_what_cannot_work() -> None:
    from polyrl.config.validate import summarize, validate_config

    cfg = load_config(["recipe=grpo_lora"])
    assert validate_config(cfg) == []
    assert (
        "LoRA: rank 8, alpha 16.0, targets all-linear, dropout 0.0; reference = the actor's model "
        "with adapters disabled (no second copy); weight sync sends merged weights (rollout 'hf' "
        "takes no adapters); checkpoints hold the adapters only"
    ) in summarize(cfg).splitlines()
    for engine in ("deepspeed", "megatron"):
        bad = load_config(["recipe=grpo_lora", f"actor_rollout_ref.actor.strategy={engine}"])
        (line,) = [p for p in validate_config(bad) if "LoRA" in p]
        assert line.startswith(
            f"actor_rollout_ref.model.lora_rank=8: actor_rollout_ref.actor.strategy='{engine}' "
            f"(package polyrl-engine-{engine}) does not support LoRA; use one that does"
        ), line
    split = load_config(["recipe=grpo_lora", "trainer.role_pools.ref=refpool",
                         "trainer.resource_pools.refpool=1"])  # fmt: skip
    assert validate_config(split) == [
        "actor_rollout_ref.model.lora_rank=8: the reference is the actor's model with its "
        "adapters disabled, so it must run in the actor's pool 'global', not 'refpool': remove "
        "trainer.role_pools.ref"
    ]
    values = load_config(["recipe=grpo_lora", "actor_rollout_ref.model.lora_alpha=0",
                          "actor_rollout_ref.model.lora_dropout=1.0",
                          "actor_rollout_ref.model.target_modules=[]"])  # fmt: skip
    assert validate_config(values) == [
        "actor_rollout_ref.model.lora_alpha=0.0 must be a number > 0, e.g. 16",
        "actor_rollout_ref.model.lora_dropout=1.0 must be in [0, 1), e.g. 0.0",
        "actor_rollout_ref.model.target_modules=[] must be all-linear or a non-empty list of "
        "module names, e.g. [q_proj,k_proj,v_proj,o_proj]",
    ]
    off = load_config(["recipe=tiny", "actor_rollout_ref.actor.strategy=deepspeed"])
    assert not any("LoRA" in p for p in validate_config(off))
    assert "LoRA" not in summarize(load_config(["recipe=tiny"]))


def _prompts(rows: int = 4, width: int = 6) -> Batch:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 400, (rows, width), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    mask[3, :4] = 0
    return Batch({"input_ids": ids * mask, "attention_mask": mask})


def _gap(worker, params: SamplingParams) -> tuple[Batch, float]:
    """Sample with the rollout, score with the actor: the largest probability gap."""
    batch = worker.call("rollout", "generate", _prompts(), params)
    out = worker.call("actor", "compute_log_prob", batch.select_keys(MODEL_INPUT_KEYS))
    batch["old_log_probs"] = out["log_probs"]
    return batch, rollout_mismatch_metrics(batch)[GAP]


def test_the_probability_gap_catches_a_stale_sync_and_ref_is_the_base_model() -> None:
    from transformers import AutoTokenizer

    from polyrl.models.resolve import resolve_model_path
    from polyrl.workers.worker import Worker

    cfg = load_config(["recipe=grpo_lora"])
    path = resolve_model_path(str(cfg.actor_rollout_ref.model.path))
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokens = {"pad_token_id": tokenizer.pad_token_id, "eos_token_ids": [tokenizer.eos_token_id]}
    worker = Worker(
        to_container(cfg), ["actor", "ref", "rollout"], rank=0, world_size=1,
        model_path=path, tokens=tokens, plan=assemble(cfg).worker_plan(),
    )  # fmt: skip
    try:
        # What training does to the adapters (B leaves zero), without a sync yet.
        torch.manual_seed(0)
        with torch.no_grad():
            for name, param in worker.roles["actor"].engine.model.named_parameters():
                if ".lora_B." in name:
                    param.to_local().normal_(0.0, 1.0)
        params = SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=3)
        stale, stale_gap = _gap(worker, params)
        ref = worker.call("ref", "compute_log_prob", stale.select_keys(MODEL_INPUT_KEYS))
        torch.testing.assert_close(
            ref["log_probs"], stale["rollout_log_probs"], atol=2e-5, rtol=1e-5
        )  # the stale rollout still runs the base weights: the reference's
        assert stale_gap > 100 * SYNCED_GAP, f"a stale rollout went unnoticed: gap {stale_gap}"

        sync = worker.sync_weights("actor", "rollout")
        _, synced_gap = _gap(worker, params)
        print(f"probability gap: stale {stale_gap:.3g}, synced {synced_gap:.3g}")
        assert synced_gap < SYNCED_GAP, f"the synced rollout differs from the actor: {synced_gap}"
        assert sync["bytes"] > 0
    finally:
        worker.shutdown()


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """recipe=grpo_lora's 10 steps with a checkpoint at step 5 (its 2 mini-batches per step run
    the old log-prob pass, and with it the probability gap, every step)."""
    out = tmp_path_factory.mktemp("lora_learning")
    steps = [
        *recipe_overrides(),
        "trainer.total_training_steps=10",
        "trainer.save_freq=5",
        "trainer.test_freq=10",
    ]
    proc = polyrl_train(out, *steps)
    assert "LoRA: rank 8" in proc.stderr and "adapters disabled" in proc.stderr
    return out, steps


@pytest.mark.slow
def test_lora_run_learns_with_adapters_reaching_the_rollout_every_step(lora_run) -> None:
    out, _ = lora_run
    val_before, records = split_records(read_records(out))
    assert [r["step"] for r in records] == list(range(1, 11))
    gaps = [r[GAP] for r in records]
    assert max(gaps) < SYNCED_GAP, f"sampler/trainer probability gap per step: {gaps}"
    assert val_before is not None
    before, after = val_before[VAL_REWARD], records[-1][VAL_REWARD]
    assert after >= before + 0.3, f"greedy val reward {before} -> {after}"


@pytest.mark.slow
def test_lora_checkpoint_and_export_hold_adapters_and_resume_bitwise(lora_run) -> None:
    from polyrl.safe_load import SafeFileSystemReader

    out, steps = lora_run
    metadata = SafeFileSystemReader(str(out / "global_step_5" / "actor")).read_metadata()
    tensors = [k for k in metadata.state_dict_metadata if k.startswith("model.")]
    assert tensors and all(".lora_A." in k or ".lora_B." in k for k in tensors), tensors[:3]
    exported = sorted(p.name for p in (out / "hf_model").glob("*.safetensors"))
    assert exported == ["adapter_model.safetensors"]
    assert (out / "hf_model" / "adapter_config.json").is_file()

    resumed = out.parent / f"{out.name}_resumed"
    proc = polyrl_train(
        resumed, *steps, "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={out / 'global_step_5'}",
    )  # fmt: skip
    assert "resumed from" in proc.stderr
    a, b = final_weights(out), final_weights(resumed)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[name], b[name]) for name in a), "adapters differ after resume"
    straight = {r["step"]: r["critic/score/mean"] for r in split_records(read_records(out))[1]}
    assert [straight[r["step"]] for r in read_records(resumed)] == [
        r["critic/score/mean"] for r in read_records(resumed)
    ]
