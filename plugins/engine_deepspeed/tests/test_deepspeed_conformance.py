"""polyrl's training-engine conformance suite on the DeepSpeed engine (one rank, in-process):
ZeRO-2 in bf16 with gradient checkpointing, and ZeRO-3 in fp32 with parameters and optimizer
offloaded and token-budget micro-batches."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from ds_context import ds_context

from polyrl.models.tiny import TOKENIZER_VOCAB_SIZE
from polyrl.testing.conformance import TrainingEngineConformance
from polyrl_engine_kit.testing import tiny_model


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
    check_non_finite_skip = True
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
            tiny_model("ds_conf_"),
            model=self.model_overrides,
            engine=engine,
            deepspeed=self.deepspeed,
        )
        return DeepSpeedEngine(ctx)


class TestZero2Bf16Conformance(_DeepSpeedConformance):
    model_overrides = {"dtype": "bfloat16", "enable_gradient_checkpointing": True}
    deepspeed = {"zero_stage": 2}


class TestZero3OffloadConformance(_DeepSpeedConformance):
    model_overrides = {"dtype": "float32"}
    engine_overrides = {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 8}
    deepspeed = {"zero_stage": 3, "offload_param": True, "offload_optimizer": True}
