"""The sandbox's launcher: the first code that runs in a sandboxed process, before any untrusted
code. Run as a script (``python -I [-S] -B _sandbox_child.py '<json settings>'``) by
:mod:`polyrl.rewards.sandbox`; it uses the standard library only, because with ``-S`` no
site-packages are on the path.

Order matters, each step needing the privileges the next one drops:

1. new network, mount and PID namespaces (``unshare``; as an unprivileged user inside a new user
   namespace). No network namespace: socket creation is refused by an audit hook instead, which
   code that loads native libraries can get around (the docs say so);
2. in the mount namespace, every mount read-only except the working directory;
3. become a child subreaper and fork: the target runs in the child (PID 1 of the new PID
   namespace when there is one: when it exits the kernel kills every process it left). The
   launcher stays behind as the case's undertaker: every process the target leaves -- a
   double-forked daemon that called ``setsid`` included -- is re-parented to the launcher, which
   kills and reaps all of them when the target exits or when the parent asks it to stop
   (SIGTERM), then passes on the target's status. Without this, a sandbox nested in a reward
   worker (no namespaces of its own) would leave its orphans to that worker, alive or as
   zombies that count against the process limit of every later sample;
4. as root, switch to ``nobody`` (keeping only the right to read files when the Python install
   is not readable by others), and set ``no_new_privs`` so no set-user-ID program gains rights;
5. resource limits, then run the target (a file as ``__main__``, or ``module:function``).

``POLYRL_SANDBOX`` in the environment lists what was applied; a sandbox started inside another
(the code reward scoring inside a sandboxed reward worker) keeps the outer namespaces and user
and only adds its own limits and directory.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MOUNT_ATTR_RDONLY = 0x1
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
SYS_MOUNT_SETATTR = 442  # the same number on every Linux architecture (added in 5.12)
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_KEEPCAPS = 8
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_RAISE = 2
CAP_DAC_READ_SEARCH = 2
NOBODY = 65534

_libc = ctypes.CDLL(None, use_errno=True)


class _MountAttr(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("attr_set", "attr_clr", "propagation", "userns")]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in ("effective", "permitted", "inheritable")]


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _unshare(root: bool) -> list[str]:
    """Enter new namespaces; the names of those entered (none when the OS refuses)."""
    uid, gid = os.getuid(), os.getgid()
    user = 0 if root else CLONE_NEWUSER
    for flags, names in (
        (CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID, ["netns", "mountns", "pidns"]),
        (CLONE_NEWNET, ["netns"]),
    ):
        if _libc.unshare(flags | user) == 0:
            if not root:  # map our own ids, so files we create have an owner
                _write("/proc/self/uid_map", f"{uid} {uid} 1")
                _write("/proc/self/setgroups", "deny")
                _write("/proc/self/gid_map", f"{gid} {gid} 1")
            return names
    return []


def _read_only_except(workdir: str) -> None:
    """Every mount of this mount namespace read-only, but ``workdir`` (bind-mounted on itself)."""
    _check(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make mounts private")
    path = workdir.encode()
    _check(_libc.mount(path, path, None, MS_BIND | MS_REC, None), "bind the working directory")
    syscall = _libc.syscall
    read_only = _MountAttr(attr_set=MOUNT_ATTR_RDONLY)
    size = ctypes.sizeof(_MountAttr)
    args = (AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(read_only), size)
    _check(syscall(SYS_MOUNT_SETATTR, *args), "make mounts read-only")
    writable = _MountAttr(attr_clr=MOUNT_ATTR_RDONLY)
    _check(syscall(SYS_MOUNT_SETATTR, AT_FDCWD, path, 0, ctypes.byref(writable), size), "workdir")


def _others_can_read(path: str) -> bool:
    """Whether a user with no rights of its own can reach and read ``path``."""
    path = os.path.realpath(path)
    if not os.path.exists(path):
        return True
    parts = path.split(os.sep)
    for i in range(2, len(parts)):
        if not os.stat(os.sep.join(parts[:i]) or os.sep).st_mode & 0o001:
            return False
    return bool(os.stat(path).st_mode & 0o004)


def _drop_root(workdir: str) -> str:
    """Become ``nobody``. When the Python installation is not readable by others (a root-only
    home folder), keep the one capability to read files, ambient so nested Pythons keep it."""
    for base, dirs, files in os.walk(workdir):
        for name in [base] + [os.path.join(base, n) for n in dirs + files]:
            os.chown(name, NOBODY, NOBODY)
    needed = [sys.executable, *(p for p in sys.path if p)]
    keep_read = not all(_others_can_read(p) for p in needed)
    if keep_read:
        _check(_libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0), "keep capabilities")
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    if not keep_read:
        return "user=nobody"
    header = _CapHeader(version=0x20080522, pid=0)
    bit = 1 << CAP_DAC_READ_SEARCH
    data = (_CapData * 2)(_CapData(bit, bit, bit), _CapData(0, 0, 0))
    _check(_libc.capset(ctypes.byref(header), data), "capset")
    _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_DAC_READ_SEARCH, 0, 0), "ambient")
    return "user=nobody+read-all"


def _limit(settings: dict) -> None:
    mb = 1024 * 1024
    for name, key, scale, slack in (
        ("RLIMIT_AS", "memory_mb", mb, 0),
        ("RLIMIT_CPU", "cpu_s", 1, 1),
        ("RLIMIT_NPROC", "max_processes", 1, 0),
        ("RLIMIT_FSIZE", "max_file_mb", mb, 0),
    ):
        value = settings.get(key)
        if value is not None:
            soft = int(value * scale)
            resource.setrlimit(getattr(resource, name), (soft, soft + slack))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _block_sockets() -> None:
    """Refuse network sockets from Python code (the fallback without a network namespace)."""
    import socket

    families = {socket.AF_INET, socket.AF_INET6}

    def hook(event: str, args: tuple) -> None:
        if event == "socket.__new__" and args[1] in families:
            raise PermissionError("network access is disabled in the polyrl sandbox")
        if event in ("socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo"):
            raise PermissionError("network access is disabled in the polyrl sandbox")

    sys.addaudithook(hook)


def _ns_pids(status_path: str) -> list[int]:
    """The ``NSpid`` line of a ``/proc/.../status``: the pid in each PID namespace, from the
    namespace of the mounted /proc down to the process's own."""
    with open(status_path) as fh:
        for line in fh:
            if line.startswith("NSpid:"):
                return [int(pid) for pid in line.split()[1:]]
    return []


