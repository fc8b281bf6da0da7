"""The hf rollout's static-KV-cache decode step (``polyrl_rollout_hf.static_decode``).

On CPU the static step runs eagerly (``engine_kwargs.hf.static_cache=true``): it must sample
exactly what the eager DynamicCache loop samples (float32, same seed), on a model with grouped
KV heads too. On CUDA it is a CUDA graph: the tests there (skipped without CUDA) check it
against the eager loop, and that weight updates reach the graph without capturing it again.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hf_engines import build_gqa_model, hf_engine

from polyrl.batch import Batch
from polyrl.errors import ConfigError
from polyrl.interfaces import RolloutContext, SamplingParams
from polyrl.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID, build_tiny_model
from polyrl_rollout_hf.engine import HFRolloutEngine, engine_option
from polyrl_rollout_hf.static_decode import (
    StaticDecodePool,
    bucket,
    grouped_decode_attention,
)

torch.set_num_threads(1)

PROMPTS = ["What is 3 + 4?", "Hi", "The answer is"]
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def make_engine(
    path,
    *,
    static="false",
    device="cpu",
    dtype="float32",
    micro_batch_size=64,
    continuous="false",
    **hf,
):
    """The engine with continuous batching off unless asked for: these tests are about the
    chunked static path (tests/test_continuous.py covers the other)."""
    hf = {"static_cache": static, "continuous_batching": continuous, **hf}
    config = {"dtype": dtype, "micro_batch_size": micro_batch_size, "engine_kwargs": {"hf": hf}}
    return hf_engine(path, config, device)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return {
        "tiny": build_tiny_model(str(tmp_path_factory.mktemp("tiny")), seed=0),
        "gqa": build_gqa_model(str(tmp_path_factory.mktemp("gqa0")), seed=0),
        "gqa1": build_gqa_model(str(tmp_path_factory.mktemp("gqa1")), seed=1),
    }


@pytest.fixture(scope="module")
def prompts(dirs):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(dirs["tiny"])
    enc = tokenizer(PROMPTS, padding=True, return_tensors="pt")  # left padding
    return Batch({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})


PARAMS = [
    SamplingParams(n=3, max_new_tokens=12, greedy=True),
    SamplingParams(n=4, max_new_tokens=16, seed=3),
    SamplingParams(n=2, max_new_tokens=16, seed=5, temperature=0.7, top_k=20, top_p=0.9),
    SamplingParams(n=4, max_new_tokens=8, seed=3, stop_token_ids=list(range(100, 448))),
    SamplingParams(n=1, max_new_tokens=1, seed=2),
]


def assert_same_samples(a: Batch, b: Batch, atol: float = 1e-5) -> None:
    assert torch.equal(a["responses"], b["responses"])
    assert torch.equal(a["response_mask"], b["response_mask"])
    assert torch.allclose(a["rollout_log_probs"], b["rollout_log_probs"], atol=atol)


# ---- pure logic ---------------------------------------------------------------------------------
def test_buckets_are_geometric_and_cover_the_value():
    assert [bucket(v, 8) for v in (1, 8, 9, 12, 13, 17, 25, 33, 64, 65, 256, 257)] == [
        8, 8, 12, 12, 16, 24, 32, 48, 64, 96, 256, 384,
    ]  # fmt: skip
    assert bucket(320, 64) == 384 and bucket(64, 64) == 64 and bucket(65, 64) == 96
    for value in range(1, 3000, 7):
        size = bucket(value, 1)
        assert value <= size <= max(2, value * 3 // 2 + 1)
    assert len({bucket(v, 64) for v in range(1, 4097)}) == 13  # 64, 96, ..., 4096
    assert StaticDecodePool.buckets(256, 64 + 256) == (256, 384)
    with pytest.raises(ValueError):
        bucket(0, 8)


def test_engine_options_nested_flat_and_invalid(dirs):
    cfg = SimpleNamespace(engine_kwargs={"hf": {"static_cache": True}, "static_cache": False})
    assert engine_option(cfg, "static_cache", "auto") is True  # verl's nesting wins
    assert engine_option(SimpleNamespace(engine_kwargs={"cuda_graphs": 0}), "cuda_graphs", 1) == 0
    assert engine_option(SimpleNamespace(engine_kwargs={}), "static_cache", "auto") == "auto"
    assert make_engine(dirs["tiny"], static="auto").static_decode is None  # CPU default: eager
    assert make_engine(dirs["tiny"], static="true").static_decode is not None
    with pytest.raises(ConfigError, match=r"engine_kwargs\.hf\.static_cache='maybe'"):
        make_engine(dirs["tiny"], static="maybe")


def test_grouped_decode_attention_equals_sdpa_with_repeated_kv_heads():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module = SimpleNamespace(num_key_value_groups=3, is_causal=True)
    generator = torch.Generator().manual_seed(0)
    batch, kv_heads, length, dim = 5, 2, 11, 16
    query = torch.randn(batch, kv_heads * 3, 1, dim, generator=generator, dtype=torch.float64)
    key = torch.randn(batch, kv_heads, length, dim, generator=generator, dtype=torch.float64)
    value = torch.randn(batch, kv_heads, length, dim, generator=generator, dtype=torch.float64)
    mask = torch.rand(batch, 1, 1, length, generator=generator) < 0.6
    mask[..., -1] = True
    ours, _ = grouped_decode_attention(module, query, key, value, mask, scaling=0.3)
    theirs, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    assert ours.shape == theirs.shape == (batch, 1, kv_heads * 3, dim)
    assert torch.allclose(ours, theirs, atol=1e-12)
    # a prefill (several query tokens) goes to transformers' own function unchanged
    query = torch.randn(batch, kv_heads * 3, 4, dim, generator=generator, dtype=torch.float64)
    ours, _ = grouped_decode_attention(module, query, key[:, :, :4], value[:, :, :4], None)
    theirs, _ = sdpa_attention_forward(module, query, key[:, :, :4], value[:, :, :4], None)
    assert torch.equal(ours, theirs)


# ---- the static step on CPU (eager) against the DynamicCache loop -------------------------------
@pytest.mark.parametrize("model", ["tiny", "gqa"])
@pytest.mark.parametrize("params", PARAMS, ids=lambda p: f"n{p.n}-new{p.max_new_tokens}")
def test_static_cache_samples_what_the_eager_loop_samples(dirs, prompts, model, params):
    eager = make_engine(dirs[model], static="false")
    static = make_engine(dirs[model], static="true")
    assert eager.static_decode is None and static.static_decode is not None
    assert_same_samples(static.generate(prompts, params), eager.generate(prompts, params))


@pytest.mark.parametrize("model", ["tiny", "gqa"])
def test_fused_step_greedy_equals_the_transformers_step(dirs, prompts, model):
    """The written-out decoder layers against the step through the model's own forward (the
    path before them, ``fused_step=false``) and the eager loop: the same greedy tokens."""
    fused = make_engine(dirs[model], static="true")
    plain = make_engine(dirs[model], static="true", fused_step="false")
    assert fused.static_decode.fused is not None and plain.static_decode.fused is None
    params = SamplingParams(n=2, max_new_tokens=24, greedy=True)
    out = fused.generate(prompts, params)
    assert_same_samples(out, plain.generate(prompts, params))
    assert_same_samples(out, make_engine(dirs[model]).generate(prompts, params))


@pytest.mark.parametrize("model", ["tiny", "gqa"])
def test_merged_projections_sample_what_the_separate_ones_sample(dirs, prompts, model):
    """q/k/v and gate/up as one GEMM each over stacked weights (the modules' parameters views of
    them): the same greedy tokens as the separate GEMMs, the same state_dict, and a weight sync
    through the views reaches the stacked weights."""
    from safetensors.torch import load_file

    from polyrl_rollout_hf.fused_step import layer_weights

    merged = make_engine(dirs[model], static="true", merge_projections="true")
    separate = make_engine(dirs[model], static="true", merge_projections="false")
    step = merged.static_decode.fused
    assert step is not None and separate.static_decode.fused.merged[0] == (None, None)
    first = merged.model.model.layers[0]
    w = layer_weights(first, step.merged[0])
    assert w.qkv is not None and w.gate_up is not None
    assert w.qkv.shape[0] == w.q.shape[0] + w.k.shape[0] + w.v.shape[0]
    state, reference = merged.model.state_dict(), separate.model.state_dict()
    assert list(state) == list(reference)
    assert all(torch.equal(state[name], reference[name]) for name in state)
    greedy = SamplingParams(n=2, max_new_tokens=24, greedy=True)
    assert_same_samples(merged.generate(prompts, greedy), separate.generate(prompts, greedy))
    sampled = SamplingParams(n=2, max_new_tokens=12, seed=3)
    assert_same_samples(merged.generate(prompts, sampled), separate.generate(prompts, sampled))
    if model == "gqa":  # the weight sync writes through the views
        merged.update_weights(load_file(f"{dirs['gqa1']}/model.safetensors").items())
        target = make_engine(dirs["gqa1"], static="false")
        assert_same_samples(merged.generate(prompts, sampled), target.generate(prompts, sampled))
    # a parameter replaced (not what the weight sync does) is read on its own again
    first.self_attn.k_proj.weight = torch.nn.Parameter(first.self_attn.k_proj.weight.clone())
    assert layer_weights(first, step.merged[0]).qkv is None
    assert layer_weights(first, step.merged[0]).gate_up is not None


def test_compiled_functions_trace_each_row_count_in_one_graph(dirs, prompts, monkeypatch):
    """The fused step's per-layer functions and the sampling function are traced with a
    symbolic row count at their first call: the continuous slots (12 rows admitted into 16
    slots, then the 16-row and 8-row decoders of the ladder, stop tokens ending rows early so
    that the ladder shrinks) share one graph per function, where a first trace with static rows
    traced each again for the second size. dynamo's own capture is counted (a backend that runs
    the captured graph), so no Inductor compile runs on CPU."""
    from collections import Counter

    from polyrl_rollout_hf import sampling

    graphs: Counter[str] = Counter()
    rows_seen: dict[str, set[int]] = {}
    real_compile = torch.compile

    def counting_compile(fn, **kwargs):
        def backend(graph, example_inputs):
            graphs[fn.__name__] += 1
            return graph.forward

        def run(*args, **kw):
            rows_seen.setdefault(fn.__name__, set()).add(args[0].shape[0])
            return compiled(*args, **kw)

        compiled = real_compile(fn, fullgraph=kwargs.get("fullgraph", False), backend=backend)
        return run

    torch._dynamo.reset()
    monkeypatch.setattr(torch, "compile", counting_compile)
    monkeypatch.setattr(sampling, "_COMPILED", {})
    try:
        engine = make_engine(
            dirs["gqa"], static="true", continuous="true", compile="true", micro_batch_size=16
        )
        engine.generate(
            prompts,
            SamplingParams(n=4, max_new_tokens=24, seed=3, stop_token_ids=list(range(100, 140))),
        )
    finally:
        torch._dynamo.reset()
    assert rows_seen["before_attention"] >= {16, 8}, rows_seen  # both decoders of the ladder
    assert rows_seen["_pick_untruncated"] >= {12, 16, 8}, rows_seen
    assert graphs == {
        "before_attention": 1,
        "after_attention": 1,
        "final_logits": 1,
        "_pick_untruncated": 1,
    }


def test_fused_step_only_where_it_applies(dirs):
    from transformers import AutoModelForCausalLM

    from polyrl_rollout_hf.fused_step import unsupported_reason

    model = AutoModelForCausalLM.from_pretrained(dirs["gqa"])
    assert unsupported_reason(model) is None
    model.config.hidden_act = "gelu"
    assert "silu" in unsupported_reason(model)
    model.config.hidden_act, model.config.model_type = "silu", "gemma"
    assert "model_type 'gemma'" in unsupported_reason(model)


def test_static_cache_reuses_its_bucket_and_chunks_like_the_eager_loop(dirs, prompts):
    engine = make_engine(dirs["gqa"], static="true", micro_batch_size=4)  # 2 prompts of n=2
    eager = make_engine(dirs["gqa"], static="false", micro_batch_size=4)
    params = SamplingParams(n=2, max_new_tokens=10, greedy=True)
    out = engine.generate(prompts, params)  # chunks of 4 and 2 rows: one row bucket (8)
    assert_same_samples(out, eager.generate(prompts, params))
    shorter = Batch({k: prompts[k][:, 2:] for k in ("input_ids", "attention_mask")})
    engine.generate(shorter, params)  # shorter prompts: the same length bucket
    assert len(engine.static_decode) == 1
    engine.generate(prompts, SamplingParams(n=2, max_new_tokens=200, greedy=True))
    assert len(engine.static_decode) == 2  # a longer cache: a second bucket


def test_static_cache_follows_weight_updates(dirs, prompts):
    from safetensors.torch import load_file

    engine = make_engine(dirs["gqa"], static="true")
    target = make_engine(dirs["gqa1"], static="false")
    params = SamplingParams(n=2, max_new_tokens=10, seed=4)
    before = engine.generate(prompts, params)
    engine.update_weights(load_file(f"{dirs['gqa1']}/model.safetensors").items())
    after = engine.generate(prompts, params)
    assert not torch.equal(before["responses"], after["responses"])
    assert_same_samples(after, target.generate(prompts, params))


def test_the_real_config_node_turns_the_static_cache_on(dirs, prompts):
    from omegaconf import OmegaConf

    from polyrl.config.schema import RolloutConfig

    node = OmegaConf.structured(RolloutConfig)
    node.engine_kwargs = {"hf": {"static_cache": True, "cuda_graphs": False}}
    ctx = RolloutContext(
        model_path=dirs["tiny"],
        config=node,
        device="cpu",
        rank=0,
        world_size=1,
        pad_token_id=PAD_TOKEN_ID,
        eos_token_ids=[EOS_TOKEN_ID],
    )
    engine = HFRolloutEngine(ctx)
    assert engine.static_decode is not None and not engine.static_decode.use_graphs
    out = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=3, seed=0))
    assert out["responses"].shape == (6, 3)


# ---- CUDA: the decode step as a CUDA graph ------------------------------------------------------
@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("params", PARAMS, ids=lambda p: f"n{p.n}-new{p.max_new_tokens}")
def test_cuda_graph_samples_what_the_eager_loop_samples(dirs, prompts, params):
    graph = make_engine(dirs["gqa"], static="auto", device="cuda")
    eager = make_engine(dirs["gqa"], static="false", device="cuda")
    assert graph.static_decode is not None and graph.static_decode.use_graphs
    assert_same_samples(graph.generate(prompts, params), eager.generate(prompts, params), 1e-4)
    assert graph.static_decode.captures == (0 if params.max_new_tokens == 1 else 1)


@pytest.mark.gpu
@CUDA
def test_cuda_fused_compiled_graph_greedy_equals_the_transformers_graph(dirs, prompts):
    """Today's CUDA path before the fused step (transformers' forward in the graph, eager
    sampling) against the fused, compiled one, in float32: the same greedy tokens. (In bfloat16
    no kernel change keeps every rounding: fused bias adds and norms may flip a near tie.)"""
    fused = make_engine(
        dirs["gqa"], static="auto", device="cuda", fused_step="true", compile="true"
    )
    plain = make_engine(dirs["gqa"], static="auto", device="cuda")
    assert fused.static_decode.fused is not None and fused.compiled
    params = SamplingParams(n=3, max_new_tokens=40, greedy=True)
    assert_same_samples(fused.generate(prompts, params), plain.generate(prompts, params), 1e-4)


@pytest.mark.gpu
@CUDA
def test_cuda_merged_projections_greedy_equal_the_transformers_graph(dirs, prompts):
    """The fused, compiled step with q/k/v and gate/up merged, in float32: the greedy tokens of
    the graph through transformers' forward, also after weight syncs (no new capture)."""
    from safetensors.torch import load_file

    merged = make_engine(
        dirs["gqa"], static="auto", device="cuda", compile="true", merge_projections="true"
    )
    plain = make_engine(dirs["gqa"], static="auto", device="cuda", fused_step="false")
    assert merged.static_decode.fused.merged[0][0] is not None
    params = SamplingParams(n=3, max_new_tokens=40, greedy=True)
    assert_same_samples(merged.generate(prompts, params), plain.generate(prompts, params), 1e-4)
    captures = merged.static_decode.captures
    for name in ("gqa1", "gqa"):
        merged.update_weights(load_file(f"{dirs[name]}/model.safetensors").items())
        reference = make_engine(dirs[name], static="false", device="cuda")
        out = merged.generate(prompts, params)
        assert_same_samples(out, reference.generate(prompts, params), 1e-4)
    assert merged.static_decode.captures == captures


