"""The run's own outputs beside its checkpoints: the ``hf_model/`` export and the reward curve.

Why a record inside ``hf_model/``: the folder name is the same for every run, and a user may
well keep a model of their own there (or an earlier run's export). ``polyrl_export.json`` says
which run (the checkpoints' ``run_id``) wrote it at which step; only an export of this run is
ever replaced, and then atomically (the new folder is renamed into place, the old one moved
aside first), so a crash leaves one complete export. Any other ``hf_model/`` makes the run
refuse at start, before Ray, rather than at the end of training: writing the export under a
second name would leave the user guessing which folder is which, and the refusal costs nothing.
A resumed run that finds this run's export of the final step already there does not write it
again; one that was stopped before or during the export writes it.

The reward curve of an earlier run is moved aside to ``reward_curve.<time>.png`` by a new run,
as ``metrics.jsonl`` is.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

from polyrl.errors import ConfigError
from polyrl.fsutil import atomic_write_text, fsync_path

EXPORT_DIR = "hf_model"
EXPORT_RECORD = "polyrl_export.json"
REWARD_CURVE = "reward_curve.png"
# a half-written export (.tmp-) and an older one moved aside while being replaced (.old-)
_EXPORT_LEFTOVER = re.compile(rf"^{EXPORT_DIR}\.(tmp|old)-\w+$")


def export_record(output_dir: str) -> dict[str, Any] | None:
    """The record of ``<output_dir>/hf_model`` (None when there is no such folder; an empty
    dict for one polyrl did not write)."""
    target = os.path.join(output_dir, EXPORT_DIR)
    if not os.path.lexists(target):
        return None
    try:
        with open(os.path.join(target, EXPORT_RECORD), encoding="utf-8") as fh:
            record = json.load(fh)
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def check_export_target(output_dir: str, run_id: str) -> None:
    """Refuse a run whose export would land on an ``hf_model/`` that this run did not write."""
    record = export_record(output_dir)
    if record is not None and record.get("run_id") != run_id:
        target = os.path.join(output_dir, EXPORT_DIR)
        raise ConfigError(
            f"{target} exists and was not exported by this run; polyrl does not replace it. "
            f"Move it away, set trainer.default_local_dir to another folder, or set "
            f"trainer.export_hf_model=false"
        )


def export_is_current(output_dir: str, run_id: str, step: int) -> bool:
    """Whether ``hf_model/`` already holds this run's export of ``step``."""
    record = export_record(output_dir) or {}
    return record.get("run_id") == run_id and record.get("step") == step


def install_export(output_dir: str, run_id: str, step: int, write: Callable[[str], None]) -> str:
    """Have ``write`` fill a staging folder beside ``hf_model/``, record the run and step in it,
    and put it in place of this run's earlier export (if any); return the export's path."""
    target = os.path.join(output_dir, EXPORT_DIR)
    staging = tempfile.mkdtemp(prefix=f"{EXPORT_DIR}.tmp-", dir=output_dir)
    write(staging)
    atomic_write_text(
        os.path.join(staging, EXPORT_RECORD), json.dumps({"run_id": run_id, "step": step})
    )
    check_export_target(output_dir, run_id)  # nothing else took the name meanwhile
    aside = None
    if os.path.lexists(target):
        aside = f"{target}.old-{os.path.basename(staging).rsplit('-', 1)[-1]}"
        os.rename(target, aside)
    os.rename(staging, target)
    fsync_path(output_dir)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
    return target


def clean_export_leftovers(output_dir: str) -> None:
    """Tidy what an export interrupted by a crash left: the staging folder goes; an older export
    moved aside goes back when the new one never took its name."""
    if not os.path.isdir(output_dir):
        return
    target = os.path.join(output_dir, EXPORT_DIR)
    for name in sorted(os.listdir(output_dir)):
        match = _EXPORT_LEFTOVER.match(name)
        path = os.path.join(output_dir, name)
        if not match or not os.path.isdir(path):
            continue
        if match.group(1) == "old" and not os.path.lexists(target):
            os.rename(path, target)
        else:
            shutil.rmtree(path, ignore_errors=True)


def move_earlier_reward_curve_aside(output_dir: str) -> None:
    """A new run keeps an earlier run's reward curve as ``reward_curve.<time>.png``."""
    path = os.path.join(output_dir, REWARD_CURVE)
    if os.path.isfile(path):
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(os.path.getmtime(path)))
        stem, ext = os.path.splitext(path)
        aside = f"{stem}.{stamp}{ext}"
        counter = 1
        while os.path.exists(aside):
            aside, counter = f"{stem}.{stamp}-{counter}{ext}", counter + 1
        os.rename(path, aside)
