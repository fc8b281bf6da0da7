"""polyrl's training-engine conformance suite on the FSDP2 engine (one rank, in-process)."""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
from fsdp_tiny_model import VOCAB, build_tiny_model

from polyrl.testing.conformance import TrainingEngineConformance

_MODEL_DIR: dict[str, str] = {}


def _tiny_model() -> str:
    if "path" not in _MODEL_DIR:
        _MODEL_DIR["path"] = build_tiny_model(tempfile.mkdtemp(prefix="fsdp_conf_") + "/m")
    return _MODEL_DIR["path"]


class TestFsdp2Conformance(TrainingEngineConformance):
    plugin_name = "fsdp2"
    vocab_size = VOCAB
    check_value_head = True
    check_non_finite_skip = True

    @pytest.fixture(autouse=True)
    def _own_process_group(self) -> Any:
        """The engine makes a 1-rank group when none exists; destroy it after each test so that
        other tests in this pytest process start without one."""
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        existed = dist.is_initialized()
        yield
        if not existed and dist.is_initialized():
            dist.destroy_process_group()

    @staticmethod
    def _context(role: str, head: Any) -> Any:
        from polyrl.interfaces import EngineContext

        return EngineContext(
            role=role,
            model_path=_tiny_model(),
            model={"dtype": "bfloat16", "enable_gradient_checkpointing": True},
            engine={
                "ppo_micro_batch_size_per_gpu": 1,
                "optim": {"lr": 1e-2, "clip_grad": 1.0},
                "fsdp_config": {"mixed_precision": True},
            },
            device="cpu",
            rank=0,
            world_size=1,
            seed=3,
            total_training_steps=4,
            head=head,
        )

    def make_engine(self, tmp_path: Any) -> Any:
        from polyrl.interfaces.training_engine import ModelHead
        from polyrl_engine_fsdp.engine import FSDPEngine

        return FSDPEngine(self._context("actor", ModelHead.CAUSAL_LM))

    def make_value_engine(self, tmp_path: Any) -> Any:
        from polyrl.interfaces.training_engine import ModelHead
        from polyrl_engine_fsdp.engine import FSDPEngine

        return FSDPEngine(self._context("critic", ModelHead.VALUE))
