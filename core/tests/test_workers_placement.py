"""Pools from the config (pure), and the driver's RoleWorkers handle over Ray-free groups of real
Worker objects hosting tiny roles (no models, no torch.distributed)."""

import os

import pytest
import torch
from omegaconf import OmegaConf

from polyrl.batch import Batch
from polyrl.errors import ConfigError, PolyrlError
from polyrl.workers.dispatch import Dispatch
from polyrl.workers.group import WorkerError
from polyrl.workers.local import LocalWorkerGroup
from polyrl.workers.mesh import DataParallelRank, MeshError
from polyrl.workers.placement import PoolPlan, RoleWorkers, plan_pools
from polyrl.workers.roles import Role
from polyrl.workers.worker import RoleError, Worker, resolve_role_class


def trainer_cfg(nnodes=1, gpus=2, role_pools=None, resource_pools=None):
    return OmegaConf.create(
        {
            "trainer": {
                "nnodes": nnodes,
                "n_gpus_per_node": gpus,
                "device": "cpu",
                "collective_timeout_s": 30,
                "role_pools": role_pools or {},
                "resource_pools": resource_pools or {},
            }
        }
    )


# ---- plan_pools ----------------------------------------------------------------------------------
def test_every_role_in_the_global_pool_by_default():
    plan = plan_pools(trainer_cfg(nnodes=2, gpus=4), ("rollout", "actor", "ref", "actor"))
    assert plan == {"global": PoolPlan(8, ("rollout", "actor", "ref"))}
    size, roles = plan["global"]
    assert (size, roles) == (8, ("rollout", "actor", "ref"))


def test_roles_moved_to_named_pools():
    cfg = trainer_cfg(
        role_pools={"ref": "aux", "critic": "aux", "unused": "elsewhere"},
        resource_pools={"aux": 1, "idle": 3},
    )
    plan = plan_pools(cfg, ("actor", "rollout", "ref", "critic"))
    assert plan == {
        "global": PoolPlan(2, ("actor", "rollout")),
        "aux": PoolPlan(1, ("ref", "critic")),
    }
    # all roles moved: no global pool
    plan = plan_pools(
        trainer_cfg(role_pools={"actor": "aux"}, resource_pools={"aux": 2}), ["actor"]
    )
    assert plan == {"aux": PoolPlan(2, ("actor",))}
    assert plan_pools(trainer_cfg(), ()) == {}


def test_a_pool_without_a_size_is_a_config_error():
    cfg = trainer_cfg(role_pools={"ref": "aux"}, resource_pools={"other": 1})
    with pytest.raises(
        ConfigError, match=r"role\(s\) \['ref'\] in the pool 'aux'.*sizes \['other'\]"
    ):
        plan_pools(cfg, ("actor", "ref"))


@pytest.mark.parametrize("size", [0, -1, "two"])
def test_a_pool_needs_at_least_one_worker(size):
    cfg = trainer_cfg(role_pools={"ref": "aux"}, resource_pools={"aux": size})
    with pytest.raises(ConfigError, match=r"pool 'aux' \(roles \['ref'\]\)"):
        plan_pools(cfg, ("ref",))
    with pytest.raises(ConfigError, match="pool 'global'"):
        plan_pools(trainer_cfg(gpus=0), ("actor",))


def test_global_size_comes_from_nnodes_and_gpus_only():
    with pytest.raises(ConfigError, match=r"resource_pools\.global: the 'global' pool's size"):
        plan_pools(trainer_cfg(resource_pools={"global": 2}), ("actor",))


# ---- tiny roles ----------------------------------------------------------------------------------
class Source(Role):
    checkpointed = True

    def tag(self, batch: Batch) -> Batch:
        return Batch({"x": batch["x"] * 10, "rank": torch.full((len(batch),), self.ctx.rank)})

    def metrics(self, batch: Batch) -> dict[str, float]:
        return {"rows": float(len(batch)), "rank": float(self.ctx.rank)}

    def named_weights(self):
        yield "w", torch.full((4,), float(self.ctx.rank))
        yield "b", torch.zeros(2, dtype=torch.float64)

    def save_checkpoint(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, f"rank{self.ctx.rank}"), "w") as f:
            f.write(self.ctx.role)

    def load_checkpoint(self, path: str) -> None:
        self.loaded_from = path

    def export_hf(self, path: str) -> None:
        if self.ctx.rank == 0:
            os.makedirs(path, exist_ok=True)

    def _private(self) -> None: ...


