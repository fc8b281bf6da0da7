"""verl's own example scripts (every one under examples/ that launches verl.trainer.main_ppo, at
the verl commit the fixture records) replayed through ``polyrl validate`` with only the model,
data and reward-function paths swapped (core/tests/verl_replay.py), each validated once with
``trainer.device=cuda``. No script may stop on an unknown key, and no fewer may validate than
:data:`VALIDATING` (raise it as features land); the counts and each remaining script's problems
are printed (``-s``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from verl_replay import VALIDATES, load_fixture, replay_all, report

from polyrl.config.verl_compat import verl_commit

# Scripts that validated with trainer.device=cuda when this was last raised.
VALIDATING = 118


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> list:
    return replay_all(Path(tmp_path_factory.mktemp("verl")))


def test_the_fixture_and_the_key_list_come_from_one_verl_commit() -> None:
    fixture = load_fixture()
    assert fixture["commit"] == verl_commit()
    assert len(fixture["scripts"]) >= 120


@pytest.mark.slow
def test_verl_examples_validate_and_none_stops_on_an_unknown_key(outcomes: list) -> None:
    print(report(outcomes))
    unknown = [(o.script, p) for o in outcomes for p in o.problems if "unknown config key" in p]
    assert unknown == []
    assert sum(o.kind in VALIDATES for o in outcomes) >= VALIDATING


def _extractor():
    import importlib.util

    path = Path(__file__).parents[2] / "scripts" / "extract_verl_examples.py"
    spec = importlib.util.spec_from_file_location("extract_verl_examples", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_extractor_reads_the_shell_forms_verls_scripts_use() -> None:
    """Arrays over lines with comments, a value quoted over lines and spread unquoted, a
    pattern substitution, arithmetic, and an if on a string test: the taken branch only."""
    script = """
backend=megatron
n=$((2 * 4))
DATA=(
    data.train_batch_size=$n  # a comment
    # a whole-line comment
    data.max_prompt_length=$((n + 1))
)
ACTOR="
    actor_rollout_ref.actor.strategy=$backend \\
    actor_rollout_ref.actor.megatron.param_offload=True"
CRITIC="${ACTOR//actor_rollout_ref.actor/critic}"
if [[ $backend == "megatron" ]]; then
    NAME=ppo_megatron_trainer
else
    NAME=ppo_trainer
fi
python3 -m verl.trainer.main_ppo --config-name=$NAME "${DATA[@]}" $ACTOR $CRITIC "$@"
"""
    assert _extractor().extract(script) == [
        "--config-name=ppo_megatron_trainer",
        "data.train_batch_size=8",
        "data.max_prompt_length=9",
        "actor_rollout_ref.actor.strategy=megatron",
        "actor_rollout_ref.actor.megatron.param_offload=True",
        "critic.strategy=megatron",
        "critic.megatron.param_offload=True",
    ]
