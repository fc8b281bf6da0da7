"""Run untrusted Python (model-written programs, scorers that evaluate expressions, reward code
marked untrusted) in a separate, limited process, so that it cannot take down, hang, or reach out
of the run.

What a sandboxed process gets (``_sandbox_child.py`` applies it, best effort, and lists what it
applied in ``POLYRL_SANDBOX``):

- resource limits: address space (``memory_mb``), CPU seconds, processes (no fork bombs), size
  of files written; no core dumps;
- a wall-clock limit enforced here;
- a clean process table afterwards: the launcher outlives the program as a child subreaper and
  kills every process the program left, a double-forked daemon in its own session included;
  when the launcher itself is gone (killed by the program, as the same user), whatever was
  re-parented to the calling process is killed and reaped by :func:`reap_orphans`, provided the
  caller is a subreaper (:func:`become_subreaper`; a reward worker is one) -- otherwise zombies
  of one sample would use up the process limit of every later one;
- a report channel (``report=True``): a pipe only the program holds and a random nonce, both
  handed over in the environment (``POLYRL_REPORT_FD``, ``POLYRL_REPORT_NONCE``), so the program
  can prove that it reached a given point -- an exit status cannot, since any code can exit 0.
  A report counts only when the launcher saw the program end without a signal: one that kills
  its launcher (and so itself) reports nothing, however far it got;
- no network: a new network namespace where the OS allows one (root, or unprivileged user
  namespaces); otherwise an audit hook refuses to create sockets in Python code;
- a fresh working directory (deleted afterwards) that is the only writable place when a mount
  namespace is available (everything else read-only); a clean, minimal environment;
- not root: a process started as root switches to ``nobody``;
- JSON over pipes to talk to it: nothing it sends is unpickled;
- a cap on what a long-lived worker prints (:class:`CappedOutput`): a bounded head reaches the
  console, the rest is counted and dropped but for a bounded tail shown when it stops.

What it does NOT protect against (say so, do not assume otherwise): reading files the user can
read (and, when Python is installed in a root-only folder, any file: the sandbox keeps the right
to read so that Python can import its standard library); kernel exploits; using up CPU time of the
machine until the wall-clock limit; and, without namespaces, native code opening sockets around
the audit hook or writing to world-writable folders. For hostile code at scale, run the reward in
a container or VM (a reward plugin can).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from polyrl.rewards._sandbox_child import own_children

_LAUNCHER = str(Path(__file__).with_name("_sandbox_child.py"))
REPORT_FD_ENV = "POLYRL_REPORT_FD"
REPORT_NONCE_ENV = "POLYRL_REPORT_NONCE"
# How long a launcher asked to stop may take to kill what its program left, before the whole
# group is killed (leaving any escaped orphans to reap_orphans).
STOP_GRACE_S = 2.0
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37

# Launchers started by this process and not yet waited for: reap_orphans leaves them alone.
_launchers: set[int] = set()
_launchers_lock = threading.Lock()


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed process; None lifts a limit. ``max_processes`` counts every
    process and thread of the sandbox user (``nobody`` when started as root)."""

    memory_mb: int | None = 1024
    cpu_s: float | None = None
    max_processes: int | None = 64
    max_file_mb: int | None = 16


@dataclass(frozen=True)
class ProgramResult:
    """How a sandboxed program ended. ``returncode`` is negative for a signal (-9: killed);
    ``timed_out`` and ``truncated`` say that we killed it (wall clock, too much output)."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool
    elapsed_s: float
    reported: bool = False  # the program wrote the nonce to the report channel


def clean_env(workdir: str) -> dict[str, str]:
    """The whole environment of a sandboxed process: nothing of the driver's (tokens, paths)."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        # one thread each: numeric libraries otherwise reserve memory per core, which the
        # address-space limit counts
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    if "POLYRL_SANDBOX" in os.environ:  # nested: the launcher keeps the outer sandbox
        env["POLYRL_SANDBOX"] = os.environ["POLYRL_SANDBOX"]
    return env


