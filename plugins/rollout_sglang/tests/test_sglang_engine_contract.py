"""Contract tests of the SGLang rollout engine against real SGLang on a CUDA GPU: the same
contract as the vLLM plugin's engine tests (shapes, log-probs against a teacher-forced forward of
the same Hugging Face model, weight sync from a checkpoint and from the FSDP trainer, bad streams)
plus what only a GPU has: memory released and resumed, and a tensor-parallel engine over two
workers.

They run wherever ``import sglang`` works and a GPU is present, and skip with that reason
elsewhere. No machine of this project can run SGLang (no CPU build; its torch pin differs from
the GPU machine's): they were written against SGLang 0.5's API and have never run.

Model: polyrl's tiny Qwen2 in float32 with SGLang's torch-native attention and sampling, so that
both sides compute in float32; tolerance 1e-3 absolute on log-probs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from polyrl.testing import rollout_contract
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
    sequence_log_probs,
    teacher_forced_log_probs,
    tiny_model_pair,
    token_log_probs,
    trainer_batch,
)

HAS_CUDA = torch.cuda.is_available()
pytestmark = [
    pytest.mark.sglang,
    pytest.mark.gpu,
    pytest.mark.skipif(
        importlib.util.find_spec("sglang") is None or not HAS_CUDA,
        reason="needs SGLang on a CUDA GPU (pip install 'polyrl-rollout-sglang[cuda]'); SGLang "
        "has no CPU build, and no machine of this project can run it",
    ),
]

ATOL = 1e-3
CHANGED = 1e-2  # another checkpoint moves the log-probs by more than this
ENGINE_KWARGS = {"sglang": {"attention_backend": "torch_native", "sampling_backend": "pytorch"}}


def rollout_config(**values):
    """The schema's ``actor_rollout_ref.rollout`` node (the plugin's own keys mounted)."""
    from omegaconf import OmegaConf

    from polyrl.api.testing import schema_config

    rollout = dict(
        name="sglang",
        dtype="float32",
        gpu_memory_utilization=0.2,
        free_cache_engine=True,
        enforce_eager=True,
        max_num_seqs=16,
        update_weights_bucket_megabytes=1,  # several buckets for the tiny model (~1.7 MB)
        engine_kwargs=ENGINE_KWARGS,
        **values,
    )
    return OmegaConf.merge(
        schema_config(), {"actor_rollout_ref": {"rollout": rollout}}
    ).actor_rollout_ref.rollout


def rollout_context(model_path: str, config, *, rank: int = 0, world_size: int = 1):
    return rollout_contract.rollout_context(
        model_path, config, device="cuda", rank=rank, world_size=world_size
    )


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_model_pair(tmp_path_factory.mktemp("sglang_tiny"))


def _hf(path: str):
    return hf_causal_lm(path, "cuda")


@pytest.fixture(scope="module")
def hf_base(models):
    return _hf(models[0])


@pytest.fixture(scope="module")
def engine(models):
    from polyrl_rollout_sglang.engine import SGLangRolloutEngine

    eng = SGLangRolloutEngine(rollout_context(models[0], rollout_config()))
    print(f"\nSGLang engine start: {eng.start_seconds:.1f} s")
    yield eng
    eng.close()


@pytest.fixture
def base_engine(engine, hf_base):
    """The engine awake, holding the base (seed 0) weights, whatever an earlier test did."""
    engine.wake_up()
    engine.update_weights(iter(hf_base.state_dict().items()))
    return engine


def test_generate_shapes_grouping_masks_and_log_probs(base_engine, hf_base):
    from polyrl.interfaces import SamplingParams

    prompts = left_padded_prompts()
    n, new = 2, 6
    out = base_engine.generate(prompts, SamplingParams(n=n, temperature=0.7, max_new_tokens=new))
    b, p = prompts["input_ids"].shape
    assert out["responses"].shape == out["rollout_log_probs"].shape == (b * n, new)
    assert out["input_ids"].shape == out["position_ids"].shape == (b * n, p + new)
    for i in range(b):
        for j in range(n):
            assert torch.equal(out["prompts"][i * n + j], prompts["input_ids"][i])
    mask = out["response_mask"]
    for r in range(b * n):
        length = int(mask[r].sum())
        assert length == new or int(out["responses"][r, length - 1]) == EOS
        assert torch.all(out["responses"][r, length:] == PAD)
        assert torch.all(out["rollout_log_probs"][r, length:] == 0)
    assert torch.equal(out["attention_mask"][:, p:], mask)
    # sampling log-probs = log_softmax(logits / T) of the same weights at the sampled tokens
    expected = teacher_forced_log_probs(hf_base, out, 0.7)
    valid = mask.bool()
    assert torch.allclose(out["rollout_log_probs"][valid], expected[valid], atol=ATOL, rtol=0)


def test_top_k_samples_within_the_top_k_with_unnormalised_log_probs(base_engine, hf_base):
    from polyrl.interfaces import SamplingParams

    out = base_engine.generate(
        left_padded_prompts(), SamplingParams(n=2, top_k=5, max_new_tokens=5)
    )
    logits = response_logits(hf_base, out)
    valid, tokens = out["response_mask"].bool(), out["responses"]
    assert torch.all((logits.topk(5, dim=-1).indices == tokens.unsqueeze(-1)).any(-1)[valid])
    # SGLang reports log_softmax over the whole vocabulary (as the hf rollout), not over the 5
    expected = token_log_probs(logits.log_softmax(-1), tokens)
    assert torch.allclose(out["rollout_log_probs"][valid], expected[valid], atol=ATOL, rtol=0)


def test_greedy_and_stop_token(base_engine, hf_base):
    from polyrl.interfaces import SamplingParams

    prompts = left_padded_prompts()
    greedy = base_engine.generate(prompts, SamplingParams(n=2, greedy=True, max_new_tokens=6))
    assert torch.equal(greedy["responses"][0::2], greedy["responses"][1::2])
    assert torch.equal(response_logits(hf_base, greedy).argmax(-1), greedy["responses"])
    # the latest step k at which a greedy token first appears in its row becomes a stop token
    rows = greedy["responses"][0::2].tolist()
    k, r = max((i, r) for r, row in enumerate(rows) for i in range(6) if row[i] not in row[:i])
    stop = rows[r][k]
    stopped = base_engine.generate(
        prompts, SamplingParams(greedy=True, max_new_tokens=6, stop_token_ids=[stop])
    )
    assert stopped["responses"][r].tolist() == rows[r][: k + 1] + [PAD] * (5 - k)
    assert stopped["response_mask"][r].tolist() == [1] * (k + 1) + [0] * (5 - k)


def _free_gpu_bytes() -> int:
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]  # device-wide: SGLang's scheduler is another process


def test_sleep_releases_gpu_memory_and_wake_up_restores_generation(base_engine, hf_base):
    from polyrl.interfaces import SamplingParams
    from polyrl.rollout_layout import WeightSyncError

    prompts = left_padded_prompts()
    params = SamplingParams(greedy=True, max_new_tokens=4)
    before = base_engine.generate(prompts, params)
    awake = _free_gpu_bytes()
    base_engine.sleep(level=1)
    kv_released = _free_gpu_bytes()
    assert kv_released > awake + (64 << 20), "sleep(1) must release the KV cache"
    base_engine.wake_up()
    assert torch.equal(base_engine.generate(prompts, params)["responses"], before["responses"])
    base_engine.sleep(level=2)
    assert _free_gpu_bytes() > awake + (64 << 20)
    with pytest.raises(WeightSyncError, match="call update_weights"):
        base_engine.generate(prompts, params)
    base_engine.update_weights(iter(hf_base.state_dict().items()))  # wakes the weights first
    assert torch.equal(base_engine.generate(prompts, params)["responses"], before["responses"])
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
    """A different model's HF state dict, in several buckets: SGLang's log-probs then equal
    transformers holding it, and differ from the old ones."""
    before = base_engine.score_log_probs(SEQUENCES)
    for got, want in zip(before, sequence_log_probs(hf_base, SEQUENCES)):
        assert torch.allclose(got, want, atol=ATOL, rtol=0)
    other = _hf(models[1])
    base_engine.update_weights(iter(other.state_dict().items()))
    assert base_engine.last_sync["tensors"] == len(other.state_dict())
    after = base_engine.score_log_probs(SEQUENCES)
    for got, want, old in zip(after, sequence_log_probs(other, SEQUENCES), before):
        assert torch.allclose(got, want, atol=ATOL, rtol=0)
        assert (got - old).abs().max() > CHANGED


def test_bad_weight_streams_block_generation_until_a_complete_sync(base_engine, hf_base):
    from polyrl.interfaces import SamplingParams
    from polyrl.rollout_layout import WeightSyncError

    state = list(hf_base.state_dict().items())
    want = sequence_log_probs(hf_base, SEQUENCES)
    bad_streams = {
        "has shape": [(k, v[:-1] if k.endswith("o_proj.weight") else v) for k, v in state],
        "must hold the full model": state[:5],
    }
    for message, stream in bad_streams.items():
        with pytest.raises(WeightSyncError, match=message):
            base_engine.update_weights(iter(stream))
        with pytest.raises(WeightSyncError, match="call update_weights"):
            base_engine.generate(left_padded_prompts(), SamplingParams(max_new_tokens=2))
        base_engine.update_weights(iter(state))
        for got, expected in zip(base_engine.score_log_probs(SEQUENCES), want):
            assert torch.allclose(got, expected, atol=ATOL, rtol=0)


def test_weight_sync_from_fsdp_trainer(base_engine, models):
    """The real trainer path on the GPU: an FSDP2 engine (1 rank, NCCL) takes an optimizer step
    and streams named_weights() (gathered DTensors on the GPU) into SGLang; SGLang's log-probs of
    fixed prompt+response tokens then equal the trainer's compute_log_prob."""
    pytest.importorskip("polyrl_engine_fsdp")
    import torch.distributed as dist

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        actor = fsdp_actor(models[0], "cuda")
        batch, seqs = trainer_batch()
        rmask = batch["response_mask"]

        def engine_response_log_probs():
            scores = base_engine.score_log_probs(seqs)
            return [s[-int(rmask[i].sum()) :] for i, s in enumerate(scores)]

        before = engine_response_log_probs()
        actor.train_step(batch, response_nll_loss)
        trainer_after, _ = actor.compute_log_prob(batch)
        base_engine.update_weights(actor.named_weights())
        after = engine_response_log_probs()
        for i in range(2):
            width = int(rmask[i].sum())
            assert torch.allclose(after[i], trainer_after[i, :width].cpu(), atol=ATOL, rtol=0)
            assert (after[i] - before[i]).abs().max() > CHANGED
    finally:
        if created:
            dist.destroy_process_group()


