"""The per-token distillation signal against hand-derived values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from polyrl_algo_distill.kl_signal import (
    distill_advantages,
    mix_teacher_log_probs,
    reverse_kl,
    signal_metrics,
)

# Two responses of 3 tokens; the second has one padding token at the end.
STUDENT = torch.tensor([[-1.0, -2.0, -0.5], [-0.25, -3.0, -7.0]])
TEACHER = torch.tensor([[-0.5, -3.0, -0.5], [-1.25, -1.0, -9.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_reverse_kl_is_student_minus_teacher_on_real_tokens_only():
    # row 0: -1+0.5, -2+3, -0.5+0.5; row 1: -0.25+1.25, -3+1, padding -> 0
    expected = torch.tensor([[-0.5, 1.0, 0.0], [1.0, -2.0, 0.0]])
    assert torch.equal(reverse_kl(STUDENT, TEACHER, MASK), expected)


def test_advantage_is_minus_coef_times_the_kl():
    adv = distill_advantages(STUDENT, TEACHER, MASK, coef=2.0)
    assert torch.equal(adv, torch.tensor([[1.0, -2.0, 0.0], [-2.0, 4.0, 0.0]]))


def test_padding_gets_no_advantage_whatever_its_log_probs():
    student = STUDENT.clone()
    student[1, 2] = 123.0  # garbage on the padding position
    task = torch.full_like(STUDENT, 10.0)
    adv = distill_advantages(student, TEACHER, MASK, 1.0, task, task_reward_weight=0.5)
    assert adv[1, 2] == 0.0


def test_a_task_advantage_is_added_with_its_weight():
    # GRPO-like task advantages: one value per row, spread over its real tokens
    task = torch.tensor([[0.7071, 0.7071, 0.7071], [-0.7071, -0.7071, 0.0]])
    adv = distill_advantages(STUDENT, TEACHER, MASK, 1.0, task, task_reward_weight=2.0)
    # -k + 2 * task: row 0: 0.5+1.4142, -1+1.4142, 0+1.4142; row 1: -1-1.4142, 2-1.4142, 0
    expected = torch.tensor([[1.9142, 0.4142, 1.4142], [-2.4142, 0.5858, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-6)


def test_a_task_weight_without_task_advantages_is_an_error():
    with pytest.raises(ValueError, match="no task advantages"):
        distill_advantages(STUDENT, TEACHER, MASK, 1.0, None, task_reward_weight=1.0)


def test_metrics_average_real_tokens_and_sum_per_response():
    m = signal_metrics(STUDENT, TEACHER, MASK)
    # k over real tokens: -0.5, 1, 0, 1, -2 -> mean -0.1; per response: 0.5 and -1 -> mean -0.25
    assert m["distill/reverse_kl/mean"] == pytest.approx(-0.1)
    assert m["distill/reverse_kl/seq_sum_mean"] == pytest.approx(-0.25)
    assert m["distill/student_log_prob/mean"] == pytest.approx((-3.5 - 3.25) / 5)
    assert m["distill/teacher_log_prob/mean"] == pytest.approx((-4.0 - 2.25) / 5)


A = torch.tensor([[-1.0, -2.0], [-3.0, -4.0], [-5.0, -6.0]])
B = torch.tensor([[-3.0, -4.0], [-1.0, -2.0], [-9.0, -10.0]])


def test_teachers_without_data_sources_are_mixed_by_weight():
    # weights 1 and 3 -> 0.25 A + 0.75 B
    mixed = mix_teacher_log_probs([A, B], [1.0, 3.0], [None, None], None)
    expected = torch.tensor([[-2.5, -3.5], [-1.5, -2.5], [-8.0, -9.0]])
    assert torch.equal(mixed, expected)


def test_a_row_of_a_teachers_data_source_takes_that_teacher_alone():
    rows = np.array(["math", "code", "chat"], dtype=object)
    # A is the math teacher (weight 0: not in the mix); B is for code and the mix (weight 1)
    mixed = mix_teacher_log_probs([A, B], [0.0, 1.0], ["math", "code"], rows)
    assert torch.equal(mixed[0], A[0])  # math -> A
    assert torch.equal(mixed[1], B[1])  # code -> B
    assert torch.equal(mixed[2], B[2])  # no match -> the mix, which is B alone


def test_unmatched_rows_mix_all_teachers_routed_ones_included():
    rows = np.array(["math", "other", "other"], dtype=object)
    mixed = mix_teacher_log_probs([A, B], [1.0, 1.0], ["math", None], rows)
    assert torch.equal(mixed[0], A[0])
    assert torch.equal(mixed[1:], (A[1:] + B[1:]) / 2)


def test_zero_total_weight_is_refused():
    with pytest.raises(ValueError, match="sum to 0"):
        mix_teacher_log_probs([A, B], [0.0, 0.0], [None, None], None)
