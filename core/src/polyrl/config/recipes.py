"""The ready-made configs of the ``recipe`` config group (``polyrl train recipe=NAME``)."""

from __future__ import annotations

from importlib import resources


def available_recipes() -> list[str]:
    folder = resources.files("polyrl.config.conf") / "recipe"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))
