"""The built-in scorers on concrete right, wrong and malformed responses."""

from __future__ import annotations

import json

import pytest

from polyrl.rewards.scorers import (
    default_compute_score,
    exact_match_score,
    extract_answer,
    gsm8k_extract,
    gsm8k_score,
    supported_data_sources,
    tiny_digits_score,
)


# ---- extraction -----------------------------------------------------------------------------
def test_extract_answer_prefers_last_tag_then_last_line():
    assert extract_answer("<answer>1</answer> then <answer> 2 </answer>") == "2"
    assert extract_answer("work\n\nThe result:\n  17  \n\n") == "17"
    assert extract_answer("") == ""


# ---- exact match ----------------------------------------------------------------------------
def test_exact_match_normalised_and_strict():
    assert exact_match_score("  Hello   World ", "hello world") == 1.0
    assert exact_match_score("Hello World", "hello world", normalise=False) == 0.0
    assert exact_match_score("reasoning <answer>Paris</answer>", "paris") == 1.0
    assert exact_match_score("London", "Paris") == 0.0
    assert exact_match_score("b", ["a", "b"]) == 1.0
    assert default_compute_score("exact_match", "YES", "yes") == 1.0
    assert default_compute_score("exact_match/strict", "YES", "yes") == 0.0
    assert default_compute_score("exact_match/strict", " yes\n", "yes") == 1.0


# ---- GSM8K ----------------------------------------------------------------------------------
def test_gsm8k_strict_takes_number_after_last_marker():
    text = "She has 3 + 4 = 7 apples.\n#### 7\nWait, #### 1,000"
    assert gsm8k_extract(text, "strict") == "1,000"
    assert gsm8k_score(text, "1000") == 1.0
    assert gsm8k_score(text, "7") == 0.0


def test_gsm8k_strict_needs_marker_flexible_takes_last_number():
    text = "So the total is 12 and then 18."
    assert gsm8k_extract(text, "strict") is None
    assert gsm8k_score(text, "18") == 0.0
    assert gsm8k_score(text, "18", method="flexible") == 1.0
    assert gsm8k_score("The answer is -3.50", "-3.5", method="flexible") == 1.0
    assert gsm8k_score("no numbers here", "3", method="flexible") == 0.0


def test_gsm8k_ground_truth_may_be_a_full_solution_and_numbers_compare_numerically():
    gt = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72"
    assert default_compute_score("openai/gsm8k", "blah #### 72", gt) == 1.0
    assert default_compute_score("gsm8k", "#### 72.0", "72") == 1.0
    assert default_compute_score("gsm8k", "#### $1,234", "1234") == 1.0
    assert default_compute_score("gsm8k", "#### 71", "72") == 0.0
    flexible = {"answer_extraction": "flexible"}
    assert default_compute_score("gsm8k", "it is 72", "72", flexible) == 1.0
    with pytest.raises(ValueError, match="strict' or 'flexible"):
        default_compute_score("gsm8k", "#### 72", "72", {"answer_extraction": "loose"})


# ---- math -----------------------------------------------------------------------------------
def test_math_verify_equivalence():
    assert default_compute_score("lighteval/MATH", r"so $\boxed{\frac{1}{2}}$", "0.5") == 1.0
    assert default_compute_score("math", r"The answer is $\boxed{3}$.", "3") == 1.0
    assert default_compute_score("DigitalLearningGmbH/MATH-lighteval", r"$\boxed{4}$", "3") == 0.0
    assert default_compute_score("math_dapo", "I do not know", r"\frac{2}{3}") == 0.0


# ---- reasoning-gym --------------------------------------------------------------------------
def _rg_entry(task: str, **config):
    import reasoning_gym

    return reasoning_gym.create_dataset(task, size=1, seed=3, **config)[0]


def test_reasoning_gym_uses_the_tasks_own_scorer_with_the_entry():
    entry = _rg_entry("chain_sum", min_terms=2, max_terms=2, min_digits=1, max_digits=1)
    answer = entry["answer"]
    extra = {"entry": json.dumps(entry)}
    source = "reasoning_gym/chain_sum"
    assert default_compute_score(source, f"<answer>{answer}</answer>", answer, extra) == 1.0
    # chain_sum's scorer compares decimals: "+05.0" equals "5".
    assert default_compute_score(source, f"work\n{int(answer):+d}.0", answer, extra) == 1.0
    assert default_compute_score(source, "<answer>not a number</answer>", answer, extra) == 0.0
    assert default_compute_score(source, "", answer, extra) == 0.0


