"""What user code in the reward path may do to the run (issue 30.6, 30.7), with real sandboxed
reward workers: a custom reward that prints 100 MB under ``reward_model.sandbox=always`` reaches
the console as a bounded head and tail and a count of what was dropped; ``sandbox=never`` says in
one line which scorers then evaluate model output unsandboxed, and where; ``num_workers=0`` scores
in one sandboxed child (not in the driver) unless ``sandbox=never``."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from polyrl.interfaces.reward import RewardContext, RewardSample
from polyrl.rewards.provider import NaiveRewardProvider
from polyrl.rewards.sandbox import OUTPUT_HEAD_BYTES, OUTPUT_TAIL_BYTES, SandboxedProcess

CHATTY = """\
import os, sys

def compute_score(data_source, solution_str, ground_truth, extra_info):
    chunk = "x" * 999 + "\\n"
    for _ in range(50_000):  # 50 MB to stdout, 50 MB to stderr
        sys.stdout.write(chunk)
        sys.stderr.write(chunk)
    print("THE END OF THE NOISE", flush=True)
    sandboxed = float("POLYRL_SANDBOX" in os.environ)
    return {"score": float(solution_str == ground_truth), "sandboxed": sandboxed}
"""

WHERE = """\
import os

def compute_score(data_source, solution_str, ground_truth, extra_info):
    sandboxed = float("POLYRL_SANDBOX" in os.environ)
    return {"score": 1.0, "pid": float(os.getpid()), "sandboxed": sandboxed}
"""


def provider(reward_model: dict, path: Path | None = None) -> NaiveRewardProvider:
    custom = {"path": str(path)} if path else {}
    return NaiveRewardProvider(RewardContext({"timeout_s": 120, **reward_model}, custom, 0))


def sample(answer: str = "ok") -> RewardSample:
    return RewardSample(index=0, data_source="mine", solution_str=answer, ground_truth="ok")


def test_a_reward_printing_100_mb_in_the_sandbox_is_capped_at_the_console(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    scorer = tmp_path / "chatty.py"
    scorer.write_text(CHATTY)
    rewards = provider({"sandbox": "always", "num_workers": 1}, scorer)
    try:
        (result,) = rewards.score([sample()])
    finally:
        rewards.close()
    assert (result.score, result.extra["sandboxed"]) == (1.0, 1.0)
    err = capfd.readouterr().err
    assert len(err) < OUTPUT_HEAD_BYTES + OUTPUT_TAIL_BYTES + 4096, len(err)
    dropped = re.search(r"(\d+) bytes of its output were dropped; the last (\d+) of them", err)
    assert dropped, err[-2000:]
    printed = 2 * 50_000 * 1000 + len("THE END OF THE NOISE\n")  # 100 MB and the end
    assert int(dropped[1]) + OUTPUT_HEAD_BYTES == printed
    assert int(dropped[2]) == OUTPUT_TAIL_BYTES
    assert "THE END OF THE NOISE" in err.split(dropped[0])[1]  # the tail is the output's end
    assert f"printed more than {OUTPUT_HEAD_BYTES} bytes: the rest is dropped" in err


def test_sandbox_never_names_the_unsandboxed_scorers_in_one_line(
    capfd: pytest.CaptureFixture[str],
) -> None:
    rewards = provider({"sandbox": "never", "num_workers": 0})
    try:
        exact = RewardSample(0, "exact_match", "<answer>8</answer>", "8")
        (result,) = rewards.score([exact])
        rewards.score([exact])  # a second step says nothing more
    finally:
        rewards.close()
    assert result.score == 1.0 and rewards.runner.worker_pids == []  # in the driver
    lines = [line for line in capfd.readouterr().err.splitlines() if "sandbox" in line]
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("polyrl: reward_model.sandbox=never: model output is evaluated")
    assert "in the driver process" in line and "math_verify" in line and "reasoning" in line
    assert "set reward_model.sandbox=auto" in line


def test_sandbox_never_with_workers_says_where(capfd: pytest.CaptureFixture[str]) -> None:
    provider({"sandbox": "never", "num_workers": 1}).close()
    assert "in plain reward worker processes" in capfd.readouterr().err


def test_the_default_sandbox_says_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    provider({"num_workers": 0}).close()
    assert "sandbox" not in capfd.readouterr().err


@pytest.mark.parametrize(("mode", "custom"), [("auto", False), ("always", True)])
def test_num_workers_0_scores_in_one_sandboxed_child(tmp_path: Path, mode: str, custom) -> None:
    scorer = tmp_path / "where.py"
    scorer.write_text(WHERE)
    rewards = provider({"sandbox": mode, "num_workers": 0}, scorer if custom else None)
    try:
        assert len(rewards.runner.worker_pids) == 1
        assert isinstance(rewards.runner._workers[0].process, SandboxedProcess)
        probe = sample() if custom else RewardSample(0, "exact_match", "a", "a")
        (result,) = rewards.score([probe])
    finally:
        rewards.close()
    assert result.score == 1.0, result.error
    if custom:
        assert result.extra["sandboxed"] == 1.0 and result.extra["pid"] != os.getpid()


def test_num_workers_0_with_never_or_a_trusted_custom_function_scores_in_the_driver(
    tmp_path: Path,
) -> None:
    scorer = tmp_path / "where.py"
    scorer.write_text(WHERE)
    for reward_model in ({"sandbox": "never", "num_workers": 0}, {"num_workers": 0}):
        rewards = provider(reward_model, scorer)  # auto leaves the user's own code unsandboxed
        try:
            (result,) = rewards.score([sample()])
        finally:
            rewards.close()
        assert rewards.runner.worker_pids == []
        assert (result.extra["pid"], result.extra["sandboxed"]) == (os.getpid(), 0.0)
