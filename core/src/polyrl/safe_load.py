"""Loading checkpoint files without running code from them.

A pickle can call any function on load, so a checkpoint folder someone else wrote (or tampered
with) must not be unpickled freely; checksums do not help, whoever can edit a file can rewrite its
checksum. Engines load their tensors and extra state with ``torch.load(weights_only=True)``
(:func:`load_plain`: tensors, numbers, strings, lists, dicts, plus the few classes a format needs
when the caller names them) and read torch.distributed.checkpoint folders through
:class:`SafeFileSystemReader`. DCP unpickles two things freely itself: the ``.metadata`` file
(plain ``pickle.load``), which the reader reads with an unpickler that admits only the classes
DCP's metadata is made of, and the non-tensor entries of the state dict (``torch.load`` with
``weights_only=False`` in its load planner), whose bytes the reader first loads tensor-only.
Anything else is refused with a one-line error naming the file.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Iterable
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


class _TensorOnlyBytes:
    """A DCP load planner whose ``load_bytes`` receives only bytes that unpickle tensor-only.

    The planner's own ``load_bytes`` (which puts the value in its place in the state dict) runs
    ``torch.load(weights_only=False)``; it gets the bytes after they loaded with
    ``weights_only=True``, so the full unpickler replays calls the restricted one admitted.
    """

    def __init__(self, planner: Any, path: str) -> None:
        self._planner = planner
        self._path = path

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        data = value.read()
        where = f"{self._path} (entry {read_item.dest_index.fqn})"
        _load_tensor_only(io.BytesIO(data), where, ())
        self._planner.load_bytes(read_item, io.BytesIO(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._planner, name)


class SafeFileSystemReader(FileSystemReader):
    """torch.distributed.checkpoint's reader with a restricted unpickler for ``.metadata`` and
    tensor-only loading of the state dict's non-tensor entries."""

    def read_data(self, plan: Any, planner: Any) -> Any:
        return super().read_data(plan, _TensorOnlyBytes(planner, os.fspath(self.path)))

    def load(self, state_dict: dict[str, Any]) -> None:
        """``torch.distributed.checkpoint.load`` of ``state_dict`` (in place) through this
        reader; a refused file is raised as the one-line :class:`UnsafeCheckpointError`, not
        inside DCP's exception that collects each rank's traceback."""
        from torch.distributed.checkpoint import load
        from torch.distributed.checkpoint.api import CheckpointException

        try:
            load(state_dict, storage_reader=self)
        except CheckpointException as exc:
            for failure, _trace in exc.failures.values():
                if isinstance(failure, UnsafeCheckpointError):
                    raise failure from None
            raise

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = _MetadataUnpickler(stream, str(path)).load()
        if getattr(metadata, "storage_meta", None) is None:
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _load_tensor_only(source: Any, name: str, allowed: Iterable[Any]) -> Any:
    try:
        with torch.serialization.safe_globals(list(allowed)):
            return torch.load(source, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpointError(
            f"refusing to load {name}: it holds objects other than tensors and plain data "
            f"({_what_was_refused(exc)}); polyrl does not run code from checkpoints"
        ) from exc


def _what_was_refused(exc: pickle.UnpicklingError) -> str:
    """The line of torch's long message that names what the file holds."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in lines:
        if "Unsupported" in line:
            return line.split(". Please use")[0].removeprefix("WeightsUnpickler error: ")
    return lines[0] if lines else type(exc).__name__


def load_plain(path: str, allowed: Iterable[Any] = ()) -> Any:
    """``torch.load`` of a file that must hold only tensors and plain Python data, and instances
    of the classes in ``allowed`` (a format's own data classes, e.g. DeepSpeed's loss scaler):
    an allowed class is rebuilt from its saved attributes, nothing else is called."""
    return _load_tensor_only(path, path, allowed)
