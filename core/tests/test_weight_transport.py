"""The weight transport between pools, piece by piece: buckets, the gloo channel, versions, the
probe, and failures joined into one line.

Channels here are real gloo process groups between threads of this process (the transport
never touches the default group, so threads can stand for processes); the end-to-end runs over
Ray are in ``tests/test_split_placement.py``.
"""

from __future__ import annotations

import threading

import pytest
import torch
from test_workers_placement import local_workers

from polyrl.batch import Batch
from polyrl.errors import PolyrlError
from polyrl.workers import transport
from polyrl.workers.buckets import ALIGN, pack_buckets, unpack_buckets
from polyrl.workers.placement import RoleWorkers
from polyrl.workers.roles import Role
from polyrl.workers.weight_sync import WeightSyncSettings, probe_prompt, run_together


def odd_tensors() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("fp32", torch.randn(3, 5, generator=g)),
        ("bool", torch.tensor([True, False, True])),
        ("scalar", torch.tensor(2.5, dtype=torch.float64)),
        ("empty", torch.zeros(0, 4, dtype=torch.bfloat16)),
        ("bf16", torch.randn(37, generator=g).to(torch.bfloat16)),
        ("int8", torch.arange(-5, 6, dtype=torch.int8)),
        ("fp16_t", torch.randn(6, 4, generator=g).to(torch.float16).t()),  # not contiguous
        ("complex", torch.randn(3, dtype=torch.complex64, generator=g)),
        ("big", torch.randn(200, generator=g)),  # 800 bytes: cut over several buckets
    ]


# ---- buckets -----------------------------------------------------------------------------------
@pytest.mark.parametrize("max_bytes", [ALIGN, 64, 1000, 2**20])
def test_pack_unpack_round_trip_is_exact_and_bounded(max_bytes: int) -> None:
    tensors = odd_tensors()
    buckets = list(pack_buckets(iter(tensors), max_bytes))
    assert all(b.buffer.numel() <= max_bytes for b in buckets)
    assert all(b.buffer.dtype == torch.uint8 for b in buckets)
    out = list(unpack_buckets(buckets))
    assert [name for name, _ in out] == [name for name, _ in tensors]
    for (_, want), (name, got) in zip(tensors, out):
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert torch.equal(got.view(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8))


def test_a_tensor_that_fits_a_bucket_is_never_cut() -> None:
    tensors = [("a", torch.ones(10)), ("b", torch.ones(10)), ("c", torch.ones(3))]
    buckets = list(pack_buckets(iter(tensors), 64))
    assert [[e.name for e in b.entries] for b in buckets] == [["a"], ["b", "c"]]
    assert all(e.start == 0 and e.length == e.nbytes for b in buckets for e in b.entries)


def test_bucket_stream_errors() -> None:
    with pytest.raises(ValueError, match="a bucket needs at least 16 bytes"):
        list(pack_buckets(iter([("a", torch.ones(1))]), 8))
    first = next(pack_buckets(iter([("a", torch.ones(100))]), 64))
    with pytest.raises(ValueError, match=r"ended inside the tensors \['a'\]"):
        list(unpack_buckets([first]))


# ---- the channel --------------------------------------------------------------------------------
def in_threads(*fns):
    """Run each function in a thread; their results, or the first error raised."""
    results, errors = [None] * len(fns), []

    def run(i, fn):
        try:
            results[i] = fn()
        except Exception as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, fn), daemon=True) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if errors:
        raise errors[0]
    return results


def channels(size: int, timeout_s: float = 10.0) -> list[transport.Channel]:
    store, port = transport.serve_store("127.0.0.1", timeout_s)

    def member(rank):
        root_store = store if rank == 0 else None
        return lambda: transport.Channel(
            "127.0.0.1", port, rank, size, "cpu", timeout_s, store=root_store
        )

    return in_threads(*(member(r) for r in range(size)))


@pytest.mark.timeout(60)
def test_channel_broadcasts_every_bucket_to_every_receiver() -> None:
    root, *receivers = channels(3)
    tensors = odd_tensors()

    def receive(channel):
        return lambda: list(unpack_buckets(transport.receive(channel, 7)))

    sent, *got = in_threads(
        lambda: transport.send(root, iter(tensors), 7, 64), *(receive(c) for c in receivers)
    )
    assert sent >= sum(t.numel() * t.element_size() for _, t in tensors)
    for out in got:
        assert [n for n, _ in out] == [n for n, _ in tensors]
        assert all(torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
                   for (_, a), (_, b) in zip(tensors, out))  # fmt: skip