def own_children() -> list[int]:
    """The live and zombie children of this process, as pids of its own namespace. /proc may
    belong to an outer PID namespace (a sandbox mounts none of its own), where the pids it lists
    differ: each is translated through its ``NSpid``."""
    try:
        depth = len(_ns_pids("/proc/self/status")) - 1
        listed: list[int] = []
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as fh:
                listed += [int(pid) for pid in fh.read().split()]
    except (OSError, ValueError):  # no /proc: the blocking wait still reaps what exits
        return []
    pids = []
    for pid in listed:
        try:
            ns_pids = _ns_pids(f"/proc/{pid}/status")
        except OSError:  # gone meanwhile
            continue
        if len(ns_pids) > depth >= 0:
            pids.append(ns_pids[depth])
    return pids


def _kill_descendants() -> None:
    """SIGKILL and reap every process left: each round kills the children seen, whose own
    children then come to this subreaper; a fork bomb cannot outrun it (it cannot fork once
    killed, and the process limit caps what it has)."""
    while True:
        for pid in own_children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


class _Stop(Exception):
    """The parent asked the case to end (SIGTERM)."""


def _stop(signum: int, frame: object) -> None:
    raise _Stop


def _supervise(child: int) -> None:
    """The launcher's part after forking the target: wait for it (reaping adopted orphans on
    the way), kill whatever it left, and exit as it did (a signal as the same signal)."""
    signal.signal(signal.SIGTERM, _stop)
    os.closerange(0, 2)  # stdin, stdout: the parent sees EOF when the target's side closes
    os.closerange(3, 1 << 16)  # the report channel and anything else: the target's alone
    try:
        while True:
            pid, status = os.waitpid(-1, 0)
            if pid == child:
                break
    except _Stop:
        status = signal.SIGKILL  # a wait status: killed by SIGKILL
        os.kill(child, signal.SIGKILL)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # from here on nothing interrupts the cleanup
    _kill_descendants()
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig != signal.SIGKILL:
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status))


def _run(target: str, args: list) -> None:
    if ":" in target and not target.endswith(".py"):
        module, _, function = target.partition(":")
        __import__(module)
        getattr(sys.modules[module], function)(*args)
        return
    import runpy

    sys.argv = [target]
    runpy.run_path(target, run_name="__main__")


def main() -> None:
    settings = json.loads(sys.argv[1])
    workdir = settings["workdir"]
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "parent-death signal")
    if os.getppid() != settings["parent"]:  # the process that started us is already gone
        os._exit(137)
    nested = "POLYRL_SANDBOX" in os.environ
    root = os.geteuid() == 0
    applied = ["nested"] if nested else _unshare(root)
    if "mountns" in applied:
        try:
            _read_only_except(workdir)
            applied.append("read-only-fs")
        except OSError:
            pass
    _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "child subreaper")
    child = os.fork()
    if child:
        _supervise(child)
    if root and not nested:
        applied.append(_drop_root(workdir))
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    # Set again: forking and changing user clear it. The target dies with the launcher (and,
    # in a PID namespace, with it every process of the namespace).
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "parent-death signal")
    if not nested and "netns" not in applied:
        _block_sockets()
        applied.append("socket-hook")
    os.chdir(workdir)
    os.environ["POLYRL_SANDBOX"] = ",".join(applied)
    _limit(settings)
    _run(settings["target"], settings.get("args", []))


if __name__ == "__main__":
    main()
