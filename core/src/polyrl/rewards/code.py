"""The code-execution reward (``data_source`` ``code``): run the Python program a response writes
against the row's test cases, each in the sandbox (:mod:`polyrl.rewards.sandbox`).

The program is the last fenced block of the response (a fence labelled ``python`` or ``py``, or
an unlabelled one), else the whole response. The row's ``reward_model.ground_truth`` is a dict (or
its JSON text) with either kind of test case, or both:

- ``inputs`` / ``outputs``: lists of equal length; case ``i`` feeds ``inputs[i]`` on stdin and
  passes when the program exits 0 and prints ``outputs[i]`` (trailing whitespace of each line and
  trailing empty lines ignored) -- the stdin/stdout layout of verl's code datasets;
- ``tests``: a list of Python snippets (``assert add(1, 2) == 3``); each is appended to the
  program and passes when the whole file exits 0.

The score is the fraction of cases passed (``reward_model.code.score=fraction``) or 1.0 only when
all pass (``all``, which stops at the first failure). Extras: ``passed``, ``total``, ``timeouts``.
Programs get the standard library only (no site-packages), ``case_timeout_s`` each and at most
``max_parallel`` at once: a response's worst case takes about
``ceil(cases / max_parallel) * case_timeout_s``, which ``reward_model.timeout_s`` must cover.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from polyrl.rewards.sandbox import SandboxLimits, run_program

CODE_SOURCES = ("code",)
SCORE_MODES = ("fraction", "all")

_FENCE = re.compile(r"```[ \t]*(python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class CodeRewardSettings:
    """``reward_model.code`` (the schema holds the defaults)."""

    score: str = "fraction"
    case_timeout_s: float = 5.0
    max_parallel: int = 2
    memory_mb: int = 512
    max_output_kb: int = 1024


@dataclass(frozen=True)
class _Case:
    stdin: str = ""
    expected: str | None = None  # stdout to match; None: an assert-style case
    test: str = ""  # code appended to the program


def extract_code(text: str) -> str:
    """The program in a response: its last Python (or unlabelled) fenced block, else all of it."""
    blocks = [body for label, body in _FENCE.findall(text) if label or body.strip()]
    return blocks[-1] if blocks else text


def load_cases(ground_truth: Any) -> list[_Case]:
    """The test cases of a row; ValueError with the expected layout when they are malformed."""
    truth = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    layout = (
        "code ground truth must be a dict (or its JSON) with 'inputs' and 'outputs' (lists of "
        "equal length) and/or 'tests' (a list of assert snippets)"
    )
    if not isinstance(truth, dict):
        raise ValueError(f"{layout}; got {type(truth).__name__}")
    inputs, outputs, tests = truth.get("inputs"), truth.get("outputs"), truth.get("tests")
    cases: list[_Case] = []
    if inputs is not None or outputs is not None:
        if not isinstance(inputs, list) or not isinstance(outputs, list):
            raise ValueError(f"{layout}; 'inputs' and 'outputs' must both be lists")
        if len(inputs) != len(outputs):
            raise ValueError(f"{layout}; got {len(inputs)} inputs and {len(outputs)} outputs")
        cases += [_Case(stdin=str(i), expected=str(o)) for i, o in zip(inputs, outputs)]
    if tests is not None:
        if not isinstance(tests, list):
            raise ValueError(f"{layout}; 'tests' must be a list")
        cases += [_Case(test=str(t)) for t in tests]
    if not cases:
        raise ValueError(f"{layout}; it holds no test case")
    return cases


def _normalise_output(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()).rstrip()


def _run_case(program: str, case: _Case, settings: CodeRewardSettings) -> tuple[bool, bool]:
    """``(passed, timed_out)`` of one case."""
    source = program if case.expected is not None else f"{program}\n\n{case.test}\n"
    result = run_program(
        source,
        case.stdin,
        timeout_s=settings.case_timeout_s,
        limits=SandboxLimits(memory_mb=settings.memory_mb, cpu_s=settings.case_timeout_s),
        max_output_bytes=settings.max_output_kb * 1024,
    )
    if result.returncode != 0 or result.truncated:
        return False, result.timed_out
    if case.expected is None:
        return True, False
    return _normalise_output(result.stdout) == _normalise_output(case.expected), False


def _results(
    program: str, cases: list[_Case], settings: CodeRewardSettings
) -> Iterator[tuple[bool, bool]]:
    with ThreadPoolExecutor(max_workers=max(1, settings.max_parallel)) as pool:
        futures = [pool.submit(_run_case, program, case, settings) for case in cases]
        for future in futures:
            outcome = future.result()
            yield outcome
            if settings.score == "all" and not outcome[0]:
                for rest in futures:
                    rest.cancel()
                return


def code_score(
    solution_str: str, ground_truth: Any, settings: CodeRewardSettings | None = None
) -> dict[str, float]:
    """Score a response's program against the row's test cases (see the module doc)."""
    settings = settings or CodeRewardSettings()
    if settings.score not in SCORE_MODES:
        raise ValueError(f"reward_model.code.score={settings.score!r}: use one of {SCORE_MODES}")
    cases = load_cases(ground_truth)
    program = extract_code(solution_str)
    passed = timeouts = 0
    for ok, timed_out in _results(program, cases, settings):
        passed += ok
        timeouts += timed_out
    total = len(cases)
    score = float(passed == total) if settings.score == "all" else passed / total
    return {"score": score, "passed": passed, "total": total, "timeouts": timeouts}
