"""The step pipeline: editing, the declared data contract, roles, stage state, and how the
config selects an algorithm and composes its defaults."""

from __future__ import annotations

import pytest

from polyrl.config.loader import load_config
from polyrl.errors import ConfigError
from polyrl.plan import build_pipeline, select_algorithm
from polyrl.registry import PluginNotFoundError
from polyrl.specs import AlgorithmSpec, PluginKind
from polyrl.step import PROMPT_BATCH_KEYS, Stage, StepPipeline, StepState, policy_gradient_pipeline


class Recorder(Stage):
    def __init__(self, name, requires=(), provides=(), roles=(), log=None):
        self.name, self.requires, self.provides, self.roles = name, requires, provides, roles
        self.log = log if log is not None else []

    def run(self, state, ctx):
        self.log.append(self.name)


def test_editing_keeps_order_and_rejects_duplicate_names():
    log: list[str] = []
    pipe = StepPipeline([Recorder("a", log=log), Recorder("c", log=log)])
    pipe.insert_after("a", Recorder("b", log=log))
    pipe.insert_before("a", Recorder("start", log=log))
    pipe.append(Recorder("end", log=log))
    pipe.replace("c", Recorder("c2", log=log))
    pipe.remove("start")
    assert pipe.names() == ["a", "b", "c2", "end"]
    pipe.run(StepState(step=1, batch=None), ctx=None)
    assert log == ["a", "b", "c2", "end"]
    with pytest.raises(ValueError, match="already has a stage named 'b'"):
        pipe.insert_after("a", Recorder("b"))
    with pytest.raises(KeyError, match="no stage 'zzz'"):
        pipe.remove("zzz")


def test_every_stage_is_timed_under_its_name():
    pipe = StepPipeline([Recorder("a"), Recorder("b")])
    state = pipe.run(StepState(step=1, batch=None), ctx=None)
    assert set(state.timing) == {"a", "b"}


def test_chain_check_names_the_stage_and_the_missing_key():
    pipe = StepPipeline(
        [
            Recorder("gen", requires=("input_ids",), provides=("responses",)),
            Recorder("adv", requires=("responses", "values"), provides=("advantages",)),
        ]
    )
    (problem,) = pipe.check()
    assert "stage 'adv' requires batch key 'values'" in problem
    assert "no stage provides it" in problem
    assert "\n" not in problem


def test_chain_check_reports_a_key_provided_too_late():
    pipe = StepPipeline(
        [
            Recorder("adv", requires=("values",)),
            Recorder("critic", provides=("values",)),
        ]
    )
    (problem,) = pipe.check()
    assert "only the later stage(s) critic provide it" in problem


def test_a_stage_may_require_and_provide_the_same_key():
    pipe = StepPipeline(
        [
            Recorder("reward", provides=("token_level_rewards",)),
            Recorder("shape", requires=("token_level_rewards",), provides=("token_level_rewards",)),
        ]
    )
    assert pipe.check() == []


def test_roles_are_the_union_of_stage_roles_in_first_use_order():
    pipe = StepPipeline(
        [Recorder("g", roles=("rollout",)), Recorder("u", roles=("actor", "rollout"))]
    )
    assert pipe.roles() == ("rollout", "actor")


def test_stage_state_round_trips_by_stage_name():
    class Counter(Stage):
        name = "counter"

        def __init__(self):
            self.count = 0

        def run(self, state, ctx):
            self.count += 1

        def state_dict(self):
            return {"count": self.count}

        def load_state_dict(self, state):
            self.count = state["count"]

    first = StepPipeline([Recorder("a"), Counter()])
    for step in range(3):
        first.run(StepState(step=step, batch=None), ctx=None)
    saved = first.state_dict()
    assert saved == {"counter": {"count": 3}}
    second = StepPipeline([Recorder("a"), Counter()])
    second.load_state_dict(saved)
    assert second["counter"].count == 3


# ---- the standard policy-gradient step from config ----------------------------------------------
def _names(overrides):
    return policy_gradient_pipeline(load_config(["recipe=tiny", *overrides])).names()


def test_reference_only_with_a_kl_term():
    assert "ref" in _names(["actor_rollout_ref.actor.use_kl_loss=true"])
    assert "ref" not in _names(["actor_rollout_ref.actor.use_kl_loss=false"])
    with_kl_reward = _names(
        ["actor_rollout_ref.actor.use_kl_loss=false", "algorithm.use_kl_in_reward=true"]
    )
    assert with_kl_reward.index("old_log_prob") < with_kl_reward.index("kl_in_reward")
    assert with_kl_reward.index("kl_in_reward") < with_kl_reward.index("adv")


def test_standard_step_chain_is_complete_and_uses_three_roles():
    pipe = policy_gradient_pipeline(load_config(["recipe=tiny"]))
    assert pipe.check(PROMPT_BATCH_KEYS) == []
    assert set(pipe.roles()) == {"actor", "rollout", "ref"}


