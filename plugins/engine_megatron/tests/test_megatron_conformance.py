"""polyrl's training-engine conformance suite on the Megatron engine (one GPU, in-process).

On a machine without CUDA the registration tests run and the engine tests skip: megatron-core's
forward needs a GPU (they run on the GPU machine: ``pytest plugins/engine_megatron``)."""

from __future__ import annotations

import math
import tempfile
from typing import Any

import pytest
from mcore_context import megatron_context

from polyrl.models.tiny import TOKENIZER_VOCAB_SIZE, build_tiny_model
from polyrl.testing.conformance import TrainingEngineConformance

_MODEL_DIR: dict[str, str] = {}


def _tiny_model() -> str:
    if "path" not in _MODEL_DIR:
        _MODEL_DIR["path"] = build_tiny_model(tempfile.mkdtemp(prefix="mcore_conf_") + "/m")
    return _MODEL_DIR["path"]


@pytest.fixture(scope="module", autouse=True)
def one_gpu_group() -> Any:
    """The engines of this module share the 1-rank NCCL group and megatron-core's parallel
    state that the first one creates; both are torn down at the module's end."""
    yield
    import torch.distributed as dist

    if dist.is_initialized():
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


class TestMegatronConformance(TrainingEngineConformance):
    plugin_name = "megatron"
    vocab_size = TOKENIZER_VOCAB_SIZE

    def make_engine(self, tmp_path: Any) -> Any:
        import torch

        if not torch.cuda.is_available():
            pytest.skip("megatron-core's forward needs CUDA; this test runs on the GPU machine")
        from polyrl_engine_megatron.engine import MegatronEngine

        engine = {
            "ppo_micro_batch_size_per_gpu": 1,
            "optim": {"lr": 1e-2, "clip_grad": 1.0},
        }
        return MegatronEngine(megatron_context(_tiny_model(), engine=engine))

    def test_non_finite_grad_norm_skips_the_update(self, engine: Any) -> None:
        """A NaN loss: weights stay, the step is reported as skipped, the schedule advances."""
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
