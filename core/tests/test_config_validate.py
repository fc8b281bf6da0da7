"""``validate_config``: good configs pass, each kind of mistake gives one clear line."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from polyrl import builtins
from polyrl.config import load_config
from polyrl.config.validate import summarize, validate_config
from polyrl.errors import ConfigError
from polyrl.registry import Provenance, Registry
from polyrl.specs import (
    ESTIMATOR_KEYS,
    AdvantageEstimatorSpec,
    AlgorithmSpec,
    RolloutEngineSpec,
    TrainingEngineSpec,
)
from polyrl.step import Stage, policy_gradient_pipeline
from polyrl.testing.pytest_plugin import copy_registry, plugin_from_specs

# Test registrations. Validation loads the selected implementations (and calls the estimator on a
# synthetic batch), so these point at real objects (or at a module that does not exist, to test
# that error).
ENGINE = "polyrl.interfaces.training_engine:TrainingEngine"
ROLLOUT = "polyrl.interfaces.rollout_engine:RolloutEngine"
FN = f"{__name__}:zero_advantage"


def zero_advantage(batch, config):
    """An estimator that keeps its contract: zero advantages and returns, [B, T] floats."""
    zeros = batch["response_mask"] * 0.0
    return zeros, zeros.clone()


@dataclass
class GroupSettings:
    beta: float = 0.1
    mode: str = "mean"


@pytest.fixture(scope="module")
def registry() -> Registry:
    specs = plugin_from_specs(
        TrainingEngineSpec(name="eng", description="cpu+cuda", engine=ENGINE, supports_cpu=True),
        TrainingEngineSpec(name="gpu_only", description="cuda", engine=ENGINE),
        TrainingEngineSpec(
            name="ghost", description="missing backend", engine="polyrl_no_such.engine:Engine"
        ),
        RolloutEngineSpec(name="roll", description="cpu", engine=ROLLOUT, supports_cpu=True),
        AdvantageEstimatorSpec(
            name="grp",
            description="group",
            fn=FN,
            requires_groups=True,
            config_class=f"{__name__}:GroupSettings",
        ),
        AdvantageEstimatorSpec(
            name="gae_like", description="c", fn=FN, requires=(*ESTIMATOR_KEYS, "values")
        ),
    )
    reg = Registry()
    reg.add_plugin(builtins, Provenance("builtins", "polyrl", "0.1.0"))
    reg.add_plugin(specs, Provenance("test", "polyrl-test-plugins", "1.0"))
    return reg


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("validate")
    good = pa.table(
        {
            "data_source": ["openai/gsm8k"],
            "prompt": [[{"role": "user", "content": "2+2?"}]],
            "reward_model": [{"ground_truth": "4", "style": "rule"}],
            "extra_info": [{"index": 0}],
        }
    )
    pq.write_table(good, root / "train.parquet")
    pq.write_table(good.drop(["reward_model"]), root / "no_reward.parquet")
    (root / "garbage.parquet").write_text("not parquet")
    (root / "model").mkdir()
    return {
        "train": root / "train.parquet",
        "no_reward": root / "no_reward.parquet",
        "garbage": root / "garbage.parquet",
        "model": root / "model",
        "root": root,
    }


@pytest.fixture
def base(files: dict[str, Path]) -> list[str]:
    return [
        "~recipe",  # the schema's defaults: independent of what the shipped recipe sets
        f"data.train_files={files['train']}",
        f"actor_rollout_ref.model.path={files['model']}",
        "actor_rollout_ref.actor.strategy=eng",
        "actor_rollout_ref.rollout.name=roll",
        "algorithm.adv_estimator=grp",
        "trainer.logger=[console,jsonl]",
        "trainer.device=cpu",
        "reward_model.reward_manager=naive",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.n=4",
        "trainer.n_gpus_per_node=1",
    ]


def problems(registry: Registry, base: list[str], *overrides: str) -> list[str]:
    return validate_config(load_config([*base, *overrides]), registry)


def one_problem(registry: Registry, base: list[str], *overrides: str) -> str:
    found = problems(registry, base, *overrides)
    assert len(found) == 1, found
    assert "\n" not in found[0]
    return found[0]


def test_good_config_has_no_problems(registry: Registry, base: list[str]) -> None:
    assert problems(registry, base) == []
    assert (
        problems(registry, base, "plugins.grp.beta=0.5", "data.val_files=builtin:tiny_digits") == []
    )


def test_validation_does_not_import_heavy_modules(files: dict[str, Path]) -> None:
    """In a fresh interpreter (in this one, earlier tests may have imported anything): validating
    a real config with the installed plugins imports no backend it does not select (the selected
    implementations are loaded: a misspelled import string is a problem line, not "config OK")."""
    code = (
        "import sys, json\n"
        "from polyrl.config.loader import load_config\n"
        "from polyrl.config.validate import validate_config\n"
        "validate_config(load_config(sys.argv[1:]))\n"
        "heavy = ('vllm', 'sglang', 'megatron', 'deepspeed', 'ray')\n"
        "print(json.dumps([m for m in heavy if m in sys.modules]))\n"
    )
    overrides = ["recipe=tiny", f"data.train_files={files['train']}"]  # fsdp2 and hf
    done = subprocess.run([sys.executable, "-c", code, *overrides], capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "actor_rollout_ref.actor.optim.lr=0",
            "actor.optim.lr=0.0 is out of range: it must be > 0",
        ),
        (
            "actor_rollout_ref.actor.clip_ratio=1.0",
            "actor_rollout_ref.actor.clip_ratio=1.0 is out of range",
        ),
        (
            "actor_rollout_ref.actor.clip_ratio_low=0",
            "actor_rollout_ref.actor.clip_ratio_low=0 is out of range",
        ),
        (
            "actor_rollout_ref.actor.clip_ratio_high=-0.1",
            "clip_ratio_high=-0.1 is out of range: it must be > 0",
        ),
        (
            "actor_rollout_ref.actor.clip_ratio_high=abc",
            "clip_ratio_high='abc' must be a number",
        ),
        (
            "actor_rollout_ref.actor.clip_ratio_c=1.0",
            "clip_ratio_c=1.0 is out of range: it must be > 1",
        ),
        (
            "actor_rollout_ref.rollout.temperature=-0.5",
            "rollout.temperature=-0.5 is out of range: it must be >= 0",
        ),
        (
            "actor_rollout_ref.rollout.top_p=0",
            "rollout.top_p=0.0 is out of range: it must be in (0, 1]",
        ),
        (
            "actor_rollout_ref.rollout.top_p=1.5",
            "rollout.top_p=1.5 is out of range",
        ),
        (
            "actor_rollout_ref.actor.ppo_epochs=0",
            "actor.ppo_epochs=0 is out of range: it must be >= 1",
        ),
        (
            "trainer.total_training_steps=0",
            "total_training_steps=0 is out of range: it must be null or >= 1",
        ),
        (
            "trainer.total_training_steps=2.5",
            "trainer.total_training_steps=2.5 must be an integer",
        ),
        (
            "actor_rollout_ref.actor.loss_agg_mode=token-median",
            "loss_agg_mode='token-median' is not one of token-mean, token-sum, seq-mean-",
        ),
        (
            "actor_rollout_ref.actor.kl_loss_type=k4",
            "kl_loss_type='k4' is not one of kl, k1, abs, mse, k2, low_var_kl, k3",
        ),
        (
            "algorithm.kl_penalty=lowvar_kl",
            "algorithm.kl_penalty='lowvar_kl' is not one of",
        ),
        (
            "algorithm.kl_ctrl.type=pid",
            "algorithm.kl_ctrl.type='pid' is not one of fixed, adaptive",
        ),
        (
            "trainer.resume_mode=always",
            "trainer.resume_mode='always' is not one of auto, disable, resume_path",
        ),
        (
            "trainer.resume_mode=resume_path",
            "trainer.resume_mode=resume_path needs trainer.resume_from_path",
        ),
        (
            "actor_rollout_ref.actor.optim.warmup_style=linear",
            "warmup_style='linear' is not one of constant, cosine",
        ),
        (
            "actor_rollout_ref.rollout.val_kwargs.n=3",
            "val_kwargs.temperature=0 gives 3 identical",
        ),
        (
            "actor_rollout_ref.rollout.val_kwargs.top_p=2",
            "val_kwargs.top_p=2.0 is out of range",
        ),
        (
            "data.max_response_length=0",
            "data.max_response_length=0 is out of range",
        ),
        (
            "trainer.log_val_generations=-1",
            "trainer.log_val_generations=-1 is out of range: it must be 0 (off) or more",
        ),
    ],
)
def test_types_and_ranges(
    registry: Registry, base: list[str], override: str, expected: str
) -> None:
    assert expected in one_problem(registry, base, override)


def test_loss_agg_mode_suggests_the_closest(registry: Registry, base: list[str]) -> None:
    line = one_problem(registry, base, "actor_rollout_ref.actor.loss_agg_mode=token_mean")
    assert "Did you mean 'token-mean'?" in line


def test_device_must_be_cpu_or_cuda(registry: Registry, base: list[str]) -> None:
    assert "trainer.device='tpu' is not one of cpu, cuda" in one_problem(
        registry, base, "trainer.device=tpu"
    )


def test_resume_path_must_exist(registry: Registry, base: list[str], files) -> None:
    line = one_problem(
        registry,
        base,
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={files['root'] / 'nope'}",
    )
    assert "trainer.resume_from_path=" in line and "does not exist" in line
    assert (
        problems(
            registry,
            base,
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={files['root']}",
        )
        == []
    )


# ---- batch arithmetic --------------------------------------------------------------------------
def test_train_batch_smaller_than_mini_batch(registry: Registry, base: list[str]) -> None:
    line = one_problem(registry, base, "data.train_batch_size=2")
    assert "data.train_batch_size 2 < actor_rollout_ref.actor.ppo_mini_batch_size 4" in line


def test_train_batch_not_a_multiple_of_mini_batch(registry: Registry, base: list[str]) -> None:
    line = one_problem(registry, base, "data.train_batch_size=6")
    assert "data.train_batch_size 6 is not divisible by actor_rollout_ref.actor" in line
    assert "ppo_mini_batch_size 4" in line


def test_batches_against_the_world_size(registry: Registry, base: list[str]) -> None:
    # world 3: 8 prompts, 32 responses, 16 responses per mini-batch: none divides by 3.
    found = problems(registry, base, "trainer.n_gpus_per_node=3")
    assert len(found) == 3, found
    world = "world size 3 = trainer.nnodes 1 x trainer.n_gpus_per_node 3"
    assert any("data.train_batch_size 8 is not divisible by the " + world in p for p in found)
    assert any("8 x rollout.n 4 = 32 responses are not divisible" in p for p in found)
    assert any(
        "ppo_mini_batch_size 4 x rollout.n 4 = 16 responses per mini-batch" in p for p in found
    )


def test_multi_node_world_size(registry: Registry, base: list[str]) -> None:
    # world 8: 8 prompts, 32 responses, 16 per mini-batch -> 2 per rank, micro-batches of 2
    micro = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"
    assert problems(registry, base, "trainer.nnodes=2", "trainer.n_gpus_per_node=4", micro) == []
    found = problems(registry, base, "trainer.nnodes=2", "trainer.n_gpus_per_node=8")
    assert any("world size 16 = trainer.nnodes 2 x trainer.n_gpus_per_node 8" in p for p in found)


def test_micro_batch_must_divide_the_per_gpu_mini_batch(
    registry: Registry, base: list[str]
) -> None:
    # 4 prompts x 4 samples / 2 ranks = 8 responses per rank; 3 does not divide 8.
    line = one_problem(
        registry,
        base,
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
    )
    assert "per-GPU mini-batch 8" in line and "ppo_micro_batch_size_per_gpu 3" in line
    assert "use_dynamic_bsz=true" in line
    assert (
        problems(
            registry,
            base,
            "trainer.n_gpus_per_node=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
            "actor_rollout_ref.actor.use_dynamic_bsz=true",
        )
        == []
    )


def test_critic_and_reward_model_need_a_step_with_that_role(
    registry: Registry, base: list[str]
) -> None:
    # The selected step has no critic or reward-model role: enabling one must not pass silently,
    # and the line says which algorithm would provide one.
    line = one_problem(registry, base, "critic.enable=true")
    assert line.startswith(
        "critic.enable=true: the selected algorithm 'policy_gradient' (package polyrl) has no "
        "'critic' role, so a critic (value model) would not be trained"
    )
    assert "its step uses rollout, actor" in line and "no installed algorithm has one" in line
    # The policy-gradient step has the reward model's stage: enabling it asks for its model.
    line = one_problem(registry, base, "reward_model.enable=true")
    assert line.startswith("reward_model.enable=true needs reward_model.model.path")


# ---- plugins and capabilities ------------------------------------------------------------------
def test_unknown_plugin_name_lists_valid_ones(registry: Registry, base: list[str]) -> None:
    line = one_problem(registry, base, "algorithm.adv_estimator=gpro")
    assert line.startswith("algorithm.adv_estimator: unknown advantage_estimator 'gpro'")
    assert "grp (polyrl-test-plugins)" in line


def test_first_party_name_not_installed_says_what_to_install(
    registry: Registry, base: list[str]
) -> None:
    line = one_problem(registry, base, "actor_rollout_ref.rollout.name=vllm")
    assert "pip install polyrl-rollout-vllm" in line


def test_every_logger_is_checked(registry: Registry, base: list[str]) -> None:
    line = one_problem(registry, base, "trainer.logger=[console,tensorbord]")
    assert line.startswith("trainer.logger: unknown logger 'tensorbord'")
    assert "Did you mean 'tensorboard'?" in line


def test_missing_backend_module_is_caught_before_the_run(
    registry: Registry, base: list[str]
) -> None:
    line = one_problem(
        registry, base, "actor_rollout_ref.actor.strategy=ghost", "trainer.device=cuda"
    )
    assert (
        "'polyrl_no_such.engine:Engine' from package polyrl-test-plugins 1.0 cannot be found"
        in line
    )
    assert "No module named 'polyrl_no_such'" in line


def test_group_estimator_needs_several_samples(registry: Registry, base: list[str]) -> None:
    line = one_problem(registry, base, "actor_rollout_ref.rollout.n=1")
    assert "algorithm.adv_estimator='grp' compares samples of one prompt" in line
    assert "actor_rollout_ref.rollout.n >= 2 (got 1)" in line


def test_estimator_reading_values_needs_a_stage_that_provides_them(
    registry: Registry, base: list[str]
) -> None:
    # The estimator declares it reads `values` (a critic's output); nothing in the step makes them.
    line = one_problem(registry, base, "algorithm.adv_estimator=gae_like")
    assert line.startswith("algorithm 'policy_gradient' (package polyrl): stage 'adv' requires ")
    assert "batch key 'values', but no stage provides it" in line


def test_engine_must_support_the_device(registry: Registry, base: list[str]) -> None:
    line = one_problem(registry, base, "actor_rollout_ref.actor.strategy=gpu_only")
    assert "actor_rollout_ref.actor.strategy='gpu_only' (package polyrl-test-plugins)" in line
    assert "does not support trainer.device=cpu. Engines that do: eng." in line
    assert (
        problems(registry, base, "actor_rollout_ref.actor.strategy=gpu_only", "trainer.device=cuda")
        == []
    )


def test_plugin_section_unknown_key_suggests_the_closest(
    registry: Registry, base: list[str]
) -> None:
    line = one_problem(registry, base, "plugins.grp.bta=0.2")
    assert "unknown key plugins.grp.bta for advantage_estimator 'grp'" in line
    assert "Did you mean plugins.grp.beta?" in line and "Valid keys: beta, mode" in line


def test_plugin_section_for_no_installed_plugin(registry: Registry, base: list[str]) -> None:
    line = one_problem(registry, base, "plugins.gr.beta=0.2")
    assert line == "plugins.gr configures no installed plugin. Did you mean plugins.grp?"


# ---- required keys and files -------------------------------------------------------------------
def test_required_keys(registry: Registry, base: list[str]) -> None:
    found = validate_config(load_config(base[:1] + base[3:]), registry)
    assert found == [
        "actor_rollout_ref.model.path is not set: give a local Hugging Face folder or .gguf file, "
        "actor_rollout_ref.model.path=<path>",
        "data.train_files is not set: give a parquet file, data.train_files=<path.parquet>",
    ]


def test_missing_files(registry: Registry, base: list[str], files) -> None:
    found = problems(
        registry,
        base,
        f"data.train_files=[{files['train']},{files['root'] / 'gone.parquet'}]",
        f"actor_rollout_ref.model.path={files['root'] / 'no_model'}",
        f"custom_reward_function.path={files['root'] / 'reward.py'}",
    )
    assert len(found) == 3, found
    assert any(
        f"data.train_files: file '{files['root'] / 'gone.parquet'}' does not exist" == p
        for p in found
    )
    assert any("actor_rollout_ref.model.path=" in p and "does not exist" in p for p in found)
    assert any("custom_reward_function.path=" in p and "compute_score()" in p for p in found)


def test_generated_datasets_are_not_looked_up(registry: Registry, base: list[str]) -> None:
    assert problems(registry, base, "data.train_files=builtin:reasoning_gym/gsm_symbolic") == []


def test_parquet_columns_are_checked_from_the_schema(
    registry: Registry, base: list[str], files
) -> None:
    line = one_problem(registry, base, f"data.val_files={files['no_reward']}")
    assert line.startswith(
        f"data.val_files: '{files['no_reward']}' lacks the column(s) reward_model"
    )
    line = one_problem(registry, base, "data.prompt_key=question")
    assert "lacks the column(s) question" in line


def test_unreadable_parquet(registry: Registry, base: list[str], files) -> None:
    line = one_problem(registry, base, f"data.train_files={files['garbage']}")
    assert "is not a readable parquet file" in line


def test_all_problems_are_reported_at_once(registry: Registry, base: list[str]) -> None:
    found = problems(
        registry,
        base,
        "actor_rollout_ref.actor.optim.lr=-1",
        "actor_rollout_ref.rollout.top_p=2",
        "algorithm.adv_estimator=nope",
    )
    assert len(found) == 3


def test_summary_states_the_batch_arithmetic(registry: Registry, base: list[str]) -> None:
    text = summarize(load_config(base), registry)
    assert "algorithm: policy_gradient (package polyrl 0.1.0; estimator grp, loss vanilla" in text
    assert "batch: 8 prompts x n=4 = 32 responses per step on 1 device(s) (cpu)" in text
    assert "2 mini-batch(es) of 16 responses" in text


def test_generated_dataset_must_name_a_known_generator(registry: Registry, base: list[str]) -> None:
    pytest.importorskip("polyrl.data.generate")
    line = one_problem(registry, base, "data.train_files=builtin:tiny_digit")
    assert line.startswith("data.train_files: 'builtin:tiny_digit' names no built-in dataset")
    assert "Did you mean builtin:tiny_digits?" in line


def test_builtin_models_are_checked_by_name(registry: Registry, base: list[str]) -> None:
    pytest.importorskip("polyrl.models.resolve")
    assert problems(registry, base, "actor_rollout_ref.model.path=builtin:tiny@3") == []
    line = one_problem(registry, base, "actor_rollout_ref.model.path=builtin:smol")
    assert line.startswith("actor_rollout_ref.model.path='builtin:smol' is not a built-in model")
    assert "builtin:smollm2-135m-instruct" in line


def test_summary_names_the_algorithm_its_stages_and_the_placement(
    registry: Registry, base: list[str]
) -> None:
    text = summarize(load_config([*base, "actor_rollout_ref.actor.use_kl_loss=true"]), registry)
    lines = text.splitlines()
    assert lines[0].startswith("algorithm: policy_gradient (package polyrl 0.1.0;")
    assert lines[1] == "step:"
    assert lines[2].startswith("  gen [rollout]: input_ids, attention_mask -> responses")
    assert any(line.startswith("  ref [ref]: ") for line in lines)
    assert "placement: rollout, actor, ref -> global (1 worker(s))" in lines


# ---- names the run accepts ---------------------------------------------------------------------
def test_choices_match_what_the_run_accepts() -> None:
    # The validator keeps its own copies (validating needs no torch): they must not drift.
    pytest.importorskip("torch")
    from polyrl.algorithms.kl import KL_PENALTY_TYPES
    from polyrl.algorithms.loss_agg import LOSS_AGG_MODES
    from polyrl.config.checks import ranges

    assert tuple(KL_PENALTY_TYPES) == ranges.KL_TYPES
    assert tuple(LOSS_AGG_MODES) == ranges.LOSS_AGG_MODES


def test_straight_through_kl_types_are_accepted(registry: Registry, base: list[str]) -> None:
    assert problems(registry, base, "actor_rollout_ref.actor.kl_loss_type=k3+") == []
    assert problems(registry, base, "algorithm.kl_penalty=low_var_kl+") == []


def test_lr_scheduler_type_and_its_older_verl_name(registry: Registry, base: list[str]) -> None:
    assert problems(registry, base, "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine") == []
    assert problems(registry, base, "actor_rollout_ref.actor.optim.warmup_style=cosine") == []
    line = one_problem(registry, base, "actor_rollout_ref.actor.optim.lr_scheduler_type=linear")
    assert "lr_scheduler_type='linear' is not one of constant, cosine" in line


# ---- algorithms and their step -----------------------------------------------------------------
class ReadsValues(Stage):
    name = "value_baseline"
    requires = ("responses", "values")
    provides = ("token_level_rewards",)
    roles = ("actor",)


def needs_values_pipeline(cfg):
    pipeline = policy_gradient_pipeline(cfg)
    pipeline.insert_before("adv", ReadsValues())
    return pipeline


def broken_pipeline(cfg):
    raise ConfigError("algorithm.name=broken_step: plugins.broken_step.depth must be set")


def _with(registry: Registry, *specs) -> Registry:
    """``registry`` plus ``specs`` (registered as package polyrl-extra-plugins 2.0)."""
    copy = copy_registry(registry)
    copy.add_plugin(plugin_from_specs(*specs), Provenance("extra", "polyrl-extra-plugins", "2.0"))
    return copy


@pytest.fixture(scope="module")
def algorithms(registry: Registry) -> Registry:
    roles = ("actor", "rollout", "ref")
    return _with(
        registry,
        AlgorithmSpec(
            name="needs_values",
            description="a stage reads values",
            pipeline=f"{__name__}:needs_values_pipeline",
            roles=roles,
        ),
        AlgorithmSpec(
            name="broken_step",
            description="refuses the config",
            pipeline=f"{__name__}:broken_pipeline",
            roles=roles,
        ),
        AlgorithmSpec(
            name="with_critic",
            description="declares a critic role",
            pipeline=f"{__name__}:needs_values_pipeline",
            roles=(*roles, "critic"),
        ),
    )


def test_a_stage_requiring_a_key_nothing_provides_is_one_line(
    algorithms: Registry, base: list[str]
) -> None:
    line = one_problem(algorithms, base, "algorithm.name=needs_values")
    assert line.startswith(
        "algorithm 'needs_values' (package polyrl-extra-plugins): stage 'value_baseline' "
        "requires batch key 'values', but no stage provides it"
    )
    assert "gen -> reward -> old_log_prob -> value_baseline -> adv" in line


def test_unknown_algorithm_name_gives_the_registry_message(
    algorithms: Registry, base: list[str]
) -> None:
    line = one_problem(algorithms, base, "algorithm.name=needs_value")
    assert line.startswith("algorithm.name: unknown algorithm 'needs_value'")
    assert "Did you mean 'needs_values'?" in line


def test_a_pipeline_config_error_is_a_problem_line(algorithms: Registry, base: list[str]) -> None:
    line = one_problem(algorithms, base, "algorithm.name=broken_step")
    assert line == "algorithm.name=broken_step: plugins.broken_step.depth must be set"


def test_critic_refusal_names_the_algorithms_that_have_one(
    algorithms: Registry, base: list[str]
) -> None:
    line = one_problem(algorithms, base, "critic.enable=true")
    assert "algorithms with one: with_critic (polyrl-extra-plugins)" in line


# ---- placement ---------------------------------------------------------------------------------
def test_placement_in_pools(registry: Registry, base: list[str]) -> None:
    shared = ["trainer.role_pools.actor=train", "trainer.role_pools.rollout=train"]
    assert problems(registry, base, *shared, "trainer.resource_pools.train=2") == []
    line = one_problem(registry, base, *shared, "trainer.resource_pools.train=0")
    assert line.startswith("trainer.resource_pools.train=0 is out of range: it must be >= 1")


def test_pool_without_a_size_is_named_once_per_role(registry: Registry, base: list[str]) -> None:
    found = problems(
        registry, base, "trainer.role_pools.actor=train", "trainer.role_pools.rollout=train"
    )
    assert found == [
        "trainer.role_pools.actor='train' names a pool without a size: set "
        "trainer.resource_pools.train=<workers>.",
        "trainer.role_pools.rollout='train' names a pool without a size: set "
        "trainer.resource_pools.train=<workers>.",
    ]


def test_batches_are_checked_against_the_actor_pool(registry: Registry, base: list[str]) -> None:
    found = problems(
        registry,
        base,
        "trainer.role_pools.actor=train",
        "trainer.role_pools.rollout=train",
        "trainer.resource_pools.train=3",
    )
    assert any(
        "data.train_batch_size 8 is not divisible by the world size 3 of pool 'train' "
        "(trainer.resource_pools.train)" in p
        for p in found
    )


def test_placed_roles_must_be_roles_of_the_step(registry: Registry, base: list[str]) -> None:
    line = one_problem(
        registry, base, "trainer.role_pools.critc=global", "trainer.resource_pools.x=1"
    )
    assert line == (
        "trainer.role_pools.critc: the step has no role 'critc' (its roles: rollout, actor)."
    )
    line = one_problem(registry, base, "trainer.role_pools.acto=global")
    assert line.endswith("Did you mean trainer.role_pools.actor?")


SPLIT = "actor_rollout_ref.hybrid_engine=false"


def test_split_placement_sizes_the_rollout_pool(registry: Registry, base: list[str]) -> None:
    assert problems(registry, base, SPLIT) == []
    by_name = ("trainer.role_pools.rollout=gen", "trainer.resource_pools.gen=1")
    assert problems(registry, base, *by_name) == []
    summary = summarize(
        load_config([*base, SPLIT, "actor_rollout_ref.rollout.n_gpus_per_node=4"]), registry
    )
    assert "rollout -> rollout (4 worker(s)); actor -> global (1 worker(s))" in summary
    line = one_problem(registry, base, SPLIT, "actor_rollout_ref.rollout.n_gpus_per_node=0")
    assert line.startswith("actor_rollout_ref.rollout.n_gpus_per_node=0 is out of range")
    line = one_problem(registry, base, SPLIT, "actor_rollout_ref.rollout.n_gpus_per_node=3")
    assert line.startswith(
        "data.train_batch_size 8 is not divisible by the rollout pool's 3 data-parallel rank(s)"
    )


@pytest.mark.parametrize(
    ("overrides", "start"),
    [
        (
            ("trainer.role_pools.rollout=global",),
            "trainer.role_pools.rollout='global' contradicts actor_rollout_ref.hybrid_engine=false",
        ),
        (
            ("trainer.role_pools.actor=rollout", "trainer.resource_pools.rollout=2"),
            "trainer.resource_pools.rollout: with actor_rollout_ref.hybrid_engine=false the",
        ),
        (
            ("actor_rollout_ref.rollout.update_weights_bucket_megabytes=0",),
            "actor_rollout_ref.rollout.update_weights_bucket_megabytes=0 is out of range",
        ),
    ],
)
def test_split_placement_contradictions(registry, base, overrides, start) -> None:
    assert one_problem(registry, base, SPLIT, *overrides).startswith(start)


def test_weight_sync_settings(registry: Registry, base: list[str]) -> None:
    sync = "actor_rollout_ref.rollout.weight_sync"
    assert one_problem(registry, base, f"{sync}.timeout_s=0").startswith(
        f"{sync}.timeout_s=0.0 is out of range"
    )
    line = one_problem(registry, base, "actor_rollout_ref.rollout.temperature=0")
    assert line.startswith(f"{sync}.probe_tokens=4 needs actor_rollout_ref.rollout.temperature > 0")
    no_probe = ("actor_rollout_ref.rollout.temperature=0", f"{sync}.probe_tokens=0")
    assert problems(registry, base, *no_probe) == []


# ---- plugin-supplied checks --------------------------------------------------------------------
def engine_check(cfg) -> list[str]:
    """A training engine's own rule, named by import string."""
    if cfg.actor_rollout_ref.actor.ppo_epochs > 2:
        return ["actor_rollout_ref.actor.ppo_epochs > 2 is not supported by engine 'checked'"]
    return []


