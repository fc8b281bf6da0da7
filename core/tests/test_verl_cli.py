"""verl's ``--config-path``/``--config-name`` through the real ``polyrl`` entry point."""

from __future__ import annotations

from pathlib import Path

import pytest

from polyrl.cli import main

TINY = ["recipe=tiny", "trainer.device=cpu"]


def test_verl_ppo_trainer_validates(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["validate", "--config-path=config", "--config-name=ppo_trainer", *TINY])
    assert code == 0, capsys.readouterr()
    assert "config OK" in capsys.readouterr().out


def test_verl_ppo_megatron_trainer_means_megatron(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["config", "--config-path", "config", "--config-name", "ppo_megatron_trainer"])
    assert code == 0, capsys.readouterr()
    assert "strategy: megatron" in capsys.readouterr().out


def test_users_yaml_in_verl_layout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "my_run.yaml").write_text(
        "hydra:\n  searchpath: [file://verl/trainer/config]\n"
        "defaults: [ppo_trainer, _self_]\n"
        "trainer:\n  total_epochs: 3\n  device: cpu\n"
    )
    args = ["--config-path", str(tmp_path), "--config-name=my_run", *TINY]
    assert main(["validate", *args, "trainer.total_epochs=5"]) == 0, capsys.readouterr()
    capsys.readouterr()
    assert main(["config", *args, "+trainer.total_epochs=5", "~trainer.val_before_train"]) == 0
    assert "total_epochs: 5" in capsys.readouterr().out


def test_bad_config_name_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["train", *TINY, "--config-path", str(tmp_path), "--config-name", "nope"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --config-name nope: no nope.yaml under --config-path {tmp_path}")
    assert err.count("\n") == 1
