"""Behaviour of the hf rollout engine on the tiny random Qwen2 (float32, so comparisons are tight).

Expected values are derived in the tests themselves: a teacher-forced forward pass of the same
model gives the log-probs, a greedy run gives the tokens a stop-token run must reproduce, and a
model built from other weights gives what a weight update must produce.
"""

from __future__ import annotations

import pytest
import torch
from hf_engines import hf_engine

from polyrl.batch import Batch
from polyrl.errors import ConfigError
from polyrl.interfaces import RolloutContext, SamplingParams
from polyrl.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID, build_tiny_model
from polyrl.testing import RolloutEngineConformance
from polyrl.testing.rollout_contract import teacher_forced_log_probs
from polyrl_rollout_hf.engine import HFRolloutEngine

torch.set_num_threads(1)

PROMPTS = ["What is 3 + 4?", "Hi", "The answer is"]


def make_engine(path: str, *, micro_batch_size: int = 64, dtype: str = "float32"):
    return hf_engine(path, {"dtype": dtype, "micro_batch_size": micro_batch_size})


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    """Two tiny models with different random weights (seeds 0 and 1)."""
    return (
        build_tiny_model(str(tmp_path_factory.mktemp("tiny0")), seed=0),
        build_tiny_model(str(tmp_path_factory.mktemp("tiny1")), seed=1),
    )


@pytest.fixture(scope="module")
def engine(tiny_dirs):
    return make_engine(tiny_dirs[0])


@pytest.fixture(scope="module")
def prompts(tiny_dirs):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dirs[0])
    enc = tokenizer(PROMPTS, padding=True, return_tensors="pt")  # left padding (tokenizer default)
    assert tokenizer.padding_side == "left"
    return Batch(
        {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]},
        {"uid": ["p0", "p1", "p2"]},
    )


def test_shapes_grouping_and_concatenated_fields(engine, prompts):
    n, new = 3, 6
    out = engine.generate(prompts, SamplingParams(n=n, max_new_tokens=new, seed=0))
    rows, prompt_len = 3 * n, prompts["input_ids"].shape[1]
    assert out["responses"].shape == (rows, new)
    assert out["response_mask"].shape == (rows, new)
    assert out["rollout_log_probs"].shape == (rows, new)
    assert out["rollout_log_probs"].dtype == torch.float32
    # samples of prompt i are rows i*n .. i*n+n-1, with the prompt's own ids and fields
    for i in range(3):
        for j in range(n):
            assert torch.equal(out["prompts"][i * n + j], prompts["input_ids"][i])
            assert out["uid"][i * n + j] == f"p{i}"
    assert torch.equal(out["input_ids"], torch.cat([out["prompts"], out["responses"]], 1))
    prompt_mask = prompts["attention_mask"].repeat_interleave(n, 0)
    assert torch.equal(out["attention_mask"], torch.cat([prompt_mask, out["response_mask"]], 1))
    # "Hi" is left-padded: its positions are 0 on the padding, then 0, 1, 2 ... on real tokens
    row = 1 * n
    pad_count = int((prompts["attention_mask"][1] == 0).sum())
    real = prompt_len - pad_count + int(out["response_mask"][row].sum())
    expected = (
        [0] * pad_count + list(range(real)) + [real - 1] * (prompt_len + new - pad_count - real)
    )
    assert out["position_ids"][row].tolist() == expected
    # the n samples of one prompt differ (sampling at temperature 1 from 448 tokens)
    assert not torch.equal(out["responses"][0], out["responses"][1])


def test_mask_ends_at_the_first_stop_token_and_pads_after(engine, prompts):
    # Most of the vocabulary as stop tokens: rows stop early, at different steps.
    stop_ids = list(range(100, 448))
    out = engine.generate(
        prompts, SamplingParams(n=4, max_new_tokens=8, seed=3, stop_token_ids=stop_ids)
    )
    stops = set(stop_ids) | {EOS_TOKEN_ID}
    lengths = set()
    for tokens, mask, log_probs in zip(
        out["responses"].tolist(), out["response_mask"].tolist(), out["rollout_log_probs"]
    ):
        first_stop = next((k for k, t in enumerate(tokens) if t in stops), None)
        length = len(tokens) if first_stop is None else first_stop + 1
        lengths.add(length)
        assert mask == [1] * length + [0] * (len(tokens) - length)
        assert tokens[length:] == [PAD_TOKEN_ID] * (len(tokens) - length)
        assert (log_probs[length:] == 0).all() and (log_probs[:length] < 0).all()
    assert len(lengths) > 1, "expected rows to stop at different steps"