def raising_check(cfg) -> list[str]:
    raise RuntimeError("boom")


@pytest.fixture
def checked(isolated_registry: Registry, register_plugin) -> Registry:
    """Built-ins plus CPU engines whose specs carry their own config checks (in-process)."""
    return register_plugin(
        [
            TrainingEngineSpec(
                name="checked",
                description="checks its own keys",
                engine=ENGINE,
                supports_cpu=True,
                config_check=f"{__name__}:engine_check",
            ),
            TrainingEngineSpec(
                name="raises",
                description="its check raises",
                engine=ENGINE,
                supports_cpu=True,
                config_check=raising_check,
            ),
            TrainingEngineSpec(
                name="returns_str",
                description="its check returns a string",
                engine=ENGINE,
                supports_cpu=True,
                config_check=lambda cfg: "not a list",
            ),
            TrainingEngineSpec(
                name="missing_check",
                description="its check cannot be imported",
                engine=ENGINE,
                supports_cpu=True,
                config_check="polyrl_no_such.checks:check",
            ),
            TrainingEngineSpec(
                name="eng", description="no check", engine=ENGINE, supports_cpu=True
            ),
            RolloutEngineSpec(name="roll", description="cpu", engine=ROLLOUT, supports_cpu=True),
            AdvantageEstimatorSpec(name="grp", description="g", fn=FN, requires_groups=True),
        ],
        distribution="polyrl-checked",
        version="3.0",
    )


def test_selected_plugin_config_check_is_run(checked: Registry, base: list[str]) -> None:
    engine = "actor_rollout_ref.actor.strategy=checked"
    assert problems(checked, base, engine) == []
    line = one_problem(checked, base, engine, "actor_rollout_ref.actor.ppo_epochs=3")
    assert line == "actor_rollout_ref.actor.ppo_epochs > 2 is not supported by engine 'checked'"
    # not selected: not run
    assert problems(checked, base, "actor_rollout_ref.actor.ppo_epochs=3") == []


def test_a_failing_plugin_check_names_its_package(checked: Registry, base: list[str]) -> None:
    line = one_problem(checked, base, "actor_rollout_ref.actor.strategy=raises")
    assert line.startswith("actor_rollout_ref.actor.strategy='raises' (package polyrl-checked): ")
    assert "failed (RuntimeError: boom); report it to polyrl-checked" in line
    line = one_problem(checked, base, "actor_rollout_ref.actor.strategy=returns_str")
    assert "returned str, not a list of strings" in line
    line = one_problem(checked, base, "actor_rollout_ref.actor.strategy=missing_check")
    assert "its config check 'polyrl_no_such.checks:check' failed (ModuleNotFoundError" in line
