"""Splitting a rank's rows into micro-batches, and cutting padding out of each one.

Rows are ``[left-padded prompt | right-padded response]``. A micro-batch only needs the columns
that hold a real token in at least one of its rows, so we cut the all-padding columns on both
sides (:func:`trim_columns`). Grouping rows of similar length (the token-budget partition sorts
them) makes that cut large.

FSDP runs collectives inside every forward and backward, so all ranks must run the same number
of micro-batches; :func:`equalize_count` splits micro-batches (useful work) and, only when a rank
has too few rows, tells the engine how many zero-weight dummy passes to add.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from polyrl.api import ConfigError

if TYPE_CHECKING:
    from polyrl.api import Batch
    from polyrl_engine_kit.config import EngineSettings


@dataclass(frozen=True)
class RowLengths:
    """Real (non-padding) prompt and response token counts per row, and the column split."""

    prompt: list[int]
    response: list[int]
    prompt_width: int

    @property
    def total(self) -> list[int]:
        return [p + r for p, r in zip(self.prompt, self.response)]


def row_lengths(attention_mask: torch.Tensor, response_width: int) -> RowLengths:
    """Count real tokens of each row's prompt part and response part."""
    prompt_width = attention_mask.shape[1] - response_width
    mask = attention_mask.bool()
    prompt = mask[:, :prompt_width].sum(dim=1).tolist()
    response = mask[:, prompt_width:].sum(dim=1).tolist()
    return RowLengths(prompt=prompt, response=response, prompt_width=prompt_width)


def fixed_partition(num_rows: int, size: int) -> list[list[int]]:
    """Consecutive groups of ``size`` rows (the last may be shorter)."""
    return [list(range(start, min(start + size, num_rows))) for start in range(0, num_rows, size)]


def token_budget_partition(lengths: RowLengths, budget: int, key: str) -> list[list[int]]:
    """Groups whose padded size (rows x (longest prompt + longest response)) fits ``budget``.

    Rows are taken longest first so that neighbours have similar lengths and little padding is
    left after :func:`trim_columns`. ``key`` names the config key for the error message.
    """
    order = sorted(range(len(lengths.prompt)), key=lambda i: (-lengths.total[i], i))
    groups: list[list[int]] = []
    current: list[int] = []
    max_prompt = max_response = 0
    for row in order:
        prompt, response = lengths.prompt[row], lengths.response[row]
        if prompt + response > budget:
            raise ConfigError(
                f"a row holds {prompt + response} tokens but {key}={budget}; raise {key} to at "
                f"least the longest prompt + response (max_prompt_length + max_response_length)"
            )
        new_prompt, new_response = max(max_prompt, prompt), max(max_response, response)
        if current and (len(current) + 1) * (new_prompt + new_response) > budget:
            groups.append(current)
            current, new_prompt, new_response = [], prompt, response
        current.append(row)
        max_prompt, max_response = new_prompt, new_response
    if current:
        groups.append(current)
    return groups


def packed_budget_partition(totals: list[int], budget: int, key: str) -> list[list[int]]:
    """Groups whose real tokens (summed: a packed micro-batch carries no padding) fit ``budget``.

    First-fit decreasing: rows longest first, each into the first group with room, so that few
    groups are needed; every group lists its rows in ascending order. ``key`` names the config
    key for the error message.
    """
    order = sorted(range(len(totals)), key=lambda i: (-totals[i], i))
    groups: list[list[int]] = []
    used: list[int] = []
    for row in order:
        if totals[row] > budget:
            raise ConfigError(
                f"a row holds {totals[row]} tokens but {key}={budget}; raise {key} to at least "
                f"the longest prompt + response (max_prompt_length + max_response_length)"
            )
        slot = next((g for g, size in enumerate(used) if size + totals[row] <= budget), None)
        if slot is None:
            groups.append([])
            used.append(0)
            slot = len(groups) - 1
        groups[slot].append(row)
        used[slot] += totals[row]
    return [sorted(group) for group in groups]


