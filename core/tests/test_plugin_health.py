"""Plugin health: a registration whose implementation cannot be imported is not "ok" anywhere,
and an installed package that looks like a plugin but registers nothing is reported."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from polyrl import doctor
from polyrl import registry as registry_module
from polyrl.cli import main
from polyrl.registry import (
    DISABLE_AUTOLOAD_ENV,
    PluginNotFoundError,
    discover,
    find_silent_packages,
)
from polyrl.specs import (
    LoggerSpec,
    PluginKind,
    PolicyLossSpec,
    RewardProviderSpec,
    RolloutEngineSpec,
    TrainingEngineSpec,
)
from polyrl.testing.cli import run_polyrl

PACKAGE = "polyrl-health-test"


@pytest.fixture
def plugins(isolated_registry, register_plugin):
    return register_plugin(
        [
            PolicyLossSpec(
                name="typo_loss",
                description="misspelled object",
                fn="polyrl.algorithms.policy_loss:vanila_policy_loss",
            ),
            PolicyLossSpec(
                name="fine_loss",
                description="resolves",
                fn="polyrl.algorithms.policy_loss:vanilla_policy_loss",
            ),
            RewardProviderSpec(
                name="ghost_reward",
                description="module missing",
                provider="polyrl_no_such_module.reward:Reward",
            ),
            LoggerSpec(name="bad_logger", description="malformed", logger="no_colon_here"),
            TrainingEngineSpec(
                name="typo_engine",
                description="module found, object misspelled",
                engine="polyrl.interfaces.training_engine:TrainingEngin",
            ),
            RolloutEngineSpec(
                name="ghost_engine",
                description="module missing",
                engine="polyrl_no_such_module.engine:Engine",
            ),
        ],
        distribution=PACKAGE,
        version="1.2",
    )


def json_rows(capsys, *args: str) -> dict[str, dict]:
    assert main(["plugins", "--json", *args]) == 0
    return {r["name"]: r for r in json.loads(capsys.readouterr().out)}


# ---- implementations that do not resolve -------------------------------------------------------
def test_light_registrations_are_imported_and_shown_broken(plugins, capsys) -> None:
    rows = json_rows(capsys)
    typo = rows["typo_loss"]
    assert typo["status"] == "broken" and typo["kind"] == "policy_loss"
    assert "AttributeError" in typo["error"] and "vanila_policy_loss" in typo["error"]
    assert f"from package {PACKAGE} 1.2 failed to load" in typo["error"]
    assert rows["fine_loss"]["status"] == "ok" and rows["fine_loss"]["error"] is None
    ghost = rows["ghost_reward"]
    assert ghost["status"] == "broken" and "polyrl_no_such_module" in ghost["error"]
    assert rows["bad_logger"]["status"] == "broken"
    assert "malformed import string 'no_colon_here'" in rows["bad_logger"]["error"]
    assert rows["vanilla"]["status"] == "ok"  # the built-ins resolve


def test_engines_are_only_located_unless_asked(plugins, capsys) -> None:
    rows = json_rows(capsys)
    assert rows["ghost_engine"]["status"] == "broken"
    assert "No module named 'polyrl_no_such_module'" in rows["ghost_engine"]["error"]
    # its module exists: without importing it, the misspelled class cannot be seen
    assert rows["typo_engine"]["status"] == "ok"
    rows = json_rows(capsys, "--import-engines")
    assert rows["typo_engine"]["status"] == "broken"
    assert "TrainingEngin" in rows["typo_engine"]["error"]


def test_table_shows_the_broken_registration_with_its_error(plugins, capsys) -> None:
    assert main(["plugins", "--kind", "policy_loss"]) == 0
    lines = capsys.readouterr().out.splitlines()
    typo = next(line for line in lines if line.startswith("typo_loss "))
    assert typo.split()[:5] == ["typo_loss", "policy_loss", PACKAGE, "1.2", "broken"]
    assert "AttributeError" in typo


def test_doctor_flags_a_registration_that_does_not_resolve(plugins) -> None:
    findings = {f.name: f for f in doctor.plugins()}
    typo = findings["plugin policy_loss typo_loss"]
    assert (
        not typo.ok and typo.value.startswith(f"{PACKAGE} 1.2: ") and "AttributeError" in typo.value
    )
    assert findings["plugin policy_loss fine_loss"].ok
    assert findings["plugin policy_loss fine_loss"].value == f"{PACKAGE} 1.2"
    assert not findings["plugin rollout_engine ghost_engine"].ok
    assert findings["plugin training_engine typo_engine"].ok  # engines are located only


# ---- installed packages that register nothing --------------------------------------------------
def make_distribution(
    root: Path, name: str, version: str, requires: tuple[str, ...] = (), entry_points: str = ""
) -> None:
    """What pip leaves for an installed distribution: a ``.dist-info`` folder."""
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {requirement}" for requirement in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    if entry_points:
        (info / "entry_points.txt").write_text(entry_points)


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A path entry with packages that look like plugins, some registering nothing."""
    root = tmp_path / "site"
    make_distribution(root, "polyrl-reward-foo", "0.1")
    make_distribution(root, "my-rl-app", "2.0", requires=("polyrl>=0.1", "numpy"))
    make_distribution(
        root, "polyrl_logger_bar", "0.3", entry_points="[polyrl]\nbar = polyrl_logger_bar\n"
    )
    make_distribution(root, "uses-polyrl-extra", "1.0", requires=('polyrl; extra == "rl"',))
    make_distribution(root, "polyrlish", "1.0")
    monkeypatch.syspath_prepend(str(root))
    return root


