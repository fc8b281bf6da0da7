"""No checkpoint file of any engine runs code on resume (issue 30).

For every file kind each engine writes, a real checkpoint is committed as a run commits it, one
file gets a pickled payload (an object whose unpickling creates a marker file), and the
checksum manifest in ``COMPLETE`` is rewritten to match, as anyone who can write the folder can.
The driver then selects the checkpoint (its checksums verify) and the engine's
``load_checkpoint`` must refuse it in one line naming the file, with the marker never created.
Each engine runs in one spawned rank (gloo) so that one process serves all its file kinds.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
from collections.abc import Callable
from typing import Any

import pytest
import torch

from polyrl.checkpoint import MARKER_FILE, CheckpointManager, file_checksums, verify_checkpoint
from polyrl.errors import PolyrlError
from polyrl.interfaces.training_engine import EngineContext, ModelHead
from polyrl.models.tiny import build_tiny_model
from polyrl_engine_kit.launch import run_on_ranks
from polyrl_engine_kit.testing import composed_context

ROLE = "actor"


class Payload:
    """Unpickling this creates ``marker``: proof that code from the checkpoint ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


# ---- ways to put a payload into a file, each leaving the file otherwise as the engine wrote it --
def into_torch_file(path: str, marker: str) -> None:
    """A ``torch.save`` file (extra state, DeepSpeed's and Megatron's shards): one more entry."""
    state = torch.load(path, weights_only=False, map_location="cpu")  # the test's own file
    state["polyrl_test_entry"] = Payload(marker)
    torch.save(state, path)


def into_dcp_metadata(path: str, marker: str) -> None:
    """DCP's ``.metadata`` pickle: the payload in its planner data."""
    with open(path, "rb") as fh:
        metadata = pickle.load(fh)  # the test's own file
    metadata.planner_data = {"polyrl_test_entry": Payload(marker)}
    with open(path, "wb") as fh:
        pickle.dump(metadata, fh)