TP_WORKER = """
import json, os, sys
rank, port, base, other = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)  # as Ray does: one GPU per worker
os.environ["MASTER_ADDR"] = "127.0.0.1"
import torch, torch.distributed as dist
sys.path.insert(0, os.path.dirname(sys.argv[5]))
from test_sglang_engine_contract import _hf, rollout_config, rollout_context
from polyrl.testing.rollout_contract import SEQUENCES, left_padded_prompts
from polyrl.testing.rollout_contract import sequence_log_probs as hf_scores
from polyrl.interfaces import SamplingParams
from polyrl_rollout_sglang.engine import SGLangRolloutEngine

torch.cuda.set_device(0)
dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
engine = SGLangRolloutEngine(
    rollout_context(base, rollout_config(tensor_model_parallel_size=2), rank=rank, world_size=2)
)
position = engine.data_parallel_rank()
out = engine.generate(left_padded_prompts(), SamplingParams(n=2, greedy=True, max_new_tokens=6))
result = {
    "dp": [position.dp_rank, position.dp_size, position.returns_output],
    "responses": out["responses"].tolist(),
}
other_state = _hf(other).state_dict()
if engine.placement.is_leader:
    result["before_ok"] = all(
        torch.allclose(g, w, atol=1e-3, rtol=0)
        for g, w in zip(engine.score_log_probs(SEQUENCES), hf_scores(_hf(base), SEQUENCES))
    )
engine.update_weights(iter(other_state.items()))
if engine.placement.is_leader:
    result["after_ok"] = all(
        torch.allclose(g, w, atol=1e-3, rtol=0)
        for g, w in zip(engine.score_log_probs(SEQUENCES), hf_scores(_hf(other), SEQUENCES))
    )
engine.close()
dist.destroy_process_group()
print(json.dumps(result))
"""


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs SGLang and 2 CUDA GPUs")
def test_tensor_parallel_engine_over_two_workers(models):
    """Two workers (one GPU each, as under Ray) form one engine of 2 shards: both report one
    data-parallel rank (the leader returns), both return the leader's samples, and a weight sync
    streamed by both reaches the shards."""
    from polyrl_rollout_sglang.tensor_parallel import free_port

    port = str(free_port())
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", TP_WORKER, str(rank), port, *models, __file__],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        for rank in (0, 1)
    ]
    results = []
    for worker in workers:
        out, err = worker.communicate(timeout=600)
        assert worker.returncode == 0, err[-4000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    leader, peer = results
    assert leader["dp"] == [0, 1, True] and peer["dp"] == [0, 1, False]
    assert leader["responses"] == peer["responses"]
    assert leader["before_ok"] and leader["after_ok"]
