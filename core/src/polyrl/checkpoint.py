"""Checkpoint layout, crash-safe commits, retention, resume selection and the driver's state.

Layout (verl's, so verl users and tools find their way)::

    ${trainer.default_local_dir}/
        latest_checkpointed_iteration.txt      # the newest complete step, e.g. "40"
        global_step_40/
            actor/                             # the engine's sharded state (written by workers)
            trainer_state.json                 # step, epoch, data-loader state, config hash, ...
            driver_rng.json                    # python / numpy / torch RNG states of the driver
            COMPLETE                           # commit marker (see below)
        global_step_40.tmp-k3j2/               # a save in progress (or one a crash left behind)

Why a staging folder and a marker: a checkpoint is written by many processes (each worker writes
its shard, the driver its state) and takes seconds to minutes. A crash, a pre-emption or a full
disk in that window must never leave a folder that resume would pick up and then fail on (or,
worse, load half of). So every save goes to ``global_step_<N>.tmp-<random>`` on the same
filesystem; :meth:`CheckpointManager.commit` fsyncs everything, writes the ``COMPLETE`` marker,
and renames the folder to ``global_step_<N>`` in one atomic ``rename``. Only folders with that
exact name *and* the marker count as checkpoints. A crash at any point therefore leaves either
the previous state or the new complete checkpoint, plus some leftovers that :meth:`clean_stale`
removes at the next start.

"Newest" means the highest step among complete checkpoints. ``latest_checkpointed_iteration.txt``
is kept up to date (atomically) for verl-compatible tools, but resume does not trust it: a crash
between the rename and its update would otherwise hide the newest checkpoint.

Nothing polyrl did not write for this run is removed or replaced. A step folder belongs to the
run whose ``run_id`` its marker holds (a resumed run continues the id of its checkpoint); a
commit never replaces a ``global_step_<N>`` of another run or another tool, and a new run
(``resume_mode=disable``) into a folder that already holds step folders is refused before Ray
starts. Why refuse rather than write beside: checkpoints are found by their verl name in one
folder, so two runs' checkpoints there cannot be told apart by verl's tools, by retention or by
the next ``auto`` resume (which would pick the other run's newest); a second naming scheme would
break those tools, and a refusal at start costs nothing.

On multi-node runs ``default_local_dir`` must be a filesystem shared by the driver and the
workers (the workers write into the staging folder the driver created).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import random
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from typing import Any, ClassVar

from polyrl.errors import ConfigError
from polyrl.fsutil import atomic_write_text, fsync_path, naming_full_disk

LATEST_FILE = "latest_checkpointed_iteration.txt"
MARKER_FILE = "COMPLETE"
TRAINER_STATE_FILE = "trainer_state.json"
RNG_STATE_FILE = "driver_rng.json"
ACTOR_SUBDIR = "actor"
STEP_PREFIX = "global_step_"
RESUME_MODES = ("auto", "disable", "resume_path")

_STEP_DIR = re.compile(r"^global_step_(\d+)$")
# leftovers: a save in progress / crashed (.tmp-), an older copy being replaced (.old-),
# a checkpoint being deleted (.del-)
_LEFTOVER = re.compile(r"^global_step_(\d+)\.(tmp|old|del)-[A-Za-z0-9_]+$")

_log = logging.getLogger(__name__)


# ---- small filesystem helpers ------------------------------------------------------------------
def _polyrl_version() -> str:
    from polyrl import __version__

    return __version__


def _fsync_tree(root: str) -> None:
    """fsync every file and folder under ``root`` (bottom-up, so each folder after its entries)."""
    for folder, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                fsync_path(path)
        fsync_path(folder)


def _random_tag() -> str:
    return base64.b32encode(os.urandom(5)).decode().lower()


def step_of(path: str) -> int | None:
    """The step of a ``global_step_<N>`` folder path, or ``None`` for any other name."""
    match = _STEP_DIR.match(os.path.basename(os.path.normpath(path)))
    return int(match.group(1)) if match else None


def _parsed_marker(path: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(path, MARKER_FILE), encoding="utf-8") as fh:
            marker = json.load(fh)
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def is_complete(path: str) -> bool:
    """Whether ``path`` is a committed checkpoint folder: it holds a readable commit marker. A
    marker that does not parse (a corrupted or edited file) does not count, since the checksums
    it carries could not be checked."""
    return os.path.isdir(path) and _parsed_marker(path) is not None


def read_marker(path: str) -> dict[str, Any]:
    """The commit marker of a checkpoint folder (empty when absent or unreadable)."""
    return _parsed_marker(path) or {}


_REPORTED_UNREADABLE: set[str] = set()


def _report_unreadable_marker(path: str) -> None:
    """One line per folder and process: a checkpoint skipped for its unreadable marker."""
    if path not in _REPORTED_UNREADABLE:
        _REPORTED_UNREADABLE.add(path)
        _log.warning(
            "%s: its %s marker is unreadable, so it is not a complete checkpoint; the newest "
            "complete one before it is used",
            path,
            MARKER_FILE,
        )


def file_checksums(folder: str) -> dict[str, str]:
    """SHA-256 of every file under ``folder`` (relative paths), the marker excepted."""
    sums = {}
    for directory, _dirs, files in os.walk(folder):
        for name in sorted(files):
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, folder)
            if relative == MARKER_FILE:
                continue
            digest = hashlib.sha256()
            with open(path, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
            sums[relative] = digest.hexdigest()
    return sums


def verify_checkpoint(path: str) -> str | None:
    """None when every file of the checkpoint matches the checksum written at save, else what
    is wrong (one line naming the file and the step). Checkpoints written before checksums
    existed pass unchecked."""
    expected = read_marker(path).get("sha256")
    if not isinstance(expected, dict):
        return None
    actual = file_checksums(path)
    name = os.path.basename(path)
    for relative, digest in sorted(expected.items()):
        if relative not in actual:
            return f"checkpoint {name}: file {relative} is missing"
        if actual[relative] != digest:
            return f"checkpoint {name}: file {relative} is corrupt (its checksum differs from save)"
    extra = sorted(set(actual) - set(expected))
    if extra:
        return f"checkpoint {name}: file {extra[0]} was added after the save"
    return None


def read_latest_file(root_dir: str) -> int | None:
    """The step recorded in ``latest_checkpointed_iteration.txt`` (verl's tracker), if any."""
    try:
        with open(os.path.join(root_dir, LATEST_FILE), encoding="utf-8") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def config_hash(config: Mapping[str, Any]) -> str:
    """A stable SHA-256 of a config dict (key order does not matter), stored in
    ``trainer_state.json`` so a resume can tell whether the config changed."""
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


# ---- what changed since the checkpoint -----------------------------------------------------------
# Changing these mid-run makes the resumed run a different experiment: refused unless
# trainer.resume_allow_changes=true.
RUN_DEFINING_KEYS = (
    "actor_rollout_ref.model.path",
    "algorithm.name",
    "algorithm.adv_estimator",
    "actor_rollout_ref.rollout.n",
    "data.train_batch_size",
    "data.train_files",
    # one-step off-policy checkpoints hold the next step's batch and a loader one batch ahead
    "trainer.async_mode",
)
# Restored from the checkpoint's optimizer state (torch's Optimizer.load_state_dict puts back every
# param-group value), so a new value here would be announced but never used: refused.
RESTORED_BY_CHECKPOINT = re.compile(
    r"^(actor_rollout_ref\.actor|critic)\.optim\.(lr|weight_decay|betas)$"
)
# Expected to differ between the first run and its resumption: not reported.
RESUME_NEUTRAL_PREFIXES = (
    "trainer.total_training_steps",
    "trainer.total_epochs",
    "trainer.resume_mode",
    "trainer.resume_from_path",
    "trainer.resume_fallback",
    "trainer.resume_allow_changes",
    "trainer.logger",
    "trainer.save_freq",
    "trainer.test_freq",
    "trainer.val_before_train",
    "trainer.log_val_generations",
    "trainer.export_hf_every_save",
    "trainer.experiment_name",
    "trainer.project_name",
    "trainer.default_local_dir",
    "trainer.max_actor_ckpt_to_keep",
    "trainer.max_restarts",
)


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, Mapping):
        flat: dict[str, Any] = {}
        for key, value in node.items():
            flat.update(_flatten(value, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: node}


def config_changes(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``key: old -> new`` for every setting that differs from the checkpoint's config, the
    run-defining ones first (marked), resumption bookkeeping left out."""
    before, after = _flatten(saved), _flatten(current)
    changed = []
    for key in sorted(set(before) | set(after)):
        if key.startswith(RESUME_NEUTRAL_PREFIXES) or before.get(key) == after.get(key):
            continue
        line = f"{key}: {before.get(key)!r} -> {after.get(key)!r}"
        changed.append(f"{line} (run-defining)" if key in RUN_DEFINING_KEYS else line)
    return sorted(changed, key=lambda line: not line.endswith("(run-defining)"))


def check_resume_changes(
    checkpoint: str, saved: Mapping[str, Any], current: Mapping[str, Any], allow_changes: bool
) -> list[str]:
    """The settings changed since ``checkpoint``'s run that the resumed run applies (for the
    user to see); a :class:`ConfigError` for a change it would not apply (a value the optimizer
    state puts back) or, without ``allow_changes``, a run-defining one."""
    changes = config_changes(saved, current)
    restored = [c for c in changes if RESTORED_BY_CHECKPOINT.match(c.split(":", 1)[0])]
    if restored:
        raise ConfigError(
            f"resuming {checkpoint} with {'; '.join(restored)}: the checkpoint's optimizer state "
            f"restores its own value, so the change would not take effect. Resume with the "
            f"checkpoint's value, or start a new run from its exported weights "
            f"(actor_rollout_ref.model.path=<hf_model>) in another trainer.default_local_dir"
        )
    defining = [c for c in changes if c.endswith("(run-defining)")]
    if defining and not allow_changes:
        raise ConfigError(
            f"resuming {checkpoint} with settings that define another run: "
            f"{'; '.join(defining)}. Resume with the checkpoint's settings, train into another "
            f"trainer.default_local_dir, or set trainer.resume_allow_changes=true"
        )
    return changes


# ---- one live run per folder --------------------------------------------------------------------
LOCK_FILE = "polyrl.lock"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


class RunLock:
    """``<root>/polyrl.lock``: the pid and host of the run writing into ``root``.

    A second run started into the folder of a live run would interleave checkpoints and
    metrics with it; it is refused. A lock whose process is gone (same host) is stale and taken
    over; one from another host cannot be checked from here, so it is refused with the command
    to clear it.
    """

    #: The locks this process holds, for :func:`release_held_run_locks`.
    _held: ClassVar[set[RunLock]] = set()

    def __init__(self, root_dir: str) -> None:
        self.path = os.path.join(os.path.abspath(os.path.expanduser(root_dir)), LOCK_FILE)
        self.held = False

    def acquire(self) -> None:
        import socket

        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": time.time()}
        for _attempt in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._refuse_or_clear_stale(record["host"])
                continue
            try:
                with (
                    naming_full_disk(self.path, "the run lock"),
                    os.fdopen(fd, "w", encoding="utf-8") as fh,
                ):
                    json.dump(record, fh)
            except BaseException:
                os.unlink(self.path)  # ours (O_EXCL); left empty it would refuse the next run
                raise
            self.held = True
            RunLock._held.add(self)
            return
        raise ConfigError(f"could not take the run lock {self.path}: another run took it first")

    def _refuse_or_clear_stale(self, host: str) -> None:
        try:
            with open(self.path, encoding="utf-8") as fh:
                owner = json.load(fh)
            pid, owner_host = int(owner["pid"]), str(owner["host"])
        except (OSError, ValueError, KeyError, TypeError):
            owner, pid, owner_host = {}, -1, "?"
        if owner_host == host and not _pid_alive(pid):
            _log.warning("taking over the stale run lock of pid %s (no longer running)", pid)
            os.unlink(self.path)
            return
        since = time.strftime("%Y-%m-%d %H:%M", time.localtime(owner.get("started_at", 0)))
        raise ConfigError(
            f"another polyrl run (pid {pid} on host {owner_host}, since {since}) is writing into "
            f"{os.path.dirname(self.path)}: wait for it or stop it, or set "
            f"trainer.default_local_dir to another folder (if that run is gone, delete "
            f"{self.path})"
        )

    def release(self) -> None:
        if self.held:
            self.held = False
            RunLock._held.discard(self)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


def release_held_run_locks() -> None:
    """Release every run lock of this process: for an exit that skips ``finally`` blocks (the
    stop deadline's ``os._exit``), so that the folder is not left locked by a gone run."""
    for lock in list(RunLock._held):
        lock.release()


# ---- the manager -------------------------------------------------------------------------------
class CheckpointManager:
    """Owns ``root_dir`` (``trainer.default_local_dir``): staging, commit, retention, lookup.

    ``max_to_keep`` (``trainer.max_actor_ckpt_to_keep``): keep at most this many complete
    checkpoints, deleting the oldest after each commit; ``None`` or a value ``<= 0`` keeps all
    (as in verl). Retention deletes only checkpoints of this run (its ``run_id`` is in each
    marker; a resumed run continues the id of the checkpoint it resumed from), never another
    run's or another tool's folders.
    """

    def __init__(self, root_dir: str, max_to_keep: int | None = None) -> None:
        if max_to_keep is not None and (
            isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int)
        ):
            raise ConfigError(
                f"trainer.max_actor_ckpt_to_keep must be an integer or null, got {max_to_keep!r}"
            )
        self.root_dir = os.path.abspath(os.path.expanduser(str(root_dir)))
        self.max_to_keep = max_to_keep if max_to_keep and max_to_keep > 0 else None
        self.run_id = _random_tag()

    def adopt_run(self, checkpoint: str) -> None:
        """Continue the run that wrote ``checkpoint`` (after resuming from it): its older
        checkpoints become this run's, for retention."""
        self.run_id = str(read_marker(checkpoint).get("run_id") or self.run_id)

    # ---- writing ---------------------------------------------------------------------------
    def step_path(self, step: int) -> str:
        """Where the committed checkpoint of ``step`` lives."""
        return os.path.join(self.root_dir, f"{STEP_PREFIX}{int(step)}")

    def staging_dir(self, step: int) -> str:
        """A new, empty ``global_step_<N>.tmp-<random>`` folder under the root (same filesystem,
        so the commit's rename is atomic) for the workers and the driver to write into."""
        step = self._check_step(step)
        os.makedirs(self.root_dir, exist_ok=True)
        return tempfile.mkdtemp(prefix=f"{STEP_PREFIX}{step}.tmp-", dir=self.root_dir)

    def commit(self, step: int, staging: str) -> str:
        """Make the save in ``staging`` the checkpoint of ``step``; return its final path.

        Order: fsync the staged files, write and fsync the marker, move an existing
        ``global_step_<N>`` aside, rename staging into place, fsync the root, update the latest
        file, delete the old copy, apply retention. Before the rename nothing has the final name;
        after it the folder is complete.
        """
        step = self._check_step(step)
        staging = os.path.abspath(staging)
        expected_prefix = f"{STEP_PREFIX}{step}.tmp-"
        if (
            os.path.dirname(staging) != self.root_dir
            or not os.path.basename(staging).startswith(expected_prefix)
            or not os.path.isdir(staging)
        ):
            raise ValueError(
                f"commit(step={step}) needs a staging folder made by staging_dir({step}) under "
                f"{self.root_dir}; got {staging!r}"
            )
        self._refuse_foreign(self.step_path(step))
        _fsync_tree(staging)
        marker = {
            "step": step,
            "run_id": self.run_id,
            "polyrl_version": _polyrl_version(),
            "committed_at": time.time(),
            "sha256": file_checksums(staging),
        }
        marker_path = os.path.join(staging, MARKER_FILE)
        with open(marker_path, "w", encoding="utf-8") as fh:
            json.dump(marker, fh)
            fh.flush()
            os.fsync(fh.fileno())
        fsync_path(staging)

        final = self.step_path(step)
        old: str | None = None
        if os.path.lexists(final):
            old = os.path.join(self.root_dir, f"{STEP_PREFIX}{step}.old-{_random_tag()}")
            os.rename(final, old)
        os.rename(staging, final)
        fsync_path(self.root_dir)
        self._write_latest_file()
        if old is not None:
            self._remove(old)
        self._apply_retention(keep=final)
        return final

    def _refuse_foreign(self, final: str) -> None:
        """A ``global_step_<N>`` that another run or tool wrote is never replaced (checked before
        the marker is written, so the staged save stays a leftover, not a checkpoint)."""
        if os.path.lexists(final) and read_marker(final).get("run_id") != self.run_id:
            raise ConfigError(
                f"{final} was not written by this run; polyrl does not replace it. Move it "
                f"away or set trainer.default_local_dir to another folder"
            )

    def _write_latest_file(self) -> None:
        newest = self.latest()
        if newest is not None and read_latest_file(self.root_dir) != newest[0]:
            atomic_write_text(os.path.join(self.root_dir, LATEST_FILE), str(newest[0]))

    def _apply_retention(self, keep: str) -> None:
        if self.max_to_keep is None:
            return
        complete = [
            (step, path)
            for step, path in self.complete_checkpoints()
            if read_marker(path).get("run_id") == self.run_id
        ]
        surplus = len(complete) - self.max_to_keep
        for _step, path in complete:
            if surplus <= 0:
                break
            if path != keep:
                self._remove(path)
                surplus -= 1

    def _remove(self, path: str) -> None:
        """Delete a checkpoint folder: first rename it to a ``.del-`` name (atomic, so it stops
        counting at once), then delete the files; a crash in between leaves only a leftover."""
        name = os.path.basename(path)
        match = _STEP_DIR.match(name) or _LEFTOVER.match(name)
        step = match.group(1) if match else "x"
        doomed = os.path.join(self.root_dir, f"{STEP_PREFIX}{step}.del-{_random_tag()}")
        os.rename(path, doomed)
        fsync_path(self.root_dir)
        shutil.rmtree(doomed, ignore_errors=True)

    # ---- reading ---------------------------------------------------------------------------
    def complete_checkpoints(self) -> list[tuple[int, str]]:
        """Every committed checkpoint as ``(step, path)``, oldest first."""
        if not os.path.isdir(self.root_dir):
            return []
        found = []
        for name in os.listdir(self.root_dir):
            match = _STEP_DIR.match(name)
            path = os.path.join(self.root_dir, name)
            if match and is_complete(path):
                found.append((int(match.group(1)), path))
            elif match and os.path.isfile(os.path.join(path, MARKER_FILE)):
                _report_unreadable_marker(path)
        return sorted(found)

    def latest(self) -> tuple[int, str] | None:
        """The newest complete checkpoint as ``(step, path)``; ``None`` when there is none.
        Staging folders, leftovers and folders without the marker are never returned."""
        complete = self.complete_checkpoints()
        return complete[-1] if complete else None

    def newest_of_run(self) -> str | None:
        """The newest complete checkpoint of this run whose files match their checksums (where
        a restart after a lost worker goes back to); ``None`` when it has none yet."""
        for _step, path in reversed(self.complete_checkpoints()):
            if read_marker(path).get("run_id") == self.run_id and verify_checkpoint(path) is None:
                return path
        return None

    def clean_stale(self) -> list[str]:
        """Tidy what crashed runs left behind; call once at start, before any save.

        Removes staging (``.tmp-``) and half-deleted (``.del-``) folders. An ``.old-`` copy
        (moved aside while a step was being re-saved) is put back if the crash happened before
        the new copy took its name, else removed. Also removes stray temporary latest files and
        brings ``latest_checkpointed_iteration.txt`` in line with :meth:`latest`. Returns the
        paths removed.
        """
        if not os.path.isdir(self.root_dir):
            return []
        removed: list[str] = []
        for name in sorted(os.listdir(self.root_dir)):
            path = os.path.join(self.root_dir, name)
            match = _LEFTOVER.match(name)
            if match and os.path.isdir(path):
                final = self.step_path(int(match.group(1)))
                if match.group(2) == "old" and not os.path.lexists(final) and is_complete(path):
                    os.rename(path, final)
                    _log.warning("restored %s from an interrupted re-save", final)
                    continue
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
            elif name.startswith(f".{LATEST_FILE}.") and name.endswith(".tmp"):
                os.unlink(path)
                removed.append(path)
        if removed:
            fsync_path(self.root_dir)
            _log.info(
                "removed %d leftovers of interrupted saves under %s", len(removed), self.root_dir
            )
        self._write_latest_file()
        return removed

    def resolve_resume(self, trainer_cfg: Any) -> str | None:
        """The checkpoint folder to resume from, per ``trainer.resume_mode``:

        ``auto``: the newest complete checkpoint under the root, or ``None`` (fresh start);
        ``disable``: ``None``; ``resume_path``: ``trainer.resume_from_path``, which must be a
        complete ``global_step_<N>`` folder. ``trainer_cfg`` is the ``trainer`` section (a
        partial dict is completed from the schema).
        """
        from polyrl.config.nodes import schema_node

        trainer_cfg = schema_node(trainer_cfg, "trainer")
        mode = str(trainer_cfg.resume_mode)
        if mode == "disable":
            self._refuse_step_folders_for_a_new_run()
            return None
        if mode == "auto":
            newest = self.latest()
            if newest is None:
                self._refuse_unreadable_checkpoints()
                return None
            return self._verified(newest[1], fallback=bool(trainer_cfg.resume_fallback))
        if mode == "resume_path":
            return self._verified(self._check_resume_path(trainer_cfg.resume_from_path), False)
        raise ConfigError(
            f"trainer.resume_mode={mode!r} is not valid; use one of {', '.join(RESUME_MODES)}"
        )

    def _verified(self, path: str, fallback: bool) -> str:
        """``path`` if its files match their checksums; with ``fallback`` the newest older
        complete checkpoint that does, else an error naming the corrupt file."""
        problem = verify_checkpoint(path)
        if problem is None:
            return path
        if fallback:
            newer_than = step_of(path) or 0
            for step, older in reversed(self.complete_checkpoints()):
                if step < newer_than and verify_checkpoint(older) is None:
                    _log.warning("%s; resuming from the older %s instead", problem, older)
                    return older
        hint = (
            "no older checkpoint is intact"
            if fallback
            else "set trainer.resume_fallback=true to resume from the newest intact older one"
        )
        raise ConfigError(f"{problem}: resuming from it would not be exact; {hint}")

    def _step_folders(self) -> list[str]:
        """The names of every ``global_step_<N>`` folder under the root, complete or not, by
        step."""
        if not os.path.isdir(self.root_dir):
            return []
        found = [
            name
            for name in os.listdir(self.root_dir)
            if _STEP_DIR.match(name) and os.path.isdir(os.path.join(self.root_dir, name))
        ]
        return sorted(found, key=lambda name: int(name[len(STEP_PREFIX) :]))

    def _refuse_step_folders_for_a_new_run(self) -> None:
        """A new run into a folder with step folders would mix its checkpoints with them (see
        the module docstring): refused, before anything is written."""
        existing = self._step_folders()
        if existing:
            shown = ", ".join(existing[:4]) + (" ..." if len(existing) > 4 else "")
            raise ConfigError(
                f"trainer.resume_mode=disable: {self.root_dir} already holds {len(existing)} "
                f"checkpoint folder(s) ({shown}); polyrl never replaces them and a new run beside "
                f"them could not be told apart from them. Set trainer.default_local_dir to a new "
                f"folder (or move them away)"
            )

    def _refuse_unreadable_checkpoints(self) -> None:
        """``auto`` found nothing to resume: make sure that is not because the folder holds
        checkpoints polyrl cannot read (another tool's layout, folders without the marker),
        which a fresh start would silently train past."""
        foreign = self._step_folders()
        if foreign:
            shown = ", ".join(foreign[:4]) + (" ..." if len(foreign) > 4 else "")
            raise ConfigError(
                f"trainer.resume_mode=auto: {self.root_dir} holds {len(foreign)} checkpoint "
                f"folder(s) polyrl cannot resume from ({shown}: no {MARKER_FILE} marker, so "
                f"written by another tool or a save that never finished); they are left "
                f"untouched. Train into another trainer.default_local_dir (or move them away)"
            )

    def _check_resume_path(self, given: Any) -> str:
        if not given:
            raise ConfigError(
                "trainer.resume_mode=resume_path needs trainer.resume_from_path=<.../global_step_N>"
                " (or use trainer.resume_mode=auto to take the newest checkpoint)"
            )
        path = os.path.abspath(os.path.expanduser(str(given)))
        if not os.path.isdir(path):
            raise ConfigError(f"trainer.resume_from_path={given!r}: no such folder ({path})")
        if step_of(path) is None:
            raise ConfigError(
                f"trainer.resume_from_path={given!r} must be a checkpoint folder named "
                f"global_step_<N> (got {os.path.basename(path)!r})"
            )
        if not is_complete(path):
            hint = CheckpointManager(os.path.dirname(path)).latest()
            alternative = (
                f"; the newest complete one there is {hint[1]}" if hint else "; none there is"
            )
            raise ConfigError(
                f"trainer.resume_from_path={given!r} is an incomplete checkpoint (no readable "
                f"{MARKER_FILE} marker: its save was interrupted or the marker is damaged)"
                f"{alternative}"
            )
        return path

    @staticmethod
    def _check_step(step: Any) -> int:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"checkpoint step must be a non-negative integer, got {step!r}")
        return step


