"""Tools this package ships, usable from a verl tool-config YAML by ``class_name``.

``python`` runs model-written code in polyrl's sandbox (:func:`polyrl.api.run_program`: limits on
memory, processes, output and wall time, no network where the OS allows), so what the model
writes never runs in the driver. ``calculate`` evaluates arithmetic by walking its syntax tree:
numbers and ``+ - * / // % **`` only, nothing is executed.
"""

from __future__ import annotations

import ast
import operator
from typing import Any

from polyrl.api import run_program

PYTHON_SCHEMA = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run a Python program and return what it prints.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the program"}},
            "required": ["code"],
        },
    },
}
CALCULATE_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression such as (12 + 7) * 3.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
# A program's time limit in the sandbox; the tool call's own limit (tool_timeout_s) is above it.
PYTHON_TIMEOUT_S = 5.0
PYTHON_MAX_OUTPUT_BYTES = 4096


def python(code: str) -> str:
    """The program's output (stdout, then stderr), or why it stopped."""
    result = run_program(code, timeout_s=PYTHON_TIMEOUT_S, max_output_bytes=PYTHON_MAX_OUTPUT_BYTES)
    text = result.stdout + (f"\n{result.stderr}" if result.stderr else "")
    if result.timed_out:
        text += f"\n(stopped: over {PYTHON_TIMEOUT_S:g}s)"
    elif result.truncated:
        text += "\n(stopped: too much output)"
    elif result.returncode:
        text += f"\n(exit code {result.returncode})"
    return text.strip()


_OPERATORS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
MAX_EXPONENT = 64


def calculate(expression: str) -> str:
    """The value of ``expression``, or ``error: ...``."""
    try:
        value = _evaluate(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as exc:
        return f"error: {exc}"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def _evaluate(node: ast.AST) -> float | int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is above {MAX_EXPONENT}")
        return _OPERATORS[type(node.op)](left, right)
    raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")
