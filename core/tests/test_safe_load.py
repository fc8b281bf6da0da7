"""Checkpoint files are loaded without running code from them: a tampered ``.metadata`` or extra
state file is refused with a line naming it, and the payload never runs."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from polyrl.safe_load import SafeFileSystemReader, UnsafeCheckpointError, load_plain


class Payload:
    """Unpickling this creates a file: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.fixture
def process_group():
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def checkpoint(tmp_path: Path, process_group) -> Path:
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp_path / "ckpt"))
    return tmp_path / "ckpt"


def test_a_real_dcp_checkpoint_loads_through_the_safe_reader(checkpoint: Path) -> None:
    model = torch.nn.Linear(4, 3)
    with torch.no_grad():
        model.weight.zero_()
    state = {"model": model.state_dict()}
    dcp.load(state, storage_reader=SafeFileSystemReader(str(checkpoint)))
    assert state["model"]["weight"].abs().sum() > 0
    metadata = SafeFileSystemReader(str(checkpoint)).read_metadata()
    assert any(key.startswith("optim.") for key in metadata.state_dict_metadata)


def test_a_tampered_metadata_file_is_refused_and_its_payload_never_runs(
    checkpoint: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    (checkpoint / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(
        UnsafeCheckpointError, match=r"refusing to load .*\.metadata: it references"
    ):
        SafeFileSystemReader(str(checkpoint)).read_metadata()
    assert not marker.exists()


def test_extra_state_with_objects_is_refused_and_plain_state_loads(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    bad = tmp_path / "extra_state_rank_0.pt"
    torch.save({"rng": Payload(marker)}, bad)
    with pytest.raises(UnsafeCheckpointError, match="holds objects other than tensors"):
        load_plain(str(bad))
    assert not marker.exists()
    good = tmp_path / "good.pt"
    torch.save({"step": 3, "rng": [torch.arange(3), (1, 2.0, None)], "lr": [1e-3]}, good)
    assert load_plain(str(good))["step"] == 3
    assert not os.path.exists(marker)


def test_a_payload_in_a_dcp_state_entry_is_refused_and_never_runs(
    tmp_path: Path, process_group
) -> None:
    """DCP stores the state dict's non-tensor values (an optimizer's lr, a step counter) as
    pickled bytes and its default planner loads them with ``weights_only=False``."""
    marker = tmp_path / "pwned"
    target = tmp_path / "ckpt"
    dcp.save({"w": torch.ones(2), "note": Payload(marker)}, checkpoint_id=str(target))
    state = {"w": torch.zeros(2), "note": None}
    with pytest.raises(UnsafeCheckpointError, match=r"refusing to load .*ckpt \(entry note\)"):
        SafeFileSystemReader(str(target)).load(state)
    assert not marker.exists()
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(target)))  # DCP's own reader
    assert marker.exists(), "without polyrl's reader the payload runs (else this test is void)"
    marker.unlink()
    dcp.save({"w": torch.ones(2), "note": ("lr", 0.5, (0.9, 0.99))}, checkpoint_id=str(target))
    SafeFileSystemReader(str(target)).load(state)
    assert state["note"] == ("lr", 0.5, (0.9, 0.99)) and state["w"].sum() == 2


def test_an_allowed_class_is_rebuilt_and_any_other_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "state.pt"
    torch.save({"scaler": Scaler(4.0)}, path)
    with pytest.raises(UnsafeCheckpointError, match="Scaler"):
        load_plain(str(path))
    assert load_plain(str(path), [Scaler])["scaler"].scale == 4.0
    torch.save({"scaler": Scaler(4.0), "x": Payload(marker)}, path)
    with pytest.raises(UnsafeCheckpointError, match="holds objects other than tensors"):
        load_plain(str(path), [Scaler])
    assert not marker.exists()


class Scaler:
    """A format's plain data class (as DeepSpeed's loss scaler is)."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
