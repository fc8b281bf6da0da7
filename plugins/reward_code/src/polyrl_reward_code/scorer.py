"""The code-execution reward (``data_source`` ``code``): run the Python program a response writes
against the row's test cases, each in polyrl's sandbox (``polyrl.api.run_program``).

The program is the last fenced block of the response (a fence labelled ``python`` or ``py``, or
an unlabelled one), else the whole response. The row's ``reward_model.ground_truth`` is a dict (or
its JSON text) with either kind of test case, or both:

- ``inputs`` / ``outputs``: lists of equal length; case ``i`` feeds ``inputs[i]`` on stdin and
  passes when the program exits 0 and prints ``outputs[i]`` (trailing whitespace of each line and
  trailing empty lines ignored) -- the stdin/stdout layout of verl's code datasets. The output is
  what is judged, so how the program ends (``sys.exit(0)`` after printing) is its own business;
- ``tests``: a list of Python snippets (``assert add(1, 2) == 3``); each runs after the program,
  in its namespace, and passes only when the snippet itself ran to its end.

Why not "append the tests and count exit status 0", as before: any program that exits early
(``raise SystemExit``, ``sys.exit(0)``, ``os._exit(0)``) then passes every test without running
one, and a policy learns that in a few steps. A case's verdict therefore comes from a channel the
program cannot forge easily: :mod:`polyrl_reward_code._harness` runs the program (catching
``BaseException``, so an early ``sys.exit`` just moves on to the test), then the test, then writes
a per-case random nonce to a pipe only the case holds (the sandbox's report channel). The nonce
and the pipe's number are taken out of the environment before the program runs, the files are
compiled before it runs, and the harness holds its own references to ``exec`` and ``os.write``:
exiting, killing itself, replacing builtins, rewriting the files or writing to stray descriptors
all end without the nonce, so the case fails. A nonce rather than a bare pipe, because any code
can find and write to an open descriptor; a pipe rather than stdout, so that stdout stays the
program's. What it does not stop: code written against this harness that reads the nonce out of
the harness's frame or rewinds it with a trace function (the program runs in the same
interpreter, as the tests must call its functions), and answers built to compare equal to
anything -- those are visible in the responses, not hidden in a process trick.

Every case is its own sandboxed process: when it ends, everything it started is killed and
reaped (the sandbox's launcher is its subreaper), so a fork bomb, a sleeper or a double-forked
daemon costs only its own case. The score is the fraction of cases passed
(``reward_model.code.score=fraction``) or 1.0 only when all pass (``all``, which stops at the
first failure). Extras: ``passed``, ``total``, ``timeouts``. Programs get the standard library
only (no site-packages), ``case_timeout_s`` each and at most ``max_parallel`` at once: a
response's worst case takes about ``ceil(cases / max_parallel) * case_timeout_s``, which
``reward_model.timeout_s`` must cover.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from polyrl.api import SandboxLimits, run_program
from polyrl_reward_code.settings import SCORE_MODES, CodeRewardSettings

CODE_SOURCES = ("code",)

_FENCE = re.compile(r"```[ \t]*(python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class _Case:
    stdin: str = ""
    expected: str | None = None  # stdout to match; None: an assert-style case
    test: str = ""  # code run after the program


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


@cache
def _harness() -> str:
    return Path(__file__).with_name("_harness.py").read_text(encoding="utf-8")


def _run_case(program: str, case: _Case, settings: CodeRewardSettings) -> tuple[bool, bool]:
    """``(passed, timed_out)`` of one case. A case that cannot start because the sandbox's
    process budget is spent (``EAGAIN``: a fork bomb in this program's other case, running beside
    it, holds the budget's processes until its sandbox ends) fails like the program failing."""
    try:
        return _run_started_case(program, case, settings)
    except BlockingIOError:
        return False, False


def _run_started_case(program: str, case: _Case, settings: CodeRewardSettings) -> tuple[bool, bool]:
    limits = SandboxLimits(
        memory_mb=settings.memory_mb,
        cpu_s=settings.case_timeout_s,
        max_processes=settings.max_processes,
    )
    common = {
        "timeout_s": settings.case_timeout_s,
        "limits": limits,
        "max_output_bytes": settings.max_output_kb * 1024,
    }
    if case.expected is None:
        files = {"program.py": program, "tests.py": case.test}
        result = run_program(_harness(), files=files, report=True, **common)
        return result.reported and not result.truncated, result.timed_out
    result = run_program(program, case.stdin, **common)
    if result.returncode != 0 or result.truncated:
        return False, result.timed_out
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


def score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any],
    settings: Mapping[str, Any],
) -> dict[str, float]:
    """The data-source scorer polyrl calls (``DataSourceScorerSpec.fn``); ``settings`` is
    ``reward_model.code`` as a dict."""
    return code_score(solution_str, ground_truth, CodeRewardSettings(**settings))