def _command(target: str, args: list[Any], workdir: str, limits: SandboxLimits) -> list[str]:
    """``python -I -B`` (no user site, no environment, no bytecode written); ``-S`` too for a
    program file: it gets the standard library only, and starts faster."""
    settings = {
        "workdir": workdir,
        "target": target,
        "args": args,
        "parent": os.getpid(),
        **asdict(limits),
    }
    flags = ["-I", "-B"] + (["-S"] if target.endswith(".py") else [])
    return [sys.executable, *flags, _LAUNCHER, json.dumps(settings)]


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the sandbox's whole process group (its session), then reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def end_case(proc: subprocess.Popen) -> None:
    """End a sandboxed program and everything it started: ask its launcher (SIGTERM), which
    kills and reaps the program's processes, then kill the group if it has not ended."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_GRACE_S)
    kill_group(proc)


def become_subreaper() -> None:
    """Make this process the subreaper of its descendants (Linux), so that processes a sandboxed
    program leaves behind come to it, where :func:`reap_orphans` ends them, instead of going to
    init. For a process that runs sandboxed programs and nothing else of its own: a dedicated
    worker, not a driver whose other daemons would then be adopted."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _is_subreaper() -> bool:
    if os.getpid() == 1:
        return True
    flag = ctypes.c_int(0)
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and bool(flag)


def reap_orphans() -> int:
    """Kill and reap the children of this process that sandboxed programs left behind; the
    number ended. Only in a subreaper (or PID 1), where orphans come. A child is a sandbox's
    orphan when it runs in another session than this process (every sandbox starts its own)
    and is not a launcher still at work; children this process started itself stay."""
    if not _is_subreaper():
        return 0
    ours = os.getsid(0)
    ended = 0
    while True:
        with _launchers_lock:
            found = []
            for pid in own_children():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    if pid not in _launchers and os.getsid(pid) != ours:
                        found.append(pid)
            for pid in found:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if not found:
            return ended
        for pid in found:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
                ended += 1


def run_program(
    source: str,
    stdin: str = "",
    *,
    timeout_s: float = 5.0,
    limits: SandboxLimits = SandboxLimits(),
    max_output_bytes: int = 1 << 20,
    files: Mapping[str, str] | None = None,
    report: bool = False,
) -> ProgramResult:
    """Run ``source`` as a Python program (``main.py``) in the sandbox, ``stdin`` as its input,
    ``files`` (name -> text) beside it.

    Returns within about ``timeout_s`` whatever the program does; output past
    ``max_output_bytes`` (stdout and stderr together) ends the program (``truncated``). With
    ``report``, ``reported`` says whether the program wrote the nonce of
    ``POLYRL_REPORT_NONCE`` to the file descriptor ``POLYRL_REPORT_FD`` (see the module doc).
    """
    start = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="polyrl-sandbox-")
    nonce = secrets.token_hex(16)
    read_end, write_end = os.pipe() if report else (-1, -1)
    try:
        for name, text in {"main.py": source, **(files or {})}.items():
            Path(workdir, name).write_text(text, encoding="utf-8")
        env = clean_env(workdir)
        if report:
            env.update({REPORT_FD_ENV: str(write_end), REPORT_NONCE_ENV: nonce})
        with tempfile.TemporaryFile() as stdin_file:
            stdin_file.write(stdin.encode("utf-8", "replace"))
            stdin_file.seek(0)
            with _launchers_lock:
                proc = subprocess.Popen(
                    _command("main.py", [], workdir, limits),
                    stdin=stdin_file,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    cwd=workdir,
                    env=env,
                    start_new_session=True,
                    pass_fds=(write_end,) if report else (),
                )
                _launchers.add(proc.pid)
        if report:
            os.close(write_end)
            write_end = -1
        try:
            deadline = start + timeout_s
            out, err, timed_out, truncated = _collect(proc, deadline, max_output_bytes)
            end_case(proc)  # anything it left behind
        finally:
            with _launchers_lock:
                _launchers.discard(proc.pid)
        reap_orphans()
        return ProgramResult(
            returncode=proc.returncode if proc.returncode is not None else -signal.SIGKILL,
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            timed_out=timed_out,
            truncated=truncated,
            elapsed_s=time.monotonic() - start,
            # Only a run the launcher saw to its end: a program that kills its launcher dies
            # with it (parent-death signal), racing its own report -- a verdict by timing.
            reported=report
            and proc.returncode is not None
            and proc.returncode >= 0
            and _read_report(read_end) == nonce.encode(),
        )
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(workdir, ignore_errors=True)