def test_stop_token_cuts_the_greedy_response(engine, prompts):
    full = engine.generate(prompts, SamplingParams(max_new_tokens=8, greedy=True))
    tokens = full["responses"][0].tolist()
    stop = tokens[3]
    cut = tokens.index(stop)  # the first time the greedy response emits that token
    out = engine.generate(
        prompts, SamplingParams(max_new_tokens=8, greedy=True, stop_token_ids=[stop])
    )
    assert out["responses"][0].tolist() == tokens[: cut + 1] + [PAD_TOKEN_ID] * (7 - cut)
    assert out["response_mask"][0].tolist() == [1] * (cut + 1) + [0] * (7 - cut)
    assert torch.allclose(
        out["rollout_log_probs"][0, : cut + 1], full["rollout_log_probs"][0, : cut + 1]
    )


def test_greedy_tokens_and_log_probs_match_a_teacher_forced_forward(engine, prompts):
    out = engine.generate(prompts, SamplingParams(max_new_tokens=10, greedy=True))
    expected = teacher_forced_log_probs(engine.model, out)
    mask = out["response_mask"].bool()
    assert torch.allclose(out["rollout_log_probs"][mask], expected[mask], atol=1e-4)
    # greedy: each response token is the argmax of the teacher-forced logits
    prompt_len = out["prompts"].shape[1]
    with torch.no_grad():
        logits = engine.model(
            input_ids=out["input_ids"],
            attention_mask=out["attention_mask"],
            position_ids=out["position_ids"],
        ).logits
    argmax = logits[:, prompt_len - 1 : -1].argmax(-1)
    assert torch.equal(argmax[mask], out["responses"][mask])


def test_sampled_log_probs_are_the_untruncated_tempered_distribution(engine, prompts):
    """With top-k/top-p the recorded log-prob is still log_softmax(logits / T) (what the trainer
    computes), not the renormalised truncated distribution."""
    temperature = 0.7
    out = engine.generate(
        prompts,
        SamplingParams(n=2, max_new_tokens=6, temperature=temperature, top_k=20, top_p=0.9, seed=5),
    )
    expected = teacher_forced_log_probs(engine.model, out, temperature)
    mask = out["response_mask"].bool()
    assert torch.allclose(out["rollout_log_probs"][mask], expected[mask], atol=1e-4)


def test_same_seed_same_samples_other_seed_other_samples(engine, prompts):
    params = dict(n=2, max_new_tokens=8, temperature=1.0)
    first = engine.generate(prompts, SamplingParams(seed=11, **params))
    second = engine.generate(prompts, SamplingParams(seed=11, **params))
    other = engine.generate(prompts, SamplingParams(seed=12, **params))
    assert torch.equal(first["responses"], second["responses"])
    assert torch.equal(first["rollout_log_probs"], second["rollout_log_probs"])
    assert not torch.equal(first["responses"], other["responses"])


def test_top_k_one_equals_greedy(engine, prompts):
    greedy = engine.generate(prompts, SamplingParams(max_new_tokens=8, greedy=True))
    top1 = engine.generate(prompts, SamplingParams(max_new_tokens=8, top_k=1, seed=9))
    assert torch.equal(greedy["responses"], top1["responses"])
    assert torch.allclose(greedy["rollout_log_probs"], top1["rollout_log_probs"], atol=1e-6)


def test_left_padding_and_micro_batches_do_not_change_greedy_output(tiny_dirs, engine, prompts):
    batched = engine.generate(prompts, SamplingParams(max_new_tokens=8, greedy=True))
    alone = engine.generate(
        Batch({"input_ids": prompts["input_ids"][1:2, -2:], "attention_mask": torch.ones(1, 2)}),
        SamplingParams(max_new_tokens=8, greedy=True),
    )
    assert prompts["attention_mask"][1].sum() == 2  # "Hi" is two tokens
    assert torch.equal(alone["responses"][0], batched["responses"][1])
    assert torch.allclose(alone["rollout_log_probs"][0], batched["rollout_log_probs"][1], atol=1e-4)
    one_row_chunks = make_engine(tiny_dirs[0], micro_batch_size=1)
    chunked = one_row_chunks.generate(prompts, SamplingParams(max_new_tokens=8, greedy=True))
    assert torch.equal(chunked["responses"], batched["responses"])


