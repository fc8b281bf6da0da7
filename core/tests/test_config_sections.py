"""Plugins own their typed config sections at verl's places (polyrl.config.sections)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from polyrl.config.keys import schema_keys
from polyrl.config.loader import load_config
from polyrl.config.schema import PolyrlConfig
from polyrl.config.sections import installed_sections, section_problems
from polyrl.errors import ConfigError
from polyrl.specs import LoggerSpec

TINY = ["recipe=tiny"]


@dataclass
class BufferSettings:
    flush_every: int = 10
    path: str = "${trainer.default_local_dir}/buffer"


@dataclass
class RolloutKnob:
    speculative_tokens: int = 0


def _logger(name: str = "buffered", **sections) -> LoggerSpec:
    return LoggerSpec(
        name=name, description="test", logger="polyrl.loggers.console:ConsoleLogger", **sections
    )


@pytest.fixture
def buffered(register_plugin):
    return register_plugin(
        _logger(
            config_sections={
                "trainer.buffer": BufferSettings,
                "actor_rollout_ref.rollout": RolloutKnob,
            },
            key_aliases={"trainer.buffer_cfg": "trainer.buffer"},
        )
    )


def test_a_plugin_section_is_typed_with_its_defaults_wherever_it_is_mounted(buffered) -> None:
    cfg = load_config([*TINY, "trainer.buffer.flush_every=3"])
    assert cfg.trainer.buffer.flush_every == 3
    assert cfg.trainer.buffer.path == f"{cfg.trainer.default_local_dir}/buffer"
    # into core's existing group, beside core's keys
    assert cfg.actor_rollout_ref.rollout.speculative_tokens == 0
    assert cfg.actor_rollout_ref.rollout.n == load_config(TINY).actor_rollout_ref.rollout.n


def test_a_wrong_type_in_a_plugin_section_is_one_line_naming_the_type(buffered) -> None:
    with pytest.raises(ConfigError) as err:
        load_config([*TINY, "actor_rollout_ref.rollout.speculative_tokens=many"])
    message = str(err.value)
    assert "\n" not in message
    assert "actor_rollout_ref.rollout.speculative_tokens" in message
    assert "an integer" in message


def test_a_misspelled_plugin_key_gets_the_closest_one(buffered) -> None:
    with pytest.raises(ConfigError, match=r"Did you mean 'trainer\.buffer\.flush_every'"):
        load_config([*TINY, "trainer.buffer.flush_evry=3"])


def test_an_alias_means_the_key_it_names(buffered) -> None:
    cfg = load_config([*TINY, "trainer.buffer_cfg.flush_every=7"])
    assert cfg.trainer.buffer.flush_every == 7


def test_the_section_is_gone_with_its_plugin() -> None:
    assert "trainer.buffer.flush_every" not in schema_keys()
    with pytest.raises(ConfigError, match="unknown config key"):
        load_config([*TINY, "trainer.buffer.flush_every=3"])


def test_two_plugins_declaring_one_key_differently_is_reported_naming_both(
    register_plugin,
) -> None:
    @dataclass
    class Other:
        speculative_tokens: int = 4

    register_plugin(_logger(config_sections={"actor_rollout_ref.rollout": RolloutKnob}))
    registry = register_plugin(
        _logger("other", config_sections={"actor_rollout_ref.rollout": Other}),
        distribution="other-plugin",
    )
    problems = section_problems(registry)
    assert len(problems) == 1
    assert "actor_rollout_ref.rollout.speculative_tokens" in problems[0]
    assert "buffered (test-plugin)" in problems[0] and "other (other-plugin)" in problems[0]


def test_the_same_declaration_from_two_plugins_is_one_key(register_plugin) -> None:
    register_plugin(_logger(config_sections={"actor_rollout_ref.rollout": RolloutKnob}))
    registry = register_plugin(
        _logger("again", config_sections={"actor_rollout_ref.rollout": RolloutKnob})
    )
    assert section_problems(registry) == []


def test_a_section_that_cannot_be_imported_leaves_the_rest_working(register_plugin) -> None:
    registry = register_plugin(
        _logger(config_sections={"trainer.broken": "no_such_module_xyz:Settings"})
    )
    [problem] = section_problems(registry)
    assert "trainer.broken" in problem and "buffered (test-plugin)" in problem
    assert load_config(TINY).trainer.seed == load_config(TINY).trainer.seed


# The first-party plugins' settings: declared by them, at verl's paths, and not by core.
FIRST_PARTY_SECTIONS = {
    "actor_rollout_ref.actor.fsdp_config.param_offload": "polyrl-engine-fsdp",
    "actor_rollout_ref.ref.fsdp_config.param_offload": "polyrl-engine-fsdp",
    "critic.model.fsdp_config.fsdp_size": "polyrl-engine-fsdp",
    "actor_rollout_ref.model.use_liger": "polyrl-engine-fsdp",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size": "polyrl-engine-megatron",
    "actor_rollout_ref.rollout.max_num_seqs": "polyrl-rollout-vllm",
    "critic.cliprange_value": "polyrl-algo-ppo",
    "trainer.critic_warmup": "polyrl-algo-ppo",
    "algorithm.filter_groups.enable": "polyrl-algo-grpo",
    "data.gen_batch_size": "polyrl-algo-grpo",
    "reward_model.overlong_buffer.len": "polyrl-algo-grpo",
}


@pytest.mark.parametrize("key", sorted(FIRST_PARTY_SECTIONS))
def test_a_first_party_setting_is_declared_by_its_plugin_not_by_core(key: str) -> None:
    assert key not in schema_keys(PolyrlConfig)
    owners = {
        s.owner.rpartition("(")[2].rstrip(")")
        for s in installed_sections()
        if key in schema_keys(s.dataclass, f"{s.path}.")
    }
    assert FIRST_PARTY_SECTIONS[key] in owners


def test_the_reference_fsdp_settings_follow_the_actors_unless_set() -> None:
    cfg = load_config([*TINY, "actor_rollout_ref.actor.fsdp_config.param_offload=true"])
    assert cfg.actor_rollout_ref.ref.fsdp_config.param_offload is True
    cfg = load_config(
        [
            *TINY,
            "actor_rollout_ref.actor.fsdp_config.param_offload=true",
            "actor_rollout_ref.ref.fsdp_config.param_offload=false",
        ]
    )
    assert cfg.actor_rollout_ref.ref.fsdp_config.param_offload is False


def test_verls_dapo_reward_manager_keys_mean_polyrls_overlong_buffer() -> None:
    cfg = load_config(
        [
            "recipe=dapo",
            "reward_model.reward_kwargs.overlong_buffer_cfg.enable=true",
            "reward_model.reward_kwargs.overlong_buffer_cfg.len=4",
            "reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5",
        ]
    )
    buffer = cfg.reward_model.overlong_buffer
    assert (buffer.enable, buffer.len, buffer.penalty_factor) == (True, 4, 0.5)


def test_validate_refuses_a_selected_plugins_broken_section_and_warns_for_others(
    register_plugin, caplog
) -> None:
    from polyrl.config.validate import validate_config

    register_plugin(_logger(config_sections={"trainer.broken": "no_such_module_xyz:Settings"}))
    problems = validate_config(load_config([*TINY, "trainer.logger=[console,buffered]"]))
    assert any("trainer.broken" in p for p in problems)
    caplog.clear()
    problems = validate_config(load_config(TINY))
    assert not any("trainer.broken" in p for p in problems)
    assert "trainer.broken" in caplog.text


def test_a_key_of_an_uninstalled_first_party_plugin_names_the_package(monkeypatch) -> None:
    from importlib import metadata

    from polyrl.config.keys import unknown_key_message

    real = metadata.distribution

    def without_megatron(name: str):
        if name == "polyrl-engine-megatron":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "distribution", without_megatron)
    message = unknown_key_message(
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size", set()
    )
    assert "pip install polyrl-engine-megatron" in message


@dataclass
class Switch:
    on: bool = False


def _implied_by_switch(cfg) -> dict:
    if not cfg.trainer.switch.on:
        return {}
    return {"trainer.total_epochs": (7, "trainer.switch.on=true")}


@pytest.fixture
def switching(register_plugin):
    return register_plugin(
        _logger(
            "switching",
            config_sections={"trainer.switch": Switch},
            implies=_implied_by_switch,
        )
    )


def test_a_plugins_keys_imply_other_settings_when_composed(switching):
    assert load_config([*TINY, "trainer.switch.on=true"]).trainer.total_epochs == 7
    assert load_config(TINY).trainer.total_epochs != 7


def test_an_implied_setting_the_user_set_otherwise_is_refused(switching):
    assert load_config([*TINY, "trainer.switch.on=true", "trainer.total_epochs=7"])
    with pytest.raises(ConfigError) as caught:
        load_config([*TINY, "trainer.switch.on=true", "trainer.total_epochs=3"])
    assert str(caught.value) == (
        "trainer.total_epochs=3 conflicts with trainer.switch.on=true, which means "
        "trainer.total_epochs=7 to the plugin 'switching' (test-plugin); drop one of them"
    )
