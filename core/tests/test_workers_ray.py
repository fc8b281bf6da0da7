"""One real Ray pool: 2 CPU workers (real Worker processes in a gloo group) hosting a tiny role.

Checks that calls by role reach the right ranks, that a rank failing while its peer waits in
a collective surfaces at once, naming the rank (no hang), and that a stop signal arriving while
a collective call is being handed to the ranks reaches the driver only once every rank has it.
"""

import os
import signal
import sys
import time

import pytest
import torch

from polyrl.batch import Batch
from polyrl.workers.dispatch import Dispatch
from polyrl.workers.group import WorkerError
from polyrl.workers.roles import Role

ray = pytest.importorskip("ray")


class Probe(Role):
    def tag(self, batch: Batch) -> Batch:
        return Batch({"x": batch["x"] * 2, "rank": torch.full((len(batch),), self.ctx.rank)})

    def world(self) -> tuple[int, int]:
        import torch.distributed as dist

        return dist.get_rank(), dist.get_world_size()

    def barrier_then_count(self, _: int) -> int:
        import torch.distributed as dist

        dist.barrier()  # rank 0 alone in it would wait for rank 1 until the collective timeout
        self.passed = getattr(self, "passed", 0) + 1
        return self.passed

    def barriers_passed(self) -> int:
        return getattr(self, "passed", 0)

    def fail_on_rank_one(self) -> None:
        import torch.distributed as dist

        if self.ctx.rank == 1:
            raise RuntimeError("rank one broke")
        dist.barrier()  # waits for rank 1 until the collective timeout: a hang without care


class Stopped(BaseException):
    """What the test's SIGTERM handler raises (the CLI raises its own ``Terminated``)."""


class SignalOnSecondSend:
    """An argument that sends this process SIGTERM while it is pickled for the second rank,
    i.e. after rank 0 has its call and before rank 1 does; it arrives as 0."""

    sends = 0

    def __reduce__(self):
        SignalOnSecondSend.sends += 1
        if SignalOnSecondSend.sends == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return (int, ())


def _stop(signum, frame):
    raise Stopped


def check_a_stop_signal_mid_dispatch_reaches_every_rank_first(workers) -> None:
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        with pytest.raises(Stopped):
            workers.call(
                "probe", "barrier_then_count", SignalOnSecondSend(), dispatch=Dispatch.BROADCAST
            )
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert SignalOnSecondSend.sends == 2
    # both ranks got the call and passed the barrier together; had rank 1 missed it, rank 0
    # would still be waiting in the barrier and this call would time out behind it
    assert workers.call("probe", "barriers_passed", dispatch=Dispatch.BROADCAST, timeout_s=20) == [
        1,
        1,
    ]


@pytest.mark.timeout(90)
def test_ray_pool_calls_by_role_and_surfaces_a_failing_rank(monkeypatch, tmp_path):
    from polyrl.workers.placement import start_role_workers
    from polyrl.workers.worker_group import ensure_ray

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    started_ray = not ray.is_initialized()
    ensure_ray(num_cpus=1)  # fewer CPUs than workers: each reserves a fraction
    # The role class travels to the workers by value (this test module is not importable there).
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cfg = {
        "trainer": {
            "nnodes": 1,
            "n_gpus_per_node": 2,
            "device": "cpu",
            "collective_timeout_s": 60,
            "role_pools": {},
            "resource_pools": {},
            "default_local_dir": str(tmp_path),
        }
    }
    workers = start_role_workers(
        cfg,
        ("probe",),
        model_path="",
        total_training_steps=1,
        tokens={"pad_token_id": 0, "eos_token_ids": []},
        role_classes={"probe": Probe},
        ready_timeout_s=60,
        call_timeout_s=60,
    )
    try:
        assert workers.dp_size("probe") == 2
        out = workers.call("probe", "tag", Batch({"x": torch.arange(4)}))
        assert out["x"].tolist() == [0, 2, 4, 6]
        assert out["rank"].tolist() == [0, 0, 1, 1]
        assert workers.call("probe", "world", dispatch=Dispatch.BROADCAST) == [(0, 2), (1, 2)]
        check_a_stop_signal_mid_dispatch_reaches_every_rank_first(workers)
        start = time.monotonic()
        with pytest.raises(
            WorkerError, match=r"worker rank 1 of pool 'global' failed in 'probe.fail_on_rank_one'"
        ) as info:
            workers.call("probe", "fail_on_rank_one", dispatch=Dispatch.BROADCAST)
        assert time.monotonic() - start < 15
        assert "rank one broke" in str(info.value)
        assert "\n" not in str(info.value)  # one line; the traceback is in the run folder's log
        assert "rank one broke" in (tmp_path / "worker_errors.log").read_text()
    finally:
        start = time.monotonic()
        workers.shutdown()  # rank 0 is still in the barrier: killed, not waited for
        assert time.monotonic() - start < 15
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        if started_ray:
            ray.shutdown()