def test_loss_requirements_reach_the_update_stage(register_plugin):
    from polyrl.specs import PolicyLossSpec

    register_plugin(
        PolicyLossSpec(
            name="tis_like",
            description="needs the sampler's log-probs",
            fn=lambda batch, log_prob, config: (log_prob, {}),
            requires=("old_log_probs", "advantages", "response_mask", "rollout_log_probs"),
        )
    )
    pipe = build_pipeline(
        load_config(["recipe=tiny", "actor_rollout_ref.actor.policy_loss.loss_mode=tis_like"])
    )
    assert "rollout_log_probs" in pipe["update_actor"].requires
    assert pipe.check() == []  # the hf rollout provides rollout_log_probs


def test_estimator_requirements_reach_the_advantage_stage(register_plugin):
    from polyrl.specs import AdvantageEstimatorSpec

    register_plugin(
        AdvantageEstimatorSpec(
            name="needs_values",
            description="reads a critic's values",
            fn=lambda batch, config: (batch["values"], batch["values"]),
            requires=("token_level_rewards", "response_mask", "values"),
        )
    )
    cfg = load_config(["recipe=tiny", "algorithm.adv_estimator=needs_values"])
    (problem,) = build_pipeline(cfg).check()
    assert "stage 'adv' requires batch key 'values'" in problem


# ---- algorithm selection and composed defaults ------------------------------------------------
def test_estimators_select_the_algorithm_that_owns_them():
    assert select_algorithm(None, "grpo").name == "grpo"
    assert select_algorithm(None, "dr_grpo").name == "drgrpo"
    assert select_algorithm(None, "rloo").name == "rloo"


def test_an_unclaimed_estimator_runs_the_builtin_policy_gradient_step(register_plugin):
    from polyrl.specs import AdvantageEstimatorSpec

    register_plugin(
        AdvantageEstimatorSpec(name="lonely", description="x", fn=lambda batch, config: None)
    )
    assert select_algorithm(None, "lonely").name == "policy_gradient"


def test_an_explicit_unknown_algorithm_name_lists_the_valid_ones():
    with pytest.raises(PluginNotFoundError, match=r"Valid names: .*grpo"):
        select_algorithm("nope", "grpo")


def test_two_algorithms_claiming_one_estimator_must_be_disambiguated(register_plugin):
    register_plugin(
        AlgorithmSpec(
            name="grpo_clone",
            description="x",
            pipeline=policy_gradient_pipeline,
            estimators=("grpo",),
            roles=("actor", "rollout", "ref"),
        )
    )
    with pytest.raises(ConfigError, match=r"algorithm\.name=<name>"):
        select_algorithm(None, "grpo")
    assert select_algorithm("grpo_clone", "grpo").name == "grpo_clone"


def test_algorithm_defaults_sit_between_the_schema_and_the_recipe_and_command_line(
    register_plugin,
):
    register_plugin(
        AlgorithmSpec(
            name="tuned",
            description="brings defaults",
            pipeline=policy_gradient_pipeline,
            roles=("actor", "rollout", "ref"),
            config_defaults={
                "actor_rollout_ref.actor.entropy_coeff": 0.01,
                "actor_rollout_ref.actor.clip_ratio_high": 0.28,
                "actor_rollout_ref.rollout.n": 3,
            },
        )
    )
    cfg = load_config(
        ["recipe=tiny", "algorithm.name=tuned", "actor_rollout_ref.actor.clip_ratio_high=0.3"]
    )
    assert cfg.actor_rollout_ref.actor.entropy_coeff == 0.01  # the algorithm's default
    assert cfg.actor_rollout_ref.actor.clip_ratio_high == 0.3  # the command line wins
    assert cfg.actor_rollout_ref.rollout.n == 4  # recipe=tiny sets n=4: the recipe wins
    plain = load_config(["recipe=tiny"])
    assert plain.actor_rollout_ref.actor.entropy_coeff == 0.0


def test_a_pipeline_using_an_undeclared_role_is_refused(register_plugin):
    register_plugin(
        AlgorithmSpec(
            name="sneaky",
            description="uses ref without declaring it",
            pipeline=lambda cfg: StepPipeline([Recorder("r", roles=("ref",))]),
            roles=("actor", "rollout"),
        )
    )
    with pytest.raises(ConfigError, match=r"role\(s\) \['ref'\]"):
        build_pipeline(load_config(["recipe=tiny", "algorithm.name=sneaky"]))


def test_the_algorithm_kind_is_registered_through_its_hook():
    from polyrl.registry import get_registry

    reg = get_registry().get(PluginKind.ALGORITHM, "grpo")
    assert reg.provenance.distribution == "polyrl-algo-grpo"
    assert get_registry().get(PluginKind.ALGORITHM, "policy_gradient").provenance.distribution == (
        "polyrl"
    )
