"""Write the configuration reference (Markdown) from the schema of the installed packages.

Usage::

    .venv/bin/python scripts/config_reference.py [OUT.md]     # default: standard output

The docs site generates the page on every build (``docs/hooks.py``), so it cannot go stale;
this command is for reading it without building the site.

Every key of ``polyrl config`` is listed (:func:`polyrl.config.keys.schema_keys`), grouped by
its top-level group, with its type, its default, the package that declares it (core, or the
plugin whose ``config_sections`` mounts it: :func:`polyrl.config.sections.installed_sections`),
the verl key that means it where verl spells it differently (the declared aliases) and its
meaning, taken from the comments beside the field in the dataclass that declares it: the
schema's comments are the one place a key is explained, so the reference repeats them rather
than keeping a second description that could disagree.
"""

from __future__ import annotations

import inspect
import io
import json
import sys
import tokenize
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, get_type_hints

from omegaconf import OmegaConf

from polyrl.config.keys import schema_keys, schema_types
from polyrl.config.schema import PolyrlConfig
from polyrl.config.sections import installed_sections, key_aliases, schema_config
from polyrl.config.verl_compat import ALIASES

CORE = "polyrl (core)"
# Comments that speak to a tool, not to the reader.
TOOL_COMMENTS = ("type:", "noqa", "fmt:", "pragma")


def field_comments(cls: type) -> dict[str, str]:
    """``{field: the comment lines just above it and the comment at the end of its line}``."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            text = token.string.lstrip("#").strip()
            if not text.startswith(TOOL_COMMENTS):
                comments[token.start[0]] = text
    lines = source.splitlines()
    names = {f.name for f in fields(cls)}
    found: dict[str, str] = {}
    for number, line in enumerate(lines, start=1):
        name = line.strip().split(":", 1)[0]
        if name not in names or name in found or not line.startswith("    "):
            continue
        above: list[str] = []
        previous = number - 1
        while previous in comments and lines[previous - 1].lstrip().startswith("#"):
            above.insert(0, comments[previous])
            previous -= 1
        end = comments.get(number)
        found[name] = " ".join([*above, *([end] if end else [])])
    return found


def described_keys(cls: type, prefix: str, out: dict[str, str]) -> None:
    """Each key of the dataclass ``cls`` (and of the dataclasses it nests) with its comments."""
    comments = field_comments(cls)
    hints = get_type_hints(cls)
    for f in fields(cls):
        key = f"{prefix}{f.name}"
        if comments.get(f.name):
            out.setdefault(key, comments[f.name])
        if is_dataclass(hints[f.name]):
            described_keys(hints[f.name], key + ".", out)


def owners_and_meanings() -> tuple[dict[str, list[str]], dict[str, str]]:
    owners: dict[str, list[str]] = {key: [CORE] for key in schema_keys(PolyrlConfig)}
    meanings: dict[str, str] = {}
    described_keys(PolyrlConfig, "", meanings)
    for section in installed_sections():
        package = section.owner.rpartition("(")[2].rstrip(")")
        for key in schema_keys(section.dataclass, section.path + "."):
            if package not in owners.setdefault(key, []):
                owners[key].append(package)
        described_keys(section.dataclass, section.path + ".", meanings)
    return owners, meanings


def verl_names() -> dict[str, list[str]]:
    """``{polyrl key: [verl keys that mean it]}``, from the declared aliases: core's
    (:data:`polyrl.config.verl_compat.ALIASES`) and the installed plugins'."""
    names: dict[str, list[str]] = {}
    for alias, key in {**ALIASES, **key_aliases()}.items():
        names.setdefault(key, []).append(alias)
    return names


def defaults() -> dict[str, Any]:
    """The default of every leaf key, interpolations kept as written (``${...}``)."""
    flat: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict) and value:
                walk(value, f"{prefix}{key}.")
            else:
                flat[f"{prefix}{key}"] = value

    walk(OmegaConf.to_container(schema_config(), resolve=False), "")
    return flat


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def shown_default(value: Any) -> str:
    """As a user writes it on the command line: ``null``, ``true``, ``[0.9,0.999]``."""
    if value == "???":
        return "required"
    if value is None or isinstance(value, bool):
        return f"`{json.dumps(value)}`"
    if isinstance(value, list | dict):
        return f"`{json.dumps(value, separators=(',', ':'))}`"
    return f"`{value}`" if value != "" else '`""`'


def render() -> str:
    keys = schema_keys()
    types, values = schema_types(), defaults()
    owners, meanings = owners_and_meanings()
    verl = verl_names()
    lines = [
        "# Configuration reference",
        "",
        "Every key `polyrl config` shows, generated from the schema of the installed packages "
        "(`scripts/config_reference.py`). Keys keep verl's names; the verl column names the "
        "verl key only where verl spells it differently. *Owner* is the package that declares "
        "the key: core, or the plugin whose `config_sections` mounts it (installed plugins' "
        "keys exist whether or not the run selects them). Set any key on the command line "
        "(`polyrl train trainer.total_training_steps=10`) or in a recipe.",
        "",
    ]
    groups = dict.fromkeys(key.split(".")[0] for key in keys)
    for group in groups:
        lines += [f"## `{group}`", "", "| key | type | default | owner | verl | meaning |"]
        lines.append("|---|---|---|---|---|---|")
        for key in (k for k in keys if k == group or k.startswith(group + ".")):
            leaf = key in values and key not in {k.rpartition(".")[0] for k in keys}
            kind = types.get(key, "any" if leaf else "group")
            default = shown_default(values[key]) if leaf else ""
            row = [
                f"`{key}`",
                kind,
                default,
                ", ".join(owners.get(key, [CORE])),
                ", ".join(f"`{name}`" for name in verl.get(key, [])),
                meanings.get(key, ""),
            ]
            lines.append("| " + " | ".join(cell(c) for c in row) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    text = render()
    if argv:
        Path(argv[0]).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
