"""Convert a GGUF file into a bf16 safetensors Hugging Face folder.

Why: transformers can read GGUF (``gguf_file=``), but it dequantises every tensor on each load,
which is slow (tens of seconds for 135M parameters on 2 cores), and neither the FSDP engine nor vLLM
should each re-do it. Converting once gives a plain folder that every component loads in ~1 s.

Reading GGUF needs the ``gguf`` and ``accelerate`` packages, an extra of polyrl
(``pip install 'polyrl[gguf]'``); only :func:`convert_gguf` needs them.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

_SAMPLE_BYTES = 1 << 20


def gguf_fingerprint(path: str) -> str:
    """A short content key for a GGUF file, cheap even for multi-GB files: the size plus the
    hashes of its first and last MiB and of 16 evenly spaced 64 KiB slices. Different models or
    quantisations change the header (first MiB) and the tensor data, so they get different keys."""
    size = os.path.getsize(path)
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as handle:
        digest.update(handle.read(_SAMPLE_BYTES))
        for i in range(16):
            handle.seek(size * i // 16)
            digest.update(handle.read(1 << 16))
        handle.seek(max(0, size - _SAMPLE_BYTES))
        digest.update(handle.read(_SAMPLE_BYTES))
    return digest.hexdigest()[:16]


def estimated_seconds(path: str) -> int:
    """A rough conversion time on a small CPU machine (about a tenth of a second per MB of a Q4
    file on 2 shared cores), shown to the user so that the wait is expected."""
    return max(5, int(os.path.getsize(path) / 1e6 * 0.1))


def convert_gguf(gguf_path: str, out_dir: str, *, dtype: str = "bfloat16") -> None:
    """Write the model and tokenizer of ``gguf_path`` into ``out_dir`` as safetensors (``dtype``).

    The GGUF-loaded model carries a GGUF quantisation record that ``save_pretrained`` refuses to
    serialise, although its tensors are already dequantised; the tensors are therefore moved into a
    plain model built from the same config without that record.
    """
    from polyrl.errors import ConfigError
    from polyrl.models.resolve import GGUF_MODULES
    from polyrl.preflight import require_extra

    require_extra(f"converting {gguf_path} (a GGUF file)", GGUF_MODULES, ConfigError)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    torch_dtype = getattr(torch, dtype)
    folder, name = os.path.split(os.path.abspath(gguf_path))
    started = time.monotonic()
    # transformers' per-tensor progress bars, for a step polyrl announces and times itself
    bars = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        with _parsed_once():
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            # dequantised in float32 (what GGUF's kernels compute in), cast once below
            loaded = AutoModelForCausalLM.from_pretrained(
                folder, gguf_file=name, dtype=torch.float32
            )
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config._name_or_path = ""
        state = {key: tensor.to(torch_dtype) for key, tensor in loaded.state_dict().items()}
        generation_config = loaded.generation_config
        del loaded
        _save_plain(gguf_path, config, state, generation_config, tokenizer, out_dir, torch_dtype)
    finally:
        if bars:
            transformers_logging.enable_progress_bar()
    print(
        f"polyrl: converted {gguf_path} in {time.monotonic() - started:.0f}s",
        file=sys.stderr,
        flush=True,
    )


@contextlib.contextmanager
def _parsed_once() -> Iterator[None]:
    """Within the block, each GGUF file is parsed once and each tensor-name map built once.

    Why: transformers reads the file's header anew for the tokenizer, the config and the model
    (three full parses of a vocabulary of tens of thousands of strings), and while mapping the
    tensor names it rebuilds gguf's name map for every submodule of the model (hundreds of
    times, the same map). Both are pure functions of their arguments, looked up on the ``gguf``
    module at each call, so caching them for the conversion leaves every result unchanged and
    takes most of the conversion's time away.
    """
    import gguf

    saved = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader = functools.cache(saved[0])
    gguf.get_tensor_name_map = functools.cache(saved[1])
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = saved


def _save_plain(
    gguf_path: str,
    config: Any,
    state: dict[str, Any],
    generation_config: Any,
    tokenizer: Any,
    out_dir: str,
    torch_dtype: Any,
) -> None:
    """``state`` into a model built from ``config`` (without the GGUF record), saved whole."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    # With tied embeddings lm_head.weight is the embedding: its absence from the state is expected.
    still_meta = [n for n, p in model.named_parameters() if p.is_meta]
    if still_meta or unexpected:
        raise RuntimeError(
            f"GGUF conversion of {gguf_path}: parameters without weights {still_meta[:5]}, "
            f"unexpected tensors {unexpected[:5]} (missing reported: {missing[:5]})"
        )
    model.generation_config = generation_config
    from polyrl.models.saving import save_hf_model

    save_hf_model(model, out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
