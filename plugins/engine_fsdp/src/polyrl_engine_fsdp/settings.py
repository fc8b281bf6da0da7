"""The FSDP engine's config sections, at verl's places: ``fsdp_config`` of the actor, the
reference and the critic's model, ``ulysses_sequence_parallel_size`` of those roles, and
``use_liger`` and the kit's LoRA keys of the model (mounted into the schema by
:mod:`polyrl.config.sections`).

Light on purpose (no torch): every composed config imports it. The reference's and the critic's
settings default to the actor's, key by key, as in verl.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from polyrl.api import following
from polyrl_engine_kit.settings import LoraModelSettings

MODEL = "actor_rollout_ref.model"
ACTOR = "actor_rollout_ref.actor"
ACTOR_FSDP = "actor_rollout_ref.actor.fsdp_config"
REF_FSDP = "actor_rollout_ref.ref.fsdp_config"
CRITIC_FSDP = "critic.model.fsdp_config"


@dataclass
class FSDPSettings:
    """How FSDP2 shards one role's model.

    ``mixed_precision``: fp32 master weights, bf16 compute. ``fsdp_size`` > 0 and below the
    world size asks for hybrid sharding (HSDP): parameters sharded within groups of that many
    ranks and replicated across the groups; it must divide the role's ranks.
    ``accumulate_unsharded``:
    within one optimizer step keep each layer's full weights gathered and its gradients unsharded
    in fp32, reduce-scattered once after the last micro-batch instead of after each; true /
    false, or auto: on CUDA when the full bf16 weights and fp32 gradients take at most a tenth
    of the GPU's memory.

    verl's precision keys: ``model_dtype``, the dtype the master weights are created in (and
    the optimizer steps): fp32, or bf16 for bf16 master weights. ``param_dtype`` /
    ``reduce_dtype`` (verl's ``mixed_precision.param_dtype`` ... , aliased here): FSDP2's
    ``MixedPrecisionPolicy``, the dtype the forward and backward compute in and the one
    gradients are reduced in; unset, ``mixed_precision=true`` computes in
    ``actor_rollout_ref.model.dtype`` and gradients reduce in fp32. ``buffer_dtype``: the
    model's floating-point buffers (rotary frequencies) are cast to it, as verl's FSDP1
    ``MixedPrecision`` does; unset, they stay in the master dtype.
    """

    param_offload: bool = False
    optimizer_offload: bool = False
    reshard_after_forward: bool = True
    mixed_precision: bool = True
    fsdp_size: int = -1
    accumulate_unsharded: Any = "auto"
    model_dtype: str = "fp32"
    param_dtype: Any = None
    reduce_dtype: Any = None
    buffer_dtype: Any = None


@dataclass
class FSDPModelSettings(LoraModelSettings):
    """The FSDP engine's keys of ``actor_rollout_ref.model``: the engine kit's LoRA keys,
    ``use_liger``: Liger-Kernel's RoPE/RMSNorm/SwiGLU, on CUDA with
    ``polyrl-engine-fsdp[cuda]``, and verl's ``enable_activation_offload``: the actor's
    activations saved for the backward wait in host memory (torch's ``save_on_cpu``) from each
    micro-batch's forward to its backward; same gradients, less GPU memory, more copying.
    With gradient checkpointing only the checkpointed layers' inputs are saved, so it moves
    those."""

    use_liger: bool = True
    enable_activation_offload: bool = False


@dataclass
class SequenceParallelSettings:
    """verl's Ulysses sequence parallelism of one role: each packed micro-batch split over
    this many consecutive ranks, which share its rows (one data-parallel rank) and exchange
    attention heads (:mod:`polyrl_engine_kit.ulysses`). It must divide the role's ranks and the
    model's attention heads, divide or be a multiple of its key/value heads, and needs
    ``use_remove_padding``; the critic runs with the actor's size."""

    ulysses_sequence_parallel_size: int = 1


# verl sets the FSDP mixed-precision dtypes as a group below fsdp_config.mixed_precision, which
# is a switch here: its keys are aliases of this section's.
MIXED_PRECISION_DTYPES = ("param_dtype", "reduce_dtype", "buffer_dtype")
KEY_ALIASES = {
    f"{node}.mixed_precision.{key}": f"{node}.{key}"
    for node in (ACTOR_FSDP, REF_FSDP, CRITIC_FSDP)
    for key in MIXED_PRECISION_DTYPES
}
FOLLOWING_ACTOR = following(FSDPSettings, ACTOR_FSDP)
SEQUENCE_PARALLEL_OF_ACTOR = following(SequenceParallelSettings, ACTOR)
CONFIG_SECTIONS = {
    MODEL: FSDPModelSettings,
    ACTOR: SequenceParallelSettings,
    "actor_rollout_ref.ref": SEQUENCE_PARALLEL_OF_ACTOR,
    "critic": SEQUENCE_PARALLEL_OF_ACTOR,
    ACTOR_FSDP: FSDPSettings,
    REF_FSDP: FOLLOWING_ACTOR,
    CRITIC_FSDP: FOLLOWING_ACTOR,
}