def test_reasoning_gym_default_scorer_partial_credit_and_task_from_entry():
    # basic_arithmetic keeps reasoning-gym's default scorer: exact 1.0; containing the answer
    # len(answer) / len(response answer).
    entry = {"question": "Calculate 2 + 3.", "answer": "5", "metadata": {}}
    extra = {"entry": entry}
    source = "reasoning_gym/basic_arithmetic"
    assert default_compute_score(source, "<answer>5</answer>", "5", extra) == 1.0
    # "is 5" has 4 characters and contains "5": 1 / 4.
    assert default_compute_score(source, "<answer>is 5</answer>", "5", extra) == pytest.approx(0.25)
    assert default_compute_score(source, "<answer>6</answer>", "5", extra) == 0.0
    # A bare "reasoning_gym" source reads the task from extra_info["task"].
    task_extra = {"entry": entry, "task": "basic_arithmetic"}
    assert default_compute_score("reasoning_gym", "<answer>5</answer>", "5", task_extra) == 1.0


def test_reasoning_gym_errors_name_the_problem():
    with pytest.raises(ValueError, match="no task 'no_such_task'"):
        default_compute_score("reasoning_gym/no_such_task", "x", "1", {})
    with pytest.raises(ValueError, match="names no reasoning-gym task"):
        default_compute_score("reasoning_gym", "x", "1", {})


# ---- tiny task ------------------------------------------------------------------------------
def test_tiny_digits_partial_credit_by_hand():
    # "7a77" with target 7: hits 3, digits 3 -> (3 + 0) / 4
    assert tiny_digits_score("7a77", "7")["score"] == pytest.approx(0.75)
    # "12x4" with target 1: hits 1, other digits 2 -> (1 + 0.5 * 2) / 4 = 0.5
    result = tiny_digits_score("12x4", "1")
    assert result == pytest.approx({"score": 0.5, "digit_frac": 0.75, "target_frac": 0.25})
    assert tiny_digits_score("", "3")["score"] == 0.0
    assert default_compute_score("polyrl/tiny_digits", "abc", "3")["score"] == 0.0
    with pytest.raises(ValueError, match="one digit"):
        tiny_digits_score("1", "12")


# ---- dispatch -------------------------------------------------------------------------------
def test_unknown_data_source_lists_supported_and_custom_function():
    with pytest.raises(ValueError) as info:
        default_compute_score("my/unknown", "x", "y")
    text = str(info.value)
    assert "'my/unknown'" in text
    assert "custom_reward_function.path" in text
    for source in ("openai/gsm8k", "lighteval/MATH", "reasoning_gym/<task>", "exact_match"):
        assert source in text
        assert source in supported_data_sources()


def test_reasoning_gym_scorer_uses_the_task_config_of_the_rows():
    # decimal_arithmetic accepts answers within 10**-max_num_decimal_places of the truth:
    # 1.05 vs 1.00 is wrong at the default 3 places (tolerance 0.001), right at 1 (0.1).
    entry = {"question": "q", "answer": "1.00", "metadata": {}}
    source = "reasoning_gym/decimal_arithmetic"
    assert default_compute_score(source, "<answer>1.05</answer>", "1.00", {"entry": entry}) == 0.0
    one_place = json.dumps({"min_num_decimal_places": 1, "max_num_decimal_places": 1})
    extra = {"entry": entry, "task_config": one_place}
    assert default_compute_score(source, "<answer>1.05</answer>", "1.00", extra) == 1.0
    assert default_compute_score(source, "<answer>1.2</answer>", "1.00", extra) == 0.0


def test_a_run_preloads_only_the_libraries_of_its_data_sources():
    """Reward workers import the optional libraries before their first sample; a run whose data
    sources are known imports only theirs (each import takes seconds in every worker)."""
    import subprocess
    import sys

    from polyrl.rewards.scorers import OPTIONAL_MODULES, modules_for_sources

    assert modules_for_sources(["polyrl/tiny_digits", "openai/gsm8k"]) == ()
    assert modules_for_sources(["reasoning_gym/basic_arithmetic", "lighteval/MATH"]) == (
        "math_verify",
        "reasoning_gym",
    )
    assert set(modules_for_sources(["reasoning_gym/x"])) <= set(OPTIONAL_MODULES)
    probe = (
        "import sys; from polyrl.rewards._worker import ScorerRef; "
        "ScorerRef(preload={}).load(); print(sorted(m for m in ('math_verify', 'reasoning_gym') "
        "if m in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe.format("()")], capture_output=True, text=True, check=True
    )
    assert loaded.stdout.strip() == "[]"