def equalize_count(groups: list[list[int]], target: int) -> tuple[list[list[int]], int]:
    """Split the largest groups until there are ``target`` of them; return the groups and the
    number of dummy micro-batches still needed when every group is a single row."""
    groups = [list(g) for g in groups if g]
    while len(groups) < target:
        largest = max(range(len(groups)), key=lambda i: len(groups[i]), default=None)
        if largest is None or len(groups[largest]) < 2:
            break
        group = groups.pop(largest)
        half = (len(group) + 1) // 2
        groups[largest:largest] = [group[:half], group[half:]]
    return groups, max(0, target - len(groups))


def plan_micro_batches(
    batch: Batch,
    settings: EngineSettings,
    training: bool,
    packed: bool = False,
    sequence_parallel: int = 1,
    split_by: str = "ulysses_sequence_parallel_size",
) -> list[list[int]]:
    """This rank's row groups: by token budget (``use_dynamic_bsz``) or by row count, with the
    training or the log-prob keys; the same plan for every engine built on these settings.
    ``packed``: the engine packs each micro-batch (no padding), so a budget counts real tokens.
    ``sequence_parallel``: ranks that split each micro-batch (Ulysses, or Megatron's context
    parallelism: ``split_by`` names the key, for the message), each holding its share of the
    per-GPU budget, so the micro-batch may hold that many times the budget (as in verl)."""
    s = settings
    if s.use_dynamic_bsz:
        budget = s.max_token_len if training else s.log_prob_max_token_len
        key = "ppo_max_token_len_per_gpu" if training else "log_prob_max_token_len_per_gpu"
        key = f"actor_rollout_ref.actor.{key}"
        if sequence_parallel > 1:
            budget *= sequence_parallel
            key = f"{key} x {split_by} {sequence_parallel}"
        lengths = row_lengths(batch["attention_mask"], batch["responses"].shape[1])
        if packed:
            return packed_budget_partition(lengths.total, budget, key)
        return token_budget_partition(lengths, budget, key)
    size = s.micro_batch_size if training else s.log_prob_micro_batch_size
    return fixed_partition(len(batch), size)


def equalize_over_ranks(
    groups: list[list[int]], device: torch.device
) -> tuple[list[list[int]], int]:
    """:func:`equalize_count` to the largest count of any rank (collective): for an engine whose
    forward and backward run collectives that every rank must join. ``device`` is where this
    rank's tensors live; the count travels on the CPU unless the backend is NCCL."""
    on = device if dist.get_backend() == "nccl" else torch.device("cpu")
    count = torch.tensor([len(groups)], dtype=torch.long, device=on)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return equalize_count(groups, int(count.item()))


@dataclass(frozen=True)
class TrimmedInputs:
    """Model inputs of one micro-batch with all-padding columns removed."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    labels: torch.Tensor  # the kept response tokens, [b, kept_response]
    kept_response: int  # response columns kept (from the left of the response part)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counting real tokens only (0 at the first real token), as HF generate does."""
    return (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)


def trim_columns(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor | None,
    responses: torch.Tensor,
) -> TrimmedInputs:
    """Drop leading columns that are padding in every row and trailing response columns that
    are padding in every row. Keeps at least the last prompt column (it predicts the first
    response token) and one response column."""
    if position_ids is None:
        position_ids = position_ids_from_mask(attention_mask)
    response_width = responses.shape[1]
    prompt_width = input_ids.shape[1] - response_width
    if prompt_width < 1 or response_width < 1:
        raise ValueError(
            f"input_ids has {input_ids.shape[1]} columns and responses {response_width}: "
            f"need at least one prompt and one response column"
        )
    real_columns = attention_mask.bool().any(dim=0).nonzero().flatten()
    if real_columns.numel():
        first, last = int(real_columns[0]), int(real_columns[-1])
    else:
        first, last = prompt_width - 1, prompt_width
    start = min(first, prompt_width - 1)
    stop = max(last + 1, prompt_width + 1)
    kept = stop - prompt_width
    return TrimmedInputs(
        input_ids=input_ids[:, start:stop],
        attention_mask=attention_mask[:, start:stop],
        position_ids=position_ids[..., start:stop],
        labels=responses[:, :kept],
        kept_response=kept,
    )
