"""``polyrl validate`` calls the selected estimator and policy loss on a synthetic batch: a plugin
that breaks its contract (a [B] loss, a bare tensor, NaN, a wrong shape) is one line naming the
plugin, its package and the rule, before anything starts."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from polyrl.cli import main
from polyrl.config import load_config
from polyrl.config.checks import contracts
from polyrl.config.checks.checker import Checker
from polyrl.config.checks.plugins import check_selection
from polyrl.config.validate import validate_config
from polyrl.registry import get_registry
from polyrl.specs import (
    ESTIMATOR_KEYS,
    AdvantageEstimatorSpec,
    PolicyLossSpec,
    RolloutEngineSpec,
    TrainingEngineSpec,
)

PACKAGE = "polyrl-contract-test"
LOSS_KEY = "actor_rollout_ref.actor.policy_loss.loss_mode"
ESTIMATOR_KEY = "algorithm.adv_estimator"


# ---- implementations, good and bad -------------------------------------------------------------
def good_estimator(batch, config):
    mask = batch["response_mask"]
    score = (batch["token_level_rewards"] * mask).sum(-1, keepdim=True)
    return score * mask, score * mask


CALLED_WITH: list[list[str]] = []


def values_estimator(batch, config):
    """Records the keys it was given (the spec requires ``values``)."""
    CALLED_WITH.append(sorted([*batch.tensors, *batch.non_tensors]))
    return batch["values"] * 0, batch["values"].clone()


def row_estimator(batch, config):
    """One advantage per response: [B], not [B, T]."""
    return batch["token_level_rewards"].sum(-1), batch["token_level_rewards"].sum(-1)


def good_loss(batch, log_prob, config):
    ratio = torch.exp(log_prob - batch["old_log_probs"])
    return -batch["advantages"] * ratio, {"ratio": float(ratio.detach().mean())}


def row_loss(batch, log_prob, config):
    """Aggregated per response: [B]."""
    loss, metrics = good_loss(batch, log_prob, config)
    return loss.sum(-1), metrics


def bare_loss(batch, log_prob, config):
    """The matrix without its metrics."""
    return good_loss(batch, log_prob, config)[0]


def nan_loss(batch, log_prob, config):
    loss, metrics = good_loss(batch, log_prob, config)
    return loss * float("nan"), metrics


def undeclared_key_loss(batch, log_prob, config):
    """Reads a key its spec does not require: the batch lacks it."""
    return good_loss(batch, log_prob, config)[0] * batch["rollout_log_probs"], {}


def never_called(*args):
    raise AssertionError("a plugin requiring a key the check cannot make up must not be called")


SPECS = [
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
    AdvantageEstimatorSpec(name="good_est", description="g", fn=good_estimator),
    AdvantageEstimatorSpec(name="row_est", description="[B]", fn=row_estimator),
    AdvantageEstimatorSpec(
        name="gae_like",
        description="needs values",
        fn=values_estimator,
        requires=(*ESTIMATOR_KEYS, "values"),
    ),
    AdvantageEstimatorSpec(
        name="exotic_est",
        description="needs a key nobody can make up",
        fn=never_called,
        requires=(*ESTIMATOR_KEYS, "my_special_baseline"),
    ),
    PolicyLossSpec(name="good_loss", description="g", fn=good_loss),
    PolicyLossSpec(name="row_loss", description="[B]", fn=row_loss),
    PolicyLossSpec(name="bare_loss", description="bare", fn=bare_loss),
    PolicyLossSpec(name="nan_loss", description="nan", fn=nan_loss),
    PolicyLossSpec(name="undeclared", description="reads more", fn=undeclared_key_loss),
    PolicyLossSpec(name="typo_loss", description="typo", fn=f"{__name__}:good_losss"),
]


@pytest.fixture
def plugins(isolated_registry, register_plugin):
    return register_plugin(SPECS, distribution=PACKAGE, version="2.5")


@pytest.fixture
def overrides(tmp_path: Path) -> list[str]:
    table = pa.table(
        {
            "data_source": ["t"],
            "prompt": [[{"role": "user", "content": "hi"}]],
            "reward_model": [{"ground_truth": "x"}],
        }
    )
    pq.write_table(table, tmp_path / "train.parquet")
    (tmp_path / "model").mkdir()
    return [
        "~recipe",
        f"data.train_files={tmp_path / 'train.parquet'}",
        f"actor_rollout_ref.model.path={tmp_path / 'model'}",
        "actor_rollout_ref.actor.strategy=eng",
        "actor_rollout_ref.rollout.name=roll",
        f"{ESTIMATOR_KEY}=good_est",
        f"{LOSS_KEY}=good_loss",
        "trainer.device=cpu",
        "actor_rollout_ref.rollout.n=2",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    ]


def problems(overrides: list[str], *more: str) -> list[str]:
    return validate_config(load_config([*overrides, *more]))


def one_line(overrides: list[str], *more: str) -> str:
    found = problems(overrides, *more)
    assert len(found) == 1, found
    assert "\n" not in found[0]
    return found[0]


# ---- validate ----------------------------------------------------------------------------------
def test_good_estimator_and_loss_pass(plugins, overrides) -> None:
    assert problems(overrides) == []


def test_a_loss_returning_one_value_per_response_is_refused(plugins, overrides) -> None:
    line = one_line(overrides, f"{LOSS_KEY}=row_loss")
    assert line.startswith(f"{LOSS_KEY}='row_loss' (package {PACKAGE} 2.5): ")
    assert "the loss must be per token [B, T] = (4, 6), got shape (4,)" in line
    assert line.endswith("see polyrl.interfaces.PolicyLossFn")


def test_a_bare_tensor_where_a_tuple_is_required_is_refused(plugins, overrides) -> None:
    line = one_line(overrides, f"{LOSS_KEY}=bare_loss")
    assert line.startswith(f"{LOSS_KEY}='bare_loss' (package {PACKAGE} 2.5): ")
    assert "must return a tuple (loss[B, T], metrics), got a bare tensor of shape (4, 6)" in line


def test_a_nan_loss_is_refused(plugins, overrides) -> None:
    line = one_line(overrides, f"{LOSS_KEY}=nan_loss")
    assert "'nan_loss' (package polyrl-contract-test 2.5)" in line
    assert "the loss has non-finite values (NaN or inf) on real tokens" in line


def test_an_estimator_of_the_wrong_shape_is_refused(plugins, overrides) -> None:
    line = one_line(overrides, f"{ESTIMATOR_KEY}=row_est")
    assert line.startswith(f"{ESTIMATOR_KEY}='row_est' (package {PACKAGE} 2.5): ")
    assert "advantages must be per token [B, T] = (4, 6), got shape (4,)" in line
    assert "returns must be per token" in line  # both rules broken: still one line
    assert line.endswith("see polyrl.interfaces.AdvantageEstimatorFn")


def test_a_loss_reading_an_undeclared_key_is_refused(plugins, overrides) -> None:
    line = one_line(overrides, f"{LOSS_KEY}=undeclared")
    assert "'undeclared' (package polyrl-contract-test 2.5): calling it on a synthetic" in line
    assert "rollout_log_probs" in line


def test_a_required_key_that_cannot_be_made_up_skips_the_call(plugins, overrides) -> None:
    # (validate would also refuse it: no stage of the standard step provides that key)
    checker = Checker(load_config([*overrides, f"{ESTIMATOR_KEY}=exotic_est"]), get_registry())
    selected = check_selection(checker)
    contracts.check_contracts(checker, selected)  # never_called would raise
    assert checker.problems == []


def test_a_misspelled_import_string_is_a_config_error(plugins, overrides) -> None:
    line = one_line(overrides, f"{LOSS_KEY}=typo_loss")
    assert line.startswith(
        f"{LOSS_KEY}='typo_loss': policy_loss 'typo_loss' from package {PACKAGE}"
    )
    assert "AttributeError" in line and "good_losss" in line


def test_the_command_refuses_it_in_one_line(plugins, overrides, capsys) -> None:
    assert main(["validate", *overrides, f"{LOSS_KEY}=row_loss"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "config is invalid (1 problem(s)):"
    assert err[1].startswith(f"  - {LOSS_KEY}='row_loss' (package {PACKAGE} 2.5)")
    assert main(["validate", *overrides]) == 0
    assert "config OK" in capsys.readouterr().out


def test_only_selected_plugins_are_called(plugins, overrides) -> None:
    # row_loss, bare_loss ... are registered but not selected: nothing about them
    assert problems(overrides) == []


def test_other_problems_first(plugins, overrides) -> None:
    """With the config already wrong, the plugins are not called (their knobs come from it)."""
    found = problems(overrides, f"{LOSS_KEY}=row_loss", "actor_rollout_ref.actor.clip_ratio=2")
    assert len(found) == 1 and "clip_ratio=2" in found[0]


def test_skipped_without_torch(plugins, overrides, monkeypatch) -> None:
    cfg = load_config([*overrides, f"{LOSS_KEY}=row_loss"])
    checker = Checker(cfg, get_registry())
    selected = check_selection(checker)
    assert checker.problems == []
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    contracts.check_contracts(checker, selected)
    assert checker.problems == []


def test_the_check_is_fast(plugins, overrides) -> None:
    cfg = load_config([*overrides, f"{ESTIMATOR_KEY}=gae_like"])
    checker = Checker(cfg, get_registry())
    selected = check_selection(checker)
    CALLED_WITH.clear()
    contracts.check_contracts(checker, selected)  # warm: torch imported, modules loaded
    start = time.perf_counter()
    contracts.check_contracts(checker, selected)
    assert time.perf_counter() - start < 0.5
    assert checker.problems == []
    # the batch holds exactly what the spec requires, values included (the step's chain check,
    # which would refuse gae_like on the standard step, is not part of this call)
    keys = sorted(["token_level_rewards", "response_mask", "values", "uid"])
    assert [keys, keys] == CALLED_WITH


def test_the_global_rng_is_untouched(plugins, overrides) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    assert problems(overrides) == []
    assert torch.equal(torch.rand(3), expected)


# ---- the rules themselves (shared with polyrl.testing's conformance suites) -------------------
def test_rules_accept_a_conforming_result() -> None:
    mask = torch.ones(2, 3)
    assert contracts.estimator_output_problems((mask * 0, mask * 0), mask) == []
    assert contracts.policy_loss_output_problems((mask * 0, {"kl": 0.0}), mask) == []


def test_rules_name_what_is_wrong() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss = torch.zeros(2, 3)
    assert contracts.policy_loss_output_problems((loss.long(), {}), mask) == [
        "the loss must be floating point, got torch.int64"
    ]
    padded_nan = loss.clone()
    padded_nan[1, 2] = float("nan")  # padding only: allowed for a loss
    assert contracts.policy_loss_output_problems((padded_nan, {}), mask) == []
    assert contracts.policy_loss_output_problems((loss, [1.0]), mask) == [
        "metrics must be a dict of names to scalars, got a list of 1 item(s)"
    ]
    assert contracts.policy_loss_output_problems((loss, {"kl": float("inf")}), mask) == [
        "metric 'kl' is not a finite scalar (got a float)"
    ]
    assert contracts.estimator_output_problems(loss, mask) == [
        "it must return a tuple (advantages[B, T], returns[B, T]), got a bare tensor of shape "
        "(2, 3)"
    ]
    assert contracts.estimator_output_problems((loss, padded_nan), mask) == [
        "returns has non-finite values (NaN or inf)"
    ]
    assert contracts.estimator_output_problems((loss, [0.0]), mask) == [
        "returns must be a tensor, got a list of 1 item(s)"
    ]
