"""The registry's discovery, environment switches, and every error message a user can get."""

from __future__ import annotations

import os
import sys
import time
import types
from importlib import metadata

import pytest

from polyrl import hookimpl
from polyrl import registry as registry_module
from polyrl.plugin_import import ABANDONED_ENV, DISCOVERY_TIMEOUT_ENV, discovery_timeout_s
from polyrl.registry import (
    PluginBrokenError,
    PluginConflictError,
    PluginNotFoundError,
    Provenance,
    Registry,
    discover,
    get_registry,
    set_registry,
)
from polyrl.specs import (
    AdvantageEstimatorSpec,
    LoggerSpec,
    PluginKind,
    RewardProviderSpec,
    TrainingEngineSpec,
)
from polyrl.testing import (
    LoggerConformance,
    PolicyLossConformance,
    RewardProviderConformance,
)
from polyrl.testing.pytest_plugin import plugin_from_specs


def _estimator(name: str, fn: str = "polyrl.interfaces.algorithms:AdvantageEstimatorFn"):
    return AdvantageEstimatorSpec(name=name, description=f"{name} estimator", fn=fn)


def _registry(*plugins: tuple[object, str, str]) -> Registry:
    registry = Registry()
    for module, distribution, version in plugins:
        registry.add_plugin(module, Provenance("ep", distribution, version))
    return registry


# ---- lookup and errors -------------------------------------------------------------------------
def test_get_returns_registration_with_provenance() -> None:
    registry = _registry((plugin_from_specs(_estimator("alpha")), "pkg-a", "1.2.3"))
    reg = registry.get(PluginKind.ADVANTAGE_ESTIMATOR, "alpha")
    assert reg.provenance == Provenance("ep", "pkg-a", "1.2.3")
    assert reg.kind is PluginKind.ADVANTAGE_ESTIMATOR and reg.name == "alpha"
    assert registry.names(PluginKind.ADVANTAGE_ESTIMATOR) == ["alpha"]


def test_unknown_name_lists_valid_names_with_packages_and_suggests() -> None:
    registry = _registry(
        (plugin_from_specs(_estimator("alpha"), _estimator("beta")), "pkg-a", "1"),
        (plugin_from_specs(_estimator("gamma")), "pkg-g", "2"),
    )
    with pytest.raises(PluginNotFoundError) as info:
        registry.get(PluginKind.ADVANTAGE_ESTIMATOR, "alpah")
    message = str(info.value)
    assert "unknown advantage_estimator 'alpah' (config key algorithm.adv_estimator)" in message
    assert "Valid names: alpha (pkg-a), beta (pkg-a), gamma (pkg-g)." in message
    assert "Did you mean 'alpha'?" in message


def test_unknown_first_party_name_says_which_package_to_install() -> None:
    with pytest.raises(PluginNotFoundError) as info:
        Registry().get(PluginKind.ROLLOUT_ENGINE, "vllm")
    message = str(info.value)
    assert "No plugin of this kind is installed." in message
    assert "'vllm' is provided by the package polyrl-rollout-vllm" in message
    assert "pip install polyrl-rollout-vllm" in message


def test_unreleased_first_party_name_is_not_sent_to_pip(monkeypatch) -> None:
    # Every first-party package is released today; a planned one is declared like this.
    monkeypatch.setattr(registry_module, "UNRELEASED_PACKAGES", {"polyrl-engine-megatron"})
    with pytest.raises(PluginNotFoundError) as info:
        Registry().get(PluginKind.TRAINING_ENGINE, "megatron")
    message = str(info.value)
    assert "planned as the package polyrl-engine-megatron, which is not released yet" in message
    assert "pip install" not in message


def test_first_party_package_installed_but_broken_shows_its_error() -> None:
    registry = Registry()
    registry._mark_broken(
        Provenance("rollout_vllm", "polyrl-rollout-vllm", "0.1.0"), ImportError("no vllm here")
    )
    with pytest.raises(PluginNotFoundError) as info:
        registry.get(PluginKind.ROLLOUT_ENGINE, "vllm")
    assert "Package polyrl-rollout-vllm is installed but failed to load: ImportError: no vllm" in (
        str(info.value)
    )