def _read_report(fd: int) -> bytes:
    """What the program wrote to the report channel (it has ended: nothing more will come)."""
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 4096)
    except BlockingIOError:
        return b""


def _collect(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[bytes, bytes, bool, bool]:
    """Read stdout and stderr until both close, the deadline passes or ``cap`` bytes came."""
    chunks: dict[int, bytearray] = {1: bytearray(), 2: bytearray()}
    with selectors.DefaultSelector() as sel:
        assert proc.stdout is not None and proc.stderr is not None
        sel.register(proc.stdout, selectors.EVENT_READ, 1)
        sel.register(proc.stderr, selectors.EVENT_READ, 2)
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                end_case(proc)
                return bytes(chunks[1]), bytes(chunks[2]), True, False
            for key, _ in sel.select(timeout=remaining):
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fileobj)
                    continue
                chunks[key.data] += data
                if len(chunks[1]) + len(chunks[2]) > cap:
                    end_case(proc)
                    return bytes(chunks[1][:cap]), bytes(chunks[2][:cap]), False, True
    proc.stdout.close()
    proc.stderr.close()
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        end_case(proc)
        return bytes(chunks[1]), bytes(chunks[2]), True, False
    return bytes(chunks[1]), bytes(chunks[2]), False, False


# ---- long-lived sandboxed workers, spoken to in JSON lines --------------------------------------
def to_json(value: Any) -> Any:
    """``json.dumps`` fallback for what parquet rows hold: numpy arrays and scalars, bytes."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    raise TypeError(f"cannot send a {type(value).__name__} to a sandboxed process")


class JsonLines:
    """A message connection over two file descriptors, one JSON document per line (the
    ``send``/``recv``/``poll``/``fileno`` of ``multiprocessing.connection.Connection``).

    Meant for request/response use: a buffered second line is not signalled by ``fileno``."""

    def __init__(self, read: IO[bytes], write: IO[bytes]) -> None:
        self._read = read
        self._fd = read.fileno()  # read with os.read: the file object's buffer stays unused
        self._write = write
        self._buffer = bytearray()

    def fileno(self) -> int:
        return self._fd

    def send(self, message: Any) -> None:
        try:
            line = json.dumps(message, default=to_json, allow_nan=True)
        except ValueError as exc:  # a circular structure: not the pipe's fault
            raise TypeError(str(exc)) from exc
        self._write.write(line.encode() + b"\n")
        self._write.flush()

    def poll(self) -> bool:
        if b"\n" in self._buffer:
            return True
        with selectors.DefaultSelector() as sel:
            sel.register(self._fd, selectors.EVENT_READ)
            return bool(sel.select(timeout=0))

    def recv(self) -> Any:
        while b"\n" not in self._buffer:
            data = os.read(self._fd, 65536)
            if not data:
                raise EOFError("the sandboxed process closed its output")
            self._buffer += data
        line, _, rest = self._buffer.partition(b"\n")
        self._buffer = bytearray(rest)
        return json.loads(line)

    def close(self) -> None:
        for stream in (self._write, self._read):
            with contextlib.suppress(OSError):
                stream.close()


def serve_stdio() -> JsonLines:
    """In a sandboxed worker: the connection to the driver over stdin/stdout. What the worker's
    code prints goes to stderr instead, so it cannot corrupt the messages."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    return JsonLines(os.fdopen(0, "rb"), out)


#: What a sandboxed worker may print to the console over its life; past it, its output is
#: dropped (counted) but for the last ``OUTPUT_TAIL_BYTES``, shown when the worker stops.
OUTPUT_HEAD_BYTES = 64 << 10
OUTPUT_TAIL_BYTES = 16 << 10


