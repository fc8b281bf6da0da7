"""A checkpoint whose ``COMPLETE`` marker cannot be read is not complete: resume takes the newest
complete one before it (with one line saying why) instead of resuming it unchecked."""

from __future__ import annotations

import logging
import os

import pytest

from polyrl.checkpoint import MARKER_FILE, CheckpointManager, is_complete, verify_checkpoint
from polyrl.errors import ConfigError


def _commit(manager: CheckpointManager, step: int) -> str:
    staging = manager.staging_dir(step)
    with open(os.path.join(staging, "weights.bin"), "wb") as fh:
        fh.write(bytes([step]) * 16)
    return manager.commit(step, staging)


@pytest.mark.parametrize("damage", [b"\x00\xff garbage", b'{"step": 2, "sha256"', b"[1, 2]"])
def test_an_unreadable_marker_is_not_complete_and_the_previous_checkpoint_is_resumed(
    tmp_path, caplog: pytest.LogCaptureFixture, damage: bytes
) -> None:
    root = str(tmp_path / "ckpt")
    manager = CheckpointManager(root)
    first = _commit(manager, 1)
    second = _commit(manager, 2)
    with open(os.path.join(second, "weights.bin"), "wb") as fh:
        fh.write(b"corrupt")  # the damage the marker's checksums would have caught
    with open(os.path.join(second, MARKER_FILE), "wb") as fh:
        fh.write(damage)
    assert not is_complete(second) and is_complete(first)
    with caplog.at_level(logging.WARNING, logger="polyrl.checkpoint"):
        resumed = CheckpointManager(root).resolve_resume({"resume_mode": "auto"})
        CheckpointManager(root).latest()  # asked again: still one line
    assert resumed == first and verify_checkpoint(first) is None
    lines = [r.getMessage() for r in caplog.records if MARKER_FILE in r.getMessage()]
    assert lines == [
        f"{second}: its {MARKER_FILE} marker is unreadable, so it is not a complete checkpoint; "
        f"the newest complete one before it is used"
    ]
    with pytest.raises(ConfigError, match="no readable COMPLETE marker"):
        CheckpointManager(root).resolve_resume(
            {"resume_mode": "resume_path", "resume_from_path": second}
        )
