"""The tiny model: deterministic files, consistent tokenizer and config, a working chat template."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from polyrl.models.tiny import EOS_TOKEN_ID, IM_START_ID, PAD_TOKEN_ID, build_tiny_model

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny")), seed=0)


def _files(folder: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir())}


def test_same_seed_gives_identical_files_and_other_seed_other_weights(tiny, tmp_path):
    rng_before = torch.get_rng_state()
    again = build_tiny_model(str(tmp_path / "again"), seed=0)
    assert torch.equal(torch.get_rng_state(), rng_before), "must not touch the global RNG"
    assert _files(again) == _files(tiny)
    other = _files(build_tiny_model(str(tmp_path / "other"), seed=1))
    assert other["model.safetensors"] != _files(tiny)["model.safetensors"]
    assert other["tokenizer.json"] == _files(tiny)["tokenizer.json"]


def test_build_is_fast(tmp_path):
    build_tiny_model(str(tmp_path / "warm"))  # imports paid once
    start = time.perf_counter()
    build_tiny_model(str(tmp_path / "timed"), seed=3)
    assert time.perf_counter() - start < 5.0


def test_config_shape_and_token_ids(tiny):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    config = json.loads(Path(tiny, "config.json").read_text())
    assert config["model_type"] == "qwen2"
    assert (config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]) == (
        128,
        2,
        256,
    )
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (
        2,
        2,
        64,
    )
    assert config["tie_word_embeddings"] is True
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    assert 384 <= len(tokenizer) <= 512
    assert config["vocab_size"] == len(tokenizer)
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.pad_token_id == PAD_TOKEN_ID
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == EOS_TOKEN_ID
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") == IM_START_ID
    assert (config["eos_token_id"], config["pad_token_id"]) == (EOS_TOKEN_ID, PAD_TOKEN_ID)
    generation = GenerationConfig.from_pretrained(tiny)
    assert (generation.eos_token_id, generation.pad_token_id) == (EOS_TOKEN_ID, PAD_TOKEN_ID)
    model = AutoModelForCausalLM.from_pretrained(tiny)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    params = sum(p.numel() for p in model.parameters())
    # embeddings V*128 + 2 layers of (q/k/v/o 4*128*128 + q/k/v biases 3*128
    # + MLP 3*128*256 + two norms 2*128) + the final norm 128
    per_layer = 4 * 128 * 128 + 3 * 128 + 3 * 128 * 256 + 2 * 128
    assert params == len(tokenizer) * 128 + 2 * per_layer + 128


def test_chat_template_and_round_trip(tiny):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    messages = [{"role": "user", "content": "What is 12 + 7?"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nWhat is 12 + 7?<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert ids[0] == IM_START_ID and EOS_TOKEN_ID in ids
    assert tokenizer.decode(ids) == text
    sample = "Hello, World! The answer is 1234.\n#### 42 ~`{}|"
    assert tokenizer.decode(tokenizer(sample)["input_ids"]) == sample
    # AutoTokenizer (a Qwen2Tokenizer here) and the raw tokenizer file split text identically
    raw = Tokenizer.from_file(str(Path(tiny, "tokenizer.json")))
    assert raw.encode(sample).ids == tokenizer(sample)["input_ids"]
    # digits one by one, as in Qwen2, so numbers tokenise uniformly
    assert tokenizer.tokenize("1234") == ["1", "2", "3", "4"]