class CappedOutput:
    """Drains a worker's output pipe in a thread: the first ``head`` bytes go to the console as
    they come, the rest is counted and dropped but for the last ``tail`` bytes, which
    :meth:`close` shows with how much was dropped. Why: code in the sandbox (a reward function,
    model output it runs) can print without end -- hundreds of MB reached the console in one
    step -- and nothing it does may flood the run's console or the driver's memory."""

    def __init__(
        self,
        pipe: IO[bytes],
        name: str,
        *,
        head: int = OUTPUT_HEAD_BYTES,
        tail: int = OUTPUT_TAIL_BYTES,
        console: IO[str] | None = None,
    ) -> None:
        self.name, self.head, self.tail = name, head, tail
        self.shown = self.dropped = 0
        self._console = console
        self._pipe = pipe
        self._last = bytearray()
        self._thread = threading.Thread(target=self._drain, name=f"{name}-output", daemon=True)
        self._thread.start()

    def _write(self, text: str) -> None:
        console = self._console or sys.stderr
        with contextlib.suppress(OSError, ValueError):
            console.write(text)
            console.flush()

    def _drain(self) -> None:
        fd = self._pipe.fileno()
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:
                break
            if not data:
                break
            room = max(0, self.head - self.shown)
            if room:
                shown = data[:room]
                self.shown += len(shown)
                self._write(shown.decode("utf-8", "replace"))
                data = data[room:]
                if data:
                    self._write(
                        f"\n[polyrl] {self.name} printed more than {self.head} bytes: the rest "
                        f"is dropped (its last {self.tail} bytes are shown when it stops)\n"
                    )
            if data:
                self.dropped += len(data)
                self._last += data
                del self._last[: -self.tail]
        with contextlib.suppress(OSError):
            self._pipe.close()

    def close(self, timeout_s: float = 2.0) -> None:
        """Wait for the pipe to close (the worker has ended), then show the tail of what was
        dropped; idempotent."""
        self._thread.join(timeout_s)
        if self.dropped:
            kept = len(self._last)
            self._write(
                f"[polyrl] {self.name}: {self.dropped} bytes of its output were dropped; the "
                f"last {kept} of them:\n{self._last.decode('utf-8', 'replace')}\n"
                f"[polyrl] end of {self.name}'s output\n"
            )
            self.dropped = 0


class SandboxedProcess:
    """A long-lived sandboxed worker running ``target`` (``module:function``, called with
    ``args``), with the few ``multiprocessing.Process`` members the reward runner uses. What it
    prints (stdout and stderr: the JSON channel has its own descriptor) is capped
    (:class:`CappedOutput`)."""

    def __init__(self, target: str, args: list[Any], limits: SandboxLimits, name: str) -> None:
        self.name = name
        self.workdir = tempfile.mkdtemp(prefix="polyrl-sandbox-")
        self._proc = subprocess.Popen(
            _command(target, args, self.workdir, limits),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=self.workdir,
            env=clean_env(self.workdir),
            start_new_session=True,
        )
        assert self._proc.stdin is not None and self._proc.stdout is not None
        assert self._proc.stderr is not None
        self.conn = JsonLines(self._proc.stdout, self._proc.stdin)
        self.output = CappedOutput(self._proc.stderr, f"reward worker {name}")
        self.sentinel = os.pidfd_open(self._proc.pid)
        self._released = False

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def exitcode(self) -> int | None:
        return self._proc.poll()

    def is_alive(self) -> bool:
        return self._proc.poll() is None

    def join(self, timeout: float | None = None) -> None:
        """Wait for the process; once it has ended, release what it had (as :meth:`kill`)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=timeout)
        if self._proc.returncode is not None:
            self.kill()

    def kill(self) -> None:
        """Kill the whole group, free the pipes and delete the working directory (idempotent)."""
        kill_group(self._proc)
        if self._released:
            return
        self._released = True
        for closer in (self.conn.close, lambda: os.close(self.sentinel)):
            with contextlib.suppress(OSError):
                closer()
        self.output.close()
        shutil.rmtree(self.workdir, ignore_errors=True)
