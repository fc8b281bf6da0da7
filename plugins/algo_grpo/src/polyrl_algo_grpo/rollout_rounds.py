"""Batch plumbing for a step that generates in several rounds: prompts drawn round by round,
and the rows of several rounds joined into one batch.

Token columns (``input_ids``, ``attention_mask``, ``position_ids``) hold ``[prompt | response]``
with the prompt LEFT-padded to its round's widest prompt; the engines find the boundary as
``input_ids`` width minus ``responses`` width. Two rounds almost never have the same prompt
width, so joining them with a plain right-padding concatenation would shift every prompt of the
narrower round into the response columns. Here prompts are first left-padded to the widest
round, then the response columns are right-padded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from polyrl.api import Batch

TOKEN_COLUMNS = ("input_ids", "attention_mask", "position_ids")


def prompt_width(batch: Batch) -> int:
    """Columns of ``input_ids`` that hold the (left-padded) prompt."""
    responses = batch["responses"].shape[1] if "responses" in batch else 0
    return int(batch["input_ids"].shape[1]) - responses


def left_pad_prompts(batch: Batch, columns: int, pad_token_id: int) -> Batch:
    """``batch`` with ``columns`` more padding columns on the left of its token columns (pad id
    in ``input_ids``, 0 in the attention mask and positions)."""
    if columns <= 0:
        return batch
    tensors = dict(batch.tensors)
    for key in TOKEN_COLUMNS:
        if key in tensors:
            value = tensors[key]
            fill = pad_token_id if key == "input_ids" else 0
            padding = torch.full((value.shape[0], columns), fill, dtype=value.dtype)
            tensors[key] = torch.cat([padding, value], dim=1)
    return Batch(tensors, dict(batch.non_tensors), dict(batch.meta))


def concat_rounds(parts: Sequence[Batch], pad_token_id: int) -> Batch:
    """The rows of ``parts`` (prompt batches, or generated batches of one pipeline) in order,
    prompts aligned on the left and responses on the right."""
    parts = [part for part in parts if len(part)]
    if not parts:
        return Batch()
    widest = max(prompt_width(part) for part in parts)
    aligned = [left_pad_prompts(p, widest - prompt_width(p), pad_token_id) for p in parts]
    return Batch.concat(aligned, {"input_ids": pad_token_id, "responses": pad_token_id})


class PromptStream:
    """The prompts of successive generation rounds: the step's own batch first, then prompts
    drawn from the data loader (``draw(count)``, :attr:`polyrl.step.StepContext.next_prompts`)
    whenever a round needs more than are left. A round of ``data.gen_batch_size`` prompts may
    thus be smaller or larger than the step's ``data.train_batch_size`` batch."""

    def __init__(self, first: Batch, draw: Callable[[int], Batch], pad_token_id: int) -> None:
        self.pending = first
        self.draw = draw
        self.pad_token_id = pad_token_id

    def take(self, count: int) -> Batch:
        """The next ``count`` prompts."""
        if len(self.pending) < count:
            drawn = self.draw(count - len(self.pending))
            self.pending = concat_rounds([self.pending, drawn], self.pad_token_id)
        taken = self.pending.slice(0, count)
        self.pending = self.pending.slice(count, len(self.pending))
        return taken
