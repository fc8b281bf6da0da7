"""Multi-node placement without a cluster: the bundles a pool asks Ray for, the checks that turn
a missing cluster or missing nodes into one line, and the line naming the workers' nodes. The
real two-node run is tests/test_multi_node.py."""

from __future__ import annotations

import pytest

from polyrl.cli import main
from polyrl.config import load_config
from polyrl.errors import PolyrlError
from polyrl.workers.nodes import (
    NodePlan,
    WorkerNode,
    check_nodes_available,
    describe_nodes,
    placed_nodes,
    plan_nodes,
    require_cluster_to_join,
)

CPU_NODE = {"NodeID": "a" * 56, "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 4.0}}
GPU_NODE = {
    "NodeID": "b" * 56,
    "NodeManagerAddress": "10.0.0.2",
    "Resources": {"CPU": 8.0, "GPU": 2.0},
}


def test_one_node_keeps_a_bundle_per_worker() -> None:
    plan = plan_nodes(3, 1, {"CPU": 0.5})
    assert plan == NodePlan([{"CPU": 0.5}] * 3, "PACK", [0, 1, 2], 1)
    assert plan.describe() == "3 x {'CPU': 0.5}"


def test_several_nodes_get_one_bundle_each_with_consecutive_ranks() -> None:
    plan = plan_nodes(4, 2, {"CPU": 1.0, "GPU": 1})
    assert plan.bundles == [{"CPU": 2.0, "GPU": 2}] * 2
    assert plan.strategy == "STRICT_SPREAD"
    assert plan.bundle_of_rank == [0, 0, 1, 1]
    assert plan.describe() == "2 nodes x {'CPU': 2.0, 'GPU': 2} each (STRICT_SPREAD)"


def test_workers_that_do_not_divide_over_the_nodes_are_refused() -> None:
    with pytest.raises(PolyrlError, match="3 workers cannot be spread evenly over 2 node"):
        plan_nodes(3, 2, {"CPU": 1.0})


def test_too_few_nodes_able_to_hold_a_share_is_one_line() -> None:
    plan = plan_nodes(4, 2, {"CPU": 1.0, "GPU": 1})
    check_nodes_available(plan, "global", [GPU_NODE, {**GPU_NODE, "NodeID": "c" * 56}])
    with pytest.raises(PolyrlError) as caught:
        check_nodes_available(plan, "global", [CPU_NODE, GPU_NODE])
    assert str(caught.value).startswith(
        "pool 'global' needs 2 Ray nodes with {'CPU': 2.0, 'GPU': 2} each, but the cluster has "
        "2 node(s), 1 of them with that much: start Ray on more nodes"
    )
    check_nodes_available(plan_nodes(2, 1, {"GPU": 1}), "global", [])  # one node: Ray decides


def test_each_rank_is_on_its_bundles_node_and_the_line_names_them() -> None:
    plan = plan_nodes(4, 2, {"CPU": 1.0})
    nodes = placed_nodes(plan, {0: "b" * 56, 1: "a" * 56}, [CPU_NODE, GPU_NODE])
    assert nodes == [WorkerNode("b" * 56, "10.0.0.2")] * 2 + [WorkerNode("a" * 56, "10.0.0.1")] * 2
    assert describe_nodes("global", nodes) == (
        "polyrl: pool 'global': 4 worker(s) on 2 node(s): 10.0.0.2 (node bbbbbbbb) ranks 0,1; "
        "10.0.0.1 (node aaaaaaaa) ranks 2,3"
    )


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["trainer.nnodes=2"], "trainer"),
        (
            [
                "actor_rollout_ref.hybrid_engine=false",
                "actor_rollout_ref.rollout.nnodes=2",
                "actor_rollout_ref.rollout.n_gpus_per_node=1",
                "trainer.n_gpus_per_node=1",
            ],
            "actor_rollout_ref.rollout",
        ),
    ],
)
def test_several_nodes_need_a_cluster_to_join(
    overrides: list[str], key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cfg = load_config(["recipe=tiny", *overrides])
    with pytest.raises(PolyrlError, match=rf"^{key}.nnodes=2 needs a Ray cluster of 2 nodes"):
        require_cluster_to_join(cfg)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    require_cluster_to_join(cfg)
    monkeypatch.setenv("RAY_ADDRESS", "local")
    with pytest.raises(PolyrlError, match="RAY_ADDRESS is not set"):
        require_cluster_to_join(cfg)
    require_cluster_to_join(
        load_config(["recipe=tiny", *overrides, "+trainer.ray_init.address=auto"])
    )


def test_train_with_two_nodes_and_no_cluster_is_one_line_before_ray(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert main(["train", "recipe=tiny", "trainer.nnodes=2", "trainer.n_gpus_per_node=1"]) == 2
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("error: ")] == [
        "error: trainer.nnodes=2 needs a Ray cluster of 2 nodes, but RAY_ADDRESS is not set "
        "(polyrl would start a one-node cluster on this machine): run `ray start --head` on one "
        "node and `ray start --address=<head>:6379` on the others, then set "
        "RAY_ADDRESS=<head>:6379 (or set trainer.nnodes=1)"
    ]
    assert "Started a local Ray instance" not in err
