"""A selected plugin's ``config_class`` types its section ``plugins.<name>`` when the config is
composed: defaults shown, wrong types refused in one line, misspellings left to validate."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from polyrl.config import load_config
from polyrl.config.validate import validate_config
from polyrl.errors import ConfigError
from polyrl.specs import PolicyLossSpec


@dataclass
class ClipSettings:
    eps_high: float = 0.28
    truncate: bool = True


@pytest.fixture
def clipped(register_plugin) -> None:
    register_plugin(
        PolicyLossSpec(
            name="clipped",
            description="an outside loss with settings",
            fn=lambda batch, log_prob, config: (log_prob, {}),
            config_class=ClipSettings,
        )
    )


LOSS = "actor_rollout_ref.actor.policy_loss.loss_mode=clipped"


def test_the_selected_plugin_section_shows_its_defaults(clipped) -> None:
    cfg = load_config(["recipe=tiny", LOSS, "plugins.clipped.eps_high=0.3"])
    assert dict(cfg.plugins.clipped) == {"eps_high": 0.3, "truncate": True}
    # not selected: no section is made up for it
    assert "clipped" not in load_config(["recipe=tiny"]).plugins


def test_a_value_of_the_wrong_type_is_one_line_naming_the_key_and_its_type(clipped) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(["recipe=tiny", LOSS, "plugins.clipped.eps_high=abc"])
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("invalid config: plugins.clipped.eps_high: Value 'abc'")
    assert message.endswith("plugins.clipped.eps_high takes a number")


def test_a_misspelled_setting_gets_did_you_mean(clipped) -> None:
    problems = validate_config(load_config(["recipe=tiny", LOSS, "plugins.clipped.eps_hgh=1"]))
    assert any("Did you mean plugins.clipped.eps_high?" in p for p in problems), problems
