"""Docs pages written from the code: one per plugin package, and the plugin kinds reference.

The docs site builds them on every build (``scripts/mkdocs_hooks.py``), so each says what its
source says today: a plugin's page is its package README with its row of the support table
(``docs/plugins/index.md``: what it supports, where it was verified); the kinds page is every
hook of :mod:`polyrl.hookspecs` with its docstring's example and the fields of the spec it
yields, with their defaults and the comments beside them in :mod:`polyrl.specs`.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from pathlib import Path

from config_reference import field_comments

ROOT = Path(__file__).resolve().parent.parent
SOURCE = "https://github.com/polyrl/polyrl/tree/main"
TABLE = ROOT / "docs" / "plugins" / "index.md"
UNPUBLISHED = {"_template"}
# A relative link of a README (``[core](../../core)``): shown as a link to the repository.
ROLE = re.compile(r":\w+:`~?([^`]+)`")
# "Example::" or "Example (what it shows)::", the start of a docstring's code block.
EXAMPLE = re.compile(r"\n(Example[^\n]*?)::\n")
RELATIVE_LINK = re.compile(r"\]\((?!https?://|#)([^)]+)\)")


def plugin_folders() -> list[Path]:
    folders = sorted(p.parent for p in (ROOT / "plugins").glob("*/README.md"))
    return [f for f in folders if f.name not in UNPUBLISHED]


def support_rows() -> dict[str, dict[str, str]]:
    """``{package: {column: cell}}`` from the support table of ``docs/plugins/index.md``."""
    text = TABLE.read_text()
    table = text[text.index("| package |") :].split("\n\n")[0]
    lines = table.splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header, cells, strict=False))
    return rows


def plugin_page(folder: Path, rows: dict[str, dict[str, str]]) -> str:
    readme = folder / "README.md"
    text = readme.read_text()
    package = text.splitlines()[0].removeprefix("# ").strip()
    base = f"{SOURCE}/plugins/{folder.name}"
    text = RELATIVE_LINK.sub(lambda m: f"]({base}/{m.group(1)})", text)
    row = rows.get(package)
    if row is None:
        summary = "*Not in the support table of the [plugins page](index.md) yet.*"
    else:
        summary = "\n".join(
            f"- **{column}**: {cell}" for column, cell in row.items() if column != "package"
        )
    title, _, body = text.partition("\n")
    return f"{title}\n\n{summary}\n\nSource: <{base}>\n{body}"


def markdown(rst: str) -> str:
    """Docstring markup as Markdown: ``x`` and :role:`x` become `x`."""
    return ROLE.sub(r"`\1`", rst).replace("``", "`")


def hook_example(doc: str) -> tuple[str, str]:
    """A hook docstring's prose and its ``Example::`` block as a Python code fence."""
    prose, heading, example = [*EXAMPLE.split(inspect.cleandoc(doc), maxsplit=1), "", ""][:3]
    if not example.strip():
        return markdown(prose.strip()), ""
    code = inspect.cleandoc(example)
    return markdown(prose.strip()), f"{heading}:\n\n```python\n{code}\n```"


def spec_fields(spec: type) -> list[str]:
    comments: dict[str, str] = {}
    for cls in reversed(spec.__mro__):
        if dataclasses.is_dataclass(cls):
            comments.update(field_comments(cls))
    lines = ["| field | default | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(spec):
        if f.default is not dataclasses.MISSING:
            default = f"`{f.default!r}`"
        elif f.default_factory is not dataclasses.MISSING:
            default = f"`{f.default_factory()!r}`"
        else:
            default = "required"
        cells = (f"`{f.name}`", default, comments.get(f.name, ""))
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines


def kinds_page() -> str:
    from polyrl import hookspecs

    lines = [
        "# Plugin kinds",
        "",
        "Every hook a plugin can implement (`polyrl.hookspecs`), with the example of its "
        "docstring and the fields of the spec it yields (`polyrl.api`). Generated from the "
        "code on every docs build. How to package and test a plugin: "
        "[Writing a plugin](index.md).",
        "",
    ]
    for name, hook in inspect.getmembers(hookspecs, inspect.isfunction):
        if not name.startswith("polyrl_"):
            continue
        prose, example = hook_example(hook.__doc__ or "")
        spec = typing.get_args(typing.get_type_hints(hook, vars(hookspecs))["return"])[0]
        lines += [f"## `{name}`", "", prose, "", example, "", f"### `{spec.__name__}`", ""]
        lines += [markdown(inspect.cleandoc(spec.__doc__ or "")), "", *spec_fields(spec), ""]
    return "\n".join(lines)
