"""The sandbox for untrusted Python: real subprocesses doing what hostile or broken code does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pytest

from polyrl.interfaces.reward import RewardSample
from polyrl.rewards._worker import ScorerRef
from polyrl.rewards.runner import RewardRunner
from polyrl.rewards.sandbox import SandboxLimits, run_program

LAUNCHER = Path(__file__).parents[1] / "src/polyrl/rewards/_sandbox_child.py"


def test_a_program_reads_stdin_and_writes_stdout_in_a_fresh_folder():
    result = run_program("import os\nprint(int(input()) * 2, os.listdir('.'))", "21\n")
    assert (result.returncode, result.timed_out, result.truncated) == (0, False, False)
    assert result.stdout == "42 ['main.py']\n"


def test_the_environment_is_clean_and_not_root():
    os.environ["POLYRL_TEST_SECRET"] = "token"
    try:
        result = run_program("import os\nprint(sorted(os.environ), os.getuid())")
    finally:
        del os.environ["POLYRL_TEST_SECRET"]
    assert "POLYRL_TEST_SECRET" not in result.stdout
    if os.geteuid() == 0:
        assert result.stdout.split()[-1] == "65534"  # nobody


def test_the_network_is_unreachable():
    source = "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)\n"
    result = run_program(source)
    assert result.returncode == 1
    assert "Network is unreachable" in result.stderr or "network access is disabled" in (
        result.stderr
    )


def test_without_a_network_namespace_the_audit_hook_refuses_sockets():
    code = (
        f"import sys; sys.path.insert(0, {str(LAUNCHER.parent)!r})\n"
        "import _sandbox_child, socket\n_sandbox_child._block_sockets()\n"
        "try:\n    socket.socket()\nexcept PermissionError as e:\n    print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "network access is disabled in the polyrl sandbox"


def test_writing_outside_the_working_folder_fails_and_the_folder_is_deleted():
    target = Path(tempfile.gettempdir()) / f"polyrl-sandbox-escape-{os.getpid()}"
    source = (
        f"import os\nopen('mine.txt', 'w').write('ok')\nprint(os.getcwd())\n"
        f"open({str(target)!r}, 'w').write('escaped')\n"
    )
    result = run_program(source)
    assert result.returncode == 1
    assert "Read-only file system" in result.stderr or "Permission denied" in result.stderr
    assert not target.exists()
    assert not Path(result.stdout.strip()).exists()


def test_an_infinite_loop_is_killed_on_time():
    start = time.monotonic()
    result = run_program("while True:\n    pass\n", timeout_s=0.5)
    assert result.timed_out and result.returncode < 0
    assert time.monotonic() - start < 3


def test_a_fork_bomb_is_contained():
    start = time.monotonic()
    result = run_program("import os\nwhile True:\n    os.fork()\n", timeout_s=3)
    assert result.returncode != 0
    assert time.monotonic() - start < 5


def test_a_memory_bomb_is_contained():
    result = run_program("x = bytearray(4 * 1024**3)\n", limits=SandboxLimits(memory_mb=256))
    assert result.returncode == 1 and "MemoryError" in result.stderr


def test_exit_codes_and_shell_commands_pass_through():
    result = run_program("import os, sys\nos.system('echo from-shell')\nsys.exit(3)\n")
    assert (result.returncode, result.stdout) == (3, "from-shell\n")
    assert run_program("import os\nos._exit(7)\n").returncode == 7


def test_huge_output_is_truncated_and_the_program_stopped():
    result = run_program("while True:\n    print('y' * 1000)\n", max_output_bytes=10_000)
    assert result.truncated and len(result.stdout) == 10_000


def test_cpu_time_is_limited():
    # Killed by the CPU limit (a signal) before the 30 s wall-clock limit.
    result = run_program("while True:\n    pass\n", timeout_s=30, limits=SandboxLimits(cpu_s=1))
    assert result.returncode < 0 and not result.timed_out


def test_sandboxed_reward_workers_score_and_contain_untrusted_code(tmp_path: Path):
    scorer = tmp_path / "untrusted.py"
    scorer.write_text(
        "import os, socket\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
        "    if solution_str == 'net':\n"
        "        socket.create_connection(('1.1.1.1', 80), timeout=2)\n"
        "    if solution_str == 'exit':\n"
        "        os._exit(3)\n"
        "    print('noise on stdout does not break the protocol')\n"
        "    return {'score': float(solution_str == ground_truth), 'uid': os.getuid()}\n"
    )
    samples = [
        RewardSample(index=i, data_source="mine", solution_str=text, ground_truth="ok")
        for i, text in enumerate(["ok", "no", "net", "exit", "ok"])
    ]
    with (
        RewardRunner(
            ScorerRef(path=str(scorer)), num_workers=2, timeout_s=20, sandbox=SandboxLimits()
        ) as runner,
        warnings.catch_warnings(record=True),
    ):
        results = runner.score(samples)
    assert [r.score for r in results] == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert "Network is unreachable" in str(results[2].error)
    assert "died (exit code 3)" in str(results[3].error)
    if os.geteuid() == 0:
        assert results[0].extra["uid"] == 65534


def test_the_built_in_scorers_run_in_the_sandbox_and_numpy_values_are_sent_as_json():
    np = pytest.importorskip("numpy")
    sample = RewardSample(
        index=0,
        data_source="exact_match",
        solution_str="<answer>8</answer>",
        ground_truth=np.array(["3", "8"]),  # any of them
    )
    with RewardRunner(ScorerRef(), num_workers=1, timeout_s=30, sandbox=SandboxLimits()) as r:
        (result,) = r.score([sample])
    assert (result.error, result.score) == (None, 1.0)


def test_closing_a_sandboxed_runner_deletes_its_working_folders():
    runner = RewardRunner(ScorerRef(), num_workers=1, timeout_s=30, sandbox=SandboxLimits())
    folder = Path(runner._workers[0].process.workdir)
    assert folder.is_dir()
    runner.close()
    assert not folder.exists()


def test_the_report_channel_counts_only_the_nonce():
    fd = "int(os.environ['POLYRL_REPORT_FD'])"
    honest = f"import os\nos.write({fd}, os.environ['POLYRL_REPORT_NONCE'].encode())\n"
    assert run_program(honest, report=True).reported
    assert not run_program(f"import os\nos.write({fd}, b'0' * 32)\n", report=True).reported
    assert not run_program("pass", report=True).reported
    assert not run_program(honest).reported  # no channel asked for: none given


def test_a_report_followed_by_killing_the_launcher_counts_nothing(monkeypatch):
    """The program dies with its launcher; whether its report got out first is timing, so a
    killed launcher voids the report even when the nonce was written before the kill. Nested
    (as in a reward worker): no PID namespace, so the launcher is the program's parent."""
    monkeypatch.setenv("POLYRL_SANDBOX", "nested")
    fd = "int(os.environ['POLYRL_REPORT_FD'])"
    program = (
        f"import os, signal\nos.write({fd}, os.environ['POLYRL_REPORT_NONCE'].encode())\n"
        "os.kill(os.getppid(), signal.SIGKILL)\n"
    )
    result = run_program(program, report=True)
    assert result.returncode == -signal.SIGKILL
    assert not result.reported
