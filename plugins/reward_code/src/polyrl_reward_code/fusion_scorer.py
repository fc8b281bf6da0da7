"""verl's code data sources (``codecontests``, ``apps``, ``codeforces``, ``taco``) scored the way
verl scores them when ``reward_model.sandbox_fusion.url`` is set: each test case is one request
to the SandboxFusion service (:mod:`polyrl_reward_code.sandbox_fusion`), which runs the program;
nothing of the response runs here.

verl's rules, kept so that a verl run scores the same here:

- the program is the response's fenced block (as for ``code`` rows,
  :func:`polyrl_reward_code.scorer.extract_code`); a response without a fence scores 0;
- ``reward_model.ground_truth`` is a dict (or its JSON) with ``inputs`` and ``outputs`` (stdin
  fed, stdout expected), and optionally ``fn_name`` (LeetCode style: each stdin line is a JSON
  argument of that function, or of that method of ``Solution``, and the printed result is
  compared) and ``assert_case`` (a snippet appended to the program per case; ``inputs`` default
  to empty and ``outputs`` to none, and such a case passes when the program runs to its end);
- a case passes when the service reports ``Success`` with the run ``Finished`` and the stdout
  equals the expected output up to trailing newlines;
- the score is the share of the first ten cases that pass (verl's ``continuous`` score, which
  reads no further case: the rest are not sent).

A case whose request fails (after the client's retries) scores 0 like any failed case and is
counted in the extras (``reward_extra/api_errors``): a step never fails on the service. The
first such failure of a process is printed, with its reason, so that an unreachable service
shows at once and not as a reward that stays at 0. Extras, per sample: ``passed``, ``total``,
``wrong_answers``, ``runtime_errors`` (a non-zero exit or an exception), ``timeouts``,
``sandbox_errors`` (the service's own ``SandboxError`` or a status the API does not define),
``api_errors`` and ``no_code_block``.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from polyrl_reward_code.sandbox_fusion import SandboxFusionError, run_code, shown_url
from polyrl_reward_code.scorer import extract_code
from polyrl_reward_code.settings import SANDBOX_FUSION_SECTION, SandboxFusionSettings

SCORED_CASES = 10  # verl's continuous score reads the first ten cases
VERDICTS = ("wrong_answers", "runtime_errors", "timeouts", "sandbox_errors", "api_errors")
LAYOUT = (
    "a dict (or its JSON) with 'inputs' and 'outputs' (lists of equal length), optionally "
    "'fn_name' (a function name) and 'assert_case' (a list of snippets, one per case)"
)
# What verl's LeetCode-style cases have at hand without importing it.
_PRELUDE = (
    "from typing import *\n"
    "import bisect, collections, functools, heapq, itertools, math, re, string\n"
    "from bisect import *\nfrom collections import *\nfrom functools import *\n"
    "from heapq import *\nfrom itertools import *\nfrom math import *\n"
)
# Calls fn_name with one JSON argument per stdin line and prints what it returns.
_CALL = """

def _polyrl_call(name):
    import json, sys
    args = [json.loads(line) for line in sys.stdin.read().split("\\n") if line.strip()]
    fn = globals()[name] if name in globals() else getattr(globals()["Solution"](), name)
    result = fn(*args)
    structured = result is None or isinstance(result, (bool, dict, list, tuple))
    print(json.dumps(result) if structured else result)