@pytest.mark.gpu
@CUDA
def test_cuda_graph_weight_updates_need_no_new_capture(dirs, prompts):
    from safetensors.torch import load_file

    engine = make_engine(dirs["gqa"], static="auto", device="cuda")
    weights = [
        load_file(f"{dirs['gqa1']}/model.safetensors"),
        load_file(f"{dirs['gqa']}/model.safetensors"),
    ]
    references = [
        make_engine(dirs["gqa1"], static="false", device="cuda"),
        make_engine(dirs["gqa"], static="false", device="cuda"),
    ]
    params = SamplingParams(n=3, max_new_tokens=12, seed=7, top_k=50, top_p=0.95)
    engine.generate(prompts, params)
    assert engine.static_decode.captures == 1
    for _ in range(2):  # two rounds of two updates, each followed by a call
        for tensors, reference in zip(weights, references, strict=True):
            engine.update_weights(tensors.items())
            out = engine.generate(prompts, params)
            assert_same_samples(out, reference.generate(prompts, params), 1e-4)
    assert engine.static_decode.captures == 1
    # Replacing a parameter's storage (not what update_weights does) forces a new capture.
    norm = engine.model.model.norm
    norm.weight = torch.nn.Parameter(norm.weight.detach().clone(), requires_grad=False)
    engine.generate(prompts, params)
    assert engine.static_decode.captures == 2


