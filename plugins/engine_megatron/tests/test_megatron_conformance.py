"""polyrl's training-engine conformance suite on the Megatron engine (one GPU, in-process).

On a machine without CUDA the registration tests run and the engine tests skip: megatron-core's
forward needs a GPU (they run on the GPU machine: ``pytest plugins/engine_megatron``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from mcore_context import megatron_context

from polyrl.models.tiny import TOKENIZER_VOCAB_SIZE
from polyrl.testing.conformance import TrainingEngineConformance
from polyrl_engine_kit.testing import tiny_model


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
    check_non_finite_skip = True
    check_value_head = True

    def make_engine(self, tmp_path: Any) -> Any:
        return self._engine(role="actor")

    def make_value_engine(self, tmp_path: Any) -> Any:
        return self._engine(role="critic")

    @staticmethod
    def _engine(role: str) -> Any:
        import torch

        if not torch.cuda.is_available():
            pytest.skip("megatron-core's forward needs CUDA; this test runs on the GPU machine")
        from polyrl.interfaces.training_engine import ModelHead
        from polyrl_engine_megatron.engine import MegatronEngine

        engine = {
            "ppo_micro_batch_size_per_gpu": 1,
            "optim": {"lr": 1e-2, "clip_grad": 1.0},
        }
        ctx = megatron_context(tiny_model("mcore_conf_"), engine=engine, role=role)
        head = ModelHead.VALUE if role == "critic" else ModelHead.CAUSAL_LM
        return MegatronEngine(replace(ctx, head=head))
