"""The Ray-free worker group: failure surfacing, output order, dispatch over a TP-style mesh."""

import threading
import time

import pytest
import torch

from polyrl.batch import Batch
from polyrl.workers.dispatch import Dispatch
from polyrl.workers.group import WorkerError
from polyrl.workers.local import LocalWorkerGroup
from polyrl.workers.mesh import DataParallelRank


class Probe:
    def __init__(self, rank: int, world_size: int, release: threading.Event | None = None):
        self.rank, self.world_size = rank, world_size
        self.release = release or threading.Event()
        self.shut = False

    def rank_after(self, delays: list[float]) -> int:
        time.sleep(delays[self.rank])  # later ranks finish first: order must still hold
        return self.rank

    def fail_on(self, failing: int) -> int:
        if self.rank == failing:
            raise RuntimeError(f"boom on {self.rank}")
        self.release.wait(30)  # as if stuck in a collective waiting for the failed rank
        return self.rank

    def tag(self, batch: Batch) -> Batch:
        return Batch({"x": batch["x"], "by": torch.full((len(batch),), self.rank)})

    def shutdown(self) -> None:
        self.shut = True


@pytest.mark.timeout(10)
def test_failing_rank_surfaces_at_once_while_another_blocks():
    release = threading.Event()
    group = LocalWorkerGroup(Probe, world_size=3, init_kwargs={"release": release})
    start = time.monotonic()
    with pytest.raises(
        WorkerError, match=r"worker rank 2 of pool 'local' failed in 'fail_on'"
    ) as info:
        group.call("fail_on", 2)
    assert time.monotonic() - start < 5
    assert "RuntimeError: boom on 2" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)
    release.set()


@pytest.mark.timeout(10)
def test_timeout_names_the_pending_ranks():
    release = threading.Event()
    group = LocalWorkerGroup(Probe, world_size=3, init_kwargs={"release": release}, name="p")
    with pytest.raises(
        WorkerError, match=r"'fail_on' in pool 'p' did not finish within 0.3 s on ranks \[0, 1, 2\]"
    ):
        group.call("fail_on", 99, timeout_s=0.3)
    release.set()


@pytest.mark.timeout(10)
def test_outputs_come_back_in_rank_order():
    group = LocalWorkerGroup(Probe, world_size=4)
    assert group.call("rank_after", [0.3, 0.2, 0.1, 0.0]) == [0, 1, 2, 3]
    assert group.call("rank_after", [0.0] * 4, dispatch=Dispatch.RANK_ZERO) == 0


@pytest.mark.timeout(10)
def test_dp_split_over_a_tensor_parallel_mesh():
    group = LocalWorkerGroup(Probe, world_size=4)
    tp2 = [DataParallelRank(r // 2, 2, r % 2 == 1) for r in range(4)]  # the 2nd peer returns
    out = group.call("tag", Batch({"x": torch.arange(6)}), dispatch=Dispatch.DP_SPLIT, mesh=tp2)
    assert out["x"].tolist() == [0, 1, 2, 3, 4, 5]
    assert out["by"].tolist() == [1, 1, 1, 3, 3, 3]


@pytest.mark.timeout(10)
def test_start_failure_names_the_rank_and_shutdown_calls_workers():
    class Fragile(Probe):
        def __init__(self, rank, world_size):
            if rank == 1:
                raise ValueError("no device")
            super().__init__(rank, world_size)

    with pytest.raises(WorkerError, match=r"worker rank 1 of pool 'local' failed in 'start'"):
        LocalWorkerGroup(Fragile, world_size=2)
    group = LocalWorkerGroup(Probe, world_size=2)
    workers = list(group.workers)
    group.shutdown()
    assert all(w.shut for w in workers)
    assert group.workers == []


class Stepper:
    """A step that outlives the caller's wait, as when a signal interrupts the driver."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.events: list[str] = []

    def step(self) -> None:
        time.sleep(0.5)
        self.events.append("step done")

    def shutdown(self) -> None:
        self.events.append("shutdown")


def test_shutdown_waits_for_an_interrupted_call_to_end_first():
    """Leaving the process group under a running step aborted the interpreter at exit (a
    SIGTERM mid-step of an in-process run, under load)."""
    group = LocalWorkerGroup(Stepper, world_size=1)
    worker = group.workers[0]
    with pytest.raises(WorkerError, match="did not finish"):
        group.run("step", [()], timeout_s=0.05)  # the caller stops waiting; the step runs on
    group.shutdown(timeout_s=5)
    assert worker.events == ["step done", "shutdown"]
