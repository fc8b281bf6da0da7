"""Dispatch over data-parallel meshes: pure functions, hand-made meshes."""

import pytest
import torch

from polyrl.batch import Batch
from polyrl.workers.dispatch import Dispatch, gather_outputs, split_args
from polyrl.workers.mesh import (
    DataParallelRank,
    MeshError,
    check_mesh,
    tensor_parallel_mesh,
    trivial_mesh,
)

# 4 workers, tensor parallel 2: ranks 0,1 -> dp 0 (rank 0 returns); 2,3 -> dp 1 (rank 2 returns)
TP2 = (
    DataParallelRank(0, 2, True),
    DataParallelRank(0, 2, False),
    DataParallelRank(1, 2, True),
    DataParallelRank(1, 2, False),
)


def rows(n: int) -> Batch:
    return Batch({"x": torch.arange(n)}, {"tag": [f"r{i}" for i in range(n)]})


def test_trivial_mesh_every_worker_its_own_dp_rank():
    mesh = trivial_mesh(3)
    assert [p.dp_rank for p in mesh] == [0, 1, 2]
    assert check_mesh(mesh) == 3
    parts = split_args(Dispatch.DP_SPLIT, mesh, (rows(6), "param"))
    assert [p[0]["x"].tolist() for p in parts] == [[0, 1], [2, 3], [4, 5]]
    assert all(p[1] == "param" for p in parts)


def test_dp_split_gives_tp_peers_the_same_rows():
    parts = split_args(Dispatch.DP_SPLIT, TP2, (rows(4),))
    assert [p[0]["x"].tolist() for p in parts] == [[0, 1], [0, 1], [2, 3], [2, 3]]


def test_gather_takes_one_output_per_dp_rank_in_dp_order():
    outputs = [
        Batch({"x": torch.tensor([0, 1])}),
        Batch({"x": torch.tensor([-1, -1])}),  # TP peer: not gathered
        Batch({"x": torch.tensor([2, 3])}),
        None,  # a peer that returns nothing
    ]
    assert gather_outputs(Dispatch.DP_SPLIT, TP2, outputs)["x"].tolist() == [0, 1, 2, 3]


def test_gather_orders_by_dp_rank_not_worker_rank():
    mesh = (DataParallelRank(1, 2, True), DataParallelRank(0, 2, True))
    parts = split_args(Dispatch.DP_SPLIT, mesh, (rows(4),))
    assert [p[0]["x"].tolist() for p in parts] == [[2, 3], [0, 1]]
    out = gather_outputs(Dispatch.DP_SPLIT, mesh, [p[0] for p in parts])
    assert out["x"].tolist() == [0, 1, 2, 3]
    assert list(out["tag"]) == ["r0", "r1", "r2", "r3"]


def test_gather_non_batch_outputs_one_per_dp_rank():
    metrics = [{"loss": 1.0}, {"loss": 9.0}, {"loss": 2.0}, {"loss": 9.0}]
    assert gather_outputs(Dispatch.DP_SPLIT, TP2, metrics) == [{"loss": 1.0}, {"loss": 2.0}]


def test_gather_pads_token_ids_with_the_given_value():
    outputs = [
        Batch({"input_ids": torch.tensor([[5, 6]])}),
        Batch({"input_ids": torch.tensor([[7]])}),
    ]
    out = gather_outputs(Dispatch.DP_SPLIT, trivial_mesh(2), outputs, {"input_ids": 0})
    assert out["input_ids"].tolist() == [[5, 6], [7, 0]]
    out = gather_outputs(Dispatch.DP_SPLIT, trivial_mesh(2), outputs, {"input_ids": 42})
    assert out["input_ids"].tolist() == [[5, 6], [7, 42]]


def test_broadcast_and_rank_zero():
    args = (rows(2), 7)
    per = split_args(Dispatch.BROADCAST, TP2, args)
    assert len(per) == 4 and all(p is args for p in per)
    assert split_args(Dispatch.RANK_ZERO, TP2, args) == [args] * 4
    assert gather_outputs(Dispatch.BROADCAST, TP2, [0, 1, 2, 3]) == [0, 1, 2, 3]
    assert gather_outputs(Dispatch.RANK_ZERO, TP2, ["a", "b", "c", "d"]) == "a"


def test_dp_split_needs_a_batch_and_divisible_rows():
    with pytest.raises(TypeError, match="needs a Batch"):
        split_args(Dispatch.DP_SPLIT, TP2, ())
    with pytest.raises(TypeError, match="got dict"):
        split_args(Dispatch.DP_SPLIT, TP2, ({"x": 1},))
    with pytest.raises(ValueError, match="multiple of 2"):
        split_args(Dispatch.DP_SPLIT, TP2, (rows(3),))
    with pytest.raises(ValueError, match="3 outputs for a mesh of 4"):
        gather_outputs(Dispatch.BROADCAST, TP2, [1, 2, 3])


@pytest.mark.parametrize(
    ("mesh", "message"),
    [
        ((), "has no workers"),
        ((DataParallelRank(0, 2), DataParallelRank(1, 3)), "disagree on the data-parallel size"),
        ((DataParallelRank(0, 2), DataParallelRank(0, 2, False)), "no worker for dp rank 1"),
        ((DataParallelRank(0, 1), DataParallelRank(0, 1)), r"has 2 workers returning output"),
        ((DataParallelRank(0, 1, False),), r"has 0 workers returning output"),
        ((DataParallelRank(0, 1), DataParallelRank(5, 1, False)), "dp_rank of 5 outside 0..0"),
    ],
)
def test_invalid_meshes_are_refused(mesh, message):
    with pytest.raises(MeshError, match=message):
        check_mesh(mesh, "actor")


def test_tensor_parallel_groups_form_one_dp_rank_each():
    mesh = tuple(tensor_parallel_mesh(rank, 4, 2) for rank in range(4))
    assert mesh == (
        DataParallelRank(0, 2, True),
        DataParallelRank(0, 2, False),
        DataParallelRank(1, 2, True),
        DataParallelRank(1, 2, False),
    )
    assert check_mesh(mesh) == 2
    rows = split_args(Dispatch.DP_SPLIT, mesh, (Batch({"x": torch.arange(4)}),))
    assert [r[0]["x"].tolist() for r in rows] == [[0, 1], [0, 1], [2, 3], [2, 3]]


def test_a_model_parallel_size_that_does_not_divide_the_workers_is_refused():
    with pytest.raises(MeshError, match="must divide the number of workers"):
        tensor_parallel_mesh(0, 3, 2)