# ---- the driver's own state --------------------------------------------------------------------
def capture_rng_state() -> dict[str, Any]:
    """The driver's python, numpy and torch (CPU; CUDA when initialised) RNG states as JSON-able
    data (byte states in base64). Libraries that are not installed are skipped."""
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {"python": [version, list(internal), gauss]}
    try:
        import numpy as np
    except ImportError:
        np = None  # type: ignore[assignment]
    if np is not None:
        kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        state["numpy"] = {
            "kind": kind,
            "keys": [int(k) for k in keys],
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    try:
        import torch
    except ImportError:
        return state
    state["torch"] = base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["torch_cuda"] = [
            base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()
        ]
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Put back what :func:`capture_rng_state` returned."""
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in state:
        import numpy as np

        s = state["numpy"]
        np.random.set_state(
            (s["kind"], np.array(s["keys"], dtype=np.uint32), s["pos"], s["has_gauss"],
             s["cached_gaussian"])
        )  # fmt: skip
    if "torch" in state or "torch_cuda" in state:
        import torch

        def _bytes(b64: str) -> Any:
            return torch.frombuffer(bytearray(base64.b64decode(b64)), dtype=torch.uint8)

        if "torch" in state:
            torch.set_rng_state(_bytes(state["torch"]))
        cuda = state.get("torch_cuda")
        if cuda and torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
            torch.cuda.set_rng_state_all([_bytes(s) for s in cuda])
        elif cuda:
            _log.warning("checkpoint has CUDA RNG states for %d devices; not restored", len(cuda))


def save_driver_state(ckpt_dir: str, state: dict[str, Any], *, rng: bool = True) -> None:
    """Write ``trainer_state.json`` (``state`` plus ``polyrl_version``) into ``ckpt_dir`` — usually
    a staging folder — and, with ``rng``, the driver's RNG states to ``driver_rng.json``.

    ``state`` must be JSON-able: the step, epoch, data-loader position, ``config_hash(...)``.
    """
    record = {"polyrl_version": _polyrl_version(), **state}
    try:
        text = json.dumps(record, indent=2, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"driver state for {ckpt_dir} must be JSON-serialisable (plain numbers, strings, "
            f"lists, dicts; finite floats): {exc}"
        ) from exc
    atomic_write_text(os.path.join(ckpt_dir, TRAINER_STATE_FILE), text + "\n")
    if rng:
        atomic_write_text(os.path.join(ckpt_dir, RNG_STATE_FILE), json.dumps(capture_rng_state()))


def load_driver_state(ckpt_dir: str, *, restore_rng: bool = True) -> dict[str, Any]:
    """Read ``trainer_state.json`` from a checkpoint folder; with ``restore_rng`` also put back
    the driver's RNG states saved beside it (a warning if there are none)."""
    path = os.path.join(ckpt_dir, TRAINER_STATE_FILE)
    try:
        with open(path, encoding="utf-8") as fh:
            state = json.load(fh)
    except FileNotFoundError:
        raise ConfigError(
            f"{ckpt_dir} is not a polyrl checkpoint: it has no {TRAINER_STATE_FILE}"
        ) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is corrupt ({exc}); resume from another checkpoint") from exc
    if restore_rng:
        rng_path = os.path.join(ckpt_dir, RNG_STATE_FILE)
        if os.path.isfile(rng_path):
            with open(rng_path, encoding="utf-8") as fh:
                restore_rng_state(json.load(fh))
        else:
            _log.warning("%s has no %s: driver RNG states not restored", ckpt_dir, RNG_STATE_FILE)
    return state
