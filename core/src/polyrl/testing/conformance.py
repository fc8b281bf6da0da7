"""Conformance suites: one base test class per plugin kind.

A plugin's test module subclasses the class of its kind, names the registration, and inherits tests
that check the contract every trainer relies on::

    class TestGrpo(AdvantageEstimatorConformance):
        plugin_name = "grpo"

    class TestFsdp(TrainingEngineConformance):
        plugin_name = "fsdp2"
        vocab_size = 256
        def make_engine(self, tmp_path):
            ...  # a tiny model, one rank
            return engine

The registration is looked up in the installed plugins (entry points). A plugin that is not
installed can set ``plugin_module`` to its hook module (or any object with ``@hookimpl``s); the
suite then builds a registry of the built-ins plus that module.

The class names do not start with ``Test``, so pytest collects them only through subclasses.
torch is imported inside the tests, never when this module is imported.
"""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
from dataclasses import is_dataclass
from importlib import metadata
from typing import Any, ClassVar

import pytest

from polyrl.registry import BUILTIN_DISTRIBUTION, Provenance, Registration, Registry, discover
from polyrl.specs import SPEC_TYPES, PluginKind, resolve_object

HEAVY_MODULES = (
    "torch",
    "vllm",
    "sglang",
    "megatron",
    "deepspeed",
    "ray",
    "transformers",
    "tensorflow",
    "jax",
)


def _entry_point_module(provenance: Provenance) -> str | None:
    """The module an installed plugin's entry point names (``polyrl.builtins`` for built-ins)."""
    if provenance.distribution == BUILTIN_DISTRIBUTION and provenance.plugin == "builtins":
        return "polyrl.builtins"
    for ep in metadata.entry_points(group="polyrl"):
        dist = getattr(ep, "dist", None)
        if (
            ep.name == provenance.plugin
            and dist is not None
            and dist.metadata["Name"] == provenance.distribution
        ):
            return ep.value.partition(":")[0]
    return None