_polyrl_call({name!r})
"""

_reported: set[str] = set()
_reported_lock = threading.Lock()


@dataclass(frozen=True)
class FusionCase:
    """One request: the program (with its ``assert_case``, if any) and what it must print."""

    code: str
    stdin: str
    expected: str | None  # None: the case passes when the program runs to its end


def load_fusion_cases(solution: str, ground_truth: Any) -> list[FusionCase]:
    """The requests a response makes of the row's ``ground_truth`` (at most the scored ten);
    ValueError with the expected layout when the ground truth is malformed."""
    truth = _parsed(ground_truth)
    asserts = truth.get("assert_case")
    if asserts is not None and not isinstance(asserts, list):
        raise ValueError(f"verl code ground truth must be {LAYOUT}; 'assert_case' is not a list")
    count = len(asserts) if asserts is not None else None
    inputs = truth.get("inputs", [""] * count if count is not None else None)
    outputs = truth.get("outputs", [None] * count if count is not None else None)
    if not isinstance(inputs, list) or not isinstance(outputs, list) or not inputs:
        raise ValueError(f"verl code ground truth must be {LAYOUT}; got keys {sorted(truth)}")
    sizes = {len(inputs), len(outputs), len(asserts) if asserts is not None else len(inputs)}
    if len(sizes) > 1:
        raise ValueError(f"verl code ground truth must be {LAYOUT}; its lists differ in length")
    fn_name = truth.get("fn_name")
    if fn_name is not None and not (isinstance(fn_name, str) and fn_name.isidentifier()):
        raise ValueError(f"verl code ground truth's 'fn_name' must be a Python name: {fn_name!r}")
    cases = []
    for i, (stdin, expected) in enumerate(zip(inputs, outputs)):
        if i == SCORED_CASES:
            break
        code = solution if asserts is None else f"{solution}\n\n{asserts[i]}"
        if fn_name:
            code = f"{_PRELUDE}{code}{_CALL.format(name=fn_name)}"
        text = None if expected is None else str(expected)
        cases.append(FusionCase(code, "" if stdin is None else str(stdin), text))
    return cases


def verdict(answer: Mapping[str, Any], expected: str | None) -> str:
    """``passed`` or one of :data:`VERDICTS` for the service's ``answer`` to a case."""
    run = answer.get("run_result") or {}
    compiled = answer.get("compile_result") or {}
    status = answer.get("status")
    if status == "Success":
        if not isinstance(run, Mapping) or run.get("status") != "Finished":
            return "sandbox_errors"
        if expected is None:
            return "passed"
        stdout = str(run.get("stdout") or "")
        return "passed" if stdout.rstrip("\n") == expected.rstrip("\n") else "wrong_answers"
    if status == "Failed":
        limits = [part.get("status") for part in (run, compiled) if isinstance(part, Mapping)]
        return "timeouts" if "TimeLimitExceeded" in limits else "runtime_errors"
    return "sandbox_errors"


def fusion_score(
    solution_str: str, ground_truth: Any, settings: SandboxFusionSettings
) -> dict[str, float]:
    """Score a response through the service at ``settings.url`` (see the module doc)."""
    if not settings.url:
        raise ValueError(
            f"verl's code data sources are scored by a SandboxFusion service: set "
            f"{SANDBOX_FUSION_SECTION}.url=http://<host>/run_code, or give the rows data_source "
            f"'code' to run them in polyrl's local sandbox"
        )
    if "```" not in solution_str:
        cases = load_fusion_cases("", ground_truth)
        return _extras(Counter(), len(cases), no_code=True)
    cases = load_fusion_cases(extract_code(solution_str), ground_truth)
    with ThreadPoolExecutor(max_workers=min(len(cases), max(1, settings.max_concurrent))) as pool:
        counts = Counter(pool.map(lambda case: _run(case, settings), cases))
    return _extras(counts, len(cases), no_code=False)


def score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any],
    settings: Mapping[str, Any],
) -> dict[str, float]:
    """The data-source scorer polyrl calls (``DataSourceScorerSpec.fn``); ``settings`` is
    ``reward_model.sandbox_fusion`` as a dict."""
    return fusion_score(solution_str, ground_truth, SandboxFusionSettings(**settings))


def _parsed(ground_truth: Any) -> dict[str, Any]:
    try:
        truth = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    except ValueError:
        raise ValueError(f"verl code ground truth must be {LAYOUT}; it is not JSON") from None
    if not isinstance(truth, dict):
        raise ValueError(f"verl code ground truth must be {LAYOUT}; got {type(truth).__name__}")
    return truth


def _run(case: FusionCase, settings: SandboxFusionSettings) -> str:
    url = str(settings.url)
    try:
        answer = run_code(
            url,
            case.code,
            case.stdin,
            run_timeout_s=settings.run_timeout_s,
            memory_limit_mb=settings.memory_limit_mb,
            max_concurrent=settings.max_concurrent,
        )
    except SandboxFusionError as exc:
        _report_first_failure(url, str(exc))
        return "api_errors"
    return verdict(answer, case.expected)


def _report_first_failure(url: str, reason: str) -> None:
    with _reported_lock:
        if url in _reported:
            return
        _reported.add(url)
    print(
        f"polyrl-reward-code: a SandboxFusion request to {shown_url(url)} failed: {reason}; "
        f"each case whose request fails scores 0 and is counted in reward_extra/api_errors",
        file=sys.stderr,
        flush=True,
    )


def _extras(counts: Counter, total: int, *, no_code: bool) -> dict[str, float]:
    result = {"score": counts["passed"] / total, "passed": counts["passed"], "total": total}
    result.update({name: counts[name] for name in VERDICTS})
    result["no_code_block"] = float(no_code)
    return result