@pytest.mark.gpu
@CUDA
def test_cuda_graph_bf16_sampling_is_reproducible_and_finite(dirs, prompts):
    engine = make_engine(dirs["gqa"], static="auto", device="cuda", dtype="bfloat16")
    params = SamplingParams(n=8, max_new_tokens=40, seed=1, temperature=0.8, top_k=40, top_p=0.9)
    first, second = engine.generate(prompts, params), engine.generate(prompts, params)
    assert_same_samples(first, second, 0.0)
    assert torch.isfinite(first["rollout_log_probs"]).all()
    assert first["responses"].device.type == "cpu"


# ---- top-k + top-p without sorting the whole vocabulary -----------------------------------------
def random_logits(trial: int, generator: torch.Generator, device: str = "cpu") -> torch.Tensor:
    rows = int(torch.randint(1, 9, (1,), generator=generator))
    vocab = int(torch.randint(2, 300, (1,), generator=generator))
    if trial % 3 == 0:  # many exact ties
        logits = torch.randint(-3, 4, (rows, vocab), generator=generator).float()
    elif trial % 3 == 1:  # bf16-rounded logits, as a bf16 model gives them
        logits = (torch.randn(rows, vocab, generator=generator) * 3).bfloat16().float()
    else:
        logits = torch.randn(rows, vocab, generator=generator)
    return (logits / (0.7, 1.0, 1.3)[trial % 3]).to(device)