@functools.cache
def _heavy_imports_of(module: str, pythonpath: str | None) -> tuple[int, str, list[str]]:
    """``(exit status, stderr, the HEAVY_MODULES loaded)`` of importing ``module`` in a fresh
    interpreter. Once per module (and ``PYTHONPATH``) in a process: a package's registrations
    share their entry-point module, and each of its conformance classes asks about it."""
    code = (
        "import importlib, json, sys\n"
        f"importlib.import_module({module!r})\n"
        f"print(json.dumps([m for m in {list(HEAVY_MODULES)!r} if m in sys.modules]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0:
        return done.returncode, done.stderr, []
    return 0, done.stderr, json.loads(done.stdout.strip().splitlines()[-1])


def _scalar(value: Any) -> float:
    """A metric value (float, int or 0-d tensor) as a float."""
    if hasattr(value, "item"):
        return float(value.item())
    return float(value)


class _PluginConformance:
    """Tests every registration passes, whatever its kind."""

    kind: ClassVar[PluginKind]
    plugin_name: ClassVar[str] = ""
    plugin_module: ClassVar[Any] = None
    """Set to a hook module/object to test a plugin that is not installed."""

    # ---- fixtures ----------------------------------------------------------------------------
    @pytest.fixture
    def conformance_registry(self) -> Registry:
        if not self.plugin_name:
            pytest.fail(f"{type(self).__name__} must set plugin_name = '<registered name>'")
        if self.plugin_module is None:
            return discover()
        from polyrl import builtins

        registry = Registry()
        registry.add_plugin(builtins, Provenance("builtins", BUILTIN_DISTRIBUTION, "0"))
        registry.add_plugin(self.plugin_module, Provenance("in-process", "in-process", "0"))
        return registry

    @pytest.fixture
    def registration(self, conformance_registry: Registry) -> Registration:
        return conformance_registry.get(self.kind, self.plugin_name)

    @pytest.fixture
    def implementation(self, registration: Registration) -> Any:
        return registration.load()

    # ---- tests -------------------------------------------------------------------------------
    def test_registered_with_its_spec_type(self, registration: Registration) -> None:
        assert isinstance(registration.spec, SPEC_TYPES[self.kind]), (
            f"{self.plugin_name!r} must be registered with {SPEC_TYPES[self.kind].__name__}"
        )
        assert registration.name == self.plugin_name

    def test_description_is_one_nonempty_line(self, registration: Registration) -> None:
        description = registration.spec.description
        assert isinstance(description, str) and description.strip(), "give a description"
        assert "\n" not in description.strip(), "the description is shown in a table: one line"

    def test_plugin_module_not_broken(
        self, conformance_registry: Registry, registration: Registration
    ) -> None:
        broken = [
            b
            for b in conformance_registry.broken
            if (b.distribution, b.plugin)
            == (registration.provenance.distribution, registration.provenance.plugin)
        ]
        assert not broken, f"the plugin module failed partly: {broken[0].traceback}"

    def test_capability_flags_are_json(self, registration: Registration) -> None:
        flags = registration.spec.capability_flags()
        assert isinstance(flags, dict)
        json.dumps(flags)

    def test_config_class_is_a_dataclass_with_defaults(self, registration: Registration) -> None:
        config_class = getattr(registration.spec, "config_class", None)
        if config_class is None:
            return
        cls = resolve_object(config_class)
        assert is_dataclass(cls), f"config_class {config_class!r} must be a dataclass"
        cls()  # every field needs a default: the plugin's section may be absent

    def test_entry_point_module_is_light(self, registration: Registration) -> None:
        """Listing plugins imports the entry-point module: it must not pull in torch & co."""
        module = _entry_point_module(registration.provenance)
        if module is None:
            pytest.skip("not installed through an entry point (plugin_module is in-process)")
        code, stderr, heavy = _heavy_imports_of(module, os.environ.get("PYTHONPATH"))
        assert code == 0, stderr
        assert heavy == [], (
            f"importing {module} imports {heavy}; name implementations by import string "
            f"('pkg.module:Class') or import inside the hookimpl"
        )


# ---- advantage estimators and policy losses ----------------------------------------------------
class _RequiredKeysBatch:
    """Builds the batch an estimator or a loss is called with: exactly the keys its spec
    ``requires``, so that reading an undeclared key fails here (with a ``KeyError`` naming it)
    instead of in a run whose step did not happen to provide it."""

    def extra_fields(self, rows: int, length: int) -> dict[str, Any]:
        """Fields your spec ``requires`` that this suite cannot make up (a baseline, a second
        reward ...): ``{key: tensor or array}``, each with ``rows`` rows; ``length`` is the
        response width."""
        return {}

    def required_batch(self, registration: Registration, known: dict[str, Any]) -> Any:
        """A :class:`~polyrl.batch.Batch` of the required keys, taken from ``known`` (the fields
        this suite makes up) and :meth:`extra_fields`."""
        from polyrl.batch import Batch

        rows, length = known["response_mask"].shape
        fields = {**known, **self.extra_fields(rows, length)}
        requires = registration.spec.requires
        missing = [key for key in requires if key not in fields]
        if missing:
            pytest.fail(
                f"the spec requires {missing}, which this suite cannot make up; return them "
                f"from {type(self).__name__}.extra_fields(rows, length)"
            )
        batch = Batch()
        for key in requires:
            batch[key] = fields[key]
        return batch


class AdvantageEstimatorConformance(_RequiredKeysBatch, _PluginConformance):
    """``(advantages, returns) = fn(batch, config)``; the batch holds the keys of the spec's
    ``requires`` (this suite makes up ``token_level_rewards``, ``response_mask``, ``uid`` and
    ``values``; give others with ``extra_fields``).

    Override ``config_overrides`` to set ``algorithm.*`` knobs (e.g. ``{"gamma": 0.99}``).
    Set ``zero_for_equal_group_rewards = False`` if, unlike GRPO/RLOO, your group estimator gives
    non-zero advantages when all samples of a prompt score the same.
    """

    kind = PluginKind.ADVANTAGE_ESTIMATOR
    num_groups: ClassVar[int] = 3
    group_size: ClassVar[int] = 4
    response_length: ClassVar[int] = 7
    config_overrides: ClassVar[dict[str, Any]] = {}
    zero_for_equal_group_rewards: ClassVar[bool] = True
    check_permutation: ClassVar[bool] = True

    def estimator_config(self) -> Any:
        from polyrl.testing.configs import algorithm_config

        return algorithm_config(**self.config_overrides)

    def make_batch(self, registration: Registration, seed: int = 0) -> Any:
        """Outcome rewards on the last real token of ragged responses, grouped by prompt."""
        import numpy as np
        import torch

        gen = torch.Generator().manual_seed(seed)
        rows, length = self.num_groups * self.group_size, self.response_length
        lengths = torch.randint(1, length + 1, (rows,), generator=gen)
        lengths[0], lengths[-1] = length, 1  # a full row and a one-token row
        mask = (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).float()
        rewards = torch.zeros(rows, length)
        scores = torch.randn(rows, generator=gen)
        rewards[torch.arange(rows), lengths - 1] = scores
        known = {
            "token_level_rewards": rewards,
            "response_mask": mask,
            "uid": np.array([f"prompt-{i // self.group_size}" for i in range(rows)], dtype=object),
            "values": torch.randn(rows, length, generator=gen) * mask,
        }
        return self.required_batch(registration, known)

    def run(self, implementation: Any, batch: Any) -> tuple[Any, Any]:
        return implementation(batch, self.estimator_config())

    def test_is_callable(self, implementation: Any) -> None:
        assert callable(implementation)

    def test_outputs_shape_dtype_finite(
        self, implementation: Any, registration: Registration
    ) -> None:
        """The rules ``polyrl validate`` checks too (:mod:`polyrl.config.checks.contracts`)."""
        from polyrl.config.checks.contracts import estimator_output_problems

        batch = self.make_batch(registration)
        problems = estimator_output_problems(
            self.run(implementation, batch), batch["response_mask"]
        )
        assert not problems, "; ".join(problems)

    def test_zero_outside_response_mask(
        self, implementation: Any, registration: Registration
    ) -> None:
        batch = self.make_batch(registration)
        advantages, returns = self.run(implementation, batch)
        outside = batch["response_mask"] == 0
        assert (advantages[outside] == 0).all(), "advantages must be 0 on padding"
        assert (returns[outside] == 0).all(), "returns must be 0 on padding"

    def test_inputs_not_modified(self, implementation: Any, registration: Registration) -> None:
        batch = self.make_batch(registration)
        before = {key: value.clone() for key, value in batch.tensors.items()}
        self.run(implementation, batch)
        for key, value in before.items():
            assert (batch[key] == value).all(), f"the estimator modified {key} in place"

    def test_rows_permute_with_their_group_ids(
        self, implementation: Any, registration: Registration
    ) -> None:
        """Shuffling rows (with their group ids) shuffles the outputs the same way."""
        import torch

        if not self.check_permutation:
            pytest.skip("check_permutation = False")
        batch = self.make_batch(registration)
        advantages, returns = self.run(implementation, batch)
        perm = torch.randperm(len(batch), generator=torch.Generator().manual_seed(1))
        adv2, ret2 = self.run(implementation, batch.select_rows(perm))
        torch.testing.assert_close(adv2, advantages[perm], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(ret2, returns[perm], atol=1e-5, rtol=1e-4)

    def test_equal_rewards_in_every_group_give_zero_advantage(
        self, implementation: Any, registration: Registration
    ) -> None:
        if not (registration.spec.requires_groups and self.zero_for_equal_group_rewards):
            pytest.skip("only for group-relative estimators")
        import torch

        batch = self.make_batch(registration)
        mask = batch["response_mask"]
        last = mask.sum(-1).long() - 1
        rewards = torch.zeros_like(mask)
        group_score = torch.tensor([float(i // self.group_size) for i in range(mask.shape[0])])
        rewards[torch.arange(mask.shape[0]), last] = group_score
        batch["token_level_rewards"] = rewards
        advantages, _ = self.run(implementation, batch)
        torch.testing.assert_close(advantages, torch.zeros_like(advantages), atol=1e-5, rtol=0)


class PolicyLossConformance(_RequiredKeysBatch, _PluginConformance):
    """``(loss[B, T], metrics) = fn(batch, log_prob, config)``; the batch holds the keys of the
    spec's ``requires`` (this suite makes up ``old_log_probs``, ``advantages``,
    ``response_mask`` and ``rollout_log_probs``; give others with ``extra_fields``).

    ``config_overrides`` sets ``actor_rollout_ref.actor.*`` knobs. ``check_gradient_sign``: at the
    on-policy point a loss to be *minimised* must push log-probs up where the advantage is positive.
    """

    kind = PluginKind.POLICY_LOSS
    batch_size: ClassVar[int] = 4
    response_length: ClassVar[int] = 6
    config_overrides: ClassVar[dict[str, Any]] = {}
    check_gradient_sign: ClassVar[bool] = True

    def loss_config(self) -> Any:
        from polyrl.testing.configs import actor_config

        return actor_config(**self.config_overrides)

    def make_inputs(
        self, registration: Registration, seed: int = 0, on_policy: bool = False
    ) -> tuple[Any, Any]:
        """``(batch, log_prob)``: ragged responses, the current log-probs (a leaf that requires
        grad) drifted from the old ones unless ``on_policy``, one advantage per response."""
        import torch

        gen = torch.Generator().manual_seed(seed)
        rows, length = self.batch_size, self.response_length
        lengths = torch.randint(1, length + 1, (rows,), generator=gen)
        lengths[0] = length
        mask = (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).float()
        old = -torch.rand(rows, length, generator=gen) * 3 * mask
        drift = 0.0 if on_policy else 0.1
        new = (old + drift * torch.randn(rows, length, generator=gen) * mask).requires_grad_(True)
        advantages = torch.randn(rows, 1, generator=gen).expand(rows, length) * mask
        known = {
            "old_log_probs": old,
            "advantages": advantages.contiguous(),
            "response_mask": mask,
            "rollout_log_probs": old + 0.05 * torch.randn(rows, length, generator=gen) * mask,
        }
        return self.required_batch(registration, known), new

    def run(self, implementation: Any, batch: Any, log_prob: Any) -> tuple[Any, Any]:
        return implementation(batch, log_prob, self.loss_config())

    def test_is_callable(self, implementation: Any) -> None:
        assert callable(implementation)

    def test_returns_token_matrix_and_metrics(
        self, implementation: Any, registration: Registration
    ) -> None:
        """The rules ``polyrl validate`` checks too (:mod:`polyrl.config.checks.contracts`)."""
        from polyrl.config.checks.contracts import policy_loss_output_problems

        batch, log_prob = self.make_inputs(registration)
        problems = policy_loss_output_problems(
            self.run(implementation, batch, log_prob),
            batch["response_mask"],
            registration.spec.level,
        )
        assert not problems, "; ".join(problems)

    def test_has_gradient_wrt_log_prob(
        self, implementation: Any, registration: Registration
    ) -> None:
        import torch

        batch, log_prob = self.make_inputs(registration)
        loss, _ = self.run(implementation, batch, log_prob)
        mask = batch["response_mask"]
        (loss.sum() if loss.dim() == 1 else (loss * mask).sum()).backward()
        grad = log_prob.grad
        assert grad is not None, "the loss does not depend on log_prob"
        assert torch.isfinite(grad).all()
        assert (grad[mask > 0] != 0).any(), "the gradient w.r.t. log_prob is zero everywhere"
        assert (grad[mask == 0] == 0).all()

    def test_on_policy_gradient_follows_the_advantage(
        self, implementation: Any, registration: Registration
    ) -> None:
        import torch

        if not self.check_gradient_sign:
            pytest.skip("check_gradient_sign = False")
        batch, log_prob = self.make_inputs(registration, on_policy=True)
        loss, _ = self.run(implementation, batch, log_prob)
        mask = batch["response_mask"]
        (loss * mask).sum().backward()
        grad, adv = log_prob.grad, batch["advantages"]
        product = (grad * adv)[mask > 0]
        assert (product <= 1e-6).all(), "minimising the loss must raise log-probs where A > 0"
        assert product.sum() < 0
        assert torch.isfinite(grad).all()

    def test_inputs_not_modified(self, implementation: Any, registration: Registration) -> None:
        batch, log_prob = self.make_inputs(registration)
        before = {key: value.clone() for key, value in batch.tensors.items()}
        log_prob_before = log_prob.detach().clone()
        self.run(implementation, batch, log_prob)
        for key, value in before.items():
            assert (batch[key] == value).all(), f"the loss modified {key} in place"
        assert (log_prob.detach() == log_prob_before).all(), "the loss modified log_prob in place"


# ---- reward providers --------------------------------------------------------------------------
class AlgorithmConformance(_PluginConformance):
    """An :class:`~polyrl.specs.AlgorithmSpec`: its pipeline builds from a composed config, every
    stage declares its contract, the chain of batch keys is complete, and the stages use only the
    roles the spec declares.

    ``overrides`` are the config overrides the pipeline is built with (a recipe and the keys that
    select this algorithm); the default selects it by name on ``recipe=tiny``.
    """

    kind = PluginKind.ALGORITHM

    def overrides(self) -> list[str]:
        return ["recipe=tiny", f"algorithm.name={self.plugin_name}"]

    @pytest.fixture
    def pipeline(self, conformance_registry: Registry) -> Any:
        from polyrl.config.loader import load_config
        from polyrl.plan import build_pipeline

        return build_pipeline(load_config(self.overrides()), conformance_registry)

    def test_every_stage_declares_its_contract(self, pipeline: Any) -> None:
        from polyrl.step import Stage

        for stage in pipeline.stages:
            assert isinstance(stage, Stage), f"{stage!r} must subclass polyrl.step.Stage"
            assert stage.name, f"{type(stage).__name__} needs a name"
            for field in ("requires", "provides", "roles"):
                value = getattr(stage, field)
                assert isinstance(value, tuple) and all(isinstance(v, str) for v in value), (
                    f"stage {stage.name!r}: {field} must be a tuple of strings, got {value!r}"
                )

    def test_the_chain_of_batch_keys_is_complete(self, pipeline: Any) -> None:
        assert pipeline.check() == []

    def test_roles_used_are_declared(self, pipeline: Any, registration: Registration) -> None:
        undeclared = set(pipeline.roles()) - set(registration.spec.roles)
        assert not undeclared, f"stages use roles {undeclared} that the spec does not declare"

    def test_config_defaults_are_declared_keys(self, registration: Registration) -> None:
        from polyrl.config.keys import FREE_FORM_PREFIXES, schema_keys

        declared = set(schema_keys())
        for key in registration.spec.config_defaults:
            assert key in declared or key.startswith(tuple(p + "." for p in FREE_FORM_PREFIXES)), (
                f"config_defaults key {key!r} is not a config key (`polyrl config` lists them)"
            )


class RewardProviderConformance(_PluginConformance):
    """A :class:`polyrl.interfaces.RewardProvider`: one :class:`RewardResult` per sample, in order.

    Override ``make_samples`` with samples your provider scores (``data_source`` etc.) and
    ``expected_scores`` with the scores you derived by hand for them.
    """

    kind = PluginKind.REWARD_PROVIDER
    reward_model_overrides: ClassVar[dict[str, Any]] = {}

    def make_context(self) -> Any:
        from omegaconf import OmegaConf

        from polyrl.config.sections import schema_config
        from polyrl.interfaces import RewardContext

        # The schema with the installed plugins' sections: a provider reads the settings of the
        # scorers other packages add (reward_model.<their key>) as in a run.
        cfg = OmegaConf.merge(schema_config(), {"reward_model": self.reward_model_overrides})
        return RewardContext(
            reward_model=cfg.reward_model,
            custom_reward_function=cfg.custom_reward_function,
            seed=0,
        )

    def make_samples(self) -> list[Any]:
        from polyrl.interfaces import RewardSample

        answers = ["The answer is 4.", "#### 4", "I think it is 5", ""]
        return [
            RewardSample(index=i, data_source="conformance", solution_str=a, ground_truth="4")
            for i, a in enumerate(answers)
        ]

    def expected_scores(self) -> list[float] | None:
        """Scores of ``make_samples()`` derived by hand; None skips the value check."""
        return None

    @pytest.fixture
    def provider(self, implementation: Any) -> Any:
        instance = implementation(self.make_context())
        yield instance
        instance.close()

    def test_is_reward_provider(self, implementation: Any) -> None:
        from polyrl.interfaces import RewardProvider

        assert isinstance(implementation, type) and issubclass(implementation, RewardProvider)

    def test_one_finite_result_per_sample(self, provider: Any) -> None:
        from polyrl.interfaces import RewardResult

        samples = self.make_samples()
        results = provider.score(samples)
        assert len(results) == len(samples)
        for result in results:
            assert isinstance(result, RewardResult)
            assert isinstance(result.score, (int, float)) and math.isfinite(result.score)
            for name, value in result.extra.items():
                assert isinstance(name, str) and math.isfinite(float(value))

    def test_empty_batch(self, provider: Any) -> None:
        assert provider.score([]) == []

    def test_expected_scores(self, provider: Any) -> None:
        expected = self.expected_scores()
        if expected is None:
            pytest.skip("expected_scores() not given")
        scores = [r.score for r in provider.score(self.make_samples())]
        assert scores == pytest.approx(expected, abs=1e-6)


# ---- loggers -----------------------------------------------------------------------------------
class LoggerConformance(_PluginConformance):
    """A :class:`polyrl.interfaces.MetricsLogger`: accepts steps of scalar metrics and finishes.

    Override ``check_logged(tmp_path, logged)`` to assert what your logger wrote.
    """

    kind = PluginKind.LOGGER

    def make_context(self, tmp_path: Any) -> Any:
        from polyrl.interfaces import LoggerContext

        return LoggerContext(
            project_name="conformance",
            experiment_name="test",
            log_dir=str(tmp_path),
            total_steps=2,
            config={"trainer": {"project_name": "conformance"}},
        )

    def check_logged(self, tmp_path: Any, logged: list[tuple[int, dict[str, float]]]) -> None:
        """Assert what the logger wrote for ``logged`` (``(step, metrics)`` pairs)."""

    def test_is_metrics_logger(self, implementation: Any) -> None:
        from polyrl.interfaces import MetricsLogger

        assert isinstance(implementation, type) and issubclass(implementation, MetricsLogger)

    def test_logs_steps_and_finishes(self, implementation: Any, tmp_path: Any) -> None:
        logger = implementation(self.make_context(tmp_path))
        logged = [
            (1, {"train/loss": 0.5, "train/reward": 1.0, "timing/step_s": 2.0}),
            (2, {"train/loss": 0.25, "train/reward": 2.0, "timing/step_s": 1.5}),
        ]
        for step, metrics in logged:
            logger.log(dict(metrics), step)
        logger.finish()
        self.check_logged(tmp_path, logged)


# ---- engines -----------------------------------------------------------------------------------
def _token_batch(vocab_size: int, rows: int, length: int, seed: int, pad_left: bool) -> Any:
    """Random token ids ``[rows, length]`` and a mask with row 1 padded on one side."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab_size, (rows, length), generator=gen)
    mask = torch.ones(rows, length, dtype=torch.long)
    if rows > 1 and length > 2:
        if pad_left:
            mask[1, :1] = 0
        else:
            mask[1, length // 2 :] = 0
    return ids * mask, mask


class TrainingEngineConformance(_PluginConformance):
    """A :class:`polyrl.interfaces.TrainingEngine` on a tiny model the subclass provides.

    Subclasses implement ``make_engine(self, tmp_path)`` (one rank; initialise
    ``torch.distributed`` there if the engine needs it) and set ``vocab_size``.

    An engine whose spec sets ``supports_value_head`` (it can run a PPO critic) also sets
    ``check_value_head = True`` and implements ``make_value_engine(self, tmp_path)``: the same
    tiny model built with ``EngineContext(head=ModelHead.VALUE, trainable=True)``.

    An engine that skips an optimizer step whose grad norm is not finite, and exposes
    ``global_step`` and its LR ``scheduler`` (the bundled engines do), sets
    ``check_non_finite_skip = True`` to have that tested.
    """

    kind = PluginKind.TRAINING_ENGINE
    vocab_size: ClassVar[int] = 0
    prompt_length: ClassVar[int] = 4
    response_length: ClassVar[int] = 4
    batch_rows: ClassVar[int] = 2
    check_value_head: ClassVar[bool] = False
    check_non_finite_skip: ClassVar[bool] = False

    def make_engine(self, tmp_path: Any) -> Any:
        raise TypeError(f"{type(self).__name__} must define make_engine(self, tmp_path)")

    def make_value_engine(self, tmp_path: Any) -> Any:
        raise TypeError(f"{type(self).__name__} must define make_value_engine(self, tmp_path)")

    def make_batch(self) -> Any:
        """Left-padded prompts followed by right-padded responses (the engine batch layout)."""
        import torch

        from polyrl.batch import Batch

        prompt, prompt_mask = _token_batch(
            self.vocab_size, self.batch_rows, self.prompt_length, 0, pad_left=True
        )
        response, response_mask = _token_batch(
            self.vocab_size, self.batch_rows, self.response_length, 1, pad_left=False
        )
        attention = torch.cat([prompt_mask, response_mask], dim=1)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        return Batch(
            tensors={
                "input_ids": torch.cat([prompt, response], dim=1),
                "attention_mask": attention,
                "position_ids": positions,
                "responses": response,
                "response_mask": response_mask,
            }
        )

    @pytest.fixture
    def engine(self, tmp_path: Any) -> Any:
        if not self.vocab_size:
            pytest.fail(f"{type(self).__name__} must set vocab_size")
        return self.make_engine(tmp_path)

    @staticmethod
    def nll_loss_fn(batch: Any) -> Any:
        """A loss that raises the log-likelihood of ``batch``'s responses, scaled per mini-batch."""
        total = batch["response_mask"].sum().clamp(min=1)

        def loss_fn(micro_batch: Any, log_prob: Any, entropy: Any) -> Any:
            mask = micro_batch["response_mask"].to(log_prob.dtype)
            loss = -(log_prob * mask).sum() / total.to(log_prob.device)
            return loss, {"nll": float(loss.detach())}

        return loss_fn

    def test_implementation_is_training_engine(self, implementation: Any) -> None:
        from polyrl.interfaces import TrainingEngine

        assert isinstance(implementation, type) and issubclass(implementation, TrainingEngine)

    def test_compute_log_prob(self, engine: Any) -> None:
        import torch

        batch = self.make_batch()
        mask = batch["response_mask"] > 0
        log_prob, entropy = engine.compute_log_prob(batch, calculate_entropy=True)
        shape = batch["responses"].shape
        assert log_prob.shape == shape and entropy is not None and entropy.shape == shape
        assert torch.isfinite(log_prob[mask]).all() and (log_prob[mask] <= 1e-4).all()
        assert torch.isfinite(entropy[mask]).all() and (entropy[mask] >= -1e-4).all()
        again, _ = engine.compute_log_prob(batch)
        torch.testing.assert_close(again.float(), log_prob.float())

    def test_train_step_raises_likelihood(self, engine: Any) -> None:
        import torch

        batch = self.make_batch()
        mask = batch["response_mask"] > 0
        before, _ = engine.compute_log_prob(batch)
        metrics = engine.train_step(batch, self.nll_loss_fn(batch))
        for key in ("actor/grad_norm", "actor/lr"):
            assert key in metrics and math.isfinite(_scalar(metrics[key])), key
        after, _ = engine.compute_log_prob(batch)
        assert not torch.equal(before, after), "train_step did not change the weights"
        assert after[mask].float().mean() > before[mask].float().mean()

    def test_named_weights(self, engine: Any) -> None:
        import torch

        weights = list(engine.named_weights())
        assert weights, "named_weights() yielded nothing"
        names = [name for name, _ in weights]
        assert len(set(names)) == len(names), "weight names must be unique"
        for name, tensor in weights:
            assert isinstance(name, str) and isinstance(tensor, torch.Tensor)
            assert torch.isfinite(tensor.float()).all(), name

    def test_checkpoint_round_trip(self, engine: Any, tmp_path: Any) -> None:
        import torch

        batch = self.make_batch()
        saved, _ = engine.compute_log_prob(batch)
        engine.save_checkpoint(str(tmp_path / "ckpt"))
        engine.train_step(batch, self.nll_loss_fn(batch))
        engine.load_checkpoint(str(tmp_path / "ckpt"))
        restored, _ = engine.compute_log_prob(batch)
        torch.testing.assert_close(restored.float(), saved.float(), atol=1e-5, rtol=1e-5)

    def test_export_hf(self, engine: Any, tmp_path: Any) -> None:
        target = tmp_path / "hf"
        engine.export_hf(str(target))
        assert (target / "config.json").is_file(), "export_hf must write a Hugging Face folder"

    def test_non_finite_grad_norm_skips_the_update(self, engine: Any) -> None:
        """A NaN loss: weights stay, the step is reported as skipped, the schedule still
        advances, and the next finite step trains normally (``check_non_finite_skip``)."""
        import torch

        if not self.check_non_finite_skip:
            pytest.skip("check_non_finite_skip = False")
        batch = self.make_batch()
        before = {k: v.clone() for k, v in engine.named_weights()}

        def nan_loss(micro_batch: Any, log_prob: Any, entropy: Any) -> Any:
            return log_prob.sum() * float("nan"), {}

        metrics = engine.train_step(batch, nan_loss)
        assert not math.isfinite(metrics["actor/grad_norm"]) and metrics["actor/skipped_step"] == 1
        assert engine.global_step == 1 and engine.scheduler.last_epoch == 1
        for name, tensor in engine.named_weights():
            assert torch.equal(tensor, before[name]), name
        metrics = engine.train_step(batch, self.nll_loss_fn(batch))
        assert math.isfinite(metrics["actor/grad_norm"]) and "actor/skipped_step" not in metrics
        changed = [n for n, t in engine.named_weights() if not torch.equal(t, before[n])]
        assert changed

    # ---- value head (a critic), for engines whose spec sets supports_value_head ---------------
    @pytest.fixture
    def value_engine(self, tmp_path: Any) -> Any:
        if not self.check_value_head:
            pytest.skip("check_value_head = False: the engine has no value head")
        if not self.vocab_size:
            pytest.fail(f"{type(self).__name__} must set vocab_size")
        return self.make_value_engine(tmp_path)

    @staticmethod
    def value_target_loss_fn(batch: Any, target: float) -> Any:
        """Mean squared distance of the values to ``target`` over the real response tokens,
        scaled per mini-batch (the role of a critic's value loss)."""
        total = batch["response_mask"].sum().clamp(min=1)

        def loss_fn(micro_batch: Any, values: Any) -> Any:
            mask = micro_batch["response_mask"].to(values.dtype)
            loss = (((values - target) ** 2) * mask).sum() / total.to(values.device)
            return loss, {"fit": float(loss.detach())}

        return loss_fn

    def test_value_head_tests_match_the_spec(self, registration: Registration) -> None:
        declared = bool(getattr(registration.spec, "supports_value_head", False))
        assert declared == self.check_value_head, (
            f"the spec says supports_value_head={declared} but {type(self).__name__} sets "
            f"check_value_head={self.check_value_head}: they must agree (a critic is run only on "
            f"engines that declare it, and what is declared is tested)"
        )

    def test_compute_values(self, value_engine: Any) -> None:
        import torch

        batch = self.make_batch()
        values = value_engine.compute_values(batch)
        assert isinstance(values, torch.Tensor) and values.dtype.is_floating_point
        assert values.shape == batch["responses"].shape
        real = batch["response_mask"] > 0
        assert torch.isfinite(values[real]).all()
        assert (values[~real] == 0).all(), "values must be 0 on padding"
        torch.testing.assert_close(value_engine.compute_values(batch), values)

    def test_value_of_a_token_is_read_before_the_token(self, value_engine: Any) -> None:
        """The value at response position ``t`` is the state in which token ``t`` is chosen:
        changing token ``t`` leaves the values at positions ``<= t`` unchanged."""
        import torch

        batch = self.make_batch()
        before = value_engine.compute_values(batch)
        changed = batch.select_rows(torch.arange(len(batch)))
        t = 1
        column = changed["input_ids"].shape[1] - self.response_length + t
        for key, index in (("input_ids", column), ("responses", t)):
            tokens = changed[key].clone()
            tokens[0, index] = tokens[0, index] % (self.vocab_size - 1) + 1
            changed[key] = tokens
        after = value_engine.compute_values(changed)
        torch.testing.assert_close(after[0, : t + 1], before[0, : t + 1], atol=1e-5, rtol=1e-5)
        assert not torch.equal(after[0, t + 1 :], before[0, t + 1 :]), (
            "the values after a changed token must depend on it"
        )

    def test_train_value_step_fits_a_target(self, value_engine: Any) -> None:
        import torch

        batch = self.make_batch()
        real = batch["response_mask"] > 0
        before = value_engine.compute_values(batch)
        target = float(before[real].mean()) + 1.0
        for _ in range(3):
            metrics = value_engine.train_value_step(batch, self.value_target_loss_fn(batch, target))
        for key in ("critic/grad_norm", "critic/lr", "fit"):
            assert key in metrics and math.isfinite(_scalar(metrics[key])), key
        after = value_engine.compute_values(batch)
        assert (after[real] - target).abs().mean() < (before[real] - target).abs().mean()
        assert torch.isfinite(after).all()

    def test_value_checkpoint_round_trip(self, value_engine: Any, tmp_path: Any) -> None:
        import torch

        batch = self.make_batch()
        saved = value_engine.compute_values(batch)
        value_engine.save_checkpoint(str(tmp_path / "critic"))
        value_engine.train_value_step(batch, self.value_target_loss_fn(batch, 5.0))
        value_engine.load_checkpoint(str(tmp_path / "critic"))
        torch.testing.assert_close(value_engine.compute_values(batch), saved, atol=1e-5, rtol=1e-5)


class RolloutEngineConformance(_PluginConformance):
    """A :class:`polyrl.interfaces.RolloutEngine` on a tiny model the subclass provides.

    Subclasses implement ``make_engine(self, tmp_path)`` and set ``vocab_size``.
    """

    kind = PluginKind.ROLLOUT_ENGINE
    vocab_size: ClassVar[int] = 0
    prompt_length: ClassVar[int] = 4
    prompt_rows: ClassVar[int] = 2
    max_new_tokens: ClassVar[int] = 4

    def make_engine(self, tmp_path: Any) -> Any:
        raise TypeError(f"{type(self).__name__} must define make_engine(self, tmp_path)")

    def make_prompts(self) -> Any:
        from polyrl.batch import Batch

        ids, mask = _token_batch(
            self.vocab_size, self.prompt_rows, self.prompt_length, 0, pad_left=True
        )
        return Batch(tensors={"input_ids": ids, "attention_mask": mask})

    @pytest.fixture
    def engine(self, tmp_path: Any) -> Any:
        if not self.vocab_size:
            pytest.fail(f"{type(self).__name__} must set vocab_size")
        instance = self.make_engine(tmp_path)
        yield instance
        instance.close()

    def test_implementation_is_rollout_engine(self, implementation: Any) -> None:
        from polyrl.interfaces import RolloutEngine

        assert isinstance(implementation, type) and issubclass(implementation, RolloutEngine)

    def test_generate_contract(self, engine: Any) -> None:
        import torch

        from polyrl.interfaces import SamplingParams

        n, new = 2, self.max_new_tokens
        out = engine.generate(self.make_prompts(), SamplingParams(n=n, max_new_tokens=new, seed=0))
        rows = self.prompt_rows * n
        assert len(out) == rows, f"{rows} responses expected (prompts x n), got {len(out)}"
        responses, mask = out["responses"], out["response_mask"]
        log_probs = out["rollout_log_probs"]
        assert responses.shape == (rows, new) and mask.shape == (rows, new)
        assert log_probs.shape == (rows, new)
        assert not responses.dtype.is_floating_point
        assert set(mask.unique().tolist()) <= {0, 1}
        assert (mask[:, 1:] <= mask[:, :-1]).all(), "response_mask must be 1s then 0s"
        real = mask > 0
        assert torch.isfinite(log_probs[real]).all() and (log_probs[real] <= 1e-4).all()
        assert (log_probs[~real] == 0).all(), "rollout_log_probs must be 0 on padding"
        pad = engine.ctx.pad_token_id
        assert (responses[~real] == pad).all(), "padding must use the pad token"

    def test_greedy_is_deterministic(self, engine: Any) -> None:
        import torch

        from polyrl.interfaces import SamplingParams

        params = SamplingParams(n=1, max_new_tokens=self.max_new_tokens, greedy=True)
        first = engine.generate(self.make_prompts(), params)["responses"]
        second = engine.generate(self.make_prompts(), params)["responses"]
        assert torch.equal(first, second)

    def test_generates_after_sleep_and_wake_up(self, engine: Any) -> None:
        from polyrl.interfaces import SamplingParams

        engine.sleep()
        engine.wake_up()
        out = engine.generate(
            self.make_prompts(),
            SamplingParams(n=1, max_new_tokens=self.max_new_tokens, greedy=True),
        )
        assert len(out) == self.prompt_rows