def into_dcp_entry(metadata_path: str, marker: str) -> None:
    """A non-tensor entry of the DCP state dict (an optimizer setting): its pickled bytes are
    replaced by the payload's, appended to the shard file, and the metadata points there."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    folder = os.path.dirname(metadata_path)
    with open(metadata_path, "rb") as fh:
        metadata = pickle.load(fh)
    entry = next(
        index
        for index in metadata.storage_data
        if isinstance(metadata.state_dict_metadata[index.fqn], BytesStorageMetadata)
    )
    info = metadata.storage_data[entry]
    shard = os.path.join(folder, info.relative_path)
    payload = _torch_bytes(Payload(marker))
    offset = os.path.getsize(shard)
    with open(shard, "ab") as fh:
        fh.write(payload)
    metadata.storage_data[entry] = dataclasses.replace(info, offset=offset, length=len(payload))
    with open(metadata_path, "wb") as fh:
        pickle.dump(metadata, fh)


def _torch_bytes(value: Any) -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


# ---- the driver's side: commit, tamper with a consistent manifest, select for resume -----------
def committed(root: str, save: Callable[[str], None]) -> str:
    manager = CheckpointManager(root)
    staging = manager.staging_dir(1)
    save(os.path.join(staging, ROLE))
    return manager.commit(1, staging)


def tampered_copy(
    checkpoint: str, root: str, relative: str, tamper: Callable[[str, str], None]
) -> tuple[str, str]:
    """A copy of ``checkpoint`` under ``root`` with ``relative`` (in the engine's folder)
    tampered with and the manifest rewritten; the engine folder the driver resumes, the marker."""
    step_dir = os.path.join(root, os.path.basename(checkpoint))
    shutil.copytree(checkpoint, step_dir)
    marker = os.path.join(root, "payload_ran")
    tamper(os.path.join(step_dir, ROLE, relative), marker)
    manifest = os.path.join(step_dir, MARKER_FILE)
    with open(manifest, encoding="utf-8") as fh:
        record = json.load(fh)
    record["sha256"] = file_checksums(step_dir)
    with open(manifest, "w", encoding="utf-8") as fh:
        json.dump(record, fh)
    assert verify_checkpoint(step_dir) is None  # checksums do not catch a deliberate edit
    selected = CheckpointManager(root).resolve_resume({"resume_mode": "auto"})
    assert selected == step_dir
    return os.path.join(selected, ROLE), marker


def try_loads(
    checkpoint: str,
    workdir: str,
    cases: dict[str, tuple[str, Callable[[str, str], None]]],
    load: Callable[[str], None],
) -> dict[str, dict[str, Any]]:
    """For each case (file, tamper) the error ``load`` raised and whether the payload ran."""
    outcome = {}
    for name, (relative, tamper) in cases.items():
        root = os.path.join(workdir, name)
        os.makedirs(root)
        engine_dir, marker = tampered_copy(checkpoint, root, relative, tamper)
        try:
            load(engine_dir)
            error = None
        except PolyrlError as exc:  # the line a user would see
            error = f"{type(exc).__name__}: {exc}"
        outcome[name] = {"error": error, "ran": os.path.exists(marker)}
    return outcome


def assert_all_refused(outcome: dict[str, dict[str, Any]], files: dict[str, str]) -> None:
    for name, result in outcome.items():
        assert not result["ran"], f"{name}: the payload ran"
        error = result["error"] or ""
        assert error.startswith("UnsafeCheckpointError: refusing to load "), (name, error)
        assert files[name] in error and "\n" not in error, (name, error)


DCP_CASES = {
    "dcp_metadata": (".metadata", into_dcp_metadata),
    "dcp_entry": (".metadata", into_dcp_entry),
    "extra_state": ("extra_state_rank_0.pt", into_torch_file),
}
DCP_FILES = {"dcp_metadata": ".metadata", "dcp_entry": "(entry ", "extra_state": "extra_state"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_tiny_model(str(tmp_path_factory.mktemp("model")))


# ---- FSDP: actor, critic (value head) and LoRA actor ----------------------------------------
def _fsdp_contexts(path: str) -> dict[str, EngineContext]:
    contexts = {
        "actor": composed_context(path, model={"dtype": "float32"}, actor={}),
        "critic": EngineContext(
            role="critic",
            model_path=path,
            model={"dtype": "float32"},
            engine={"fsdp_config": {"mixed_precision": False}},
            device="cpu",
            rank=0,
            world_size=1,
            seed=1,
            total_training_steps=2,
            head=ModelHead.VALUE,
        ),
    }
    try:
        import peft  # noqa: F401
    except ImportError:
        return contexts
    contexts["lora"] = composed_context(
        path, model={"dtype": "float32", "lora_rank": 4, "lora_alpha": 8}, actor={}
    )
    return contexts


def _fsdp_scenario(rank: int, world: int, path: str, workdir: str) -> dict[str, Any]:
    from polyrl_engine_fsdp.engine import FSDPEngine

    results = {}
    for kind, ctx in _fsdp_contexts(path).items():
        engine = FSDPEngine(ctx)
        root = os.path.join(workdir, kind)
        checkpoint = committed(os.path.join(root, "run"), engine.save_checkpoint)
        results[kind] = try_loads(checkpoint, root, DCP_CASES, engine.load_checkpoint)
        del engine
    return results


def test_fsdp_actor_critic_and_lora_checkpoints_never_run_a_payload(
    model_dir: str, tmp_path
) -> None:
    (results,) = run_on_ranks(_fsdp_scenario, 1, model_dir, str(tmp_path))
    assert {"actor", "critic"} <= set(results)
    for outcome in results.values():
        assert_all_refused(outcome, DCP_FILES)


# ---- DeepSpeed: model states, ZeRO optimizer states, extra state (ZeRO-2 and ZeRO-3) ---------
DS_OPTIM_STATES = "polyrl/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
DS_CASES = {
    # ZeRO-2 keeps the whole module's weights in the model-states file; ZeRO-3 writes a
    # partitioned one per rank beside its optimizer partition
    2: {
        "model_states": ("polyrl/mp_rank_00_model_states.pt", into_torch_file),
        "optim_states": (DS_OPTIM_STATES, into_torch_file),
        "extra_state": ("extra_state_rank_0.pt", into_torch_file),
    },
    3: {
        "model_states": ("polyrl/zero_pp_rank_0_mp_rank_00_model_states.pt", into_torch_file),
        "optim_states": (DS_OPTIM_STATES, into_torch_file),
        "extra_state": ("extra_state_rank_0.pt", into_torch_file),
    },
}


def _deepspeed_scenario(
    rank: int, world: int, path: str, workdir: str, stage: int
) -> dict[str, Any]:
    from polyrl_engine_deepspeed.engine import DeepSpeedEngine

    ctx = composed_context(
        path, model={"dtype": "bfloat16"}, actor={}, plugins={"deepspeed": {"zero_stage": stage}}
    )
    engine = DeepSpeedEngine(ctx)
    checkpoint = committed(os.path.join(workdir, "run"), engine.save_checkpoint)
    engine.load_checkpoint(os.path.join(checkpoint, ROLE))  # the untampered one loads
    return try_loads(checkpoint, workdir, DS_CASES[stage], engine.load_checkpoint)


@pytest.mark.parametrize("stage", sorted(DS_CASES))
def test_deepspeed_checkpoints_never_run_a_payload(model_dir: str, tmp_path, stage: int) -> None:
    pytest.importorskip("deepspeed")
    (outcome,) = run_on_ranks(_deepspeed_scenario, 1, model_dir, str(tmp_path), stage)
    files = {name: relative.rsplit("/", 1)[-1] for name, (relative, _) in DS_CASES[stage].items()}
    assert_all_refused(outcome, files)


# ---- Megatron: the parallel rank's weights-and-optimizer shard, extra state ------------------
MEGATRON_CASES = {
    "shard": ("model_optim_tp00.pt", into_torch_file),
    "extra_state": ("extra_state_rank_0.pt", into_torch_file),
}
MEGATRON_FILES = {"shard": "model_optim_tp00.pt", "extra_state": "extra_state_rank_0.pt"}


def _megatron_scenario(rank: int, world: int, workdir: str) -> dict[str, Any]:
    """The Megatron engine's checkpoint module on a plain module and AdamW: what it reads is
    the point, and megatron-core's forward needs CUDA."""
    from polyrl_engine_megatron import checkpoint as mcore_ckpt

    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    layout = {"tp": 1, "pp": 1}
    shard = mcore_ckpt.shard_name(0, 0, 1)

    def save(path: str) -> None:
        mcore_ckpt.save(path, model, optimizer, {"layout": layout}, shard=shard, writes_shard=True)

    def load(path: str) -> None:
        mcore_ckpt.load(path, model, optimizer, shard=shard, layout=layout)

    checkpoint = committed(os.path.join(workdir, "run"), save)
    load(os.path.join(checkpoint, ROLE))  # the untampered one loads
    return try_loads(checkpoint, workdir, MEGATRON_CASES, load)


def test_megatron_checkpoints_never_run_a_payload(tmp_path) -> None:
    (outcome,) = run_on_ranks(_megatron_scenario, 1, str(tmp_path))
    assert_all_refused(outcome, MEGATRON_FILES)
