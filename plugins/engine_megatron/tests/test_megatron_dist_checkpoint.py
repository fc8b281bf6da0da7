"""Loading the initial weights from a megatron-core dist checkpoint (verl's
``megatron.use_dist_checkpointing``) on the CPU over 2 gloo ranks: a checkpoint written by
megatron-core's ``dist_checkpointing.save`` from a TP=2 model under Transformer Engine's fused
layer-norm names (the layout verl's converter writes) loads into the engine's local-spec model
split PP=2 unevenly, every weight equal to the HF checkpoint's conversion; the folder's pickled
parts are checked before megatron-core reads them, and what is missing or unsafe is one line.

megatron-core's writer synchronises and allocates on the current CUDA device; the test's writer
(scaffolding, not the engine) runs it with those two calls pointed at the CPU. The load, the
engine's part, runs unpatched."""

from __future__ import annotations

import contextlib
import os
import pickle
from importlib.util import find_spec

import pytest
import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from polyrl.api import ConfigError
from polyrl.api.testing import schema_config
from polyrl_engine_kit.launch import run_on_ranks
from polyrl_engine_megatron.checks import check_config
from polyrl_engine_megatron.convert import (
    EVEN,
    GPTShape,
    StageSplit,
    hf_to_megatron,
    pipeline_stages,
    stage_shards,
)
from polyrl_engine_megatron.dist_checkpoint import FUSED_NORMS, check_folder

# Located, not imported: collecting this file must not load megatron into every test process.
pytestmark = pytest.mark.skipif(
    find_spec("megatron") is None, reason="pip install 'polyrl-engine-megatron[cpu]'"
)


@contextlib.contextmanager
def _cpu_writer():
    synchronize, current_device = torch.cuda.synchronize, torch.cuda.current_device
    torch.cuda.synchronize, torch.cuda.current_device = (lambda *_: None), (lambda: "cpu")
    try:
        yield
    finally:
        torch.cuda.synchronize, torch.cuda.current_device = synchronize, current_device


def _build(hf_path: str, tp: int, pp: int, rank_in_pp: int, split: StageSplit = EVEN):
    from transformers import AutoConfig

    from polyrl_engine_megatron.model import build_gpt_model
    from polyrl_engine_megatron.transformer_overrides import Recompute

    hf_config = AutoConfig.from_pretrained(hf_path)
    shape = GPTShape.from_hf_config(hf_config, tp)
    stage = pipeline_stages(shape.num_layers, pp, split)[rank_in_pp]
    model = build_gpt_model(
        shape,
        hf_config,
        stage,
        pipeline_parallel=pp,
        recompute=Recompute(),
        overrides={"num_layers_in_first_pipeline_stage": split.first} if split.first else None,
        device=torch.device("cpu"),
    )
    return model, shape, stage


def _scenario(rank: int, world: int, hf_path: str, folder: str) -> dict:
    from megatron.core import dist_checkpointing, parallel_state
    from transformers import AutoModelForCausalLM

    from polyrl_engine_megatron.dist_checkpoint import load_dist_checkpoint
    from polyrl_engine_megatron.model import load_hf_weights

    # written as verl's converter writes it: TP=2, Transformer Engine's norm names
    parallel_state.initialize_model_parallel(2, 1)
    writer, shape, stage = _build(hf_path, 2, 1, 0)
    load_hf_weights(writer, hf_path, shape, stage, rank, False)
    sharded = {k: v for k, v in writer.sharded_state_dict().items() if "_extra_state" not in k}
    for tensor in sharded.values():
        for local, fused in FUSED_NORMS.items():
            tensor.key = tensor.key.replace(local, fused)
    if rank == 0:
        os.makedirs(folder)
    dist.barrier()
    with _cpu_writer():
        dist_checkpointing.save(sharded, folder)
    parallel_state.destroy_model_parallel()

    # read by the engine's model split PP=2 unevenly (its 3 layers as 1 + 2)
    parallel_state.initialize_model_parallel(1, 2)
    model, shape, stage = _build(hf_path, 1, 2, rank, StageSplit(first=1))
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(float("nan"))  # nothing left from the build
    load_dist_checkpoint(model, folder)
    hf = AutoModelForCausalLM.from_pretrained(hf_path, dtype=torch.float32).state_dict()
    expected = stage_shards(hf_to_megatron(hf, shape), shape, stage)
    got = dict(model.named_parameters())
    parallel_state.destroy_model_parallel()
    return {
        "names": sorted(got) == sorted(expected),
        "unequal": [n for n, p in got.items() if not torch.equal(p, expected[n][0])],
        "files": sorted(os.listdir(folder)),
    }


def test_a_tp2_dist_checkpoint_loads_into_a_pp2_model(tmp_path) -> None:
    from test_megatron_stages import _hf_model

    hf_path = str(tmp_path / "hf")
    _hf_model(hf_path)
    results = run_on_ranks(_scenario, 2, hf_path, str(tmp_path / "dist"), timeout_s=180)
    for result in results:
        assert result["names"] and result["unequal"] == []
    assert {"metadata.json", ".metadata", "common.pt"} <= set(results[0]["files"])


class _Payload:
    def __reduce__(self):
        return (os.system, ("echo should-not-run",))


def test_unsafe_or_foreign_folders_are_one_line(tmp_path) -> None:
    with pytest.raises(ConfigError, match="is not a megatron-core dist checkpoint"):
        check_folder(str(tmp_path))
    (tmp_path / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    with open(tmp_path / ".metadata", "wb") as stream:
        pickle.dump(_Payload(), stream)
    with pytest.raises(Exception, match=r"refusing to load .*references (posix|os)\.system"):
        check_folder(str(tmp_path))


def test_use_dist_checkpointing_needs_its_path() -> None:
    given = "actor_rollout_ref.actor.megatron.use_dist_checkpointing=true"
    cfg = OmegaConf.merge(schema_config(), OmegaConf.from_dotlist([given]))
    assert check_config(cfg) == [
        "actor_rollout_ref.actor.megatron.use_dist_checkpointing=true needs "
        "actor_rollout_ref.actor.megatron.dist_checkpointing_path, the folder of a megatron-core "
        "dist checkpoint (verl's converter writes one)",
        "actor_rollout_ref.ref.megatron.use_dist_checkpointing=true needs "
        "actor_rollout_ref.ref.megatron.dist_checkpointing_path, the folder of a megatron-core "
        "dist checkpoint (verl's converter writes one)",
    ]
    path = "actor_rollout_ref.actor.megatron.dist_checkpointing_path=/ckpt"
    assert check_config(OmegaConf.merge(cfg, OmegaConf.from_dotlist([path]))) == []
