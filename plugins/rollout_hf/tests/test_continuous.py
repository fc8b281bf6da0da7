"""Continuous batching in the hf rollout (``polyrl_rollout_hf.continuous``).

The reference is today's chunked static path and the eager loop of the same model (float32): with
more samples than decode slots, stop tokens that end rows at different steps and a cache ring that
wraps, greedy tokens must be equal and log-probs equal to a teacher-forced forward; sampled first
tokens must follow the exact truncated distribution. Slot counts from a memory budget are checked
against the bytes counted by hand.
"""

from __future__ import annotations

import pytest
import torch
from hf_engines import hf_engine

from polyrl.batch import Batch
from polyrl.errors import ConfigError
from polyrl.interfaces import SamplingParams
from polyrl.models.tiny import PAD_TOKEN_ID, build_tiny_model
from polyrl.testing.rollout_contract import teacher_forced_log_probs
from polyrl_rollout_hf.continuous import (
    SAMPLING_BYTES_PER_VOCAB_ENTRY,
    bytes_per_slot,
    decode_slots,
)

torch.set_num_threads(1)

PROMPTS = ["What is 3 + 4?", "Hi", "The answer is", "a b c d e f", "Once", "1 2 3", "xyz", "ok"]
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
STOPS = list(range(60, 448, 3))  # about a third of the vocabulary: rows end at mixed steps


def make_engine(path, *, continuous, slots=64, device="cpu", static="true", budget=None):
    hf = {"static_cache": static, "continuous_batching": continuous}
    if budget is not None:
        hf["kv_cache_memory_bytes"] = budget
    config = {"dtype": "float32", "micro_batch_size": slots, "engine_kwargs": {"hf": hf}}
    return hf_engine(path, config, device)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny")), seed=0)


