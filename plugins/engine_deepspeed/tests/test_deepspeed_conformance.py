"""polyrl's training-engine conformance suite on the DeepSpeed engine (one rank, in-process):
ZeRO-2 in bf16 with gradient checkpointing, and ZeRO-3 in fp32 with parameters and optimizer
offloaded and token-budget micro-batches."""

from __future__ import annotations

import math
import tempfile
from typing import Any, ClassVar

import pytest
from ds_context import ds_context

from polyrl.models.tiny import TOKENIZER_VOCAB_SIZE, build_tiny_model
from polyrl.testing.conformance import TrainingEngineConformance

_MODEL_DIR: dict[str, str] = {}


def _tiny_model() -> str:
    if "path" not in _MODEL_DIR:
        _MODEL_DIR["path"] = build_tiny_model(tempfile.mkdtemp(prefix="ds_conf_") + "/m")
    return _MODEL_DIR["path"]


@pytest.fixture(scope="module", autouse=True)
def one_rank_group() -> Any:
    """One 1-rank gloo group for the whole module, destroyed at its end.

    DeepSpeed caches the world group it first sees (``deepspeed.utils.groups._WORLD_GROUP``), so
    the group must outlive every engine of the module; a worker process has one group for its
    life anyway. The cache is cleared with the group so that later tests start clean.
    """
    import torch
    import torch.distributed as dist
    from deepspeed.utils import groups

    torch.set_num_threads(1)
    existed = dist.is_initialized()
    if not existed:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if not existed:
        dist.destroy_process_group()
        groups._WORLD_GROUP = None


class _DeepSpeedConformance(TrainingEngineConformance):
    plugin_name = "deepspeed"
    vocab_size = TOKENIZER_VOCAB_SIZE
    model_overrides: ClassVar[dict[str, Any]] = {}
    engine_overrides: ClassVar[dict[str, Any]] = {}
    deepspeed: ClassVar[dict[str, Any]] = {}

    def make_engine(self, tmp_path: Any) -> Any:
        from polyrl_engine_deepspeed.engine import DeepSpeedEngine

        engine = {
            "ppo_micro_batch_size_per_gpu": 1,
            "optim": {"lr": 1e-2, "clip_grad": 1.0},
            **self.engine_overrides,
        }
        ctx = ds_context(
            _tiny_model(), model=self.model_overrides, engine=engine, deepspeed=self.deepspeed
        )
        return DeepSpeedEngine(ctx)

    def test_non_finite_grad_norm_skips_the_update(self, engine: Any) -> None:
        """A NaN loss: weights stay, the step is reported as skipped, the schedule still
        advances, and the next finite step trains normally."""
        import torch

        batch = self.make_batch()
        before = {k: v.clone() for k, v in engine.named_weights()}

        def nan_loss(micro_batch: Any, log_prob: Any, entropy: Any) -> Any:
            return log_prob.sum() * float("nan"), {}

        metrics = engine.train_step(batch, nan_loss)
        assert not math.isfinite(metrics["actor/grad_norm"]) and metrics["actor/skipped_step"] == 1
        assert engine.global_step == 1 and engine.scheduler.last_epoch == 1
        for name, tensor in engine.named_weights():
            assert torch.equal(tensor, before[name]), name
        metrics = engine.train_step(batch, self.nll_loss_fn(batch))
        assert math.isfinite(metrics["actor/grad_norm"]) and "actor/skipped_step" not in metrics
        changed = [n for n, t in engine.named_weights() if not torch.equal(t, before[n])]
        assert changed


class TestZero2Bf16Conformance(_DeepSpeedConformance):
    model_overrides = {"dtype": "bfloat16", "enable_gradient_checkpointing": True}
    deepspeed = {"zero_stage": 2}


class TestZero3OffloadConformance(_DeepSpeedConformance):
    model_overrides = {"dtype": "float32"}
    engine_overrides = {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 8}
    deepspeed = {"zero_stage": 3, "offload_param": True, "offload_optimizer": True}
