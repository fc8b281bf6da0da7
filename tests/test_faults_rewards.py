"""A run that learns nothing must not exit 0: rewards that always fail stop it with one line."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import ray

from polyrl.api.testing import IN_PROCESS_OVERRIDES, run_polyrl_here

pytestmark = pytest.mark.slow

BROKEN_SCORERS = {
    "raises": "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
    "    raise ValueError('my scorer is broken')\n",
    "nan": "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
    "    return float('nan')\n",
    "no_score_key": "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
    "    return {'acc': 1.0}\n",
}


@pytest.mark.parametrize("kind", sorted(BROKEN_SCORERS))
def test_a_reward_that_always_fails_stops_the_run_with_its_error(kind: str, tmp_path: Path) -> None:
    scorer = tmp_path / "scorer.py"
    scorer.write_text(BROKEN_SCORERS[kind])
    start = time.monotonic()
    done = run_polyrl_here(
        "train", "recipe=tiny", *IN_PROCESS_OVERRIDES,
        f"trainer.default_local_dir={tmp_path / 'run'}", f"custom_reward_function.path={scorer}",
        "trainer.val_before_train=false", "trainer.total_training_steps=10",
    )  # fmt: skip
    elapsed = time.monotonic() - start
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: reward scoring failed for 64 of 64 samples over steps 1-2")
    assert "most common error" in last
    assert elapsed < 180
    assert not (tmp_path / "run" / "global_step_10").exists()


def test_a_run_shorter_than_the_failure_window_whose_rewards_all_failed_exits_2(
    tmp_path: Path,
) -> None:
    scorer = tmp_path / "scorer.py"
    scorer.write_text(BROKEN_SCORERS["raises"])
    done = run_polyrl_here(
        "train", "recipe=tiny", *IN_PROCESS_OVERRIDES,
        f"trainer.default_local_dir={tmp_path / 'run'}", f"custom_reward_function.path={scorer}",
        "trainer.val_before_train=false", "trainer.total_training_steps=1",
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: reward scoring failed for 32 of 32 samples over steps 1-1")
    assert "finished" not in done.stdout


USER_FILES_THAT_END_OR_BLOCK = {
    "sys_exit": ("import sys\nsys.exit(0)\n", "failed to import: SystemExit: 0"),
    "os_exit": ("import os\nos._exit(0)\n", "ended the Python process while being imported"),
    "blocks": ("import time\ntime.sleep(600)\n", "did not finish importing within 3 s"),
}


@pytest.mark.parametrize("kind", sorted(USER_FILES_THAT_END_OR_BLOCK))
def test_a_reward_file_that_exits_or_blocks_at_import_is_one_line_naming_it(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run over Ray (the default backend), stopped before Ray: ``ray.init`` is never called.
    The run may share this process: polyrl imports the file in a process of its own, which is
    what the file ends or blocks."""
    source, expected = USER_FILES_THAT_END_OR_BLOCK[kind]
    scorer = tmp_path / f"{kind}.py"
    scorer.write_text(source + "def compute_score(*args):\n    return 1.0\n")
    ray_inits: list[dict] = []

    def no_ray(**kwargs: object) -> None:
        ray_inits.append(kwargs)
        raise AssertionError("the run started or joined Ray")

    monkeypatch.setattr(ray, "init", no_ray)
    start = time.monotonic()
    done = run_polyrl_here(
        "train", "recipe=tiny", f"trainer.default_local_dir={tmp_path / 'run'}",
        f"custom_reward_function.path={scorer}", "custom_reward_function.load_timeout_s=3",
    )  # fmt: skip
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: custom_reward_function.path='{scorer}'")
    assert expected in last
    assert time.monotonic() - start < 60
    assert not ray_inits  # stopped before Ray
