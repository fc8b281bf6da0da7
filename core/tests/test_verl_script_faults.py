"""What bash and verl's Hydra do with verl's scripts as written, as the extractor reads them
(scripts/extract_verl_examples.py): a script's own unset variable expands to nothing (0 in
arithmetic) or, under ``set -u``, stops the script before verl starts; an override verl's Hydra
cannot parse is verl's failure too; an empty boolean (``use_kl_loss=``) reads as false, as in
verl."""

from __future__ import annotations

from test_verl_examples import _extractor

from polyrl.config import load_config


def test_a_scripts_own_unset_variable_expands_as_bash_expands_it() -> None:
    script = """
set -x
RAY_DATA_HOME=${RAY_DATA_HOME:-"${HOME}/verl"}
TRAIN=${TRAIN:-"${RAY_DATA_HOME}/data/train.parquet"}
python3 -m verl.trainer.main_ppo data.train_files=$TRAIN \\
    actor_rollout_ref.actor.use_kl_loss=${use_kl_loss} \\
    data.max_prompt_length=$((8 / 2 + missing)) trainer.default_local_dir=$SCRATCH/ckpt
"""
    args, stopped = _extractor().read_launch(script)
    assert stopped is None
    assert args == [
        "data.train_files=${HOME}/verl/data/train.parquet",  # nested braces in a default
        "actor_rollout_ref.actor.use_kl_loss=",  # the script's own, never set: nothing
        "data.max_prompt_length=4",  # unset in arithmetic: 0
        "trainer.default_local_dir=$SCRATCH/ckpt",  # the environment's: as written
    ]


def test_under_set_u_an_unbound_variable_stops_the_script() -> None:
    script = """
set -xeuo pipefail
len=$(((prompt + 8) / sp_size))
sp_size=4
python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$len
"""
    _, stopped = _extractor().read_launch(script)
    assert stopped == "bash stops the script: prompt: unbound variable (set -u)"


def test_an_override_verls_hydra_cannot_parse_is_verls_failure() -> None:
    extractor = _extractor()
    assert extractor.hydra_refusal(["trainer.experiment_name=run_8npu}"]) == (
        "verl's Hydra cannot parse 'trainer.experiment_name=run_8npu}': "
        "extraneous input '}' expecting <EOF>"
    )
    # paths are the user's to write (placeholders), and $ values the shell's to expand
    assert extractor.hydra_refusal(["actor_rollout_ref.model.path=<path_to_model>"]) is None
    assert extractor.hydra_refusal(["trainer.experiment_name=${NAME}}"]) is None


def test_an_empty_boolean_reads_as_false_as_in_verl() -> None:
    cfg = load_config(
        [
            "recipe=tiny",
            "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.actor.use_kl_loss=",
        ]
    )
    assert cfg.actor_rollout_ref.actor.use_kl_loss is False