class Sink(Role):
    def update_weights(self, named_tensors) -> None:
        self.received = [(name, tensor.sum().item()) for name, tensor in named_tensors]

    def received_weights(self):
        return getattr(self, "received", None)


class TensorParallel(Role):
    """Two workers per data-parallel rank; the first of each pair returns."""

    def data_parallel_rank(self) -> DataParallelRank:
        return DataParallelRank(
            self.ctx.rank // 2, self.ctx.world_size // 2, self.ctx.rank % 2 == 0
        )

    def tag(self, batch: Batch) -> Batch:
        return Batch({"x": batch["x"], "rank": torch.full((len(batch),), self.ctx.rank)})


class BadMesh(Role):
    def data_parallel_rank(self) -> DataParallelRank:
        return DataParallelRank(0, 1, True)


CLASSES = {"actor": Source, "rollout": Sink, "tp": TensorParallel, "bad": BadMesh}


def local_workers(
    pools: dict[str, tuple[int, tuple[str, ...]]], classes: dict | None = None, **kwargs
) -> RoleWorkers:
    """In-process workers of ``pools`` ({pool: (size, roles)}) hosting ``classes`` (default: this
    module's test roles); ``kwargs`` go to :class:`RoleWorkers`."""
    groups = {
        pool: LocalWorkerGroup(
            Worker,
            world_size=size,
            name=pool,
            init_kwargs={
                "cfg": trainer_cfg(),
                "roles": roles,
                "role_classes": classes or CLASSES,
                "pool": pool,
                "tokens": {"pad_token_id": 7},
            },
        )
        for pool, (size, roles) in pools.items()
    }
    role_pools = {role: pool for pool, (_, roles) in pools.items() for role in roles}
    return RoleWorkers(groups, role_pools, **kwargs)


