"""The SGLang plugin's own logic, tested everywhere (no SGLang, no GPU): registration, the one-line
errors when SGLang is missing, the config mapping and checks, request building and output
reading, the tensor-parallel placement and the bucketed weight-sync protocol (one worker in
process, two workers over gloo).

SGLang's answers below are dicts shaped like the offline ``Engine.generate`` output of SGLang 0.5
(``output_ids`` and ``meta_info.output_token_logprobs`` = ``(log-prob, token id, text)``); they
exercise this plugin's reading of them, not SGLang.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch
from omegaconf import OmegaConf

from polyrl.api.testing import schema_config
from polyrl.config.schema import RolloutConfig
from polyrl.errors import ConfigError
from polyrl.interfaces import SamplingParams
from polyrl.registry import discover
from polyrl.rollout_layout import WeightStreamChecker, WeightSyncError
from polyrl.specs import PluginKind
from polyrl.testing import RolloutEngineConformance
from polyrl.workers.mesh import DataParallelRank, MeshError
from polyrl_rollout_sglang.checks import check_config
from polyrl_rollout_sglang.config import SEED_STRIDE, bucket_bytes, build_engine_args
from polyrl_rollout_sglang.errors import SGLangOutputError, SGLangRolloutConfigError
from polyrl_rollout_sglang.generation import (
    build_requests,
    prompt_log_probs,
    sample_from_output,
    samples_from_outputs,
)
from polyrl_rollout_sglang.tensor_parallel import (
    EngineGroup,
    TensorParallelPlacement,
    free_port,
    reachable_host,
)
from polyrl_rollout_sglang.weight_sync import (
    sync_weights,
    transpose_payloads,
    weight_buckets,
)

SGLANG_MISSING = importlib.util.find_spec("sglang") is None
NEEDS_SGLANG = (
    "needs SGLang on a CUDA GPU (pip install 'polyrl-rollout-sglang[cuda]'); SGLang has no CPU "
    "build, and no machine of this project can run it"
)
ROLLOUT = "actor_rollout_ref.rollout"


# ---- registration and missing SGLang -----------------------------------------------------------
class TestSGLangConformance(RolloutEngineConformance):
    """Registration checks run everywhere; the engine checks need SGLang on a GPU."""

    plugin_name = "sglang"
    vocab_size = 448  # polyrl.models.tiny

    @pytest.fixture
    def implementation(self, registration):
        if SGLANG_MISSING:
            pytest.skip(NEEDS_SGLANG)
        return registration.load()

    def make_engine(self, tmp_path):
        if SGLANG_MISSING or not torch.cuda.is_available():
            pytest.skip(NEEDS_SGLANG)
        from polyrl.interfaces import RolloutContext
        from polyrl.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID, build_tiny_model
        from polyrl_rollout_sglang.engine import SGLangRolloutEngine

        ctx = RolloutContext(
            model_path=build_tiny_model(str(tmp_path / "tiny"), seed=0),
            config=RolloutConfig(name="sglang", dtype="float32", gpu_memory_utilization=0.2),
            device="cuda",
            rank=0,
            world_size=1,
            max_prompt_length=16,
            max_response_length=8,
            pad_token_id=PAD_TOKEN_ID,
            eos_token_ids=[EOS_TOKEN_ID],
        )
        return SGLangRolloutEngine(ctx)


def test_registered_from_its_package_with_capabilities():
    reg = discover().get(PluginKind.ROLLOUT_ENGINE, "sglang")
    assert reg.provenance.distribution == "polyrl-rollout-sglang"
    assert reg.spec.engine == "polyrl_rollout_sglang.engine:SGLangRolloutEngine"
    assert reg.spec.runtime_modules == ("sglang",)
    assert reg.spec.config_check == "polyrl_rollout_sglang.checks:check_config"
    assert reg.spec.capability_flags() == {
        "cpu": False,
        "cuda": True,
        "weight_sync": True,
        "sleep": True,
        "logprobs": True,
        "lora_adapters": False,
    }


def _run(code: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return done.stdout.strip()


def test_missing_sglang_is_one_line_before_ray_and_names_the_extra():
    # sys.modules[name] = None makes `import sglang` fail, as on a machine without it.
    out = _run(
        """
        import sys
        sys.modules["sglang"] = None
        from omegaconf import OmegaConf
        from polyrl.api.testing import schema_config
        from polyrl.preflight import check_registration
        from polyrl.registry import PluginBrokenError, discover
        from polyrl.specs import PluginKind
        reg = discover().get(PluginKind.ROLLOUT_ENGINE, "sglang")
        print(check_registration(reg, "actor_rollout_ref.rollout.name=sglang", "cuda"))
        try:
            reg.load()
        except PluginBrokenError as exc:
            print(" ".join(str(exc).split()))
        """
    )
    preflight_line, load_error = out.splitlines()
    assert preflight_line == (
        "actor_rollout_ref.rollout.name=sglang needs the module 'sglang', which is not "
        "installed: pip install 'polyrl-rollout-sglang[cuda]'"
    )
    assert "SGLangNotInstalledError" in load_error
    assert "pip install 'polyrl-rollout-sglang[cuda]'" in load_error


def test_config_check_module_is_light():
    out = _run(
        """
        import sys, polyrl_rollout_sglang.checks, polyrl_rollout_sglang.generation
        print(int('sglang' in sys.modules), int('torch' in sys.modules))
        """
    )
    assert out.split() == ["0", "0"]


# ---- config mapping and checks -----------------------------------------------------------------
def _check(*overrides: str) -> list[str]:
    dotlist = [f"{ROLLOUT}.name=sglang", "trainer.device=cuda", *overrides]
    cfg = OmegaConf.merge(schema_config(), OmegaConf.from_dotlist(dotlist))
    return check_config(cfg)


def test_config_check_lines(monkeypatch):
    monkeypatch.delenv("SGLANG_RETURN_ORIGINAL_LOGPROB", raising=False)
    assert _check() == []
    tp2 = f"{ROLLOUT}.tensor_model_parallel_size=2"
    assert _check("trainer.n_gpus_per_node=4", tp2) == []
    assert _check("trainer.n_gpus_per_node=3", tp2) == [
        f"{ROLLOUT}.tensor_model_parallel_size 2 does not divide the world size 3 "
        "= trainer.nnodes 1 x trainer.n_gpus_per_node 3"
    ]
    (line,) = _check(f"{ROLLOUT}.dtype=int3")
    assert line.startswith(f"{ROLLOUT}.dtype='int3' is not a dtype SGLang knows")
    (line,) = _check(f"{ROLLOUT}.engine_kwargs={{sglang: 3}}")
    assert line == f"{ROLLOUT}.engine_kwargs.sglang must be a mapping, got 3"
    (line,) = _check(f"{ROLLOUT}.update_weights_bucket_megabytes=0")
    assert line.startswith(f"{ROLLOUT}.update_weights_bucket_megabytes must be a whole number")
    monkeypatch.setenv("SGLANG_RETURN_ORIGINAL_LOGPROB", "True")
    (line,) = _check()
    assert line.startswith("SGLANG_RETURN_ORIGINAL_LOGPROB=True makes SGLang report log-probs")


def test_cpu_is_refused_by_core_for_this_engine():
    from polyrl.config.validate import validate_config

    cfg = OmegaConf.merge(
        schema_config(),
        OmegaConf.from_dotlist([f"{ROLLOUT}.name=sglang", "trainer.device=cpu"]),
    )
    problems = validate_config(cfg)
    assert any(
        f"{ROLLOUT}.name='sglang' (package polyrl-rollout-sglang) does not support "
        f"trainer.device=cpu" in p
        for p in problems
    ), problems


def _node(**values):
    cfg = OmegaConf.merge(schema_config(), {"actor_rollout_ref": {"rollout": values}})
    return cfg.actor_rollout_ref.rollout


def test_engine_args_from_verl_keys():
    cfg = _node(
        name="sglang",
        dtype="bf16",
        gpu_memory_utilization=0.4,
        enforce_eager=False,
        max_num_batched_tokens=4096,
        max_num_seqs=32,
        enable_prefix_caching=False,
        free_cache_engine=True,
        seed=5,
        engine_kwargs={"vllm": {"block_size": 32}, "sglang": {"attention_backend": "triton"}},
    )
    placement = TensorParallelPlacement(rank=3, world_size=4, size=1)
    args = build_engine_args(
        cfg, model_path="/m", max_model_len=300, seed=0, placement=placement, nccl_port=4242
    )
    assert args == {
        "model_path": "/m",
        "dtype": "bfloat16",
        "random_seed": 5 + 3 * SEED_STRIDE,  # each data-parallel rank its own stream
        "mem_fraction_static": 0.4,
        "tp_size": 1,
        "disable_cuda_graph": False,
        "max_prefill_tokens": 4096,
        "max_running_requests": 32,
        "disable_radix_cache": True,
        "enable_memory_saver": True,
        "context_length": 301,
        "skip_tokenizer_init": True,
        "trust_remote_code": False,
        "log_level": "error",
        "base_gpu_id": 0,
        "nccl_port": 4242,
        "attention_backend": "triton",  # verl's nested engine_kwargs.sglang, not .vllm
    }


def test_engine_args_tensor_parallel_and_flat_passthrough():
    cfg = _node(tensor_model_parallel_size=2, engine_kwargs={"disable_cuda_graph": True})
    leader, peer = (TensorParallelPlacement(rank, 4, 2) for rank in (2, 3))
    common = {"model_path": "/m", "max_model_len": 64, "seed": 7, "dist_init_addr": "h:1"}
    first = build_engine_args(cfg, placement=leader, **common)
    second = build_engine_args(cfg, placement=peer, **common)
    assert first["tp_size"] == second["tp_size"] == 2
    assert (first["nnodes"], first["node_rank"]) == (2, 0)
    assert (second["nnodes"], second["node_rank"]) == (2, 1)
    assert first["dist_init_addr"] == second["dist_init_addr"] == "h:1"
    # both shards of one engine draw the same samples: one seed for the engine (schema seed 0)
    assert first["random_seed"] == second["random_seed"] == SEED_STRIDE
    assert "nccl_port" not in first
    assert first["disable_cuda_graph"] is True  # a flat engine_kwargs passes through


def test_partial_dicts_take_the_schema_defaults_and_bad_values_are_reported():
    where = {"model_path": "/m", "max_model_len": 8, "seed": 0}
    one = TensorParallelPlacement(0, 1, 1)
    args = build_engine_args({"max_num_seqs": 4}, placement=one, **where)
    assert args["max_running_requests"] == 4 and args["mem_fraction_static"] == 0.5
    assert bucket_bytes({}) == 512 << 20
    with pytest.raises(ConfigError, match=r"Did you mean actor_rollout_ref\.rollout\.max_num_seqs"):
        build_engine_args({"max_num_seq": 4}, placement=one, **where)
    with pytest.raises(SGLangRolloutConfigError, match=r"rollout\.dtype='int3'"):
        build_engine_args({"dtype": "int3"}, placement=one, **where)
    with pytest.raises(SGLangRolloutConfigError, match=r"engine_kwargs\.sglang must be a mapping"):
        build_engine_args({"engine_kwargs": {"sglang": [1]}}, placement=one, **where)
    with pytest.raises(SGLangRolloutConfigError, match="placed in an engine of 1 GPUs"):
        build_engine_args({"tensor_model_parallel_size": 2}, placement=one, **where)
    with pytest.raises(SGLangRolloutConfigError, match="update_weights_bucket_megabytes"):
        bucket_bytes({"update_weights_bucket_megabytes": -1})


# ---- requests and answers ----------------------------------------------------------------------
def test_requests_one_per_sample_in_layout_order_with_own_seeds():
    rows = [[5, 6], [7]]
    params = SamplingParams(
        n=2, temperature=0.7, top_p=0.9, top_k=5, max_new_tokens=4, stop_token_ids=[9], seed=10
    )
    request = build_requests(rows, params, eos_token_ids=[2])
    assert request.input_ids == [[5, 6], [5, 6], [7], [7]]
    shared = {
        "max_new_tokens": 4,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 5,
        "stop_token_ids": [2, 9],
        "no_stop_trim": True,
    }
    assert request.sampling_params == [
        {**shared, "sampling_seed": seed} for seed in (10, 11, 12, 13)
    ]


def test_greedy_and_unbounded_top_k_requests():
    greedy = build_requests([[1]], SamplingParams(greedy=True, temperature=0.9, top_k=3), [2])
    (one,) = greedy.sampling_params
    assert (one["temperature"], one["top_p"], one["top_k"]) == (0.0, 1.0, -1)
    assert "sampling_seed" not in one
    (unbounded,) = build_requests([[1]], SamplingParams(top_k=0), []).sampling_params
    assert unbounded["top_k"] == -1 and unbounded["stop_token_ids"] == []
    with pytest.raises(ValueError, match="n >= 1 and max_new_tokens >= 1"):
        build_requests([[1]], SamplingParams(n=0), [])


def _answer(tokens, log_probs, **meta):
    entries = [(lp, t, None) for lp, t in zip(log_probs, tokens)]
    return {"output_ids": list(tokens), "meta_info": {"output_token_logprobs": entries, **meta}}


def test_samples_read_from_answers():
    answers = [_answer([11, 2], [-0.5, -0.25]), _answer([12], [-1.0])]
    assert samples_from_outputs(answers, 2) == [([11, 2], [-0.5, -0.25]), ([12], [-1.0])]
    # output_ids may be absent (older answers): the log-prob entries carry the token ids
    del answers[0]["output_ids"]
    assert sample_from_output(answers[0], 0) == ([11, 2], [-0.5, -0.25])


def test_bad_answers_are_clear_errors():
    with pytest.raises(SGLangOutputError, match="answered 1 for 2 requests"):
        samples_from_outputs([_answer([1], [-1.0])], 2)
    with pytest.raises(SGLangOutputError, match="has no meta_info"):
        sample_from_output({"output_ids": [1]}, 0)
    with pytest.raises(SGLangOutputError, match="no output_token_logprobs"):
        sample_from_output({"output_ids": [1], "meta_info": {}}, 0)
    trimmed = _answer([11, 2], [-0.5, -0.25])
    trimmed["output_ids"] = [11]
    with pytest.raises(SGLangOutputError, match="disagree with the tokens of its log-probs"):
        sample_from_output(trimmed, 3)
    aborted = _answer([], [], finish_reason={"type": "abort", "message": "out of memory"})
    with pytest.raises(SGLangOutputError, match="aborted request 0: out of memory"):
        sample_from_output(aborted, 0)


def test_prompt_log_probs_of_a_scoring_answer():
    answer = {"meta_info": {"input_token_logprobs": [(None, 1, None), (-2.0, 5, None)]}}
    assert prompt_log_probs(answer, [1, 5], 0) == [-2.0]
    with pytest.raises(SGLangOutputError, match="scored other tokens"):
        prompt_log_probs(answer, [1, 6], 0)
    with pytest.raises(SGLangOutputError, match="has 2 prompt log-probs for 3 prompt tokens"):
        prompt_log_probs(answer, [1, 5, 6], 0)


# ---- tensor-parallel placement -----------------------------------------------------------------
def test_placement_of_workers_in_engines():
    peer = TensorParallelPlacement(rank=5, world_size=8, size=4)
    assert (peer.node_rank, peer.leader, peer.is_leader, peer.dp_rank) == (1, 4, False, 1)
    assert peer.data_parallel_rank() == DataParallelRank(1, 2, returns_output=False)
    leader = TensorParallelPlacement(rank=4, world_size=8, size=4)
    assert leader.is_leader and leader.data_parallel_rank() == DataParallelRank(1, 2, True)
    with pytest.raises(MeshError, match="cannot form groups of 3"):
        TensorParallelPlacement(rank=0, world_size=4, size=3)


def test_one_gpu_engine_exchanges_locally():
    group = EngineGroup.join(TensorParallelPlacement(0, 1, 1))
    assert group.gather("x") == ["x"] and group.broadcast("y") == "y"


def test_ports_and_host_for_the_leader():
    first = free_port(span=4)
    for port in range(first, first + 4):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", port))  # free, as promised
    assert reachable_host(None) == "127.0.0.1"
    assert reachable_host("127.0.0.1") == "127.0.0.1"


# ---- the bucketed weight sync ------------------------------------------------------------------
def _stream(shapes: dict[str, tuple[int, ...]], value: float = 1.0):
    return [(name, torch.full(shape, value)) for name, shape in shapes.items()]


SHAPES = {"a": (4,), "b": (2, 2), "c": (16,), "d": (1,)}  # float32: 16, 16, 64, 4 bytes


def _serialize(tensor: torch.Tensor) -> bytes:
    return tensor.numpy().tobytes()


def test_weight_buckets_are_bounded():
    sizes = [[name for name, _ in bucket] for bucket in weight_buckets(_stream(SHAPES), 32)]
    assert sizes == [["a", "b"], ["c"], ["d"]]  # c (64 bytes) is larger than a bucket: alone
    with pytest.raises(ValueError, match="bucket_bytes must be >= 1"):
        list(weight_buckets([], 0))


def test_transpose_handles_per_tensor_and_refuse_different_streams():
    per_worker = [[("a", b"a0"), ("b", b"b0")], [("a", b"a1"), ("b", b"b1")]]
    assert transpose_payloads(per_worker) == [("a", [b"a0", b"a1"]), ("b", [b"b0", b"b1"])]
    with pytest.raises(WeightSyncError, match="streamed different tensors"):
        transpose_payloads([[("a", b"")], [("b", b"")]])


def _sync_one_worker(stream, manifest=SHAPES, load=None, bucket=32):
    loaded: list[list[tuple[str, int]]] = []

    def record(named):
        loaded.append([(name, len(handles)) for name, handles in named])

    stats = sync_weights(
        stream,
        group=EngineGroup(TensorParallelPlacement(0, 1, 1)),
        checker=WeightStreamChecker(dict(manifest), "/m"),
        serialize=_serialize,
        load=load or record,
        bucket_bytes=bucket,
    )
    return stats, loaded


def test_one_worker_sync_loads_bucket_by_bucket():
    stats, loaded = _sync_one_worker(_stream(SHAPES))
    assert loaded == [[("a", 1), ("b", 1)], [("c", 1)], [("d", 1)]]
    assert (stats.tensors, stats.bytes) == (4, 100)


def test_one_worker_sync_failures_raise():
    bad_shape = [(n, t[:1] if n == "c" else t) for n, t in _stream(SHAPES)]
    with pytest.raises(WeightSyncError, match=r"'c' has shape \(1,\) from the trainer"):
        _sync_one_worker(bad_shape)

    def refuse(named):
        raise RuntimeError("no parameter named 'a'")

    with pytest.raises(WeightSyncError, match="SGLang failed to load the weights: RuntimeError"):
        _sync_one_worker(_stream(SHAPES), load=refuse)

    def broken_stream():
        yield "a", torch.zeros(4)
        raise OSError("gather failed")

    with pytest.raises(WeightSyncError, match="OSError: gather failed"):
        _sync_one_worker(broken_stream())


SYNC_WORKER = """
import json, sys, torch, torch.distributed as dist
from polyrl.rollout_layout import WeightStreamChecker, WeightSyncError
from polyrl_rollout_sglang.tensor_parallel import EngineGroup, TensorParallelPlacement
from polyrl_rollout_sglang.weight_sync import sync_weights

