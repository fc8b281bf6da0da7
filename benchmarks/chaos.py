"""Chaos run: ``recipe=tiny`` on CPU while random Ray workers and, separately, the whole driver
are killed -9 at random moments; the result must equal an undisturbed run's.

The run under chaos is the plain ``polyrl train`` command with ``trainer.max_restarts`` set, so a
lost worker is replaced by the controller itself; a killed driver (its whole session: driver,
Ray's GCS and raylet, workers, as a scheduler or the OOM killer does it) is answered by an outer
loop that starts the very same command again until it exits 0 (``resume_mode=auto`` continues
from the newest complete checkpoint). Afterwards:

* the exported weights equal those of an undisturbed run of the same command, tensor by tensor,
  bitwise (CPU, float32: the seeds make both runs draw the same samples);
* ``metrics.jsonl`` holds every step exactly once;
* the report gives the kills survived, the restarts the controller made, the finished steps
  that had to be trained again (the controller's ``restarts.jsonl`` for worker kills; the last
  logged step minus the checkpoint resumed from for driver kills) and the wall-time overhead
  against the undisturbed run.

    python benchmarks/chaos.py                    # 100 steps, 6 worker kills, 4 driver kills
    python benchmarks/chaos.py --steps 6 --worker-kills 1 --driver-kills 1 --concurrent  # the test
    python benchmarks/chaos.py --json report.json # the report as JSON too

Exit status 0 when every check holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

ENV = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "MASTER_ADDR": "127.0.0.1",
    "WANDB_MODE": "offline",
    "HF_HUB_OFFLINE": "1",
    "PYTHONUNBUFFERED": "1",
}
RUN_TIMEOUT_S = 900
STEP_LINE = re.compile(r"^\[polyrl\] step (\d+)/", re.MULTILINE)


def train_command(
    out: Path, steps: int, save_freq: int, max_restarts: int, overrides: list[str]
) -> list[str]:
    return [
        sys.executable, "-m", "polyrl", "train", "recipe=tiny",
        f"trainer.default_local_dir={out}", f"trainer.total_training_steps={steps}",
        f"trainer.save_freq={save_freq}", f"trainer.max_restarts={max_restarts}",
        "trainer.test_freq=-1", "trainer.val_before_train=false", *overrides,
    ]  # fmt: skip


def metric_steps(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def newest_checkpoint(out: Path) -> int:
    steps = [
        int(m.group(1))
        for p in out.glob("global_step_*")
        if (m := re.fullmatch(r"global_step_(\d+)", p.name)) and (p / "COMPLETE").is_file()
    ]
    return max(steps, default=0)


class Attempt:
    """One start of the command, in a session of its own (so that all of it can be killed)."""

    def __init__(self, cmd: list[str], log: Path) -> None:
        self.log = log
        self.log_start = log.stat().st_size if log.exists() else 0
        with open(log, "a") as fh:
            self.proc = subprocess.Popen(
                cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, **ENV},
            )  # fmt: skip

    def trained_step(self) -> int:
        """The last step this attempt has trained (0 before its first). Not metrics.jsonl's last
        step: after a driver kill that still holds the steps of the attempt before, and a kill
        planned at one of them would strike while the workers start, before the controller
        can restart anything."""
        with open(self.log, "rb") as fh:
            fh.seek(self.log_start)
            found = STEP_LINE.findall(fh.read().decode("utf-8", "replace"))
        return int(found[-1]) if found else 0

    def session(self) -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                if os.getsid(proc.pid) == self.proc.pid:
                    found.append(proc)
        return found

    def busy_workers(self) -> list[psutil.Process]:
        """Ray worker processes running a call (Ray titles them ``ray::Worker.<method>``)."""
        busy = []
        for proc in self.session():
            with contextlib.suppress(psutil.Error):
                title = proc.cmdline()[:1]
                if title and title[0].startswith("ray::Worker."):
                    busy.append(proc)
        return busy

    def kill_all(self) -> None:
        """kill -9 of every process of the session, then wait for the driver."""
        for proc in self.session():
            with contextlib.suppress(psutil.Error):
                proc.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)
        deadline = time.monotonic() + 30
        while self.session() and time.monotonic() < deadline:
            time.sleep(0.2)


@dataclass
class Report:
    steps: int
    worker_kills: int = 0
    driver_kills: int = 0
    restarts: int = 0
    steps_lost_to_worker_kills: int = 0
    steps_lost_to_driver_kills: int = 0
    reference_wall_s: float = 0.0
    chaos_wall_s: float = 0.0
    weights_equal: bool = False
    every_step_once: bool = False
    cpus: int = field(default_factory=lambda: os.cpu_count() or 0)
    # the machine's 1-minute load average as each run ended (other work shares the cores)
    load_after_reference: float = 0.0
    load_after_chaos: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def overhead(self) -> float | None:
        """Wall time lost to the kills, as a share of the undisturbed run's (None: the runs
        were concurrent)."""
        return self.chaos_wall_s / self.reference_wall_s - 1 if self.reference_wall_s else None

    def _against(self) -> str:
        if self.overhead is None:
            return " (the undisturbed run beside it: no overhead measured)"
        return f" vs {self.reference_wall_s:.0f} s undisturbed (+{100 * self.overhead:.0f}%)"

    def text(self) -> str:
        return (
            f"chaos run, {self.steps} steps: survived {self.worker_kills} worker kill(s) "
            f"({self.restarts} controller restart(s), {self.steps_lost_to_worker_kills} step(s) "
            f"trained again) and {self.driver_kills} driver kill(s) "
            f"({self.steps_lost_to_driver_kills} step(s) trained again); wall "
            f"{self.chaos_wall_s:.0f} s{self._against()}; final weights bitwise equal: "
            f"{self.weights_equal}; "
            f"every step logged exactly once: {self.every_step_once}; {self.cpus} CPUs, load "
            f"{self.load_after_reference:.1f} / {self.load_after_chaos:.1f} after each run"
        )


def wait_for_step(attempt: Attempt, step: int) -> bool:
    """Until this attempt has trained ``step`` or a later one (False when it ended first)."""
    while attempt.proc.poll() is None:
        if attempt.trained_step() >= step:
            return True
        time.sleep(0.05)
    return False


def kill_a_busy_worker(attempt: Attempt, patience_s: float = 20.0) -> bool:
    deadline = time.monotonic() + patience_s
    while attempt.proc.poll() is None and time.monotonic() < deadline:
        busy = attempt.busy_workers()
        if busy:
            with contextlib.suppress(psutil.Error):
                random.choice(busy).kill()
                return True
        time.sleep(0.002)
    return False


def chaos_run(args: argparse.Namespace, out: Path, log: Path, report: Report) -> None:
    """The outer loop: start the command, kill what the plan says when its step comes, start it
    again after a driver kill, until it exits 0."""
    cmd = train_command(out, args.steps, args.save_freq, args.worker_kills, args.overrides)
    # at which logged step each kill strikes (then at a random moment of the following step)
    kinds = ["worker"] * args.worker_kills + ["driver"] * args.driver_kills
    at_steps = sorted(random.sample(range(1, args.steps), len(kinds)))
    random.shuffle(kinds)
    plan = list(zip(at_steps, kinds))
    for attempt_number in range(len(plan) + 3):
        attempt = Attempt(cmd, log)
        while plan and wait_for_step(attempt, plan[0][0]):
            _step, kind = plan.pop(0)
            time.sleep(random.uniform(0.0, 0.3))
            if kind == "worker":
                report.worker_kills += kill_a_busy_worker(attempt)
                continue
            logged = (metric_steps(out) or [0])[-1]
            attempt.kill_all()
            report.driver_kills += 1
            report.steps_lost_to_driver_kills += max(0, logged - newest_checkpoint(out))
            break
        else:
            code = attempt.proc.wait(timeout=RUN_TIMEOUT_S)
            if code == 0:
                return
            report.problems.append(f"attempt {attempt_number + 1} exited {code} (see {log})")
            return
    report.problems.append("the run did not finish")


def compare_weights(reference: Path, chaos: Path) -> bool:
    import torch
    from safetensors.torch import load_file

    a = load_file(str(reference / "hf_model" / "model.safetensors"))
    b = load_file(str(chaos / "hf_model" / "model.safetensors"))
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--save-freq", type=int, default=2)
    parser.add_argument("--worker-kills", type=int, default=6)
    parser.add_argument("--driver-kills", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0, help="of the kill plan")
    parser.add_argument("--dir", type=Path, default=None, help="default: a temporary folder")
    parser.add_argument("--json", type=Path, default=None, help="write the report here too")
    parser.add_argument(
        "--concurrent",
        action="store_true",
        help="run the undisturbed run beside the chaos run (faster; the two share the machine, "
        "so no wall-time overhead is measured)",
    )
    parser.add_argument("overrides", nargs="*", help="more polyrl train overrides, for both runs")
    args = parser.parse_args(argv)
    if args.worker_kills + args.driver_kills >= args.steps:
        parser.error("more kills than steps")
    random.seed(args.seed)
    root = args.dir or Path(tempfile.mkdtemp(prefix="polyrl-chaos-"))
    root.mkdir(parents=True, exist_ok=True)
    report = Report(steps=args.steps)

    reference, chaos = root / "reference", root / "chaos"
    start = time.monotonic()
    ref_cmd = train_command(reference, args.steps, args.save_freq, 0, args.overrides)
    ref = Attempt(ref_cmd, root / "reference.log")
    if not args.concurrent:
        if ref.proc.wait(timeout=RUN_TIMEOUT_S) != 0:
            print(f"the undisturbed run failed: see {root / 'reference.log'}", file=sys.stderr)
            return 1
        report.reference_wall_s = time.monotonic() - start
        report.load_after_reference = os.getloadavg()[0]
    start = time.monotonic()
    chaos_run(args, chaos, root / "chaos.log", report)
    report.chaos_wall_s = time.monotonic() - start
    report.load_after_chaos = os.getloadavg()[0]
    if ref.proc.wait(timeout=RUN_TIMEOUT_S) != 0:
        print(f"the undisturbed run failed: see {root / 'reference.log'}", file=sys.stderr)
        return 1
    restarts_file = chaos / "restarts.jsonl"
    if restarts_file.exists():
        restarts = [json.loads(line) for line in restarts_file.read_text().splitlines()]
        report.restarts = len(restarts)
        report.steps_lost_to_worker_kills = sum(r["steps_lost"] for r in restarts)
    if not report.problems:
        report.every_step_once = metric_steps(chaos) == list(range(1, args.steps + 1))
        report.weights_equal = compare_weights(reference, chaos)
    print(report.text())
    for problem in report.problems:
        print(f"problem: {problem}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps({**asdict(report), "overhead": report.overhead}, indent=2))
    ok = not report.problems and report.weights_equal and report.every_step_once
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