@pytest.fixture(scope="module")
def prompts(model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    enc = tokenizer(PROMPTS, padding=True, return_tensors="pt")  # left padding
    return Batch({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})


def assert_same(a: Batch, b: Batch, atol: float = 1e-5) -> None:
    assert torch.equal(a["responses"], b["responses"])
    assert torch.equal(a["response_mask"], b["response_mask"])
    assert torch.allclose(a["rollout_log_probs"], b["rollout_log_probs"], atol=atol)


@pytest.mark.parametrize(
    "slots, n, max_new",
    [(64, 2, 12), (8, 3, 20), (2, 3, 40), (5, 4, 60)],
    ids=["all-fit", "refills", "fewer-slots-than-n", "ring-wraps"],
)
def test_greedy_equals_the_static_path_and_the_eager_loop(model_dir, prompts, slots, n, max_new):
    params = SamplingParams(n=n, max_new_tokens=max_new, greedy=True, stop_token_ids=STOPS)
    continuous = make_engine(model_dir, continuous="true", slots=slots)
    out = continuous.generate(prompts, params)
    lengths = out["response_mask"].sum(1)
    assert lengths.min() < lengths.max()  # a real length mix
    assert_same(
        out, make_engine(model_dir, continuous="false", slots=slots).generate(prompts, params)
    )
    assert_same(
        out, make_engine(model_dir, continuous="false", static="false").generate(prompts, params)
    )
    ladder = continuous.static_decode.ladder(continuous._decode_slots(64), 64)
    assert ladder[0].rows == slots


@pytest.mark.parametrize("slots", [16, 32])
def test_greedy_is_exact_when_the_tail_moves_to_smaller_steps(model_dir, slots):
    """40 random prompts x 2 samples; the stop tokens are those the greedy continuation emits at
    spread-out steps, so rows end from the first token to the limit; with 16 or 32 slots the
    last live rows move to the front and decode in the 8- and 16-row steps of the ladder."""
    ids = torch.randint(3, 448, (40, 6), generator=torch.Generator().manual_seed(0))
    batch = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    eager = make_engine(model_dir, continuous="false", static="false")
    free_run = eager.generate(batch, SamplingParams(n=1, max_new_tokens=40, greedy=True))
    stops = sorted({int(free_run["responses"][r, (r * 7) % 40]) for r in range(40)})
    params = SamplingParams(n=2, max_new_tokens=40, greedy=True, stop_token_ids=stops)
    out = make_engine(model_dir, continuous="true", slots=slots).generate(batch, params)
    lengths = set(out["response_mask"].sum(1).tolist())
    assert {1, 36} <= lengths and len(lengths) >= 6
    assert_same(out, eager.generate(batch, params))


def test_greedy_is_exact_when_ended_rows_are_read_back_every_few_steps(model_dir):
    """As on CUDA, where the host reads the slots back every few steps: rows that ended keep
    their slot until then, and nothing they compute meanwhile reaches the outputs."""
    ids = torch.randint(3, 448, (24, 5), generator=torch.Generator().manual_seed(1))
    batch = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    params = SamplingParams(n=3, max_new_tokens=30, greedy=True, stop_token_ids=STOPS)
    engine = make_engine(model_dir, continuous="true", slots=16)
    engine.done_check_every = 8
    out = engine.generate(batch, params)
    lengths = out["response_mask"].sum(1)
    assert lengths.min() < 8 and lengths.max() > 16
    eager = make_engine(model_dir, continuous="false", static="false")
    eager.done_check_every = 8
    assert_same(out, eager.generate(batch, params))
    assert_same(
        out, make_engine(model_dir, continuous="false", static="false").generate(batch, params)
    )


def test_a_row_longer_than_the_ring_can_hold_is_still_exact(model_dir, prompts):
    """More decode steps in one call than the cache has columns: the write column wraps many
    times while rows come and go (2 slots, 8 prompts x 3 samples of up to 50 tokens, 64 columns)."""
    params = SamplingParams(n=3, max_new_tokens=50, greedy=True)
    out = make_engine(model_dir, continuous="true", slots=2).generate(prompts, params)
    assert int(out["response_mask"].sum()) > 2 * 64
    assert_same(
        out, make_engine(model_dir, continuous="false", static="false").generate(prompts, params)
    )


def test_sampled_log_probs_are_the_models(model_dir, prompts):
    engine = make_engine(model_dir, continuous="true", slots=6)
    params = SamplingParams(n=4, max_new_tokens=24, seed=1, temperature=0.8, stop_token_ids=STOPS)
    out = engine.generate(prompts, params)
    expected = teacher_forced_log_probs(engine.model, out, temperature=0.8)
    mask = out["response_mask"].bool()
    assert torch.allclose(out["rollout_log_probs"][mask], expected[mask], atol=1e-4)
    assert (out["rollout_log_probs"][~mask] == 0).all()
    assert (out["responses"][~mask] == PAD_TOKEN_ID).all()
    # the same seed gives the same samples
    assert_same(out, engine.generate(prompts, params), 0.0)


def test_sampled_first_tokens_follow_the_truncated_distribution(model_dir, prompts):
    """600 samples of one prompt through 16 slots: the first token's frequencies match
    softmax(top-4 of the prompt's logits / T) (a chi-square bound far above its 3 degrees of
    freedom's 99.9 % point, 16.3, would flag a wrong distribution)."""
    one = Batch({k: prompts[k][:1] for k in ("input_ids", "attention_mask")})
    engine = make_engine(model_dir, continuous="true", slots=16)
    params = SamplingParams(n=600, max_new_tokens=3, seed=2, temperature=0.7, top_k=4)
    out = engine.generate(one, params)
    with torch.no_grad():
        logits = engine.model(
            input_ids=one["input_ids"], attention_mask=one["attention_mask"]
        ).logits[0, -1]
    top = torch.topk(logits / 0.7, 4)
    probs = torch.softmax(top.values, -1)
    counts = torch.stack([(out["responses"][:, 0] == t).sum() for t in top.indices]).float()
    assert int(counts.sum()) == 600  # nothing outside the top 4
    chi2 = float(((counts - 600 * probs) ** 2 / (600 * probs)).sum())
    assert chi2 < 16.3


def test_slots_from_a_memory_budget(model_dir, prompts):
    engine = make_engine(model_dir, continuous="true", slots=64)
    # tiny Qwen2: 2 layers x 2 KV heads x 64 dims, float32, keys and values; 448-token vocabulary
    per_slot = 2 * 2 * 2 * 64 * 64 * 4 + 448 * SAMPLING_BYTES_PER_VOCAB_ENTRY
    assert bytes_per_slot(engine.model, 64) == per_slot
    assert decode_slots(64, per_slot, None, "none") == 64
    assert decode_slots(64, per_slot, 5 * per_slot + per_slot // 2, "test") == 5
    assert decode_slots(4, per_slot, 5 * per_slot, "test") == 4
    with pytest.raises(ConfigError, match=r"holds no decode slot.*raise it"):
        decode_slots(64, per_slot, per_slot - 1, "kv_cache_memory_bytes")
    budgeted = make_engine(model_dir, continuous="true", slots=64, budget=3 * per_slot)
    params = SamplingParams(n=2, max_new_tokens=10, greedy=True, stop_token_ids=STOPS)
    out = budgeted.generate(prompts, params)
    assert budgeted._decode_slots(64) == 3
    assert_same(out, engine.generate(prompts, params))
    with pytest.raises(ConfigError, match="kv_cache_memory_bytes='lots'"):
        make_engine(model_dir, continuous="true", budget="lots")


def test_weight_updates_reach_the_slots(model_dir, prompts, tmp_path):
    from safetensors.torch import load_file

    other = build_tiny_model(str(tmp_path / "other"), seed=1)
    engine = make_engine(model_dir, continuous="true", slots=4)
    params = SamplingParams(n=2, max_new_tokens=10, greedy=True)
    before = engine.generate(prompts, params)
    engine.update_weights(load_file(f"{other}/model.safetensors").items())
    after = engine.generate(prompts, params)
    assert not torch.equal(before["responses"], after["responses"])
    assert_same(
        after, make_engine(other, continuous="false", static="false").generate(prompts, params)
    )


@pytest.mark.gpu
@CUDA
def test_cuda_graph_slots_greedy_equal_the_static_path_without_recapture(model_dir, prompts):
    params = SamplingParams(n=3, max_new_tokens=40, greedy=True, stop_token_ids=STOPS)
    engine = make_engine(model_dir, continuous="true", slots=16, device="cuda")
    reference = make_engine(model_dir, continuous="false", slots=16, device="cuda")
    assert engine.static_decode.use_graphs
    out = engine.generate(prompts, params)
    assert_same(out, reference.generate(prompts, params), 1e-4)
    captures = engine.static_decode.captures
    assert captures == 2  # the ladder of 16 and 8 rows
    engine.update_weights(reference.model.state_dict().items())
    assert_same(engine.generate(prompts, params), out, 1e-4)
    assert engine.static_decode.captures == captures
