"""The SGLang engine's own bookkeeping, run everywhere against a recording stand-in of the three
SGLang names it imports (``sglang.Engine``, ``LocalSerializedTensor``,
``MultiprocessingSerializer``): what it asks SGLang for when it generates, syncs weights, sleeps
and wakes up, and what it refuses. The stand-in answers in the shape of SGLang 0.5's offline
engine; it checks this plugin's calls, never that SGLang works (the contract tests in
test_sglang_engine_contract.py do, where SGLang runs).
"""

from __future__ import annotations

import glob
import importlib
import sys
import types
from dataclasses import dataclass

import pytest
import torch

from polyrl.batch import Batch
from polyrl.config.schema import RolloutConfig
from polyrl.interfaces import RolloutContext, SamplingParams
from polyrl.rollout_layout import WeightSyncError


@dataclass
class RecordedTensor:
    values: list[bytes]


class RecordingEngine:
    """Answers each request with tokens 10, 11, ... and log-prob -0.5 per token."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.calls: list[tuple] = []
        self.refuse = False

    def generate(self, input_ids, sampling_params, return_logprob, logprob_start_len=None):
        self.calls.append(("generate", len(input_ids)))
        answers = []
        for params in sampling_params:
            tokens = list(range(10, 10 + params["max_new_tokens"]))
            entries = [(-0.5, t, None) for t in tokens]
            answers.append({"output_ids": tokens, "meta_info": {"output_token_logprobs": entries}})
        return answers

    def update_weights_from_tensor(self, named_tensors, flush_cache):
        self.calls.append(("update", [name for name, _ in named_tensors], flush_cache))
        assert all(isinstance(t, RecordedTensor) and len(t.values) == 1 for _, t in named_tensors)
        return (False, "no parameter named x") if self.refuse else (True, "Success")

    def flush_cache(self):
        self.calls.append(("flush",))

    def release_memory_occupation(self, tags):
        self.calls.append(("release", tags))

    def resume_memory_occupation(self, tags):
        self.calls.append(("resume", tags))

    def shutdown(self):
        self.calls.append(("shutdown",))


@pytest.fixture
def engine_module(monkeypatch):
    """polyrl_rollout_sglang.engine imported against the recording stand-in."""
    sglang = types.ModuleType("sglang")
    sglang.__version__ = "stand-in"
    sglang.Engine = RecordingEngine
    runner = types.ModuleType("sglang.srt.model_executor.model_runner")
    runner.LocalSerializedTensor = RecordedTensor
    utils = types.ModuleType("sglang.srt.utils")
    utils.MultiprocessingSerializer = types.SimpleNamespace(
        serialize=lambda tensor: tensor.numpy().tobytes()
    )
    for name, module in {
        "sglang": sglang,
        "sglang.srt": types.ModuleType("sglang.srt"),
        "sglang.srt.model_executor": types.ModuleType("sglang.srt.model_executor"),
        "sglang.srt.model_executor.model_runner": runner,
        "sglang.srt.utils": utils,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delitem(sys.modules, "polyrl_rollout_sglang.engine", raising=False)
    monkeypatch.delenv("SGLANG_RETURN_ORIGINAL_LOGPROB", raising=False)
    yield importlib.import_module("polyrl_rollout_sglang.engine")
    sys.modules.pop("polyrl_rollout_sglang.engine", None)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from polyrl.models.tiny import build_tiny_model

    return build_tiny_model(str(tmp_path_factory.mktemp("tiny")), seed=0)


@pytest.fixture(scope="module")
def state(model_path):
    from safetensors.torch import load_file

    (file,) = glob.glob(f"{model_path}/*.safetensors")
    return list(load_file(file).items())


def make(engine_module, model_path, **config):
    ctx = RolloutContext(
        model_path=model_path,
        config=RolloutConfig(name="sglang", update_weights_bucket_megabytes=1, **config),
        device="cuda",
        rank=0,
        world_size=1,
        max_prompt_length=8,
        max_response_length=4,
        pad_token_id=0,
        eos_token_ids=[2],
    )
    return engine_module.SGLangRolloutEngine(ctx)


def _prompts():
    ids = torch.tensor([[0, 5, 6], [7, 8, 9]])
    return Batch({"input_ids": ids, "attention_mask": (ids > 0).long()})


def test_generate_asks_for_every_sample_and_builds_the_layout(engine_module, model_path):
    engine = make(engine_module, model_path)
    args = engine.engine.kwargs
    assert args["context_length"] == 13 and args["enable_memory_saver"] is True
    assert isinstance(args["nccl_port"], int) and "dist_init_addr" not in args
    out = engine.generate(_prompts(), SamplingParams(n=2, max_new_tokens=3))
    assert engine.engine.calls == [("generate", 4)]
    assert out["responses"].tolist() == [[10, 11, 12]] * 4
    assert out["rollout_log_probs"].tolist() == [[-0.5] * 3] * 4
    assert engine.data_parallel_rank().returns_output
    sglang_engine = engine.engine
    engine.close()
    engine.close()  # twice is harmless
    assert sglang_engine.calls.count(("shutdown",)) == 1


def test_sleep_levels_release_and_wake_up_resumes(engine_module, model_path, state):
    engine = make(engine_module, model_path)
    calls = engine.engine.calls
    engine.sleep(1)
    engine.sleep(1)  # already released: nothing more to ask
    engine.sleep(2)
    assert calls == [("release", ["kv_cache"]), ("release", ["weights"])]
    with pytest.raises(WeightSyncError, match="sleep\\(level=2\\) released"):
        engine.generate(_prompts(), SamplingParams(max_new_tokens=2))
    calls.clear()
    engine.update_weights(iter(state))
    # the weights' memory comes back before they are written; the KV cache with generation
    assert calls[0] == ("resume", ["weights"])
    updates = [c for c in calls if c[0] == "update"]
    assert len(updates) > 1 and all(flush is False for _, _, flush in updates)
    assert calls[-1] == ("flush",)
    assert sum(len(names) for _, names, _ in updates) == len(state)
    calls.clear()
    engine.generate(_prompts(), SamplingParams(max_new_tokens=2))
    assert calls == [("resume", ["kv_cache"]), ("generate", 2)]
    with pytest.raises(ValueError, match="sleep level"):
        engine.sleep(3)


def test_without_free_cache_engine_sleep_frees_nothing(engine_module, model_path):
    engine = make(engine_module, model_path, free_cache_engine=False)
    engine.sleep(2)
    engine.wake_up()
    assert engine.engine.calls == []


def test_failed_or_incomplete_syncs_block_generation(engine_module, model_path, state):
    engine = make(engine_module, model_path)
    with pytest.raises(WeightSyncError, match="must hold the full model"):
        engine.update_weights(iter(state[:3]))
    with pytest.raises(WeightSyncError, match="call update_weights"):
        engine.generate(_prompts(), SamplingParams(max_new_tokens=2))
    engine.engine.refuse = True
    with pytest.raises(WeightSyncError, match="SGLang refused the weights: no parameter named x"):
        engine.update_weights(iter(state))
    engine.engine.refuse = False
    engine.update_weights(iter(state))
    assert engine.last_sync["tensors"] == len(state)
    engine.generate(_prompts(), SamplingParams(max_new_tokens=2))


def test_original_logprob_mode_is_refused(engine_module, model_path, monkeypatch):
    from polyrl_rollout_sglang.errors import SGLangRolloutConfigError

    monkeypatch.setenv("SGLANG_RETURN_ORIGINAL_LOGPROB", "1")
    with pytest.raises(SGLangRolloutConfigError, match="log-probs before temperature"):
        make(engine_module, model_path)


def test_too_long_prompt_is_a_data_error(engine_module, model_path):
    from polyrl.errors import DataError

    engine = make(engine_module, model_path)
    ids = torch.ones((1, 8), dtype=torch.long)
    with pytest.raises(DataError, match="max_prompt_length"):
        engine.generate(
            Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids)}),
            SamplingParams(max_new_tokens=5),
        )
    assert engine.engine.calls == []
