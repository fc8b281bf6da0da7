"""End to end: every policy-gradient recipe (``polyrl train recipe=<name>``) runs, as a user runs
it, and learns: the greedy validation reward on the tiny_digits task rises from before training
to after. The runs are the algorithms' tests, not Ray's: each trains in its own process without
Ray (``trainer.worker_backend=in_process``, one worker); test_train_tiny.py trains over Ray with
2 workers. Each algorithm's own machinery shows in its metrics
(ReMax's greedy baseline, DAPO's dynamic sampling, the KL penalty in the reward).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_train_tiny import split_records

from polyrl.api.testing import IN_PROCESS_OVERRIDES, run_polyrl_here
from polyrl.config.loader import load_config

pytestmark = pytest.mark.slow

RECIPES = ("grpo", "drgrpo", "rloo", "gspo", "dapo", "remax", "reinforce_plus_plus", "tool_tiny")
# Estimators without a recipe of their own, run on a recipe of the same step: id -> (recipe,
# overrides). The optimal token baseline makes the old log-prob pass compute sum_pi_squared.
ESTIMATOR_RUNS = {
    "optimal_token_baseline": ("drgrpo", ("algorithm.adv_estimator=optimal_token_baseline",)),
}
CASES = {**{recipe: (recipe, ()) for recipe in RECIPES}, **ESTIMATOR_RUNS}
VAL_REWARD = "val-core/polyrl/tiny_digits/reward/mean@1"
MIN_GAIN = 0.2  # greedy reward before training is 0.0; the recipes reach about 0.55 (README)
# Metrics that show the algorithm's own stages ran, on every step.
OWN_METRICS = {
    "rloo": ("actor/reward_kl_penalty",),
    "remax": ("remax/baseline_score/mean", "timing_s/gen_max", "actor/reward_kl_penalty"),
    "dapo": ("train/num_gen_batches", "timing_s/dynamic_sampling"),
    "tool_tiny": ("multi_turn/assistant_turns/mean", "multi_turn/observation_tokens/mean"),
}
AGENTS = Path(__file__).parents[1] / "plugins" / "env_agent" / "tests" / "agent_functions.py"


def train(recipe: str, out_dir: Path, *overrides: str) -> list[dict]:
    """``polyrl train recipe=<recipe> [overrides]`` with one worker, in this test process
    (``run_polyrl_here``); its metrics.jsonl records."""
    args = ("train", f"recipe={recipe}", f"trainer.default_local_dir={out_dir}")
    proc = run_polyrl_here(*args, "trainer.logger=[jsonl]", *IN_PROCESS_OVERRIDES, *overrides)
    assert proc.returncode == 0, f"{' '.join(proc.args)} failed:\n{proc.stderr[-6000:]}"
    lines = (out_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


@pytest.mark.parametrize("case", CASES)
def test_recipe_learns(case: str, tmp_path: Path) -> None:
    recipe, overrides = CASES[case]
    cfg = load_config([f"recipe={recipe}", *overrides])
    val_before, records = split_records(train(recipe, tmp_path, *overrides))
    assert [r["step"] for r in records] == list(range(1, cfg.trainer.total_training_steps + 1))
    assert val_before is not None
    before, after = val_before[VAL_REWARD], records[-1][VAL_REWARD]
    assert after > before + MIN_GAIN, f"{case}: validation reward {before} -> {after}"
    for name in OWN_METRICS.get(recipe, ()):
        assert all(name in r for r in records), f"{recipe}: a step lacks {name}"
    if recipe == "dapo":
        check_dynamic_sampling(cfg, records)
    if recipe == "tool_tiny":  # validation played the episodes, tool calls and all
        turns = "val-aux/multi_turn/assistant_turns/mean"
        assert turns in val_before and records[-1][turns] > 1.0, (val_before, records[-1])


def test_agent_code_through_the_endpoint_learns_the_tool_task(tmp_path: Path) -> None:
    """recipe=tool_tiny with its episodes driven by an agent function and the openai client."""
    val_before, records = split_records(
        train(
            "tool_tiny",
            tmp_path,
            "actor_rollout_ref.rollout.multi_turn.environment=agent",
            f"actor_rollout_ref.rollout.multi_turn.agent_function={AGENTS}:lookup_agent",
        )
    )
    before, after = val_before[VAL_REWARD], records[-1][VAL_REWARD]
    assert after > before + MIN_GAIN, f"agent: validation reward {before} -> {after}"
    assert all(r["multi_turn/assistant_turns/mean"] == 2.0 for r in records)
    assert all(r["multi_turn/end/done"] == 1.0 for r in records)


def check_dynamic_sampling(cfg, records: list[dict]) -> None:
    """Every step's group counts add up, enough groups were kept, and some steps dropped groups
    and drew more generation batches because of it."""
    per_round, wanted = cfg.data.gen_batch_size, cfg.data.train_batch_size
    for r in records:
        rounds, kept = r["train/num_gen_batches"], r["train/num_groups_kept"]
        assert kept + r["train/num_groups_dropped"] == rounds * per_round, r
        assert kept >= wanted, r
        # a further round is drawn only while fewer than train_batch_size groups are kept
        assert kept - per_round < wanted or rounds == 1, r
        # critic/score: every sampled response; critic/kept_score: the rows trained on, logged
        # when filtering or trimming left fewer rows than were sampled
        assert ("critic/kept_score/mean" in r) == (rounds * per_round > wanted), r
    assert sum(r["train/num_groups_dropped"] for r in records) > 0
    assert any(r["train/num_gen_batches"] > 1 for r in records)
