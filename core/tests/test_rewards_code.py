"""The code-execution reward: hand-written programs and test cases, run for real in the sandbox."""

from __future__ import annotations

import json
import time

import pytest

from polyrl.rewards.code import CodeRewardSettings, code_score, extract_code, load_cases
from polyrl.rewards.scorers import default_compute_score

ADD_CASES = {"inputs": ["1 2\n", "3 4\n", "10 -2\n"], "outputs": ["3\n", "7", "8\n"]}
CORRECT = "Here you go:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```\n"
FAST = CodeRewardSettings(case_timeout_s=1.0)


def test_a_correct_solution_scores_one_with_json_ground_truth():
    result = default_compute_score("code", CORRECT, json.dumps(ADD_CASES))
    assert result == {"score": 1.0, "passed": 3, "total": 3, "timeouts": 0}


def test_a_wrong_solution_scores_zero_and_a_partial_one_its_share():
    assert code_score("print(0)", ADD_CASES)["score"] == 0.0
    partial = "a, b = map(int, input().split())\nprint(a + b if a < 5 else 0)\n"
    assert code_score(partial, ADD_CASES)["score"] == pytest.approx(2 / 3)
    strict = CodeRewardSettings(score="all")
    assert code_score(partial, ADD_CASES, strict)["score"] == 0.0


def test_assert_style_tests_and_both_kinds_together():
    program = "def add(a, b):\n    return a + b\n"
    tests = {"tests": ["assert add(1, 2) == 3", "assert add(2, 2) == 5"]}
    assert code_score(program, tests) == {"score": 0.5, "passed": 1, "total": 2, "timeouts": 0}
    reads_lines = "import sys\n\ndef add(a, b):\n    return a + b\n\nfor line in sys.stdin:\n"
    reads_lines += "    print(add(*map(int, line.split())))\n"
    both = {"inputs": ["1 2"], "outputs": ["3"], "tests": ["assert add(1, 1) == 2"]}
    assert code_score(reads_lines, both)["score"] == 1.0


def test_an_infinite_loop_times_out_per_case_within_a_bound():
    start = time.monotonic()
    result = code_score("while True:\n    pass\n", ADD_CASES, FAST)
    assert (result["score"], result["timeouts"]) == (0.0, 3)
    assert time.monotonic() - start < 2 * FAST.case_timeout_s + 2  # 3 cases, 2 at a time


def test_hostile_programs_score_zero():
    for program in (
        "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)\nprint(3)",
        "open('/etc/polyrl-was-here', 'w').write('x')\nprint(3)",
        "import os\nwhile True:\n    os.fork()\n",
        "x = bytearray(8 * 1024**3)\nprint(3)",
        "import os\nos.system('exit 3')\nraise SystemExit(1)",
        "while True:\n    print('y' * 10000)\n",
    ):
        assert code_score(program, {"inputs": ["1 2"], "outputs": ["3"]}, FAST)["score"] == 0.0


def test_validation_knows_the_score_modes():
    from polyrl.config.checks.ranges import CODE_SCORE_MODES
    from polyrl.rewards.code import SCORE_MODES

    assert CODE_SCORE_MODES == SCORE_MODES


def test_extract_code_takes_the_last_python_block_else_the_whole_answer():
    text = "```python\nprint(1)\n```\nbetter:\n```py\nprint(2)\n```\n```text\nnope\n```"
    assert extract_code(text) == "print(2)\n"
    assert extract_code("print(5)") == "print(5)"


@pytest.mark.parametrize(
    ("truth", "message"),
    [
        ("[1, 2]", "got list"),
        ({"inputs": ["1"], "outputs": []}, "1 inputs and 0 outputs"),
        ({"tests": "assert True"}, "'tests' must be a list"),
        ({}, "holds no test case"),
    ],
)
def test_malformed_test_cases_say_what_is_expected(truth: object, message: str):
    with pytest.raises(ValueError, match=message):
        load_cases(truth)
