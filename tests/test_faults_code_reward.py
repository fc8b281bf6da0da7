"""Model-written programs that attack the process table or the verdict, scored by the code
reward the way a run scores them: in a sandboxed reward worker, one sample after the other.
Each one may fail only its own sample; the honest samples around it score as ever."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

pytest.importorskip("polyrl_reward_code")

from polyrl.api.testing import schema_config
from polyrl.interfaces.reward import RewardSample
from polyrl.rewards._worker import ScorerRef
from polyrl.rewards.runner import RewardRunner
from polyrl.rewards.sandbox import SandboxLimits
from polyrl.rewards.scorers import plugin_scorer_refs

HONEST = "def add(a, b):\n    return a + b\n"
TESTS = {"tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]}
MARKER = f"4321.{os.getpid()}"
SETTINGS = {
    "score": "fraction",
    "case_timeout_s": 1.5,
    "max_parallel": 2,
    "memory_mb": 256,
    "max_output_kb": 64,
    "max_processes": 64,
}


def _daemon(then: str) -> str:
    """Starts a double-forked, setsid'd sleeper (``MARKER`` on its command line), then ``then``."""
    return (
        "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        f"        os.execv('/bin/sleep', ['sleep', '{MARKER}'])\n    os._exit(0)\n"
        f"os.wait()\n{HONEST}{then}"
    )


ATTACKS = {
    "fork bomb": "import os\nwhile True:\n    os.fork()\n",
    "memory bomb": "x = bytearray(8 * 1024**3)\n" + HONEST,
    "sleeper": "import time\ntime.sleep(60)\n" + HONEST,
    "raise SystemExit": "raise SystemExit\n" + HONEST,
    "sys.exit(0)": "import sys\nsys.exit(0)\n" + HONEST,
    "os._exit(0)": "import os\nos._exit(0)\n" + HONEST,
    # honest otherwise; their daemons must not outlive the case. The first passes. The second
    # kills the launcher guarding it, and so itself (it dies with its launcher): its case fails,
    # however far it got, and its daemon falls to the reward worker, which ends it.
    "double-forked daemon": _daemon(""),
    "daemon killing its launcher": _daemon("import signal\nos.kill(os.getppid(), 9)\n"),
}
EXPECTED = {name: 1.0 if name == "double-forked daemon" else 0.0 for name in ATTACKS}


def _daemons() -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if MARKER.encode() in cmdline:
            found.append(pid)
    return found


def test_each_attack_costs_only_its_own_sample():
    texts = ["honest"]
    for name in ATTACKS:
        texts += [name, "honest"]
    samples = [
        RewardSample(
            index=i,
            data_source="code",
            solution_str=f"```python\n{ATTACKS.get(name, HONEST)}```",
            ground_truth=TESTS,
        )
        for i, name in enumerate(texts)
    ]
    reward_model = schema_config().reward_model  # every installed scorer's section
    reward_model.code = OmegaConf.merge(reward_model.code, SETTINGS)
    scorer = ScorerRef(plugins=plugin_scorer_refs(reward_model))
    with RewardRunner(scorer, num_workers=1, timeout_s=20, sandbox=SandboxLimits()) as runner:
        results = runner.score(samples)
        leftovers = _daemons()  # while the worker that would have adopted them still lives
    got = {(i, name): (r.score, r.error) for i, (name, r) in enumerate(zip(texts, results))}
    want = {(i, name): (EXPECTED.get(name, 1.0), None) for i, name in enumerate(texts)}
    assert got == want
    assert leftovers == []
