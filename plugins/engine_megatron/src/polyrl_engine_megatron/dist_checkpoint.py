"""verl's ``megatron.use_dist_checkpointing``: the initial weights from a megatron-core
dist-checkpoint folder (``dist_checkpointing_path``, megatron-core's ``torch_dist`` format, as
verl's converter writes it) instead of the Hugging Face folder.

As verl loads it: megatron-core's ``dist_checkpointing.load`` of the model's
``sharded_state_dict(prefix=dist_checkpointing_prefix)``, unexpected keys of the checkpoint
ignored; the folder may have been written with other tensor- and pipeline-parallel sizes
(megatron-core reshards). The weights are loaded in place, on every rank its own shards.

Why the layer-norm names are mapped: verl's converter builds its models with Transformer
Engine's layer spec, where each decoder layer's norms are fused into the next linear layer
(``self_attention.linear_qkv.layer_norm_weight``, ``mlp.linear_fc1.layer_norm_weight``); the
engine's local spec keeps them apart (``input_layernorm.weight``, ``pre_mlp_layernorm.weight``),
with the same values. A checkpoint that has the fused names is read under them.

Why nothing in it runs code: the folder's ``.metadata`` pickle is first read with polyrl's
restricted unpickler (:class:`polyrl.api.SafeFileSystemReader`), which admits only the classes
DCP's metadata is made of, so megatron-core's own read of the same bytes calls nothing else;
``common.pt`` is first loaded tensor-only; and only tensors are requested (the local spec's
``_extra_state`` entries, pickled objects in the folder, are left out: they are None here).
"""

from __future__ import annotations

import os

import torch

from polyrl.api import ConfigError, SafeFileSystemReader, load_plain

# the engine's local-spec names -> Transformer Engine's fused names of the same weights
FUSED_NORMS = {
    "input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
    "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
}
COMMON = "common.pt"
EXTRA_STATE = "_extra_state"


def check_folder(path: str) -> None:
    """A megatron-core dist-checkpoint folder whose pickled parts hold only data; one line
    naming what is wrong otherwise."""
    if not os.path.isfile(os.path.join(path, "metadata.json")):
        raise ConfigError(
            f"megatron.dist_checkpointing_path={path!r} is not a megatron-core dist checkpoint "
            f"(no metadata.json); give the folder megatron-core's dist_checkpointing.save wrote"
        )
    SafeFileSystemReader(path).read_metadata()
    if os.path.isfile(os.path.join(path, COMMON)):
        load_plain(os.path.join(path, COMMON))


def load_dist_checkpoint(model: torch.nn.Module, path: str, prefix: str = "") -> None:
    """This rank's weights of ``model`` (a GPTModel stage) from the dist checkpoint at
    ``path``, in place; a :class:`ConfigError` naming the weights the folder lacks."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import StrictHandling

    check_folder(path)
    stored = set(dist_checkpointing.load_tensors_metadata(path))
    sharded = {
        name: tensor
        for name, tensor in model.sharded_state_dict(prefix=prefix).items()
        if not name.endswith(EXTRA_STATE)
    }
    missing = []
    for tensor in sharded.values():
        tensor.key = _stored_key(tensor.key, stored)
        if tensor.key not in stored:
            missing.append(tensor.key)
    if missing:
        raise ConfigError(
            f"megatron.dist_checkpointing_path={path!r} lacks {sorted(missing)[:4]} "
            f"({len(missing)} weights; prefix {prefix!r}): give a checkpoint of this model, "
            f"or set megatron.dist_checkpointing_prefix to the prefix its keys carry"
        )
    try:
        dist_checkpointing.load(sharded, path, strict=StrictHandling.ASSUME_OK_UNEXPECTED)
    except Exception as exc:  # megatron-core's reasons are long; the first line says it
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"megatron.dist_checkpointing_path={path!r} does not load into this model: {first}"
        ) from exc


def _stored_key(key: str, stored: set[str]) -> str:
    """``key``, or its Transformer Engine name where the checkpoint has that one instead."""
    if key in stored:
        return key
    for local, fused in FUSED_NORMS.items():
        if key.endswith(local) and key.removesuffix(local) + fused in stored:
            return key.removesuffix(local) + fused
    return key
