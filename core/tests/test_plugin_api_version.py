"""A plugin's declared polyrl API range (a spec's ``api_version``): an excluding or invalid one is
listed as ``incompatible`` with the release to install, and selecting it is one error line."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from polyrl import doctor
from polyrl.api import API_VERSION
from polyrl.cli import main
from polyrl.errors import PolyrlError
from polyrl.plan import select_algorithm
from polyrl.preflight import preflight
from polyrl.registry import PluginIncompatibleError, api_incompatibility
from polyrl.specs import (
    AdvantageEstimatorSpec,
    AlgorithmSpec,
    DataSourceScorerSpec,
    PluginKind,
    RolloutEngineSpec,
    TrainingEngineSpec,
)

PACKAGE = "polyrl-foo"
NEWER = (
    f"polyrl-foo 0.3 supports polyrl API >=2.0, this polyrl has API {API_VERSION}: upgrade "
    "polyrl or install a polyrl-foo release for API 1.x"
)


def zero_advantage(batch, config):
    """An estimator that keeps its contract (validate calls it on a synthetic batch)."""
    zeros = batch["response_mask"] * 0.0
    return zeros, zeros.clone()


def estimator(name: str, api_version: str | None) -> AdvantageEstimatorSpec:
    return AdvantageEstimatorSpec(
        name=name,
        description=f"declares {api_version}",
        fn=f"{__name__}:zero_advantage",
        api_version=api_version,
    )


@pytest.fixture
def plugins(isolated_registry, register_plugin):
    """Built-ins, CPU engines and estimators declaring a compatible, an excluding and an invalid
    range (and none)."""
    return register_plugin(
        [
            TrainingEngineSpec(
                name="eng",
                description="test engine",
                engine="polyrl.interfaces.training_engine:TrainingEngine",
                supports_cpu=True,
            ),
            RolloutEngineSpec(
                name="roll",
                description="test rollout",
                engine="polyrl.interfaces.rollout_engine:RolloutEngine",
                supports_cpu=True,
            ),
            estimator("fits", ">=1.0,<2"),
            estimator("undeclared", None),
            estimator("too_new", ">=2.0"),
            estimator("too_old", "<1.0"),
            estimator("garbled", ">=1.0<2"),
        ],
        distribution=PACKAGE,
        version="0.3",
    )


@pytest.fixture
def overrides(tmp_path: Path) -> list[str]:
    pq.write_table(
        pa.table(
            {
                "data_source": ["t"],
                "prompt": [[{"role": "user", "content": "hi"}]],
                "reward_model": [{"ground_truth": "x"}],
            }
        ),
        tmp_path / "train.parquet",
    )
    (tmp_path / "model").mkdir()
    return [
        "~recipe",
        f"data.train_files={tmp_path / 'train.parquet'}",
        f"actor_rollout_ref.model.path={tmp_path / 'model'}",
        "actor_rollout_ref.actor.strategy=eng",
        "actor_rollout_ref.rollout.name=roll",
        "actor_rollout_ref.rollout.n=2",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    ]


# ---- judging a declaration ---------------------------------------------------------------------
def test_api_version_is_the_one_the_specs_are_judged_against() -> None:
    assert API_VERSION == "1.4"


@pytest.mark.parametrize("declared", [None, "", ">=1.0,<2", "~=1.0", "==1.*", ">=0.9"])
def test_ranges_admitting_this_api_are_compatible(declared: str | None) -> None:
    assert api_incompatibility(declared, PACKAGE, "0.3") is None


def test_a_range_above_this_api_says_upgrade_polyrl() -> None:
    assert api_incompatibility(">=2.0", PACKAGE, "0.3") == NEWER


@pytest.mark.parametrize("declared", ["<1.0", "==0.*", ">=0.5,<1"])
def test_a_range_below_this_api_names_a_plugin_release(declared: str) -> None:
    why = api_incompatibility(declared, PACKAGE, "0.3")
    assert why == (
        f"polyrl-foo 0.3 supports polyrl API {declared}, this polyrl has API {API_VERSION}: "
        f"install a polyrl-foo release for API 1.x"
    )


@pytest.mark.parametrize("declared", [">=1.0<2", "1.0", 1.0])
def test_an_invalid_specifier_is_incompatible(declared: object) -> None:
    why = api_incompatibility(declared, PACKAGE, "0.3")
    assert why is not None and "\n" not in why
    assert f"declares api_version={declared!r}" in why and "not a PEP 440" in why
    assert "install another polyrl-foo release" in why


# ---- listing -----------------------------------------------------------------------------------
def test_plugins_lists_incompatible_registrations_with_the_reason(plugins, capsys) -> None:
    assert main(["plugins", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["fits"]["status"] == "ok" and rows["undeclared"]["status"] == "ok"
    assert (rows["too_new"]["status"], rows["too_new"]["error"]) == ("incompatible", NEWER)
    assert rows["too_old"]["status"] == rows["garbled"]["status"] == "incompatible"
    assert "not a PEP 440" in rows["garbled"]["error"]


def test_plugins_table_shows_incompatible_and_exits_0(plugins, capsys) -> None:
    assert main(["plugins", "--kind", "advantage_estimator"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("too_new "))
    assert line.split()[:5] == ["too_new", "advantage_estimator", PACKAGE, "0.3", "incompatible"]
    assert line.endswith(NEWER)


def test_doctor_counts_an_incompatible_registration_as_a_problem(plugins) -> None:
    found = {f.name: f for f in doctor.plugins()}
    assert not found["plugin advantage_estimator too_new"].ok
    assert NEWER in found["plugin advantage_estimator too_new"].value
    assert found["plugin advantage_estimator fits"].ok


# ---- selecting ---------------------------------------------------------------------------------
def test_get_refuses_an_incompatible_registration(plugins) -> None:
    assert plugins.get(PluginKind.ADVANTAGE_ESTIMATOR, "fits").name == "fits"
    with pytest.raises(PluginIncompatibleError) as info:
        plugins.get(PluginKind.ADVANTAGE_ESTIMATOR, "too_new")
    assert str(info.value) == f"advantage_estimator 'too_new' is incompatible: {NEWER}"


def test_validate_accepts_a_compatible_declaration(plugins, overrides, capsys) -> None:
    assert main(["validate", *overrides, "algorithm.adv_estimator=fits"]) == 0, (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("name", ["too_new", "garbled"])
def test_validate_selecting_an_incompatible_plugin_is_one_line(
    plugins, overrides, capsys, name: str
) -> None:
    assert main(["validate", *overrides, f"algorithm.adv_estimator={name}"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"error: advantage_estimator {name!r} is incompatible: ")
    if name == "too_new":
        assert err[0].endswith(NEWER)


def test_an_incompatible_algorithm_claiming_the_estimator_is_refused(
    plugins, register_plugin
) -> None:
    """Chosen through ``algorithm.adv_estimator`` rather than by name, it is judged the same."""
    registry = register_plugin(
        AlgorithmSpec(
            name="foo_algo",
            description="owns fits",
            pipeline="polyrl.step.policy_gradient:policy_gradient_pipeline",
            estimators=("fits",),
            api_version=">=2.0",
        ),
        distribution=PACKAGE,
        version="0.3",
    )
    with pytest.raises(PluginIncompatibleError, match="algorithm 'foo_algo' is incompatible"):
        select_algorithm(None, "fits", registry)


def test_an_installed_incompatible_scorer_stops_validate(
    plugins, register_plugin, overrides, capsys
) -> None:
    """Data-source scorers are used because they are installed, so one that is incompatible
    stops every run, not only runs naming it."""
    register_plugin(
        DataSourceScorerSpec(
            name="foo_scorer",
            description="scores foo rows",
            fn=f"{__name__}:zero_advantage",
            data_sources=("foo",),
            api_version=">=2.0",
        ),
        distribution=PACKAGE,
        version="0.3",
    )
    assert main(["validate", *overrides, "algorithm.adv_estimator=fits"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"error: data_source_scorer 'foo_scorer' is incompatible: {NEWER}"]


def test_the_template_plugin_declares_a_range_this_api_satisfies() -> None:
    template = pytest.importorskip("polyrl_plugin_template.plugin")
    specs = [*template.polyrl_advantage_estimators(), *template.polyrl_reward_providers()]
    assert specs and all(spec.api_version == template.API_RANGE for spec in specs)
    assert api_incompatibility(template.API_RANGE, "polyrl-plugin-template", "0") is None


def test_preflight_names_the_reason_not_an_install_of_the_first_party_package(
    isolated_registry, register_plugin
) -> None:
    """``vllm`` is first-party: an installed release for another API must not be reported as
    "not installed"."""
    registry = register_plugin(
        RolloutEngineSpec(
            name="vllm",
            description="an old vLLM engine",
            engine="polyrl.interfaces.rollout_engine:RolloutEngine",
            api_version="<1.0",
        ),
        distribution="polyrl-rollout-vllm",
        version="0.0.1",
    )
    cfg = OmegaConf.create(
        {
            "actor_rollout_ref": {"actor": {"strategy": "fsdp"}, "rollout": {"name": "vllm"}},
            "algorithm": {"name": None, "adv_estimator": "grpo"},
            "trainer": {"logger": ["console"], "device": "cpu"},
        }
    )
    with pytest.raises(PolyrlError) as info:
        preflight(cfg, registry)
    line = next(x for x in str(info.value).splitlines() if x.startswith("actor_rollout_ref.roll"))
    assert line == (
        "actor_rollout_ref.rollout.name=vllm: rollout_engine 'vllm' is incompatible: "
        f"polyrl-rollout-vllm 0.0.1 supports polyrl API <1.0, this polyrl has API {API_VERSION}: "
        "install a polyrl-rollout-vllm release for API 1.x"
    )
