"""Command-line ergonomics verl users rely on: scalars where a list is declared, and type errors
that name the key and the type it takes."""

from __future__ import annotations

import pytest

from polyrl.config.loader import load_config
from polyrl.errors import ConfigError


def test_a_scalar_logger_is_a_one_element_list_as_in_verl() -> None:
    assert list(load_config(["trainer.logger=console"]).trainer.logger) == ["console"]
    assert list(load_config(["trainer.logger=[console,jsonl]"]).trainer.logger) == [
        "console",
        "jsonl",
    ]


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("trainer.total_epochs=abc", "trainer.total_epochs takes an integer"),
        ("data.train_batch_size=1.5", "data.train_batch_size takes an integer"),
        ("actor_rollout_ref.actor.use_kl_loss=maybe", "use_kl_loss takes true or false"),
        ("actor_rollout_ref.actor.optim.lr=fast", "optim.lr takes a number"),
    ],
)
def test_a_type_error_names_the_override_and_the_type_the_key_takes(override, expected) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config([override])
    message = str(caught.value)
    assert message.startswith(f"invalid config: {override}: ")
    assert expected in message
    assert "\n" not in message


def test_a_composed_config_leaves_nothing_behind_for_the_next_one() -> None:
    """Hydra's per-compose copy of the ConfigStore is skipped (loader.py shares the store):
    what one load sets or selects must not reach a later load."""
    first = load_config(["recipe=ppo", "trainer.total_training_steps=7"])
    assert first.trainer.total_training_steps == 7 and first.algorithm.adv_estimator == "gae"
    second = load_config([])
    assert second.trainer.total_training_steps != 7
    assert second.algorithm.adv_estimator != "gae"
