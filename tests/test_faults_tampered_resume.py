"""A refused tampered checkpoint is one line (issue 30.7), from the real ``polyrl train``: a run's
checkpoint gets a pickled payload in its extra state, the checksum manifest rewritten to match
(anyone who can write the folder can), and the same command resumes: it stops with one
``error:`` line naming the file, exit 2, no traceback, the payload never runs, and the worker's
whole traceback is in the log the line points to."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import torch

from polyrl.api.testing import IN_PROCESS_OVERRIDES, run_polyrl_here
from polyrl.checkpoint import MARKER_FILE, file_checksums

TRAIN = ["train", "recipe=tiny", *IN_PROCESS_OVERRIDES,
         "trainer.test_freq=-1",
         "trainer.val_before_train=false", "trainer.save_freq=1"]  # fmt: skip


class Payload:
    """Unpickling this creates ``marker``: proof that code from the checkpoint ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


def train(out: Path, *overrides: str) -> subprocess.CompletedProcess:
    """``polyrl train`` with one worker, in this test process (``run_polyrl_here``)."""
    return run_polyrl_here(*TRAIN, f"trainer.default_local_dir={out}", *overrides)


def test_a_tampered_checkpoint_is_refused_in_one_line_with_the_details_logged(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    first = train(out, "trainer.total_training_steps=1")
    assert first.returncode == 0, first.stderr[-3000:]
    step = out / "global_step_1"
    extra = step / "actor" / "extra_state_rank_0.pt"
    marker = tmp_path / "payload_ran"
    state = torch.load(extra, weights_only=False)  # the test's own file
    state["polyrl_test_entry"] = Payload(str(marker))
    torch.save(state, extra)
    record = json.loads((step / MARKER_FILE).read_text())
    record["sha256"] = file_checksums(str(step))
    (step / MARKER_FILE).write_text(json.dumps(record))

    proc = train(out, "trainer.total_training_steps=2")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    assert not marker.exists(), "the payload ran"
    line = errors[0]
    assert "refusing to load" in line and "extra_state_rank_0.pt" in line, line
    log = Path(line.rsplit(" in ", 1)[1].rstrip(")"))
    details = log.read_text() if log.is_file() else ""
    assert "load_checkpoint" in details and 'File "' in details, line  # the worker's frames
