"""Which dimensions the rollout's compiled functions are traced with as symbols.

Why: the decode step's per-layer functions and the sampling function are called with many row
counts in one run: the decode ladder's 256, 128, ... 8 slots, a continuous batch's refills, the
weight-sync probe's few rows. dynamo traces a function with the sizes of its first call and,
when a later call has other sizes, traces it again with those dimensions symbolic. That second
trace is work in the first step of every run (a full compile when cold, still a trace and a
cache load when warm). Marking the row dimension at the first call makes the first trace the
one every row count shares; the other dimensions (hidden size, heads, vocabulary) stay static,
so the generated kernels are those of the recompiled graph that served the smaller rows before.
"""

from __future__ import annotations

import torch


def rows_dynamic(*tensors: torch.Tensor) -> None:
    """Trace dimension 0 of each of ``tensors`` as a symbol if a compile happens now (no effect
    on eager calls or on graphs already compiled). One row stays specialised, as dynamo keeps
    sizes 0 and 1: a single-row call has a graph of its own."""
    for tensor in tensors:
        if tensor.shape[0] > 1:
            torch._dynamo.maybe_mark_dynamic(tensor, 0)