def test_unknown_name_mentions_broken_third_party_packages() -> None:
    registry = Registry()
    registry._mark_broken(Provenance("x", "polyrl-thing", "3"), RuntimeError("boom"))
    with pytest.raises(PluginNotFoundError, match=r"may provide it: polyrl-thing \(RuntimeError"):
        registry.get(PluginKind.LOGGER, "thing")


def test_two_packages_one_name_names_both() -> None:
    registry = _registry(
        (plugin_from_specs(_estimator("same")), "pkg-one", "1.0"),
        (plugin_from_specs(_estimator("same")), "pkg-two", "2.0"),
    )
    with pytest.raises(PluginConflictError) as info:
        registry.get(PluginKind.ADVANTAGE_ESTIMATOR, "same")
    message = str(info.value)
    assert "is registered by more than one package" in message
    assert "pkg-one 1.0 (plugin ep)" in message and "pkg-two 2.0 (plugin ep)" in message
    assert "POLYRL_PLUGINS" in message


def test_same_entry_point_name_in_two_distributions_registers_both() -> None:
    registry = Registry()
    registry.add_plugin(plugin_from_specs(_estimator("a")), Provenance("same", "pkg-a", "1"))
    registry.add_plugin(plugin_from_specs(_estimator("b")), Provenance("same", "pkg-b", "1"))
    assert registry.broken == []
    assert registry.names(PluginKind.ADVANTAGE_ESTIMATOR) == ["a", "b"]


def test_hook_yielding_the_wrong_spec_type_marks_the_plugin_broken() -> None:
    module = types.ModuleType("wrong_type_plugin")

    @hookimpl
    def polyrl_loggers():
        yield _estimator("not_a_logger")

    module.polyrl_loggers = polyrl_loggers
    registry = _registry((module, "pkg-wrong", "1"))
    assert registry.names(PluginKind.LOGGER) == []
    [broken] = registry.broken
    assert broken.distribution == "pkg-wrong"
    assert broken.error == (
        "TypeError: hook polyrl_loggers must yield LoggerSpec objects, got AdvantageEstimatorSpec"
    )


def test_a_misspelled_hook_name_marks_the_plugin_broken_instead_of_registering_nothing() -> None:
    module = types.ModuleType("typo_plugin")

    @hookimpl
    def polyrl_algorithm():  # the hook is polyrl_algorithms
        return []

    module.polyrl_algorithm = polyrl_algorithm
    registry = _registry(
        (module, "pkg-typo", "1"), (plugin_from_specs(_estimator("fine")), "pkg-ok", "1")
    )
    [broken] = registry.broken
    assert broken.distribution == "pkg-typo"
    assert "polyrl_algorithm" in broken.error and "unknown hook" in broken.error
    assert registry.get(PluginKind.ADVANTAGE_ESTIMATOR, "fine")  # later plugins still load


def test_hook_that_raises_marks_the_plugin_broken_and_keeps_others() -> None:
    module = types.ModuleType("raising_plugin")

    @hookimpl
    def polyrl_loggers():
        raise RuntimeError("config file missing")

    module.polyrl_loggers = polyrl_loggers
    registry = _registry(
        (module, "pkg-raise", "1"), (plugin_from_specs(_estimator("fine")), "pkg-ok", "1")
    )
    assert [b.error for b in registry.broken] == ["RuntimeError: config file missing"]
    assert "config file missing" in registry.broken[0].traceback
    assert registry.get(PluginKind.ADVANTAGE_ESTIMATOR, "fine")


def test_load_failure_names_the_package_and_the_fix() -> None:
    spec = TrainingEngineSpec(
        name="ghost", description="d", engine="polyrl_no_such_backend.engine:Engine"
    )
    registry = _registry((plugin_from_specs(spec), "polyrl-engine-ghost", "0.4"))
    with pytest.raises(PluginBrokenError) as info:
        registry.load(PluginKind.TRAINING_ENGINE, "ghost")
    message = str(info.value)
    assert "training_engine 'ghost' from package polyrl-engine-ghost 0.4 failed to load" in message
    assert "ModuleNotFoundError: No module named 'polyrl_no_such_backend'" in message
    assert "pip install 'polyrl-engine-ghost'" in message


