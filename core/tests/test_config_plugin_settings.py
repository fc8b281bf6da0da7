"""A selected plugin's ``config_class`` types its section ``plugins.<name>`` when the config is
composed: defaults shown, wrong types refused in one line, misspellings left to validate."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from polyrl.config import load_config
from polyrl.config.validate import validate_config
from polyrl.errors import ConfigError
from polyrl.specs import AlgorithmSpec, PolicyLossSpec


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


@dataclass
class Inner:
    dtype: str = "${actor_rollout_ref.model.dtype}"  # an interpolated default
    path: str | None = None


@dataclass
class OwnedGroup:
    inner: Inner = field(default_factory=Inner)
    items: list[Inner] = field(default_factory=list)
    weight: float = 1.0


@pytest.fixture
def owner(register_plugin) -> None:
    register_plugin(
        AlgorithmSpec(
            name="owner",
            description="an outside algorithm owning a group with a nested group",
            pipeline="polyrl.step.policy_gradient:policy_gradient_pipeline",
            config_sections={"owned_group": OwnedGroup},
            owned_keys=("owned_group",),
        )
    )


def test_an_owned_nested_group_left_at_its_defaults_is_not_refused(owner) -> None:
    # recipe=tiny sets model.dtype: the nested interpolated default follows it, unchanged
    assert validate_config(load_config(["recipe=tiny"])) == []


@pytest.mark.parametrize(
    "override", ["owned_group.inner.path=x", "owned_group.weight=2", "owned_group.items=[{}]"]
)
def test_a_changed_key_of_an_owned_group_is_refused_by_its_full_name(owner, override) -> None:
    problems = validate_config(load_config(["recipe=tiny", override]))
    key = override.split("=")[0]
    (line,) = [p for p in problems if p.startswith(key)]
    assert "read only by the algorithm 'owner'" in line