def check_truncation_equals_reference(device: str) -> None:
    from polyrl_rollout_hf.sampling import reference_truncate_logits, truncate_logits

    generator = torch.Generator().manual_seed(0)
    for trial in range(300):
        logits = random_logits(trial, generator, device)
        top_k = int(torch.randint(1, logits.shape[-1] + 2, (1,), generator=generator))
        top_p = float(torch.rand(1, generator=generator)) * 0.999 + 0.001
        fast = truncate_logits(logits, top_k, top_p)
        assert torch.equal(fast, reference_truncate_logits(logits, top_k, top_p)), (trial, top_k)


def test_top_k_then_top_p_keeps_exactly_what_the_full_sort_keeps():
    check_truncation_equals_reference("cpu")


def test_top_p_keeps_ties_in_token_order():
    from polyrl_rollout_hf.sampling import truncate_logits

    logits = torch.tensor([[1.0, 0.0, 1.0, 1.0, 1.0]])  # four equal tokens, 0.23 each
    kept = truncate_logits(logits, 4, 0.5).isfinite()  # top-k keeps the four 1.0s (0.25 each)
    assert kept.tolist() == [[True, False, True, False, False]]  # the two lowest ids reach 0.5
    kept = truncate_logits(logits, -1, 0.6).isfinite()  # no top-k: three are needed for 0.6
    assert kept.tolist() == [[True, False, True, True, False]]


def test_race_draws_what_multinomial_draws():
    """The exponential race takes the same draws from the generator as torch.multinomial, so
    the CPU path samples exactly what it sampled before."""
    from polyrl_rollout_hf.sampling import race

    probs = torch.softmax(torch.randn(64, 1000, generator=torch.Generator().manual_seed(0)), -1)
    ours, theirs = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    expected = torch.multinomial(probs, 1, generator=theirs).squeeze(-1)
    assert torch.equal(race(probs, ours), expected)
    assert torch.equal(ours.get_state(), theirs.get_state())


@pytest.mark.gpu
@CUDA
def test_cuda_top_k_then_top_p_keeps_exactly_what_the_full_sort_keeps():
    check_truncation_equals_reference("cuda")
