"""Which scoring path the Megatron engine takes for which keys: the fused log-probs need a packed
row (with the vocabulary split over TP ranks, the vocab-parallel fused path; only the one-rank
statistics are compiled); padded rows score the logits of this rank's vocabulary slice. (The
vocab-parallel math is checked on CPU in test_megatron_vocab_parallel.py; the paths' numbers in
the engine on the GPU: tests/test_engine_equivalence.py and test_megatron_cuda.py.)"""

from __future__ import annotations

import pytest

from polyrl_engine_megatron.scoring import ScoringPaths

# (use_remove_padding, use_fused_kernels, use_torch_compile, TP)
#   -> (packed, fused, vocab_split, compiled)
CASES = [
    ((True, True, True, 1), (True, True, False, True)),  # the defaults on one TP rank
    ((True, True, False, 1), (True, True, False, False)),
    ((True, True, True, 2), (True, True, True, False)),  # the vocabulary is split
    ((False, True, True, 1), (False, False, False, False)),  # padded rows
    ((False, True, True, 2), (False, False, True, False)),
    ((True, False, True, 1), (True, False, False, False)),  # fused kernels off
]


@pytest.mark.parametrize(("keys", "expected"), CASES)
def test_fused_log_probs_on_a_packed_row_compiled_with_the_whole_vocabulary(
    keys: tuple[bool, bool, bool, int], expected: tuple[bool, bool, bool, bool]
) -> None:
    remove_padding, fused_log_prob, torch_compile, tp = keys
    paths = ScoringPaths.choose(
        remove_padding=remove_padding,
        fused_log_prob=fused_log_prob,
        torch_compile=torch_compile,
        tp=tp,
    )
    assert (paths.packed, paths.fused, paths.vocab_split, paths.compiled) == expected
