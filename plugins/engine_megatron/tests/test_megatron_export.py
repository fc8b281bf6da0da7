"""``polyrl export`` of Megatron engine checkpoints on the CPU, without megatron-core.

The checkpoints are written here as the engine writes them (see
:mod:`polyrl_engine_megatron.checkpoint`): one ``model_optim_tp<t>[_pp<p>].pt`` per tensor- and
pipeline-parallel rank with the model's ``state_dict()`` and AdamW's, one
``extra_state_rank_<r>.pt`` per rank with the layout. The weights are a perturbed copy of the model
folder's (so a reader that kept the folder's weights fails), split by
:func:`~polyrl_engine_megatron.convert.hf_to_megatron` and
:func:`~polyrl_engine_megatron.convert.stage_shards`, which
``test_megatron_convert.test_shards_fit_a_real_gpt_model`` checks against a real GPTModel's
parameter names and shapes; the ``_extra_state`` entries a GPTModel's ``state_dict()`` adds (None
for the local spec, seen with megatron-core 0.16) are written too. The reader must give back the
perturbed HF weights exactly for every layout: the tiny model (Qwen2: attention biases, tied
embedding, so the last of several stages holds a copy of it), and a Llama shape (grouped KV heads,
untied output layer, a vocabulary padded for TP=4). The real engine's checkpoints are exported in
``test_megatron_export_gpu.py``.
"""

from __future__ import annotations

import functools
import os
import re
import tempfile

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, LlamaConfig

from polyrl.api.testing import build_tiny_model, schema_config
from polyrl.checkpoint import CheckpointManager, save_driver_state
from polyrl.export import checkpoint_reader, export_checkpoint
from polyrl_engine_kit.checkpoint import CheckpointError, loop_state
from polyrl_engine_megatron.checkpoint import EXTRA_STATE, STAGE_LAYERS, read_checkpoint, shard_name
from polyrl_engine_megatron.convert import (
    EVEN,
    GPTShape,
    StageSplit,
    hf_to_megatron,
    pipeline_stages,
    stage_shards,
)

torch.set_num_threads(1)
# the modules of a local-spec GPTModel whose state_dict() has an ``_extra_state`` entry
_LINEARS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
LLAMA = LlamaConfig(
    vocab_size=450,  # padded to 452 for TP=4
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=4,
    tie_word_embeddings=False,
)


@functools.cache
def _tiny() -> str:
    return build_tiny_model(tempfile.mkdtemp(prefix="polyrl_mcore_export_") + "/tiny")


@functools.cache
def _llama() -> str:
    folder = tempfile.mkdtemp(prefix="polyrl_mcore_export_") + "/llama"
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(LLAMA).save_pretrained(folder)
    return folder


def _config(model_path: str, dtype: str = "bfloat16") -> dict:
    overrides = {
        "actor_rollout_ref": {
            "model": {"path": model_path, "dtype": dtype},
            "actor": {"strategy": "megatron"},
        }
    }
    return OmegaConf.to_container(OmegaConf.merge(schema_config(), overrides), resolve=True)


def _trained_weights(model_path: str) -> tuple[dict[str, torch.Tensor], object]:
    """The model folder's float32 weights, each moved (as a training step would) and the HF
    config."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator), alpha=0.01)
    return {name: t.clone() for name, t in model.state_dict().items()}, model.config


def _with_extra_state(weights: dict[str, torch.Tensor], is_last: bool) -> dict[str, object]:
    """A stage's weights as a local-spec GPTModel's ``state_dict()`` holds them."""
    state: dict[str, object] = dict(weights)
    for name in weights:
        module = name.rpartition(".")[0]
        if module.rpartition(".")[2] in _LINEARS:
            state[f"{module}._extra_state"] = None
    if is_last:
        state["output_layer._extra_state"] = None  # present even when tied
    return state


def _optimizer_state(weights: dict[str, torch.Tensor]) -> dict:
    """AdamW's state after one step over these weights, as the engine saves it."""
    params = [torch.nn.Parameter(t.clone()) for t in weights.values()]
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    for param in params:
        param.grad = torch.ones_like(param)
    optimizer.step()
    return optimizer.state_dict()


