"""Named shapes and random-weight models: the config follows the shape, the tokenizer's ids
reach the config, the same seed gives the same weights, bad names fail clearly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from polyrl.errors import ConfigError
from polyrl.models.shapes import QWEN2_05B, QWEN2_TINY, build_random_model, random_model_config
from polyrl.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID

torch.set_num_threads(1)


def test_config_follows_shape_and_overrides():
    config = random_model_config("qwen2-0.5b")
    for key, value in QWEN2_05B.items():
        if key != "rope_theta":  # transformers keeps it under rope_parameters
            assert getattr(config, key) == value, key
    assert config.rope_parameters["rope_theta"] == 1000000.0
    small = random_model_config("tiny", vocab_size=300, max_position_embeddings=256)
    assert (small.vocab_size, small.max_position_embeddings) == (300, 256)
    assert small.hidden_size == QWEN2_TINY["hidden_size"] == 128


def test_unknown_shape_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="unknown model shape 'qwen9'"):
        random_model_config("qwen9")
    with pytest.raises(ConfigError, match="unknown model shape"):
        build_random_model(str(tmp_path / "m"), "qwen9")


def test_tiny_shape_with_tiny_tokenizer_is_deterministic(tmp_path):
    rng_before = torch.get_rng_state()
    first = build_random_model(str(tmp_path / "a"), "tiny", dtype="float32", seed=3)
    assert torch.equal(torch.get_rng_state(), rng_before), "must not touch the global RNG"
    again = build_random_model(str(tmp_path / "b"), "tiny", dtype="float32", seed=3)
    weights = Path(first, "model.safetensors").read_bytes()
    assert weights == Path(again, "model.safetensors").read_bytes()
    config = json.loads(Path(first, "config.json").read_text())
    assert config["vocab_size"] == 512 and config["num_hidden_layers"] == 2
    assert (config["eos_token_id"], config["pad_token_id"]) == (EOS_TOKEN_ID, PAD_TOKEN_ID)
    assert Path(first, "tokenizer.json").is_file()
    record = json.loads(Path(first, "polyrl_random.json").read_text())
    # tied embeddings 512x128 + 2 layers of (attention 4 x 128x128 + biases 3 x 128 + MLP
    # 3 x 128x256 + 2 norms of 128) + final norm 128
    per_layer = 4 * 128 * 128 + 3 * 128 + 3 * 128 * 256 + 2 * 128
    assert record["parameters"] == 512 * 128 + 2 * per_layer + 128


def test_weights_only_model_has_no_tokenizer(tmp_path):
    out = build_random_model(str(tmp_path / "w"), "tiny", tokenizer_from=None, dtype="bfloat16")
    config = json.loads(Path(out, "config.json").read_text())
    assert config["pad_token_id"] is None and config["dtype"] == "bfloat16"
    assert not Path(out, "tokenizer.json").exists()
