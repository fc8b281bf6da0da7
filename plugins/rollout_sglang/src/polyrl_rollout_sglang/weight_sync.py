"""A weight sync into SGLang: the trainer's ``(hf_name, tensor)`` stream, cut into buckets of at
most ``update_weights_bucket_megabytes``, each bucket handed over as serialized handles to the
tensors (CUDA IPC: no copy through the host) and loaded by the engine's leader with
``Engine.update_weights_from_tensor``.

Why buckets: a request per tensor costs a round trip through every scheduler for each of the
hundreds of tensors of a model; one request for the whole model would hold every full
(gathered) tensor at once, e.g. 15 GB for a 7B model in bf16 beside the trainer's shards. A
bucket bounds what a worker holds at a time and keeps the requests few.

Why a verdict after every bucket: each worker of a tensor-parallel engine hands its own tensors,
on its own GPU, to its own shard, so all of them take part in every bucket. When one of them
cannot go on (a tensor of the wrong shape, a stream that fails or ends early) the others must not
wait for it forever: every round each worker reports ``(problem, handles)`` to the leader, which
loads the bucket or refuses it, and every worker acts on the one verdict the leader broadcasts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from polyrl.api import WeightStreamChecker, WeightSyncError
from polyrl_rollout_sglang.tensor_parallel import EngineGroup

# One tensor -> bytes another process turns back into the same tensor (a handle, not a copy).
Serializer = Callable[[torch.Tensor], bytes]
# The leader's loader of one bucket: (name, [handle of each worker of the engine, node order]).
BucketLoader = Callable[[list[tuple[str, list[bytes]]]], None]

MORE, DONE = "more", "done"


@dataclass
class SyncStats:
    """What this worker streamed in one sync."""

    tensors: int = 0
    bytes: int = 0


def weight_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive pairs of at most ``bucket_bytes`` together; a larger tensor travels alone."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def transpose_payloads(
    per_worker: Sequence[Sequence[tuple[str, bytes]]],
) -> list[tuple[str, list[bytes]]]:
    """Buckets of the engine's workers (node order) -> ``(name, [handle per worker])`` per
    tensor. Every worker must have streamed the same names in the same order."""
    names = [[name for name, _ in bucket] for bucket in per_worker]
    for node, other in enumerate(names[1:], start=1):
        if other != names[0]:
            raise WeightSyncError(
                f"the workers of one tensor-parallel engine streamed different tensors: "
                f"{names[0][:3]}... at node 0, {other[:3]}... at node {node}; every worker "
                f"must stream the same full model"
            )
    return [(name, [bucket[i][1] for bucket in per_worker]) for i, name in enumerate(names[0])]


def _checked(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    checker: WeightStreamChecker,
    stats: SyncStats,
) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in named_tensors:
        if hasattr(tensor, "full_tensor"):  # a sharded DTensor: gather it first
            tensor = tensor.full_tensor()
        checker.check(name, tensor)
        stats.tensors += 1
        stats.bytes += tensor.numel() * tensor.element_size()
        yield name, tensor.detach()


def _problem(exc: Exception) -> str:
    return str(exc) if isinstance(exc, WeightSyncError) else f"{type(exc).__name__}: {exc}"


def _leader_verdict(reports: Sequence[tuple[str | None, Any]], load: BucketLoader) -> str:
    """MORE (the bucket is loaded), DONE (every stream ended) or the problem to raise."""
    several = len(reports) > 1
    for node, (problem, _) in enumerate(reports):
        if problem:
            return f"worker {node} of the engine: {problem}" if several else problem
    payloads = [payload for _, payload in reports]
    ended = [payload is None for payload in payloads]
    if all(ended):
        return DONE
    if any(ended):
        return (
            "the workers of one tensor-parallel engine streamed different numbers of tensors; "
            "every worker must stream the same full model"
        )
    try:
        load(transpose_payloads(payloads))
    except WeightSyncError as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - becomes the verdict every worker raises
        return f"SGLang failed to load the weights: {_problem(exc)}"
    return MORE


def sync_weights(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    *,
    group: EngineGroup,
    checker: WeightStreamChecker,
    serialize: Serializer,
    load: BucketLoader | None,
    bucket_bytes: int,
) -> SyncStats:
    """Stream ``named_tensors`` into the engine, bucket by bucket. Every worker of the engine
    calls this with its own stream; ``load`` is the leader's (None elsewhere). Raises
    :class:`~polyrl.rollout_layout.WeightSyncError` on every worker when any of them fails;
    buckets loaded before the failure stay loaded."""
    stats = SyncStats()
    buckets = weight_buckets(_checked(named_tensors, checker, stats), bucket_bytes)
    while True:
        try:
            bucket = next(buckets, None)
            handles = None if bucket is None else [(n, serialize(t)) for n, t in bucket]
            report: tuple[str | None, Any] = (None, handles)
        except Exception as exc:  # noqa: BLE001 - reported to the leader, raised by all below
            report = (_problem(exc), None)
        reports = group.gather(report)
        verdict = None
        if group.placement.is_leader:
            assert reports is not None and load is not None
            verdict = _leader_verdict(reports, load)
        verdict = group.broadcast(verdict)
        if verdict == DONE:
            return stats
        if verdict != MORE:
            raise WeightSyncError(verdict)
