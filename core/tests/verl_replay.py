"""Replay verl's example command lines (core/tests/fixtures/verl_examples.json) through
``polyrl validate``, in-process, with only the model and data paths swapped for offline ones.

Each script's outcome is one of: ``accepted`` (validates as written), ``hardware`` (validates
once ``trainer.device=cuda``: the script asks for GPUs this machine has not), ``refused`` (every
problem is a verl feature polyrl refuses in one line), ``unknown`` (a key polyrl does not know)
or ``other`` (any other problem). Also runnable as a script that prints the counts and each
refused feature: ``python core/tests/verl_replay.py``.
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


def replay(script: str, args: list[str], configs: dict[str, str], tmp: Path) -> Outcome:
    overrides = local_overrides(args)
    overrides = _with_local_config_files(overrides, configs, tmp)
    problems = _problems(overrides)
    if not problems:
        return Outcome(script, "accepted")
    with_cuda = _problems([*overrides, "trainer.device=cuda"])
    if not with_cuda:
        return Outcome(script, "hardware", problems)
    if any("unknown config key" in p for p in with_cuda):
        return Outcome(script, "unknown", with_cuda)
    if all(NOT_SUPPORTED in p for p in with_cuda):
        return Outcome(script, "refused", with_cuda)
    return Outcome(script, "other", with_cuda)


def _problems(args: list[str]) -> list[str]:
    try:
        # argparse as `polyrl validate` parses it: the same path as the command line's.
        parsed, extra = build_parser().parse_known_args(["validate", *args])
        parsed.overrides = [*parsed.overrides, *extra]
        return validate_config(load_config(command_overrides(parsed)))
    except ConfigError as exc:
        return [str(exc)]


def _with_local_config_files(args: list[str], configs: dict[str, str], tmp: Path) -> list[str]:
    """``--config-path=$(pwd)/examples/...``: the fixture carries those files; written to tmp."""
    out = []
    for arg in args:
        match = re.match(r"--config-path=\$\(pwd\)/(.*)", arg)
        if match:
            folder = tmp / match[1]
            for path, text in configs.items():
                if path.startswith(match[1] + "/"):
                    (tmp / path).parent.mkdir(parents=True, exist_ok=True)
                    (tmp / path).write_text(text)
            arg = f"--config-path={folder}"
        out.append(arg)
    return out


def replay_all(tmp: Path) -> list[Outcome]:
    fixture = load_fixture()
    configs = fixture.get("configs", {})
    return [replay(s, a, configs, tmp) for s, a in sorted(fixture["scripts"].items())]


def report(outcomes: list[Outcome]) -> str:
    counts = {k: sum(o.kind == k for o in outcomes) for k in ("accepted", "hardware", "refused")}
    counts["unknown"] = sum(o.kind == "unknown" for o in outcomes)
    counts["other"] = sum(o.kind == "other" for o in outcomes)
    lines = [f"{len(outcomes)} verl example scripts: {counts}"]
    for o in outcomes:
        if o.kind not in ("accepted", "hardware"):
            lines.append(f"{o.kind}: {o.script}")
            lines.extend(f"    {p}" for p in o.problems)
    return "\n".join(lines)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print(report(replay_all(Path(tmp))))