def _write_megatron_checkpoint(
    folder: str,
    hf: dict[str, torch.Tensor],
    hf_config: object,
    tp: int,
    pp: int,
    split: StageSplit = EVEN,
) -> None:
    """``folder`` as a Megatron engine of ``tp`` x ``pp`` ranks (data-parallel size 1) saves it,
    its stages split as ``split`` says (recorded in the layout when uneven)."""
    os.makedirs(folder, exist_ok=True)
    shape = GPTShape.from_hf_config(hf_config, tp)
    whole = hf_to_megatron(hf, shape)
    stages = pipeline_stages(shape.num_layers, pp, split)
    for pp_rank, stage in enumerate(stages):
        local = stage_shards(whole, shape, stage)
        for tp_rank in range(tp):
            weights = {name: parts[tp_rank] for name, parts in local.items()}
            state = {
                "model": _with_extra_state(weights, stage.is_last),
                "optimizer": _optimizer_state(weights),
            }
            torch.save(state, os.path.join(folder, shard_name(tp_rank, pp_rank, pp)))
    layout = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp}
    if not split.even:
        layout[STAGE_LAYERS] = [stage.num_layers for stage in stages]
    for rank in range(tp * pp):
        extra = {**loop_state(1, None, torch.device("cpu")), "layout": layout}
        torch.save(extra, os.path.join(folder, EXTRA_STATE.format(rank=rank)))


@pytest.mark.parametrize(
    ("model", "tp", "pp", "split"),
    [
        ("tiny", 1, 1, StageSplit()),
        ("tiny", 2, 1, StageSplit()),
        ("tiny", 1, 2, StageSplit()),
        ("tiny", 2, 2, StageSplit()),
        ("llama", 4, 2, StageSplit()),
        # the embedding counted as a layer: the first stage holds no decoder layer
        ("tiny", 2, 3, StageSplit(embedding=True)),
    ],
    ids=["tiny-tp1", "tiny-tp2", "tiny-pp2", "tiny-tp2-pp2", "llama-tp4-pp2", "tiny-uneven-pp3"],
)
def test_reader_gives_back_the_hf_weights_exactly(
    tmp_path, model: str, tp: int, pp: int, split: StageSplit
) -> None:
    model_path = _tiny() if model == "tiny" else _llama()
    hf, hf_config = _trained_weights(model_path)
    folder = str(tmp_path / "actor")
    _write_megatron_checkpoint(folder, hf, hf_config, tp, pp, split)
    read = read_checkpoint(folder, OmegaConf.create(_config(model_path)), model_path)
    assert type(read).__name__ == type(AutoModelForCausalLM.from_config(hf_config)).__name__
    state = read.state_dict()
    assert state.keys() == hf.keys()
    for name, tensor in hf.items():
        assert state[name].dtype == torch.float32, name
        assert torch.equal(state[name], tensor), name


def test_polyrl_export_of_a_megatron_checkpoint(tmp_path) -> None:
    """Through the registry (the spec's ``checkpoint_reader``), a committed TP=2 x PP=2
    checkpoint exports to a folder transformers loads with the checkpoint's weights; in
    float32 its logits are the checkpoint's bitwise."""
    assert checkpoint_reader("megatron") is read_checkpoint
    config = _config(_tiny(), dtype="float32")
    hf, hf_config = _trained_weights(_tiny())
    manager = CheckpointManager(str(tmp_path / "run"))
    staging = manager.staging_dir(1)
    _write_megatron_checkpoint(os.path.join(staging, "actor"), hf, hf_config, tp=2, pp=2)
    save_driver_state(staging, {"step": 1, "config": config})
    result = export_checkpoint(manager.commit(1, staging))
    assert result.check.passed and result.check.max_abs_diff == 0.0
    exported = AutoModelForCausalLM.from_pretrained(result.out, dtype=torch.float32).state_dict()
    for name, tensor in hf.items():
        assert torch.equal(exported[name], tensor), name


def test_reader_names_what_is_missing(tmp_path) -> None:
    hf, hf_config = _trained_weights(_tiny())
    cfg = OmegaConf.create(_config(_tiny()))
    with pytest.raises(CheckpointError, match="is not a Megatron engine checkpoint"):
        read_checkpoint(str(tmp_path), cfg, _tiny())
    folder = str(tmp_path / "actor")
    _write_megatron_checkpoint(folder, hf, hf_config, tp=2, pp=2)
    with pytest.raises(
        CheckpointError, match=re.escape("'decoder.layers.0.self_attention.linear_qkv.weight'")
    ):
        read_checkpoint(folder, cfg, _llama())  # another model: other head layout
    for tp_rank in range(2):  # the last stage without its final norm
        shard = os.path.join(folder, shard_name(tp_rank, 1, 2))
        state = torch.load(shard, weights_only=True)
        del state["model"]["decoder.final_layernorm.weight"]
        torch.save(state, shard)
    with pytest.raises(CheckpointError, match=r"missing \['model.norm.weight'\], unexpected \[\]"):
        read_checkpoint(folder, cfg, _tiny())
    os.remove(os.path.join(folder, shard_name(1, 1, 2)))
    with pytest.raises(
        CheckpointError, match=re.escape("has no model_optim_tp01_pp01.pt: the checkpoint")
    ):
        read_checkpoint(folder, cfg, _tiny())
