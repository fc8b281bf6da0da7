"""How a micro-batch goes through the Megatron model and how its response scores come back.

Two layouts, chosen once per engine (:class:`ScoringPaths`): padded rows (the micro-batch
without its all-padding columns, under a padding mask), or one packed row
(``actor_rollout_ref.model.use_remove_padding``, the default): the real tokens end to end,
attention kept inside each sequence (:mod:`.attention`), so a micro-batch costs its real tokens
and no quadratic mask.

The last stage scores only the positions that predict a response token (megatron-core's
``output_processor`` hook receives the final hidden states). With
``actor_rollout_ref.model.use_fused_kernels`` on a packed row, the log-probs and entropy come
from the hidden states and the output embedding without a float32 ``[tokens, vocab]`` tensor
(bf16 logits, float32 statistics a chunk at a time): on one tensor-parallel rank through the
FSDP engine's :func:`~polyrl_engine_kit.fused_logprob.linear_log_prob` (its statistics
compiled), with the vocabulary split through
:func:`~.vocab_parallel.vocab_parallel_linear_log_prob`. Otherwise the output layer writes this
rank's vocabulary slice of the logits and :mod:`.vocab_parallel` scores them. The hook returns
the scores as one tensor, ``[1 or 2, ...]`` (log-probs, then the entropy when asked for), which
megatron-core hands to the loss function.

With TP > 1 the model runs sequence-parallel (:mod:`.sequence_parallel`): the rows are padded
to a multiple of TP tokens and the hook gathers the sequence before picking the positions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from polyrl.api import Batch
from polyrl_engine_kit.fused_logprob import linear_log_prob
from polyrl_engine_kit.logprob import EntropyMode
from polyrl_engine_kit.packing import pack_rows, unpack
from polyrl_engine_kit.scoring import model_inputs, pad_to_response
from polyrl_engine_megatron.attention import (
    attention_mask,
    context_packed_layout,
    packed_layout,
    padded_layout,
)
from polyrl_engine_megatron.context_parallel import ContextParallel, KeyValueGather
from polyrl_engine_megatron.convert import GPTShape
from polyrl_engine_megatron.sequence_parallel import full_sequence, pad_columns, pad_packed
from polyrl_engine_megatron.vocab_parallel import (
    vocab_parallel_linear_log_prob,
    vocab_parallel_logprob_entropy,
)

# The last stage's output back to [b, R] log-probs and entropy, zero on padding
ToResponse = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]


@dataclass(frozen=True)
class _Rows:
    """One micro-batch laid out for the model: its inputs and attention layout, the labels,
    the hidden states that predict its response tokens (``select``), and the scores back to
    ``[b, R]`` (``to_response``)."""

    inputs: tuple[Any, ...]
    layout: Any
    labels: torch.Tensor
    select: Callable[[torch.Tensor], torch.Tensor]
    to_response: ToResponse
    # context parallelism: this rank's scores -> the whole micro-batch's (ScoreShare.spread)
    spread: Callable[[torch.Tensor], torch.Tensor] = lambda scores: scores


@dataclass(frozen=True)
class ScoringPaths:
    packed: bool  # each micro-batch one packed row (use_remove_padding)
    fused: bool  # log-probs from the hidden states (use_fused_kernels, packed)
    vocab_split: bool  # the output embedding's rows split over TP ranks (TP > 1)
    compiled: bool  # the fused one-rank statistics through torch.compile (use_torch_compile)
    sequence_parallel: bool  # the sequence split over TP ranks (TP > 1)

    @classmethod
    def choose(
        cls, *, remove_padding: bool, fused_log_prob: bool, torch_compile: bool, tp: int
    ) -> ScoringPaths:
        """The fused log-probs take a packed row; only the one-rank kernels are compiled."""
        fused = remove_padding and fused_log_prob
        return cls(
            packed=remove_padding,
            fused=fused,
            vocab_split=tp > 1,
            compiled=fused and torch_compile and tp == 1,
            sequence_parallel=tp > 1,
        )


@dataclass(frozen=True)
class Scorer:
    """What scoring a micro-batch needs besides the micro-batch."""

    shape: GPTShape
    paths: ScoringPaths
    compute_dtype: torch.dtype
    tp_group: Any
    device: torch.device
    context: ContextParallel | None = None  # context parallelism (None: off)

    def forward(
        self, model: Any, micro: Batch, *, temperature: float, entropy: EntropyMode
    ) -> tuple[torch.Tensor, ToResponse]:
        """``micro`` through this rank's stage (call under the compute dtype's autocast): the
        stage's output (the activation for the next stage, or the last stage's scores), and the
        function that turns the last stage's scores into ``[b, R]``."""
        rows = self._rows(micro)

        def score(
            hidden_states: torch.Tensor, output_layer: Any, output_weight: Any, **_: Any
        ) -> torch.Tensor:
            # logits of this rank's vocabulary slice give a partial gradient; the fused path
            # sums it over the TP group itself
            hidden_states = self._full(hidden_states, partial=not self.paths.fused)
            log_prob, ent = self._score(
                rows.select(hidden_states),
                output_layer,
                output_weight,
                rows.labels,
                temperature,
                entropy,
            )
            scores = log_prob.unsqueeze(0) if ent is None else torch.stack((log_prob, ent))
            return rows.spread(scores)

        output = model(*rows.inputs, packed_seq_params=rows.layout, output_processor=score)
        return output, rows.to_response

    def forward_values(
        self, model: Any, micro: Batch, value_head: torch.nn.Module
    ) -> tuple[torch.Tensor, ToResponse]:
        """As :meth:`forward`, scored by a value model: ``value_head`` (hidden -> 1) at the
        positions that predict each response token, in float32."""
        rows = self._rows(micro)

        def score(hidden_states: torch.Tensor, **_: Any) -> torch.Tensor:
            hidden_states = self._full(hidden_states, partial=False)  # a replicated head
            return rows.spread(value_head(rows.select(hidden_states))[..., 0].float().unsqueeze(0))

        output = model(*rows.inputs, packed_seq_params=rows.layout, output_processor=score)
        return output, rows.to_response

    def _full(self, hidden: torch.Tensor, partial: bool) -> torch.Tensor:
        """The last stage's hidden states over the whole sequence (gathered over the TP group
        when it is split)."""
        if not self.paths.sequence_parallel:
            return hidden
        return full_sequence(hidden, self.tp_group, gradient_is_partial=partial)

    def _rows(self, micro: Batch) -> _Rows:
        """The model inputs of ``micro`` in the chosen layout, and how its scores come back."""
        if self.paths.packed:
            return self._packed_rows(micro)
        return self._padded_rows(micro)

    def _multiple(self) -> int:
        """What the sequence length must be a multiple of (TP with sequence parallelism)."""
        return self.shape.tensor_parallel if self.paths.sequence_parallel else 1

    def _packed_rows(self, micro: Batch) -> _Rows:
        width = micro["responses"].shape[1]
        ids, mask = micro["input_ids"].to(self.device), micro["attention_mask"].to(self.device)
        packed = pack_rows(ids, mask, width)

        def to_packed_response(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
            ent = unpack(scores[1], packed) if len(scores) > 1 else None
            return unpack(scores[0], packed), ent

        if self.context is None:
            packed = pad_packed(packed, self._multiple())
            return _Rows(
                inputs=(packed.input_ids, packed.position_ids, None),
                layout=packed_layout(packed, self.shape.head_dim, self.shape.rope_theta),
                labels=packed.labels,
                select=lambda hidden: hidden[packed.score_index, 0],  # [M, hidden]
                to_response=to_packed_response,
            )
        # context parallelism: this rank's chunks of each sequence (padded to 2 x CP chunks)
        split = self.context.split_packed(packed.cu_seqlens, self._multiple())
        padded_ids = packed.input_ids.new_zeros(split.padded)
        padded_ids[split.real] = packed.input_ids[0]
        scored = torch.full((split.padded,), -1, dtype=torch.long, device=self.device)
        scored[split.real[packed.score_index]] = torch.arange(
            len(packed.labels), device=self.device
        )
        share = self.context.share(scored[split.local], len(packed.labels))
        return _Rows(
            inputs=(padded_ids[split.local].unsqueeze(0), split.positions.unsqueeze(0), None),
            layout=context_packed_layout(
                split, self.shape.head_dim, self.shape.rope_theta, self.context.group
            ),
            labels=packed.labels[share.slots],
            select=lambda hidden: hidden[share.rows, 0],  # [this rank's scored, hidden]
            to_response=to_packed_response,
            spread=share.spread,
        )

    def _padded_rows(self, micro: Batch) -> _Rows:
        trimmed, _, response_attention = model_inputs(micro, self.device)
        kept = trimmed.kept_response

        def to_padded_response(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
            ent = scores[1] if len(scores) > 1 else None
            return pad_to_response(scores[0], ent, response_attention, kept)

        theta, head_dim = self.shape.rope_theta, self.shape.head_dim
        if self.context is None:
            ids, positions, padding = pad_columns(
                trimmed.input_ids, trimmed.position_ids, trimmed.attention_mask, self._multiple()
            )
            return _Rows(
                inputs=(ids, positions, attention_mask(padding)),
                layout=padded_layout(positions, head_dim, theta),
                labels=trimmed.labels,
                # [b, kept, hidden]
                select=lambda hidden: hidden[-(kept + 1) : -1].transpose(0, 1),
                to_response=to_padded_response,
            )
        # context parallelism: this rank's columns (padded to 2 x CP chunks) over every rank's
        width = trimmed.input_ids.shape[1]
        split = self.context.split_padded(width, self._multiple())
        padding = F.pad(trimmed.attention_mask, (0, split.padded - width))
        masked = attention_mask(padding)[:, :, split.local][..., split.gathered]
        positions = split.pad(trimmed.position_ids)
        slots = split.local - (width - kept - 1)  # the columns that predict a response token
        slots[(slots < 0) | (slots >= kept)] = -1
        share = self.context.share(slots, kept)
        return _Rows(
            inputs=(split.pad(trimmed.input_ids), positions, masked),
            layout=padded_layout(positions, head_dim, theta, KeyValueGather(self.context.group)),
            labels=trimmed.labels[:, share.slots],
            # [b, this rank's scored, hidden]
            select=lambda hidden: hidden[share.rows].transpose(0, 1),
            to_response=to_padded_response,
            spread=share.spread,
        )

    def _score(
        self,
        hidden: torch.Tensor,
        output_layer: Any,
        output_weight: Any,
        labels: torch.Tensor,
        temperature: float,
        entropy: EntropyMode,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.paths.fused and self.paths.vocab_split:
            return vocab_parallel_linear_log_prob(
                hidden.to(self.compute_dtype),
                output_layer.weight if output_weight is None else output_weight,
                labels,
                vocab_size=self.shape.vocab_size,
                temperature=temperature,
                entropy=entropy,
                group=self.tp_group,
            )
        if self.paths.fused:
            weight = output_layer.weight if output_weight is None else output_weight
            log_prob, ent = linear_log_prob(
                hidden.to(self.compute_dtype),
                weight,
                labels,
                temperature,
                with_entropy=entropy != EntropyMode.NONE,
                compiled=self.paths.compiled,
            )
            if ent is not None and entropy == EntropyMode.DETACHED:
                ent = ent.detach()
            return log_prob, ent
        if self.paths.sequence_parallel:  # gathered already: not again by the output layer
            weight = output_layer.weight if output_weight is None else output_weight
            logits = F.linear(hidden, weight)
        else:
            logits, _ = output_layer(hidden, weight=output_weight)
        return vocab_parallel_logprob_entropy(
            logits,
            labels,
            vocab_size=self.shape.vocab_size,
            temperature=temperature,
            entropy=entropy,
            group=self.tp_group,
        )
