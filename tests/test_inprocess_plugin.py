"""A plugin registered in-process with ``polyrl.register`` (as in a notebook: no package, no
entry point) is selected by the run plan and reaches the Ray workers of a real ``recipe=tiny``
run: the actor's update calls it there.

The loss lives in the script's ``__main__`` and in a module next to it that no installed
distribution provides; both must travel to the workers by value.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

LOSS_MODULE = """
from polyrl.algorithms.policy_loss import vanilla_policy_loss


def marked_loss(batch, log_prob, config):
    loss, metrics = vanilla_policy_loss(batch, log_prob, config)
    return loss, {**metrics, "marked_calls": 1.0}
"""

SCRIPT = """
import sys

import polyrl
from polyrl.specs import PolicyLossSpec
from my_losses import marked_loss  # a module of the user's, not installed


def main_loss(batch, log_prob, config):  # defined in __main__, as in a notebook
    loss, metrics = marked_loss(batch, log_prob, config)
    return loss, {**metrics, "main_calls": 1.0}


polyrl.register(PolicyLossSpec(name="marked", description="vanilla, marked", fn=main_loss))
polyrl.train([
    "recipe=tiny",
    "actor_rollout_ref.actor.policy_loss.loss_mode=marked",
    "trainer.total_training_steps=2",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.export_hf_model=false",
    f"trainer.default_local_dir={sys.argv[1]}",
])
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_in_process_loss_trains_end_to_end_on_ray(tmp_path: Path) -> None:
    (tmp_path / "my_losses.py").write_text(textwrap.dedent(LOSS_MODULE))
    script = tmp_path / "notebook.py"
    script.write_text(textwrap.dedent(SCRIPT))
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYRL_")}
    done = subprocess.run(
        [sys.executable, str(script), str(out)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=280, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r.get("step", 0) >= 1]
    assert len(steps) == 2
    for record in steps:
        assert record["actor/main_calls"] == 1.0
        assert record["actor/marked_calls"] == 1.0
