"""Loading checkpoint files without running code from them.

A pickle can call any function on load, so a checkpoint folder someone else wrote (or tampered
with) must not be unpickled freely. Engines load their tensors and extra state with
``torch.load(weights_only=True)`` (:func:`load_plain`: tensors, numbers, strings, lists, dicts)
and read torch.distributed.checkpoint's ``.metadata`` -- which torch itself unpickles with plain
``pickle.load`` -- through :class:`SafeFileSystemReader`, whose unpickler admits only the classes
DCP's metadata is made of. Anything else is refused with a one-line error naming the file.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader

from polyrl.errors import PolyrlError

# (module, name) pairs a DCP metadata pickle may reference besides DCP's own classes.
_ALLOWED_GLOBALS = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "slice"),
}
_DCP_MODULE = "torch.distributed.checkpoint."


class UnsafeCheckpointError(PolyrlError):
    """A checkpoint file holds something other than data (it could run code when loaded)."""


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BufferedIOBase, path: str) -> None:
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if module.startswith(_DCP_MODULE) and not name.startswith("__"):
            obj = super().find_class(module, name)
            if isinstance(obj, type):
                return obj
        elif module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        elif (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise UnsafeCheckpointError(
            f"refusing to load {self.path}: it references {module}.{name}, which a checkpoint's "
            f"metadata never contains (the file may have been tampered with; polyrl does not "
            f"run code from checkpoints)"
        )


class SafeFileSystemReader(FileSystemReader):
    """torch.distributed.checkpoint's reader with a restricted unpickler for ``.metadata``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = _MetadataUnpickler(stream, str(path)).load()
        if getattr(metadata, "storage_meta", None) is None:
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def load_plain(path: str) -> Any:
    """``torch.load`` of a file that must hold only tensors and plain Python data."""
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnsafeCheckpointError(
            f"refusing to load {path}: it holds objects other than tensors and plain data "
            f"({first}); polyrl does not run code from checkpoints"
        ) from exc
