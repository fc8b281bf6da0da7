"""The interface a rollout (generation) backend implements: vLLM, SGLang, HF generate ...

An instance lives in each worker process of the rollout role's pool, usually next to the actor's
training engine (the hybrid engine). It takes prompts, samples ``n`` responses each, and
receives fresh weights after each actor update.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from polyrl.workers.mesh import DataParallelRank

if TYPE_CHECKING:
    import torch

    from polyrl.batch import Batch


@dataclass
class SamplingParams:
    """How to sample. ``greedy=True`` ignores temperature/top-p/top-k (validation)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 256
    greedy: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None


@dataclass
class RolloutContext:
    """What a rollout engine is built from. ``config`` is the ``actor_rollout_ref.rollout`` node;
    ``model_path`` a local Hugging Face folder holding the model and its tokenizer."""

    model_path: str
    config: Any
    device: str
    rank: int
    world_size: int
    seed: int = 0
    max_prompt_length: int = 512
    max_response_length: int = 256
    pad_token_id: int = 0
    eos_token_ids: list[int] = field(default_factory=list)


class RolloutEngine(ABC):
    """One worker's generation engine."""

    def __init__(self, ctx: RolloutContext) -> None:
        self.ctx = ctx

    def data_parallel_rank(self) -> DataParallelRank:
        """This worker's data-parallel position: the driver gives every worker of one
        ``dp_rank`` the same prompts and gathers the output of the one that ``returns_output``.

        The default makes every worker its own data-parallel rank. A tensor-parallel engine
        (vLLM with ``tensor_model_parallel_size > 1`` over the workers' process group)
        overrides it: the ``tp`` peers of one engine report the same ``dp_rank``
        (``rank // tp`` of ``world_size // tp``) and only one of them returns output.
        """
        return DataParallelRank(
            dp_rank=self.ctx.rank, dp_size=self.ctx.world_size, returns_output=True
        )

    @abstractmethod
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """Sample ``params.n`` responses for each prompt.

        ``prompts`` holds ``input_ids[B, P]`` (left-padded) and ``attention_mask[B, P]``. Returns a
        batch of ``B * n`` rows, the ``n`` samples of prompt ``i`` in rows ``i*n .. i*n+n-1``, with
        ``responses[B*n, R]`` right-padded with the pad token to ``R = params.max_new_tokens``,
        ``response_mask[B*n, R]`` (1 on generated tokens up to and including EOS) and
        ``rollout_log_probs[B*n, R]`` (the sampling distribution's log-probs, 0 on padding).
        """

    @abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load fresh weights, given as a stream of ``(hf_name, full_tensor)`` pairs."""

    def sleep(self, level: int = 1) -> None:
        """Free memory while the trainer runs (level 1: KV cache; level 2: weights too).
        Engines without ``supports_sleep`` keep everything resident: nothing to free."""

    def wake_up(self) -> None:
        """Undo :meth:`sleep` before the next generation."""

    def reset_prefix_cache(self) -> None:
        """Drop whatever KV the engine keeps between ``generate`` calls for prompts that extend
        earlier ones (vLLM's name). A multi-turn rollout calls it after the last turn of its
        episodes, so that memory is free before the update. Engines that keep nothing: no-op."""

    def close(self) -> None:
        """Release the engine's resources at the end of the run."""
