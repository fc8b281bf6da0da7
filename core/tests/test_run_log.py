"""The run's error log and the one line the CLI prints (polyrl.run_log), and a full disk named as
such (polyrl.fsutil): which exceptions count as a full disk, where details go when the run's
folder cannot take them, and that a log entry is written whole or not at all (on a real full
tmpfs where mounting is allowed)."""

from __future__ import annotations

import errno
import subprocess
from pathlib import Path

import pytest

from polyrl import run_log
from polyrl.errors import ConfigError
from polyrl.fsutil import DiskFullError, free_space, is_disk_full, naming_full_disk


class RemoteError(Exception):
    """Like Ray's wrapped errors: the worker's exception as ``.cause``."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__("a worker failed")
        self.cause = cause


@pytest.fixture(autouse=True)
def run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(run_log, "_run_folder", None)
    run_log.use_run_folder(str(tmp_path / "run"))
    return tmp_path / "run"


def enospc() -> OSError:
    return OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_is_found_in_the_chain_in_a_remote_cause_and_in_text() -> None:
    try:
        try:
            raise enospc()
        except OSError as inner:
            raise RuntimeError("saving failed") from inner
    except RuntimeError as outer:
        assert is_disk_full(outer)
    assert is_disk_full(RemoteError(enospc()))
    assert is_disk_full(RuntimeError("worker said: [Errno 28] No space left on device"))
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(RuntimeError("nothing of the kind"))


def test_naming_full_disk_names_the_path_and_lets_other_errors_pass(tmp_path: Path) -> None:
    named = r"writing the metrics to .* free of .* on that disk"
    with pytest.raises(DiskFullError, match=named), naming_full_disk(str(tmp_path), "the metrics"):
        raise RemoteError(enospc())
    with pytest.raises(ValueError, match="not a disk"), naming_full_disk(str(tmp_path), "x"):
        raise ValueError("not a disk problem")
    assert " free of " in free_space(str(tmp_path / "not" / "there" / "yet"))


def test_a_users_error_without_a_cause_is_its_message_alone(run_folder: Path) -> None:
    assert run_log.error_line(ConfigError("x=1 is wrong:\n  use 2")) == "x=1 is wrong: use 2"
    assert not run_folder.exists()  # nothing to keep
    assert run_log.error_line(ValueError("a bug")) is None  # its traceback shows


def test_what_caused_a_users_error_goes_to_the_run_log(run_folder: Path) -> None:
    try:
        try:
            raise KeyError("deep inside")
        except KeyError as inner:
            raise ConfigError("the checkpoint is refused") from inner
    except ConfigError as exc:
        line = run_log.error_line(exc)
    log = run_folder / run_log.RUN_LOG
    assert line == f"the checkpoint is refused (details in {log})"
    text = log.read_text()
    assert "KeyError: 'deep inside'" in text and "ConfigError" in text


def test_a_bare_full_disk_is_a_line_too(run_folder: Path) -> None:
    error = enospc()
    error.filename = str(run_folder / "metrics.jsonl")
    line = run_log.error_line(error)
    assert line is not None and line.startswith(
        f"no space left on device writing the run's output to {run_folder}/metrics.jsonl ("
    )
    assert "details in " in line


def test_a_line_that_already_points_at_a_log_is_left_alone(run_folder: Path) -> None:
    exc = ConfigError("worker failed (worker traceback in /x/worker_errors.log)")
    exc.__cause__ = RuntimeError("x")
    assert run_log.error_line(exc) == "worker failed (worker traceback in /x/worker_errors.log)"
    assert not run_folder.exists()


def test_details_go_to_the_temporary_folder_when_the_run_folder_cannot_take_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setattr(run_log.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    path = run_log.keep("the details", folder=str(blocked))
    assert path == str(tmp_path / "tmp" / run_log.RUN_LOG)
    assert "the details" in Path(path).read_text()


def test_an_entry_that_does_not_fit_is_not_left_half_written(tmp_path: Path) -> None:
    mount = tmp_path / "disk"
    mount.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(mount)], capture_output=True
    )
    if proc.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        (mount / "filler").write_bytes(b"x" * 4096)
        assert run_log.keep("fits", folder=str(mount)) == str(mount / run_log.RUN_LOG)
        before = (mount / run_log.RUN_LOG).read_bytes()
        elsewhere = run_log.keep("y" * 20000, folder=str(mount))  # more than the disk holds
        assert elsewhere != str(mount / run_log.RUN_LOG)
        assert (mount / run_log.RUN_LOG).read_bytes() == before  # cut back to the whole entry
        (mount / run_log.RUN_LOG).unlink()
        (mount / "filler").write_bytes(b"x" * 8192)  # the disk full: no empty log is created
        run_log.keep("z" * 10000, folder=str(mount))
        assert not (mount / run_log.RUN_LOG).exists()
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