@pytest.mark.timeout(10)
def test_calls_by_role_dispatch_over_each_roles_mesh():
    workers = local_workers({"global": (4, ("actor", "rollout", "tp"))})
    assert workers.roles == ("actor", "rollout", "tp")
    assert workers.dp_size("actor") == 4 and workers.dp_size("tp") == 2
    out = workers.call("actor", "tag", Batch({"x": torch.arange(8)}))
    assert out["x"].tolist() == [0, 10, 20, 30, 40, 50, 60, 70]
    assert out["rank"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    out = workers.call("tp", "tag", Batch({"x": torch.arange(4)}), dispatch=Dispatch.DP_SPLIT)
    assert out["rank"].tolist() == [0, 0, 2, 2]
    per_dp = workers.call("actor", "metrics", Batch({"x": torch.arange(8)}))
    assert per_dp == [{"rows": 2.0, "rank": float(r)} for r in range(4)]
    assert workers.call("actor", "data_parallel_rank", dispatch=Dispatch.RANK_ZERO) == (
        DataParallelRank(0, 4, True)
    )


@pytest.mark.timeout(10)
def test_unknown_roles_and_methods_are_named():
    workers = local_workers({"global": (2, ("actor",))})
    with pytest.raises(
        PolyrlError, match=r"no worker hosts the role 'ref'; the roles started are \['actor'\]"
    ):
        workers.call("ref", "compute_log_prob", Batch({"x": torch.arange(2)}))
    with pytest.raises(WorkerError, match=r"has no method 'nope'; its methods: \[.*'tag'"):
        workers.call("actor", "nope", dispatch=Dispatch.BROADCAST)
    with pytest.raises(WorkerError, match="has no method '_private'"):
        workers.call("actor", "_private", dispatch=Dispatch.BROADCAST)


@pytest.mark.timeout(10)
def test_sync_weights_between_colocated_roles():
    workers = local_workers({"global": (2, ("actor", "rollout"))})
    result = workers.sync_weights("actor", "rollout")
    assert result["bytes"] == 4 * 4 + 2 * 8
    assert result["seconds"] >= 0
    got = workers.call("rollout", "received_weights", dispatch=Dispatch.BROADCAST)
    assert got == [[("w", 0.0), ("b", 0.0)], [("w", 4.0), ("b", 0.0)]]


@pytest.mark.timeout(20)
def test_sync_weights_across_pools_broadcasts_the_senders_rank_zero():
    """A real gloo channel between two pools: every rollout worker gets actor rank 0's weights
    (the gathered full tensors), versioned."""
    workers = local_workers({"global": (2, ("actor",)), "gen": (2, ("rollout",))})
    for version in (1, 2):
        result = workers.sync_weights("actor", "rollout")
        assert result["weight_sync/version"] == version
        assert result["bytes"] == 4 * 4 + 2 * 8
    got = workers.call("rollout", "received_weights", dispatch=Dispatch.BROADCAST)
    assert got == [[("w", 0.0), ("b", 0.0)]] * 2
    versions = [w.weight_versions for w in workers.groups["gen"].workers]
    assert versions == [{"rollout": 2}] * 2


@pytest.mark.timeout(10)
def test_checkpoint_per_role_folder_and_export(tmp_path):
    workers = local_workers({"global": (2, ("actor", "rollout")), "side": (2, ("tp",))})
    assert workers.save_checkpoint(str(tmp_path / "ckpt")) == ["actor"]
    assert sorted(os.listdir(tmp_path / "ckpt" / "actor")) == ["rank0", "rank1"]
    assert workers.load_checkpoint(str(tmp_path / "ckpt")) == ["actor"]
    # loading re-synced the colocated rollout from the actor
    got = workers.call("rollout", "received_weights", dispatch=Dispatch.BROADCAST)
    assert got[1] == [("w", 4.0), ("b", 0.0)]
    with pytest.raises(WorkerError, match=r"has no folder 'actor' for role 'actor'"):
        workers.load_checkpoint(str(tmp_path / "missing"))
    workers.export_hf(str(tmp_path / "hf"))
    assert (tmp_path / "hf").is_dir()
    workers.shutdown()
    workers.shutdown()  # twice is fine


@pytest.mark.timeout(10)
def test_an_invalid_mesh_is_refused_at_start():
    with pytest.raises(MeshError, match="role 'bad'"):
        local_workers({"global": (2, ("bad",))})


def test_role_classes_resolve_core_and_plugin_roles():
    assert resolve_role_class("actor").__name__ == "ActorRole"
    assert resolve_role_class("ref").__name__ == "RefRole"
    assert resolve_role_class("rollout").__name__ == "RolloutRole"
    assert resolve_role_class("critic", {"critic": f"{__name__}:Sink"}) is Sink
    with pytest.raises(
        RoleError, match=r"no class for the worker role 'critic'.*AlgorithmSpec.role_classes"
    ):
        resolve_role_class("critic")
    with pytest.raises(RoleError, match=r"is not a subclass of polyrl\.workers\.roles\.Role"):
        resolve_role_class("critic", {"critic": dict})


@pytest.mark.timeout(10)
def test_a_role_that_fails_to_build_is_named():
    class Broken(Role):
        def __init__(self, ctx):
            raise OSError("no weights")

    with pytest.raises(
        WorkerError,
        match=r"building role 'critic' \(.*Broken\) in pool 'global' failed: OSError: no weights",
    ):
        LocalWorkerGroup(
            Worker,
            world_size=1,
            init_kwargs={
                "cfg": trainer_cfg(),
                "roles": ("critic",),
                "role_classes": {"critic": Broken},
            },
        )


@pytest.mark.timeout(30)
def test_in_process_pools_built_before_a_failing_one_are_shut_down():
    """``trainer.worker_backend=in_process`` with a pool whose role fails to build: the pools
    built before it are shut down, and the process group the first of them started is gone."""
    import torch.distributed as dist

    from polyrl.workers.placement import start_role_workers

    class Idle(Role):
        def __init__(self, ctx):
            pass

    class Broken(Role):
        def __init__(self, ctx):
            raise OSError("no weights")

    cfg = trainer_cfg(gpus=1, role_pools={"critic": "aux"}, resource_pools={"aux": 1})
    cfg.trainer.worker_backend, cfg.trainer.max_restarts = "in_process", 0
    with pytest.raises(WorkerError, match=r"building role 'critic' .* in pool 'aux' failed"):
        start_role_workers(
            cfg,
            ("actor", "critic"),
            model_path="",
            total_training_steps=1,
            tokens={},
            role_classes={"actor": Idle, "critic": Broken},
        )
    assert not dist.is_initialized()