def silent_names() -> dict[str, bool]:
    return {p.distribution: p.named_like_plugin for p in find_silent_packages()}


def test_packages_that_register_nothing_are_found(site: Path) -> None:
    silent = silent_names()
    assert silent["polyrl-reward-foo"] is True
    assert silent["my-rl-app"] is False  # depends on polyrl
    # one with a polyrl entry point, one needing polyrl only for an extra, one merely similar,
    # and polyrl itself register nothing but are not plugins that forgot to
    for name in ("polyrl_logger_bar", "uses-polyrl-extra", "polyrlish", "polyrl"):
        assert name not in silent


def test_registry_records_them_and_unknown_names_point_at_them(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    registry = discover()
    assert {p.distribution for p in registry.silent_packages} >= {"polyrl-reward-foo", "my-rl-app"}
    with pytest.raises(PluginNotFoundError) as found:
        registry.get(PluginKind.REWARD_PROVIDER, "foo")
    message = str(found.value)
    assert message.startswith("unknown reward_provider 'foo'")
    assert (
        "The installed package polyrl-reward-foo 0.1 looks like it should provide 'foo'" in message
    )
    assert '[project.entry-points.polyrl] <name> = "<module>"' in message
    with pytest.raises(PluginNotFoundError) as found:
        registry.get(PluginKind.LOGGER, "baz")
    assert (
        "Installed packages that register no polyrl plugin (one may be meant to provide it): "
        in (str(found.value))
    )
    assert "polyrl-reward-foo 0.1" in str(found.value) and "my-rl-app 2.0" in str(found.value)


def test_plugins_json_and_doctor_report_them(
    site: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    monkeypatch.setattr(registry_module, "_registry", discover())
    rows = [r for r in json_rows(capsys, "--kind", "logger").values() if r["kind"] is None]
    foo = next(r for r in rows if r["name"] == "polyrl-reward-foo")
    assert (foo["status"], foo["version"]) == ("registers_nothing", "0.1")
    assert foo["error"].startswith(
        "package polyrl-reward-foo 0.1 is named like a polyrl plugin and is installed but "
        "registers no polyrl plugin: its pyproject needs [project.entry-points.polyrl]"
    )
    findings = {f.name: f for f in doctor.plugins()}
    assert not findings["package polyrl-reward-foo (registers nothing)"].ok
    app = findings["package my-rl-app (registers nothing)"]
    assert app.ok and "depends on polyrl" in app.value  # maybe an application: reported only


def test_polyrl_plugins_names_an_installed_package_without_entry_points(site: Path) -> None:
    """A fresh interpreter, as a user runs it: the package is found on its PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYRL_")}
    env[DISABLE_AUTOLOAD_ENV] = "1"  # the installed plugins are not what this test is about
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    done = run_polyrl(env, "plugins", "--kind", "logger")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "Installed packages that register no polyrl plugin:" in out
    assert (
        "  package polyrl-reward-foo 0.1 is named like a polyrl plugin and is installed but "
        "registers no polyrl plugin: its pyproject needs [project.entry-points.polyrl] <name> = "
        '"<module>" (then reinstall it)'
    ) in out.splitlines()
