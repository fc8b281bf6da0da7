"""Tools: a Python callable (or a verl ``BaseTool``-style class) with the JSON schema the model
sees, and how one call runs: under a time limit, with what it prints bounded.

Two shapes of implementation are accepted, so that a verl tool-config YAML works unchanged:

- a callable ``fn(**arguments) -> str | JSON-able`` (sync or ``async def``);
- a class built as ``cls(config, tool_schema)`` with verl's async methods ``create(instance_id,
  **create_kwargs)``, ``execute(instance_id, parameters, **kwargs)`` (returning text, or
  ``(text, reward, metrics)``, or an object with ``.text``) and ``release(instance_id)``;
  ``create_kwargs`` come from the row's ``extra_info.tools_kwargs[<tool name>]``.

A sync callable runs in a thread of its own per call, so a call that hangs costs its episode
the time limit and never blocks another call (its thread is left behind: code that may hang for
good, or that runs model output, belongs in the sandbox, :func:`polyrl.api.run_program`, as the
``python`` tool does). What a tool's thread prints is captured per call and bounded
(:class:`CapturedPrints`), so a tool that prints without end fills neither the driver's log nor
its memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import io
import json
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from polyrl.api import ConfigError
from polyrl_env_tools.yaml_config import read_entries


@dataclass
class Tool:
    """A tool the model can call by ``schema["function"]["name"]``."""

    schema: dict[str, Any]
    fn: Callable[..., Any] | None = None
    instance_class: type | None = None
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.schema["function"]["name"])


@dataclass
class ToolOutcome:
    """One call's result: ``text`` for the tool message, or ``error`` (``timeout``: it ran past
    the limit; ``by_model``: the model's mistake, such as an unknown tool, not the tool's);
    ``reward`` / ``metrics`` as a verl tool reports them; ``dropped_bytes`` of print output past
    the limit."""

    text: str = ""
    error: str | None = None
    timeout: bool = False
    by_model: bool = False
    reward: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    dropped_bytes: int = 0


def function_tool(fn: Callable[..., Any], schema: Mapping[str, Any]) -> Tool:
    """A tool from a plain callable and its schema (the ``function`` object, or the whole
    ``{"type": "function", "function": ...}``)."""
    full = dict(schema) if "function" in schema else {"type": "function", "function": dict(schema)}
    return Tool(schema=full, fn=fn)


def load_tool_config(path: str) -> list[Tool]:
    """The tools of a verl tool-config YAML. ``class_name`` is an import path, dotted
    (``pkg.mod.Name``, verl's form) or ``pkg.mod:Name``; a wrong file is one line naming it."""
    entries = read_entries(
        path, "multi_turn.tool_config_path", "tools", "{class_name, config, tool_schema}"
    )
    tools = []
    for position, entry in enumerate(entries):
        where = f"{path}: tools[{position}]"
        if (
            not isinstance(entry, Mapping)
            or "class_name" not in entry
            or "tool_schema" not in entry
        ):
            raise ConfigError(f"{where} needs class_name and tool_schema")
        target = str(entry["class_name"])
        module, _, attribute = target.rpartition(":" if ":" in target else ".")
        try:
            impl = getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ConfigError(
                f"{where}: class_name {entry['class_name']!r} does not import ({exc})"
            ) from exc
        schema = dict(entry["tool_schema"])
        config = dict(entry.get("config") or {})
        if inspect.isclass(impl):
            tools.append(Tool(schema=schema, instance_class=impl, config=config))
        else:
            tools.append(Tool(schema=schema, fn=impl, config=config))
    return tools


class CapturedPrints(io.TextIOBase):
    """Stands in for ``sys.stdout`` / ``sys.stderr``: text written by a thread that is running a
    tool call goes to that call's bounded buffer; any other thread's goes where it went before."""

    def __init__(self, original: Any) -> None:
        self.original = original
        self.local = threading.local()

    def write(self, text: str) -> int:
        buffer = getattr(self.local, "buffer", None)
        if buffer is None:
            return self.original.write(text)
        room = self.local.limit - buffer.tell()
        buffer.write(text[: max(room, 0)])
        self.local.dropped += max(len(text) - max(room, 0), 0)
        return len(text)

    def flush(self) -> None:
        if getattr(self.local, "buffer", None) is None:
            self.original.flush()

    def begin(self, limit: int) -> None:
        self.local.buffer, self.local.limit, self.local.dropped = io.StringIO(), limit, 0

    def end(self) -> tuple[str, int]:
        buffer, dropped = self.local.buffer, self.local.dropped
        self.local.buffer = None
        return buffer.getvalue(), dropped


_capture_lock = threading.Lock()


def _captured_streams() -> tuple[CapturedPrints, CapturedPrints]:
    """Install the capturing streams once (they pass other threads' output through)."""
    with _capture_lock:
        if not isinstance(sys.stdout, CapturedPrints):
            sys.stdout = CapturedPrints(sys.stdout)
        if not isinstance(sys.stderr, CapturedPrints):
            sys.stderr = CapturedPrints(sys.stderr)
        return sys.stdout, sys.stderr  # type: ignore[return-value]


def as_text(value: Any) -> str:
    """A tool's return value as the tool message's text."""
    if isinstance(value, str):
        return value
    text = getattr(value, "text", None)
    if isinstance(text, str):
        return text
    try:
        return json.dumps(value)
    except TypeError:
        return str(value)


async def run_in_thread(fn: Callable[[], Any], max_output_bytes: int) -> tuple[Any, int]:
    """``fn()`` in a daemon thread of its own, its prints captured: ``(result, dropped_bytes)``.
    Cancelling the awaiting task abandons the thread (it cannot be killed)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[tuple[Any, int]] = loop.create_future()
    out, err = _captured_streams()

    def settle(setter: Callable[[Any], None], value: Any) -> None:
        if not done.done():
            setter(value)

    def deliver(setter: Callable[[Any], None], value: Any) -> None:
        # RuntimeError: the rollout ended (and closed its loop) while this call hung
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, setter, value)

    def target() -> None:
        out.begin(max_output_bytes)
        err.begin(max_output_bytes)
        try:
            result = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting episode
            out.end(), err.end()
            deliver(done.set_exception, exc)
            return
        dropped = out.end()[1] + err.end()[1]
        deliver(done.set_result, (result, dropped))

    threading.Thread(target=target, name="polyrl-tool-call", daemon=True).start()
    return await done


async def call_tool(
    tool: Tool,
    arguments: Mapping[str, Any],
    *,
    instance: Any = None,
    instance_id: str = "",
    timeout_s: float,
    max_output_bytes: int,
) -> ToolOutcome:
    """One call of ``tool`` with ``arguments``; failures and the time limit are outcomes."""
    try:
        if instance is not None:
            raw = await asyncio.wait_for(instance.execute(instance_id, dict(arguments)), timeout_s)
            dropped = 0
        elif inspect.iscoroutinefunction(tool.fn):
            raw = await asyncio.wait_for(tool.fn(**arguments), timeout_s)
            dropped = 0
        else:
            assert tool.fn is not None
            fn = tool.fn
            raw, dropped = await asyncio.wait_for(
                run_in_thread(lambda: fn(**arguments), max_output_bytes), timeout_s
            )
    except TimeoutError:
        return ToolOutcome(error=f"tool {tool.name!r} timed out after {timeout_s:g}s", timeout=True)
    except Exception as exc:  # noqa: BLE001 - a tool's failure is its episode's outcome
        return ToolOutcome(error=f"tool {tool.name!r} raised {type(exc).__name__}: {exc}")
    if isinstance(raw, tuple) and len(raw) == 3:  # verl's (text, reward, metrics)
        text, reward, metrics = raw
        numeric = {k: float(v) for k, v in dict(metrics or {}).items() if _is_number(v)}
        return ToolOutcome(
            as_text(text), reward=_maybe_float(reward), metrics=numeric, dropped_bytes=dropped
        )
    return ToolOutcome(as_text(raw), dropped_bytes=dropped)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _maybe_float(value: Any) -> float | None:
    return float(value) if _is_number(value) else None
