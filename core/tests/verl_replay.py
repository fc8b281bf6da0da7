"""Replay verl's example command lines (core/tests/fixtures/verl_examples.json) through
``polyrl validate``, in-process, with only the model and data paths swapped for offline ones.

Each script is validated with ``trainer.device=cuda`` (verl's scripts are written for GPUs);
its outcome is one of: ``validates``, ``refused`` (every problem is a verl feature polyrl
refuses in one line), ``unknown`` (a key polyrl does not know), ``verl_fails`` (verl cannot run
the script as written either: the fixture's ``verl_fails`` says why) or ``other`` (any other
problem).
With ``split_hardware`` a script that validates is validated once more as written, and counts
as ``accepted`` (valid as written) or ``hardware`` (valid only with ``trainer.device=cuda``:
the script asks for GPUs this machine has not); the test leaves that second pass out. Also
runnable as a script that prints the counts and each script's problems:
``python core/tests/verl_replay.py``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from polyrl.cli import build_parser, command_overrides
from polyrl.config import load_config
from polyrl.config.validate import validate_config
from polyrl.config.verl_compat import NOT_SUPPORTED
from polyrl.errors import ConfigError

FIXTURE = Path(__file__).parent / "fixtures" / "verl_examples.json"
# Paths of the scripts' machines, swapped for the offline builtins (recipe=tiny's model).
LOCAL_PATHS = {
    "data.train_files": "builtin:tiny_digits",
    "data.val_files": "builtin:tiny_digits",
    "actor_rollout_ref.model.path": "builtin:tiny",
    "critic.model.path": "builtin:tiny",
    "reward_model.model.path": "builtin:tiny",
    "actor_rollout_ref.model.tokenizer_path": "null",
    "trainer.default_local_dir": "/tmp/polyrl-verl-replay",
    # a saved LoRA adapter to start from (its adapter_config.json: validation reads no weights)
    "actor_rollout_ref.model.lora_adapter_path": str(
        Path(__file__).parent / "fixtures" / "verl_lora_adapter"
    ),
    # verl's example curriculum sampler lives in verl's tests (it imports verl): its equivalent
    "data.sampler.class_path": str(Path(__file__).parent / "fixtures" / "verl_sampler.py"),
    # verl's example dataset classes subclass verl's RLHFDataset: its contract without verl
    "data.custom_cls.path": str(Path(__file__).parent / "fixtures" / "verl_dataset.py"),
    # a reward function file of verl's repository (every script names compute_score)
    "custom_reward_function.path": str(Path(__file__).parent / "fixtures" / "verl_reward.py"),
}
# Sizes that a script takes from its cluster's environment ($SLURM_NNODES ...), as on one node.
ENVIRONMENT_SIZES = {"trainer.nnodes": "1", "trainer.n_gpus_per_node": "8"}


@dataclass
class Outcome:
    script: str
    kind: str
    problems: list[str] = field(default_factory=list)


def load_fixture() -> dict:
    return json.loads(FIXTURE.read_text())


def local_overrides(args: list[str]) -> list[str]:
    """The script's overrides with machine paths swapped; ``--config-*`` options are kept."""
    out = []
    for arg in args:
        key, sep, value = arg.partition("=")
        bare = key.lstrip("+~")
        if sep and bare in LOCAL_PATHS:
            value = LOCAL_PATHS[bare]
        elif sep and bare in ENVIRONMENT_SIZES and not value.isdigit():
            value = ENVIRONMENT_SIZES[bare]
        elif sep and "$" in value and not key.startswith("--"):
            # a shell value that the script's environment supplies
            value = re.sub(r"\$\(\(?[^)]*\)\)?|\$\{?(\w+)\}?", r"env\1", value)
        out.append(f"{key}{sep}{value}")
    return out


VALIDATES = ("validates", "accepted", "hardware")


def replay(
    script: str,
    args: list[str],
    configs: dict[str, str],
    tmp: Path,
    split_hardware: bool = False,
    verl_fails: dict[str, str] | None = None,
) -> Outcome:
    verl_fails = verl_fails or {}
    overrides = local_overrides(_with_local_config_files(args, configs, tmp))
    with_cuda = _problems([*overrides, "trainer.device=cuda"])
    if script in verl_fails:
        return Outcome(script, "verl_fails", [f"verl fails too: {verl_fails[script]}", *with_cuda])
    if with_cuda:
        if any("unknown config key" in p for p in with_cuda):
            return Outcome(script, "unknown", with_cuda)
        if all(NOT_SUPPORTED in p for p in with_cuda):
            return Outcome(script, "refused", with_cuda)
        return Outcome(script, "other", with_cuda)
    if not split_hardware:
        return Outcome(script, "validates")
    as_written = _problems(overrides)
    return Outcome(script, "hardware" if as_written else "accepted", as_written)


def _problems(args: list[str]) -> list[str]:
    try:
        # argparse as `polyrl validate` parses it: the same path as the command line's.
        parsed, extra = build_parser().parse_known_args(["validate", *args])
        parsed.overrides = [*parsed.overrides, *extra]
        return validate_config(load_config(command_overrides(parsed)))
    except ConfigError as exc:
        return [str(exc)]


def _with_local_config_files(args: list[str], configs: dict[str, str], tmp: Path) -> list[str]:
    """``--config-path=$(pwd)/examples/...`` and ``..._config_path=$(pwd)/<file>``: the fixture
    carries those files; written to tmp."""
    out = []
    for arg in args:
        key, sep, value = arg.partition("=")
        if sep and value.startswith("$(pwd)/"):
            local = value.removeprefix("$(pwd)/")
            carried = [p for p in configs if p == local or p.startswith(local + "/")]
            for path in carried:
                (tmp / path).parent.mkdir(parents=True, exist_ok=True)
                (tmp / path).write_text(configs[path])
            if carried:
                arg = f"{key}={tmp / local}"
        out.append(arg)
    return out


def replay_all(tmp: Path, split_hardware: bool = False) -> list[Outcome]:
    fixture = load_fixture()
    configs, fails = fixture.get("configs", {}), fixture.get("verl_fails", {})
    return [
        replay(s, a, configs, tmp, split_hardware, fails)
        for s, a in sorted(fixture["scripts"].items())
    ]


def counts(outcomes: list[Outcome]) -> dict[str, int]:
    kinds = ("accepted", "hardware", "validates", "refused", "unknown", "verl_fails", "other")
    found = {k: sum(o.kind == k for o in outcomes) for k in kinds}
    return {k: n for k, n in found.items() if n or k not in ("accepted", "hardware", "validates")}


def report(outcomes: list[Outcome]) -> str:
    valid = sum(o.kind in VALIDATES for o in outcomes)
    lines = [
        f"{len(outcomes)} verl example scripts: {counts(outcomes)}; {valid} "
        f"({100 * valid / len(outcomes):.0f}%) validate with trainer.device=cuda"
    ]
    for o in outcomes:
        if o.kind not in VALIDATES:
            lines.append(f"{o.kind}: {o.script}")
            lines.extend(f"    {p}" for p in o.problems)
    return "\n".join(lines)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print(report(replay_all(Path(tmp), split_hardware=True)))
