"""Cheap checks of a model's files on the driver, before Ray starts.

Why: a model folder is the user's, and a broken file in it is the user's to fix. Left to
transformers, a ``config.json`` that is not JSON is a traceback on the driver, a corrupt
``model.safetensors`` a traceback from every worker after Ray has started, and a file that is not
GGUF a ``struct.error``. Reading the JSON files and the safetensors and GGUF headers costs
milliseconds and turns each into one line naming the file and what is wrong with it. Only the
structure is checked (it parses, the offsets fit the file); the tensors are not read.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from polyrl.errors import ConfigError

#: A safetensors header is a few MB even for the largest models; more means a corrupt length.
MAX_SAFETENSORS_HEADER = 100 << 20
GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (1, 2, 3)


def check_model_folder(folder: str | os.PathLike[str]) -> None:
    """Raise a one-line :class:`ConfigError` naming the first file of ``folder`` that cannot be
    what it claims to be: a top-level ``*.json`` that does not parse (``config.json`` must hold
    an object), a ``*.safetensors`` whose header does not parse or whose tensors do not fit
    the file (truncated, or not safetensors at all)."""
    root = Path(folder)
    for path in sorted(root.glob("*.json")):
        _check_json(path, must_be_object=path.name == "config.json")
    for path in sorted(root.glob("*.safetensors")):
        problem = safetensors_problem(path)
        if problem:
            raise ConfigError(
                f"{path} is not a readable safetensors file ({problem}); the model folder is "
                "damaged: copy it again, or save the model again with save_pretrained"
            )


def _check_json(path: Path, *, must_be_object: bool) -> None:
    try:
        value = json.loads(path.read_bytes())
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise ConfigError(
            f"{path} is not valid JSON ({exc}); fix the file, or copy the model folder again"
        ) from None
    if must_be_object and not isinstance(value, dict):
        raise ConfigError(
            f"{path} holds a JSON {type(value).__name__}, not an object of model settings; "
            "point actor_rollout_ref.model.path at a folder save_pretrained wrote"
        )


def safetensors_problem(path: str | os.PathLike[str]) -> str | None:
    """What is wrong with the safetensors file ``path``'s structure, or None. The format: an
    8-byte little-endian header length, a JSON header mapping each tensor to its dtype, shape
    and ``data_offsets`` (from the end of the header), then the data, which the tensors cover
    exactly."""
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            return f"{size} bytes, shorter than the header length"
        (length,) = struct.unpack("<Q", head)
        if length > min(size - 8, MAX_SAFETENSORS_HEADER):
            return f"a header length of {length} bytes in a file of {size}"
        raw = fh.read(length)
    try:
        header = json.loads(raw)
    except ValueError:
        return "its header is not JSON"
    if not isinstance(header, dict):
        return "its header is not a JSON object"
    data = size - 8 - length
    end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and isinstance(offsets[1], int)):
            return f"tensor {name!r} has no data_offsets"
        end = max(end, offsets[1])
    if end != data:
        return f"its tensors need {end} bytes of data, the file holds {data}: truncated?"
    return None


def check_gguf_file(path: str) -> None:
    """Raise a one-line :class:`ConfigError` unless ``path`` starts as a GGUF file does: the
    magic ``GGUF``, a known version, tensor and metadata counts."""
    with open(path, "rb") as fh:
        head = fh.read(24)
    if head[:4] != GGUF_MAGIC:
        raise ConfigError(
            f"{path} is not a GGUF file (it does not start with the bytes 'GGUF'); pass a .gguf "
            "file (e.g. from llama.cpp's convert script) or a Hugging Face folder"
        )
    if len(head) < 24:
        raise ConfigError(f"{path} is a truncated GGUF file ({len(head)} bytes); copy it again")
    (version,) = struct.unpack_from("<I", head, 4)
    if version not in GGUF_VERSIONS:
        raise ConfigError(
            f"{path} is GGUF version {version}, which transformers does not read (it reads "
            f"{', '.join(map(str, GGUF_VERSIONS))}); is the file damaged?"
        )
