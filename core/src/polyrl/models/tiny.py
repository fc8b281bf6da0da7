"""A tiny randomly initialised Qwen2 with an offline tokenizer, for tests and ``recipe=tiny``.

Why: tests and CI need a real transformers model (real attention, KV cache, chat template,
save/load) that runs in milliseconds on 2 CPU cores and needs no download. Everything is built
in-process: the byte-level BPE tokenizer is trained with ``tokenizers`` on a small fixed corpus,
and the weights come from transformers' own initialisation under a fixed seed, so the folder is
the same on every machine and every run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# Special tokens first, so that their ids are fixed: 0, 1, 2.
PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
PAD_TOKEN_ID, IM_START_ID, EOS_TOKEN_ID = 0, 1, 2

TOKENIZER_VOCAB_SIZE = 448

# Qwen2's pre-tokenisation pattern (public in every Qwen2 tokenizer.json).
_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# ChatML, as Qwen2 and SmolLM2 use it; a system message is optional.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_WORDS = (
    "the be to of and a in that have it for not on with he as you do at this but his by from "
    "they we say her she or an will my one all would there their what so up out if about who "
    "get which go me when make can like time no just him know take people into year your good "
    "some could them see other than then now look only come its over think also back after "
    "use two how our work first well way even new want because any these give day most us is "
    "are was were been has had answer question solve compute sum add plus minus times divided "
    "equals number total result what is the value of first second third step therefore so "
    "final reasoning think count each more less user assistant system please explain why yes "
    "no true false correct wrong"
)


def _corpus() -> list[str]:
    """A small fixed corpus: characters, digits, arithmetic and common English words."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    lines = [
        letters,
        letters.upper(),
        "0123456789",
        "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
        _WORDS,
        _WORDS.capitalize() + ".",
    ]
    # Arithmetic in the forms that synthetic verifiable tasks use ("12 + 7 = 19", "#### 19").
    for a in range(0, 30):
        b = (a * 7 + 3) % 20
        lines.append(f"What is {a} + {b}? {a} + {b} = {a + b}. #### {a + b}")
        lines.append(f"{a} * {b} = {a * b}, {a} - {b} = {a - b}. The answer is {a * b}.")
    for word in _WORDS.split():
        lines.append(f"{word} {word.capitalize()} {word}.")
    return lines


def _build_tokenizer(out_dir: Path) -> int:
    """Train the byte-level BPE tokenizer, save it as a fast tokenizer; return its vocab size."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    # The same normaliser and pre-tokenisation as transformers' Qwen2Tokenizer, which AutoTokenizer
    # picks for a qwen2 config: so every loader (AutoTokenizer, the raw tokenizers file, vLLM)
    # splits text identically. Digits are split one by one, as in Qwen2.
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    for token_id, token in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(token) != token_id:
            raise RuntimeError(f"tiny tokenizer: {token} got id {tok.token_to_id(token)}")

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        eos_token=IM_END,
        unk_token=None,
        bos_token=None,
        additional_special_tokens=[IM_START],
        model_max_length=4096,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))
    return tok.get_vocab_size()


def tiny_config(vocab_size: int):  # -> transformers.Qwen2Config
    """The ``tiny`` shape of :mod:`polyrl.models.shapes` with this tokenizer's vocabulary and
    special-token ids."""
    from polyrl.models.shapes import random_model_config

    return random_model_config(
        "tiny",
        vocab_size=vocab_size,
        bos_token_id=None,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=PAD_TOKEN_ID,
        initializer_range=0.02,
    )


def build_tiny_model(out_dir: str, *, seed: int = 0) -> str:
    """Write the tiny model (float32 safetensors), tokenizer and generation config into ``out_dir``.

    Deterministic: the same ``seed`` gives the same files. Returns ``out_dir``. Leaves the global
    torch RNG untouched. Takes well under a second on one CPU core.
    """
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab_size = _build_tokenizer(out)

    config = tiny_config(vocab_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=EOS_TOKEN_ID, pad_token_id=PAD_TOKEN_ID, do_sample=True
    )
    from polyrl.models.saving import save_hf_model

    save_hf_model(model, str(out), safe_serialization=True)
    # Record how the folder was made (useful when a cached copy is inspected).
    (out / "polyrl_tiny.json").write_text(json.dumps({"seed": seed, "vocab_size": vocab_size}))
    return os.fspath(out)