@pytest.mark.timeout(60)
def test_a_receiver_refuses_another_version() -> None:
    root, receiver = channels(2, timeout_s=1.0)
    with pytest.raises(transport.WeightSyncError, match="expected version 2 but the trainer sent"):
        in_threads(
            lambda: list(unpack_buckets(transport.receive(receiver, 2))),
            lambda: transport.send(root, iter([("w", torch.ones(2))]), 3, 64),
        )


# ---- versions, the probe and failures through RoleWorkers ---------------------------------------
class Actor(Role):
    offset = 0.0

    def named_weights(self):
        yield "w", torch.ones(4)  # full tensors: the same on every rank

    def compute_log_prob(self, batch: Batch) -> Batch:
        return Batch({"log_probs": -batch["responses"].float() / 10 + self.offset})


class Rollout(Role):
    def update_weights(self, named_tensors) -> None:
        self.weights = dict(named_tensors)

    def generate(self, prompts: Batch, params) -> Batch:
        rows, new = len(prompts), params.max_new_tokens
        responses = torch.arange(new).repeat(rows, 1) + prompts["input_ids"][:, :1]
        return Batch(
            {
                "responses": responses,
                "response_mask": torch.ones_like(responses),
                "rollout_log_probs": -responses.float() / 10,
            }
        )


def role_workers(pools: dict[str, tuple[int, tuple[str, ...]]], **settings) -> RoleWorkers:
    classes = {"actor": Actor, "rollout": Rollout}
    return local_workers(pools, classes, weight_sync=WeightSyncSettings(**settings))


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("pools", "stale_sync"),
    [
        ({"global": (2, ("actor", "rollout"))}, ("sync_weights", "actor", "rollout", 3)),
        ({"global": (2, ("actor",)), "gen": (3, ("rollout",))}, ("receive_weights", "rollout", 3)),
    ],
    ids=["colocated", "split"],
)
def test_versions_and_probe_metrics(pools, stale_sync) -> None:
    workers = role_workers(pools, probe_tokens=3, bucket_bytes=64)
    for version in (1, 2, 3):
        metrics = workers.sync_weights("actor", "rollout")
        assert metrics["weight_sync/version"] == version
        assert metrics["weight_sync/probe_logprob_max_diff"] == 0.0
    receivers = workers.groups[workers.pool_of("rollout")].workers
    assert [w.weight_versions for w in receivers] == [{"rollout": 3}] * len(receivers)
    assert all(torch.equal(w.roles["rollout"].weights["w"], torch.ones(4)) for w in receivers)
    method, *args = stale_sync
    with pytest.raises(
        PolyrlError, match=r"version 3 for role 'rollout' .* not newer than .*\(3\)"
    ):
        getattr(receivers[0], method)(*args)


@pytest.mark.timeout(60)
def test_a_probe_beyond_tolerance_is_an_error() -> None:
    workers = role_workers({"global": (1, ("actor",)), "gen": (1, ("rollout",))}, probe_tokens=2)
    workers.groups["global"].workers[0].roles["actor"].offset = 7.5
    with pytest.raises(
        PolyrlError,
        match=r"v1 actor -> rollout: the rollout's log-probs of the probe differ from the "
        r"actor's by up to 7\.5 nats, more than .*probe_tolerance=5\.0",
    ):
        workers.sync_weights("actor", "rollout")


def test_probe_prompt_avoids_special_tokens() -> None:
    assert probe_prompt([]) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert probe_prompt([2, 5]) == [1, 3, 4, 6, 7, 8, 9, 10]


class Group:
    """Stands for a worker group whose call fails (or returns) as told."""

    def __init__(self, outcome):
        self.outcome = outcome

    def run(self, method, args, *, what, timeout_s):
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome


def test_run_together_joins_every_sides_failure() -> None:
    ok = Group(["done"])
    assert run_together([(ok, "a", [()]), (ok, "b", [()])], 1.0) == [["done"], ["done"]]
    calls = [
        (Group(PolyrlError("send failed")), "a", [()]),
        (Group(PolyrlError("stuck")), "b", [()]),
    ]
    with pytest.raises(PolyrlError, match=r"^send failed; stuck$"):
        run_together(calls, 1.0)
