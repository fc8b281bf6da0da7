"""The code-execution reward: hand-written programs and test cases, run for real in the sandbox;
programs that try to pass by how their process ends, or that leave processes behind."""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path

import pytest

from polyrl.api.testing import schema_config
from polyrl_reward_code.checks import check_config
from polyrl_reward_code.scorer import code_score, extract_code, load_cases, score
from polyrl_reward_code.settings import CodeRewardSettings

ADD_CASES = {"inputs": ["1 2\n", "3 4\n", "10 -2\n"], "outputs": ["3\n", "7", "8\n"]}
ADD_TESTS = {"tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]}
CORRECT = "Here you go:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```\n"
HONEST = "def add(a, b):\n    return a + b\n"
FAST = CodeRewardSettings(case_timeout_s=1.0, memory_mb=256)


def test_a_correct_solution_scores_one_with_json_ground_truth():
    result = score("code", CORRECT, json.dumps(ADD_CASES), {}, {"case_timeout_s": 2.0})
    assert result == {"score": 1.0, "passed": 3, "total": 3, "timeouts": 0}


def test_a_wrong_solution_scores_zero_and_a_partial_one_its_share():
    assert code_score("print(0)", ADD_CASES)["score"] == 0.0
    partial = "a, b = map(int, input().split())\nprint(a + b if a < 5 else 0)\n"
    assert code_score(partial, ADD_CASES)["score"] == pytest.approx(2 / 3)
    strict = CodeRewardSettings(score="all")
    assert code_score(partial, ADD_CASES, strict)["score"] == 0.0


def test_assert_style_tests_and_both_kinds_together():
    tests = {"tests": ["assert add(1, 2) == 3", "assert add(2, 2) == 5"]}
    assert code_score(HONEST, tests) == {"score": 0.5, "passed": 1, "total": 2, "timeouts": 0}
    reads_lines = "import sys\n\ndef add(a, b):\n    return a + b\n\nfor line in sys.stdin:\n"
    reads_lines += "    print(add(*map(int, line.split())))\n"
    both = {"inputs": ["1 2"], "outputs": ["3"], "tests": ["assert add(1, 1) == 2"]}
    assert code_score(reads_lines, both)["score"] == 1.0


@pytest.mark.parametrize(
    "ending",
    ["raise SystemExit", "import sys\nsys.exit(0)", "import os\nos._exit(0)"],
    ids=["raise-SystemExit", "sys.exit(0)", "os._exit(0)"],
)
def test_an_early_exit_scores_zero_on_assert_tests(ending: str):
    assert code_score(ending, ADD_TESTS, FAST)["score"] == 0.0
    # before its functions: the test still runs, and finds nothing to call
    assert code_score(f"{ending}\n{HONEST}", ADD_TESTS, FAST)["score"] == 0.0


def test_a_program_that_exits_after_defining_its_functions_is_still_tested():
    # sys.exit ends the program, not the case: the tests run, and decide
    assert code_score(f"{HONEST}raise SystemExit(0)\n", ADD_TESTS, FAST)["score"] == 1.0
    wrong = "def add(a, b):\n    return a - b\nimport sys\nsys.exit(0)\n"
    assert code_score(wrong, ADD_TESTS, FAST)["score"] == 0.0


@pytest.mark.parametrize(
    "forgery",
    [
        # a report without the nonce, to every descriptor it may be on
        "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'ok')\n"
        "    except OSError:\n        pass\nos._exit(0)",
        # the harness's exec replaced, so the tests would run nothing
        "import builtins\nbuiltins.exec = lambda *a, **k: None\n",
        # the tests rewritten on disk after they were read
        "open('tests.py', 'w').write('pass')\n",
        # the nonce looked up where it was handed over
        "import os\nv = os.environ.get('POLYRL_REPORT_NONCE')\n"
        "fd = os.environ.get('POLYRL_REPORT_FD')\n"
        "if v and fd:\n    os.write(int(fd), v.encode())\nos._exit(0)",
        # the tests' call ends the process
        "import sys\ndef add(a, b):\n    sys.exit(0)\n",
        "def add(a, b):\n    import os\n    os._exit(0)\n",
    ],
    ids=[
        "junk-on-fds",
        "patched-exec",
        "rewritten-tests",
        "env-nonce",
        "exit-in-call",
        "_exit-in-call",
    ],
)
def test_forging_the_report_fails_the_case(forgery: str):
    assert code_score(forgery, ADD_TESTS, FAST)["score"] == 0.0


def test_an_infinite_loop_times_out_per_case_within_a_bound():
    start = time.monotonic()
    result = code_score("while True:\n    pass\n", ADD_CASES, FAST)
    assert (result["score"], result["timeouts"]) == (0.0, 3)
    assert time.monotonic() - start < 2 * FAST.case_timeout_s + 2 + 2  # 3 cases, 2 at a time


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


def _processes_with(marker: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline:
            found.append(f"{pid}: {cmdline}")
    return found


def test_a_double_forked_daemon_dies_with_its_case():
    marker = f"4321.{os.getpid()}"
    daemon = (
        "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        f"        os.execv('/bin/sleep', ['sleep', '{marker}'])\n    os._exit(0)\n"
        "os.wait()\n"
    )
    assert code_score(daemon + HONEST, ADD_TESTS, FAST)["score"] == 1.0
    assert _processes_with(marker) == []


def test_settings_are_checked_by_the_plugin_and_come_with_the_schema():
    cfg = schema_config()
    assert check_config(cfg) == []
    cfg.reward_model.code.case_timeout_s = 0
    cfg.reward_model.code.score = "most"
    problems = check_config(cfg)
    assert len(problems) == 2
    assert "reward_model.code.score" in problems[0] and "fraction" in problems[0]
    assert "reward_model.code.case_timeout_s" in problems[1] and "> 0" in problems[1]


def test_the_old_import_path_works_with_a_deprecation_warning():
    with pytest.deprecated_call(match="import code_score from polyrl_reward_code.scorer"):
        from polyrl.rewards.code import code_score as old
    assert old is code_score
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        import polyrl.rewards.code  # noqa: F401 - importing the module alone warns nothing


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