rank, port, case = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
shapes = {"a": (4,), "b": (2, 2), "c": (16,)}
stream = [(n, torch.full(s, float(rank))) for n, s in shapes.items()]
if case == "short" and rank == 1:
    stream = stream[:2]
if case == "bad_shape" and rank == 1:
    stream[0] = ("a", torch.zeros(3))
loaded = []
def load(named):
    loaded.append([(n, [bytes(h).decode() for h in handles]) for n, handles in named])
placement = TensorParallelPlacement(rank, 2, 2)
try:
    stats = sync_weights(
        stream,
        group=EngineGroup.join(placement),
        checker=WeightStreamChecker(shapes, "/m"),
        serialize=lambda t: f"{int(t.flatten()[0])}x{t.numel()}".encode(),
        load=load if placement.is_leader else None,
        bucket_bytes=32,
    )
    result = {"tensors": stats.tensors, "loaded": loaded}
except WeightSyncError as exc:
    result = {"error": str(exc), "loaded": loaded}
print(json.dumps(result))
dist.destroy_process_group()
"""


def _two_workers(case: str) -> list[dict]:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", SYNC_WORKER, str(rank), str(port), case],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in (0, 1)
    ]
    results = []
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def test_two_worker_engine_sync_over_gloo():
    """The leader loads each bucket with one handle per worker (its own first); when one worker
    cannot go on, both raise the same error instead of waiting for each other."""
    leader, peer = _two_workers("ok")
    first_bucket = [["a", ["0x4", "1x4"]], ["b", ["0x4", "1x4"]]]
    assert leader == {"tensors": 3, "loaded": [first_bucket, [["c", ["0x16", "1x16"]]]]}
    assert peer == {"tensors": 3, "loaded": []}
    for case, message, loaded in (
        ("short", "streamed different numbers of tensors", [first_bucket]),
        ("bad_shape", "worker 1 of the engine: weight sync: 'a' has shape (3,)", []),
    ):
        leader, peer = _two_workers(case)
        assert leader["error"] == peer["error"] and message in peer["error"], case
        assert leader["loaded"] == loaded, case
