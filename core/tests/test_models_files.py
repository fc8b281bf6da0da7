"""A damaged model file is one line naming it (issue 30.7), from the checks themselves
(:mod:`polyrl.models.files`) and from the real ``polyrl validate`` / ``polyrl train`` commands,
before Ray starts: a ``config.json`` that is not JSON, a truncated or corrupt
``model.safetensors``, a ``.gguf`` that is not GGUF and a truncated GGUF.

The model folders are written byte by byte (a config.json and a one-tensor safetensors file),
so no torch is needed to build them; the truncated GGUF is a real one (written by the ``gguf``
package) cut short."""

from __future__ import annotations

import json
import os
import struct
import subprocess
from pathlib import Path

import pytest

from polyrl.api.testing import run_polyrl_here
from polyrl.errors import ConfigError
from polyrl.models.files import check_gguf_file, check_model_folder, safetensors_problem

ENV = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "HF_HUB_OFFLINE": "1",
    "WANDB_MODE": "offline",
}


def safetensors_bytes(values: int = 4) -> bytes:
    header = json.dumps(
        {"w": {"dtype": "F32", "shape": [values], "data_offsets": [0, 4 * values]}}
    ).encode()
    return struct.pack("<Q", len(header)) + header + b"\0" * (4 * values)


def model_folder(root: Path, *, config: bytes = b'{"model_type": "llama"}', weights=None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_bytes(config)
    (root / "model.safetensors").write_bytes(safetensors_bytes() if weights is None else weights)
    return root


def real_gguf(path: Path) -> Path:
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_context_length(16)
    import numpy as np

    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# ---- the checks ---------------------------------------------------------------------------------
def test_a_sound_folder_passes(tmp_path: Path) -> None:
    check_model_folder(model_folder(tmp_path / "m"))


def test_a_config_json_that_is_not_json_is_named(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "m", config=b'{"model_type": "llama",')
    with pytest.raises(ConfigError, match=r"config\.json is not valid JSON"):
        check_model_folder(folder)


def test_a_config_json_that_is_not_an_object_is_named(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "m", config=b"[1, 2]")
    with pytest.raises(ConfigError, match=r"config\.json holds a JSON list, not an object"):
        check_model_folder(folder)


def test_another_json_file_that_does_not_parse_is_named(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "m")
    (folder / "tokenizer_config.json").write_bytes(b"\xff\xfe not json")
    with pytest.raises(ConfigError, match=r"tokenizer_config\.json is not valid JSON"):
        check_model_folder(folder)


@pytest.mark.parametrize(
    ("weights", "problem"),
    [
        (safetensors_bytes()[:-5], "need 16 bytes of data, the file holds 11: truncated"),
        (b"\x01\x02", "2 bytes, shorter than the header length"),
        (struct.pack("<Q", 1 << 40) + b"{}", "a header length of 1099511627776 bytes"),
        (struct.pack("<Q", 4) + b"nope", "its header is not JSON"),
        (struct.pack("<Q", 2) + b"[]", "its header is not a JSON object"),
        (struct.pack("<Q", 11) + b'{"w": "x"}\n', "tensor 'w' has no data_offsets"),
        (os.urandom(4096), None),  # random bytes: some problem, whichever comes first
    ],
)
def test_a_damaged_safetensors_file_is_named(tmp_path: Path, weights: bytes, problem) -> None:
    folder = model_folder(tmp_path / "m", weights=weights)
    found = safetensors_problem(folder / "model.safetensors")
    assert found is not None
    if problem is not None:
        assert problem in found
    with pytest.raises(ConfigError, match=r"model\.safetensors is not a readable safetensors"):
        check_model_folder(folder)


def test_a_file_that_is_not_gguf_is_named(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_text("this is a text file, not a model\n")
    with pytest.raises(ConfigError, match=r"is not a GGUF file \(it does not start with"):
        check_gguf_file(str(fake))


def test_a_gguf_shorter_than_its_header_and_an_unknown_version_are_named(tmp_path: Path) -> None:
    short = tmp_path / "short.gguf"
    short.write_bytes(b"GGUF\x03\x00\x00\x00\x01")
    with pytest.raises(ConfigError, match=r"truncated GGUF file \(9 bytes\)"):
        check_gguf_file(str(short))
    future = tmp_path / "future.gguf"
    future.write_bytes(b"GGUF" + struct.pack("<IQQ", 99, 1, 1))
    with pytest.raises(ConfigError, match="GGUF version 99"):
        check_gguf_file(str(future))


def test_a_real_gguf_passes_the_header_check(tmp_path: Path) -> None:
    check_gguf_file(str(real_gguf(tmp_path / "ok.gguf")))


# ---- the commands -------------------------------------------------------------------------------
def polyrl(tmp_path: Path, command: str, model: Path) -> subprocess.CompletedProcess:
    """``polyrl <command>`` in this process (the checks run before anything starts, so a fresh
    interpreter would only import again); ``RAY_ADDRESS`` names a closed port, so a run that
    reached Ray would fail with another error."""
    out = tmp_path / f"run-{command}"
    env = {**ENV, "POLYRL_CACHE_DIR": str(tmp_path / "cache"), "RAY_ADDRESS": "127.0.0.1:9"}
    return run_polyrl_here(
        command,
        "recipe=tiny",
        f"actor_rollout_ref.model.path={model}",
        f"trainer.default_local_dir={out}",
        env=env,
    )


def assert_one_line(proc: subprocess.CompletedProcess, *words: str) -> str:
    """The run stopped (exit 1: the config check's list, 2: an error line) before Ray, without
    a traceback, and exactly one line says what is wrong, with ``words``."""
    text = proc.stdout + proc.stderr
    assert proc.returncode in (1, 2), text
    assert "Traceback" not in text and "Ray instance" not in text, text
    lines = [line for line in text.splitlines() if all(word in line for word in words)]
    assert len(lines) == 1, text
    return lines[0]


@pytest.fixture(scope="module")
def damaged(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("damaged")
    truncated = real_gguf(root / "truncated.gguf")
    truncated.write_bytes(truncated.read_bytes()[:-100])
    (root / "fake.gguf").write_text("not a model at all, just text\n" * 10)
    return {
        "config": model_folder(root / "config", config=b"{not json"),
        "safetensors": model_folder(root / "weights", weights=safetensors_bytes()[:-3]),
        "fake_gguf": root / "fake.gguf",
        "truncated_gguf": truncated,
    }


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("config", ("config.json is not valid JSON",)),
        ("safetensors", ("model.safetensors is not a readable safetensors file", "truncated")),
        ("fake_gguf", ("fake.gguf is not a GGUF file",)),
    ],
)
def test_validate_names_the_damaged_file_in_one_line(tmp_path, damaged, case, words) -> None:
    proc = polyrl(tmp_path, "validate", damaged[case])
    assert proc.returncode == 1
    assert_one_line(proc, *words)


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("config", ("config.json is not valid JSON",)),
        ("fake_gguf", ("fake.gguf is not a GGUF file",)),
        ("truncated_gguf", ("truncated.gguf could not be converted", "polyrl_errors.log")),
    ],
)
def test_train_names_the_damaged_file_in_one_line_before_ray(
    tmp_path, damaged, case, words
) -> None:
    line = assert_one_line(polyrl(tmp_path, "train", damaged[case]), *words)
    if "details in " in line:  # the chain behind the line is in the run's log
        log = Path(line.split("details in ")[1].rstrip(")"))
        assert log.parent == tmp_path / "run-train", line
        assert "Traceback" in log.read_text(), log.read_text()