def test_update_weights_makes_the_engine_equal_to_a_model_of_those_weights(tiny_dirs, prompts):
    from safetensors.torch import load_file

    engine = make_engine(tiny_dirs[0])
    reference = make_engine(tiny_dirs[1])
    params = SamplingParams(n=2, max_new_tokens=8, seed=4)
    before = engine.generate(prompts, params)
    target = reference.generate(prompts, params)
    assert not torch.equal(before["responses"], target["responses"])

    other_weights = load_file(f"{tiny_dirs[1]}/model.safetensors")
    assert "lm_head.weight" not in other_weights  # tied: saved once as the embedding
    # Streamed in bf16 (as a bf16 trainer sends them): cast to the engine's float32 on arrival.
    engine.update_weights((name, t.to(torch.bfloat16)) for name, t in other_weights.items())
    assert engine.model.model.norm.weight.dtype == torch.float32
    rounded = engine.generate(prompts, params)
    assert not torch.equal(rounded["responses"], before["responses"])
    assert torch.allclose(rounded["rollout_log_probs"], target["rollout_log_probs"], atol=0.05)
    # The exact weights: the engine now samples exactly what a model built from them samples.
    engine.update_weights(other_weights.items())
    exact = engine.generate(prompts, params)
    assert torch.equal(exact["responses"], target["responses"])
    assert torch.allclose(exact["rollout_log_probs"], target["rollout_log_probs"], atol=1e-5)


def test_update_weights_through_the_tied_lm_head_name(tiny_dirs):
    engine = make_engine(tiny_dirs[0])
    embedding = engine.model.get_input_embeddings().weight
    new = torch.randn_like(embedding)
    engine.update_weights([("lm_head.weight", new)])
    assert torch.equal(embedding, new)
    assert torch.equal(engine.model.get_output_embeddings().weight, new)


def test_update_weights_rejects_unknown_names_and_wrong_shapes(engine):
    with pytest.raises(ConfigError, match=r"no tensor named 'model\.nope'.*model\.embed_tokens"):
        engine.update_weights([("model.nope", torch.zeros(1))])
    with pytest.raises(ConfigError, match=r"shape \(3, 3\) from the trainer"):
        engine.update_weights([("model.norm.weight", torch.zeros(3, 3))])


def test_invalid_sampling_parameters_and_dtype_are_clear_errors(tiny_dirs, engine, prompts):
    with pytest.raises(ConfigError, match=r"top_p=0\.0"):
        engine.generate(prompts, SamplingParams(top_p=0.0))
    with pytest.raises(ConfigError, match="n=0"):
        engine.generate(prompts, SamplingParams(n=0))
    with pytest.raises(ConfigError, match=r"rollout\.dtype='float8'"):
        make_engine(tiny_dirs[0], dtype="float8")


def test_bf16_engine_samples(tiny_dirs, prompts):
    engine = make_engine(tiny_dirs[0], dtype="bfloat16")
    assert engine.model.dtype == torch.bfloat16
    out = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=4, seed=0))
    assert out["rollout_log_probs"].dtype == torch.float32
    assert torch.isfinite(out["rollout_log_probs"]).all()


class TestHFRolloutConformance(RolloutEngineConformance):
    plugin_name = "hf"
    vocab_size = 448

    def make_engine(self, tmp_path):
        return make_engine(build_tiny_model(str(tmp_path / "tiny")))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_engine_matches_the_cpu_engine(tiny_dirs, engine, prompts):
    cuda_engine = hf_engine(tiny_dirs[0], {"dtype": "float32", "micro_batch_size": 64}, "cuda")
    params = SamplingParams(n=2, max_new_tokens=8, greedy=True)
    on_gpu, on_cpu = cuda_engine.generate(prompts, params), engine.generate(prompts, params)
    assert on_gpu["responses"].device.type == "cpu"  # results come back on the host
    assert torch.equal(on_gpu["responses"], on_cpu["responses"])
    assert torch.allclose(on_gpu["rollout_log_probs"], on_cpu["rollout_log_probs"], atol=1e-3)
    sampled = cuda_engine.generate(prompts, SamplingParams(n=2, max_new_tokens=8, seed=1))
    again = cuda_engine.generate(prompts, SamplingParams(n=2, max_new_tokens=8, seed=1))
    assert torch.equal(sampled["responses"], again["responses"])
    cuda_engine.update_weights(engine.model.state_dict().items())  # CPU tensors into a GPU model
    cuda_engine.close()


def test_reads_the_real_rollout_config_node(tiny_dirs, prompts):
    from omegaconf import OmegaConf

    from polyrl.config.schema import RolloutConfig

    node = OmegaConf.structured(RolloutConfig)
    node.micro_batch_size = 2
    ctx = RolloutContext(
        model_path=tiny_dirs[0],
        config=node,
        device="cpu",
        rank=0,
        world_size=1,
        pad_token_id=PAD_TOKEN_ID,
        eos_token_ids=[],  # empty: the engine falls back to the model's own EOS id
    )
    engine = HFRolloutEngine(ctx)
    assert engine.dtype == torch.bfloat16  # the schema's default
    assert engine.micro_batch_size == 2
    assert engine.eos_token_ids == [EOS_TOKEN_ID]
    out = engine.generate(prompts, SamplingParams(n=3, max_new_tokens=3, seed=0))
    assert out["responses"].shape == (9, 3)