def test_load_resolves_an_import_string() -> None:
    spec = RewardProviderSpec(
        name="naive2", description="d", provider="polyrl.interfaces.reward:RewardProvider"
    )
    registry = _registry((plugin_from_specs(spec), "pkg", "1"))
    from polyrl.interfaces import RewardProvider

    assert registry.load(PluginKind.REWARD_PROVIDER, "naive2") is RewardProvider


# ---- discovery and environment switches --------------------------------------------------------
@pytest.fixture
def fake_entry_points(tmp_path, monkeypatch):
    """Two importable plugin modules and one that fails, exposed as entry points of group polyrl."""
    (tmp_path / "regtest_plugin_a.py").write_text(
        "from polyrl import hookimpl\n"
        "from polyrl.specs import LoggerSpec\n"
        "@hookimpl\n"
        "def polyrl_loggers():\n"
        "    yield LoggerSpec(name='log_a', description='a', logger='m:C')\n"
    )
    (tmp_path / "regtest_plugin_b.py").write_text(
        "from polyrl import hookimpl\n"
        "from polyrl.specs import LoggerSpec\n"
        "@hookimpl\n"
        "def polyrl_loggers():\n"
        "    yield LoggerSpec(name='log_b', description='b', logger='m:C')\n"
    )
    (tmp_path / "regtest_plugin_bad.py").write_text("raise ImportError('needs libfoo')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    eps = [
        metadata.EntryPoint("plug_a", "regtest_plugin_a", "polyrl"),
        metadata.EntryPoint("plug_b", "regtest_plugin_b", "polyrl"),
        metadata.EntryPoint("plug_bad", "regtest_plugin_bad", "polyrl"),
    ]
    monkeypatch.setattr(
        registry_module.metadata,
        "entry_points",
        lambda group: eps if group == "polyrl" else [],
    )
    monkeypatch.delenv("POLYRL_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("POLYRL_PLUGINS", raising=False)
    yield
    for name in ("regtest_plugin_a", "regtest_plugin_b", "regtest_plugin_bad"):
        sys.modules.pop(name, None)


@pytest.mark.usefixtures("fake_entry_points")
def test_discover_loads_entry_points_and_records_broken_ones() -> None:
    registry = discover()
    names = registry.names(PluginKind.LOGGER)
    assert {"log_a", "log_b", "console", "jsonl"} <= set(names)
    [broken] = registry.broken
    assert (broken.plugin, broken.error) == ("plug_bad", "ImportError: needs libfoo")
    assert registry.get(PluginKind.LOGGER, "console").provenance.distribution == "polyrl"


@pytest.mark.usefixtures("fake_entry_points")
def test_disable_autoload_loads_only_builtins(monkeypatch) -> None:
    monkeypatch.setenv("POLYRL_DISABLE_PLUGIN_AUTOLOAD", "1")
    registry = discover()
    assert "log_a" not in registry.names(PluginKind.LOGGER)
    assert registry.broken == []
    assert {r.provenance.distribution for r in registry.all()} == {"polyrl"}


@pytest.mark.usefixtures("fake_entry_points")
def test_polyrl_plugins_limits_loading_to_a_list(monkeypatch) -> None:
    monkeypatch.setenv("POLYRL_PLUGINS", "plug_b, plug_bad")
    registry = discover()
    names = registry.names(PluginKind.LOGGER)
    assert "log_b" in names and "log_a" not in names
    assert [b.plugin for b in registry.broken] == ["plug_bad"]


HOSTILE_MODULES = {  # module source -> the error its plugin is listed with
    "import sys\nsys.exit(3)\n": "SystemExit: 3 (the module calls sys.exit while it is imported)",
    "raise KeyboardInterrupt\n": "KeyboardInterrupt (raised by the module itself while it is "
    "imported)",
    "import time\ntime.sleep(3600)\n": "import blocked: importing 'regtest_hostile_2' of package "
    "unknown did not finish importing within 0.5 s and was abandoned",
}


@pytest.fixture
def hostile_entry_points(tmp_path, monkeypatch):
    """Entry points whose modules exit, interrupt and block at import, then a good one."""
    eps = []
    for i, source in enumerate([*HOSTILE_MODULES, "X = 1\n"]):
        (tmp_path / f"regtest_hostile_{i}.py").write_text(source)
        eps.append(metadata.EntryPoint(f"hostile_{i}", f"regtest_hostile_{i}", "polyrl"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry_module.metadata, "entry_points", lambda group: eps)
    monkeypatch.delenv("POLYRL_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("POLYRL_PLUGINS", raising=False)
    monkeypatch.setenv(ABANDONED_ENV, "")  # restored after the test: discover() writes it
    monkeypatch.setenv(DISCOVERY_TIMEOUT_ENV, "0.5")
    yield
    for i in range(len(eps)):
        sys.modules.pop(f"regtest_hostile_{i}", None)


@pytest.mark.usefixtures("hostile_entry_points")
def test_a_module_that_exits_interrupts_or_blocks_at_import_is_broken_not_fatal() -> None:
    start = time.monotonic()
    registry = discover()
    assert time.monotonic() - start < 5
    assert [(b.plugin, b.error.split(";")[0]) for b in registry.broken] == [
        (f"hostile_{i}", error) for i, error in enumerate(HOSTILE_MODULES.values())
    ]
    assert "pip uninstall unknown" in registry.broken[2].error
    assert "console" in registry.names(PluginKind.LOGGER)


@pytest.mark.usefixtures("hostile_entry_points")
def test_an_abandoned_import_is_skipped_at_once_by_the_processes_started_after_it() -> None:
    discover()
    assert os.environ[ABANDONED_ENV] == "regtest_hostile_2"
    sys.modules.pop("regtest_hostile_2", None)
    start = time.monotonic()
    [*_, blocked] = discover().broken
    assert time.monotonic() - start < 0.4  # no wait for the bound this time
    assert "did not finish in the process that started this one" in blocked.error


def test_the_import_bound_defaults_to_20_s_and_is_read_from_the_environment(monkeypatch) -> None:
    monkeypatch.delenv(DISCOVERY_TIMEOUT_ENV, raising=False)
    assert discovery_timeout_s() == 20.0
    monkeypatch.setenv(DISCOVERY_TIMEOUT_ENV, "2.5")
    assert discovery_timeout_s() == 2.5


def test_a_hook_that_exits_or_blocks_marks_its_plugin_broken(monkeypatch) -> None:
    monkeypatch.setenv(DISCOVERY_TIMEOUT_ENV, "0.5")
    exits, blocks = types.ModuleType("exits"), types.ModuleType("blocks")

    @hookimpl
    def polyrl_loggers():
        sys.exit(4)

    @hookimpl
    def polyrl_policy_losses():
        time.sleep(3600)

    exits.polyrl_loggers, blocks.polyrl_policy_losses = polyrl_loggers, polyrl_policy_losses
    registry = _registry((exits, "pkg-exits", "1"), (blocks, "pkg-blocks", "1"))
    assert registry.broken[0].error.startswith("SystemExit: 4")
    assert registry.broken[1].error.startswith(
        "import blocked: its hook polyrl_policy_losses of package pkg-blocks did not finish"
    )


def test_an_implementation_that_exits_at_import_is_a_problem_line(tmp_path, monkeypatch) -> None:
    (tmp_path / "regtest_exiting_impl.py").write_text("import sys\nsys.exit(5)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = LoggerSpec(name="bye", description="d", logger="regtest_exiting_impl:Logger")
    registry = _registry((plugin_from_specs(spec), "pkg-bye", "1"))
    try:
        problem = registry.get(PluginKind.LOGGER, "bye").implementation_problem()
    finally:
        sys.modules.pop("regtest_exiting_impl", None)
    assert problem == (
        "logger 'bye' from package pkg-bye 1 failed to load: SystemExit: 5 (the module calls "
        "sys.exit while it is imported). Reinstall it or install its missing dependencies "
        "(pip install 'pkg-bye')."
    )


def test_polyrl_plugins_matches_distribution_names(monkeypatch) -> None:
    try:
        metadata.distribution("polyrl-plugin-template")
    except metadata.PackageNotFoundError:
        pytest.skip("polyrl-plugin-template is not installed")
    monkeypatch.delenv("POLYRL_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.setenv("POLYRL_PLUGINS", "polyrl-plugin-template")
    registry = discover()
    assert {r.provenance.distribution for r in registry.all()} == {
        "polyrl",
        "polyrl-plugin-template",
    }


def test_get_registry_is_cached_and_set_registry_replaces_it(monkeypatch) -> None:
    monkeypatch.setattr(registry_module, "_registry", None)
    first = get_registry()
    assert get_registry() is first
    replacement = Registry()
    set_registry(replacement)
    assert get_registry() is replacement
    set_registry(None)
    assert get_registry() is not replacement


# ---- the pytest fixtures of polyrl.testing -----------------------------------------------------
def test_isolated_registry_holds_only_builtins(isolated_registry) -> None:
    import os

    assert get_registry() is isolated_registry
    assert os.environ["POLYRL_DISABLE_PLUGIN_AUTOLOAD"] == "1"
    assert {r.provenance.distribution for r in isolated_registry.all()} == {"polyrl"}


def test_register_plugin_adds_for_one_test_then_restores(register_plugin) -> None:
    before = get_registry()
    spec = LoggerSpec(name="inproc", description="d", logger="polyrl.interfaces:MetricsLogger")
    updated = register_plugin(spec, distribution="my-test-dist", version="9")
    assert get_registry() is updated
    reg = updated.get(PluginKind.LOGGER, "inproc")
    assert (reg.provenance.distribution, reg.provenance.version) == ("my-test-dist", "9")
    assert "inproc" not in before.names(PluginKind.LOGGER)


def test_register_plugin_was_restored() -> None:
    assert "inproc" not in get_registry().names(PluginKind.LOGGER)


def test_register_plugin_accepts_a_hook_module(isolated_registry, register_plugin) -> None:
    module = types.ModuleType("hooks")

    @hookimpl
    def polyrl_advantage_estimators():
        yield _estimator("from_module")

    module.polyrl_advantage_estimators = polyrl_advantage_estimators
    register_plugin(module)
    assert get_registry().get(PluginKind.ADVANTAGE_ESTIMATOR, "from_module")
    assert "console" in get_registry().names(PluginKind.LOGGER)


def test_polyrl_registry_is_fresh(polyrl_registry) -> None:
    assert isinstance(polyrl_registry, Registry)
    assert polyrl_registry is not registry_module._registry


# ---- the built-in registrations pass the conformance suites ------------------------------------
class TestBuiltinVanillaLoss(PolicyLossConformance):
    plugin_name = "vanilla"


class TestBuiltinJsonlLogger(LoggerConformance):
    plugin_name = "jsonl"

    def check_logged(self, tmp_path, logged) -> None:
        import json

        lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        assert [line["step"] for line in lines] == [1, 2]
        assert lines[1]["train/loss"] == 0.25


class TestBuiltinTensorboardLogger(LoggerConformance):
    plugin_name = "tensorboard"


class TestBuiltinNaiveReward(RewardProviderConformance):
    plugin_name = "naive"

    def make_samples(self):
        from polyrl.interfaces import RewardSample

        answers = ["so #### 4", "#### 5", "no final answer"]
        return [
            RewardSample(index=i, data_source="openai/gsm8k", solution_str=a, ground_truth="4")
            for i, a in enumerate(answers)
        ]

    def expected_scores(self):
        # GSM8K rule: the number after "####" must equal the ground truth; otherwise 0.
        return [1.0, 0.0, 0.0]


def test_a_name_from_a_package_filtered_out_by_polyrl_plugins_says_so(monkeypatch) -> None:
    monkeypatch.setenv(registry_module.ONLY_PLUGINS_ENV, "no-such-package")
    registry = registry_module.discover()
    assert "polyrl-algo-grpo" in registry.filtered_out
    message = registry._unknown_name_message(PluginKind.ADVANTAGE_ESTIMATOR, "grpo")
    assert "Installed but not loaded because of POLYRL_PLUGINS" in message
    assert "polyrl-algo-grpo" in message and "pip install" not in message
