"""Preference pairs (a prompt, a chosen and a rejected response) read from parquet with pyarrow,
and their batches, for offline preference optimisation (DPO, IPO).

One row per pair. Accepted layouts, so that files written by other tools load unchanged:

- polyrl's: the prompt (column ``data.prompt_key``, default ``prompt``) as chat messages
  ``[{role, content}]``, ``chosen`` and ``rejected`` as the response texts;
- TRL's standard format: ``prompt``, ``chosen`` and ``rejected`` as plain text (no chat
  template: prompt and response are joined as they are);
- TRL's conversational format: the prompt as messages, ``chosen`` and ``rejected`` each a list
  of one assistant message;
- TRL's implicit prompt: no prompt column; ``chosen`` and ``rejected`` are whole conversations
  that share every message but the last (the responses).

A response is its text's tokens followed by the tokenizer's EOS token, as a sampled response
ends, cut to ``data.max_response_length``. Prompts longer than ``data.max_prompt_length`` follow
``data.filter_overlong_prompts`` and ``data.truncation``, as prompts of RL data do. Every row is
checked when the dataset is built: a bad file fails at start-up naming its file, row and column.
A pair whose chosen and rejected texts are the same, or one of them empty, has nothing to teach
(the loss stays at ln 2): such pairs are dropped with a count, and refused above
``data.max_unteachable_share`` of the rows.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polyrl.api import (
    TRUNCATION_MODES,
    DataError,
    PromptLoader,
    read_parquet,
    settle_unteachable,
    template_kwargs,
)

#: The response columns of a preference file, in a pair's row order (chosen first).
RESPONSE_COLUMNS = ("chosen", "rejected")

#: The keys of a batch of pairs (:func:`collate_pairs`): what a preference step starts from.
PREFERENCE_BATCH_KEYS = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "responses",
    "response_mask",
    "index",
)

Prompt = str | list[dict[str, str]]


@dataclass
class PreferencePair:
    """One pair, tokenized. ``index``: its row in the dataset's files (before filtering)."""

    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]
    index: int


class _BadValue(ValueError):
    """A value of a row that is not what its column needs."""

    def __init__(self, column: str, expected: str, got: Any) -> None:
        shown = repr(got)
        super().__init__(
            f"column {column!r}: expected {expected}, got "
            f"{shown if len(shown) <= 120 else shown[:117] + '...'}"
        )


def _messages(value: Any, column: str) -> list[dict[str, str]]:
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise _BadValue(column, "a non-empty list of {role, content} messages", value)
    for position, message in enumerate(value):
        if not (
            isinstance(message, Mapping)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            raise _BadValue(f"{column}[{position}]", "a message {role: str, content: str}", message)
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _response_text(value: Any, column: str) -> str:
    """A response given as text, or as a list of one (assistant) message."""
    if isinstance(value, str):
        return value
    messages = _messages(value, column)
    if len(messages) != 1:
        raise _BadValue(column, "the response text, or a list of one assistant message", value)
    return messages[0]["content"]


def split_pair(record: Mapping[str, Any], prompt_key: str) -> tuple[Prompt, str, str]:
    """``(prompt, chosen text, rejected text)`` of one row in any accepted layout; the prompt is
    plain text or chat messages."""
    chosen, rejected = record.get("chosen"), record.get("rejected")
    prompt = record.get(prompt_key)
    if prompt is None:  # TRL's implicit prompt: the conversations' shared messages
        chosen, rejected = _messages(chosen, "chosen"), _messages(rejected, "rejected")
        if len(chosen) < 2 or chosen[:-1] != rejected[:-1]:
            raise _BadValue(
                "chosen",
                f"(without a {prompt_key!r} column) a conversation that shares every message "
                "but the last with 'rejected'",
                chosen,
            )
        prompt, chosen, rejected = chosen[:-1], chosen[-1:], rejected[-1:]
    elif isinstance(prompt, str):
        if not prompt:
            raise _BadValue(prompt_key, "a non-empty prompt", prompt)
    else:
        prompt = _messages(prompt, prompt_key)
    return prompt, _response_text(chosen, "chosen"), _response_text(rejected, "rejected")


def unteachable_pair(chosen: str, rejected: str) -> str | None:
    """Why a pair with these response texts has no preference to learn, or None."""
    if not chosen.strip() or not rejected.strip():
        return "chosen or rejected is empty"
    if chosen == rejected:
        return "chosen and rejected are identical"
    return None


class PreferenceDataset:
    """Pairs of one or more parquet files, tokenized. ``data_cfg`` is the ``data`` config node:
    ``prompt_key``, ``max_prompt_length``, ``max_response_length``,
    ``filter_overlong_prompts``, ``truncation``, ``apply_chat_template`` and
    ``max_unteachable_share``."""

    def __init__(self, files: str | Sequence[str], tokenizer: Any, data_cfg: Any) -> None:
        self.files = [str(files)] if isinstance(files, str | Path) else [str(f) for f in files]
        if not self.files:
            raise DataError("no preference files given: set data.train_files / data.val_files")
        self.tokenizer = tokenizer
        self.prompt_key = str(data_cfg.prompt_key)
        self.max_prompt_length = int(data_cfg.max_prompt_length)
        self.max_response_length = int(data_cfg.max_response_length)
        self.filter_overlong = bool(data_cfg.filter_overlong_prompts)
        self.truncation = str(data_cfg.truncation)
        self.apply_chat_template = bool(data_cfg.apply_chat_template)
        self.template_kwargs = template_kwargs(data_cfg)
        max_share = float(data_cfg.max_unteachable_share)
        if self.truncation not in TRUNCATION_MODES:
            raise DataError(
                f"data.truncation={self.truncation!r}: use one of {', '.join(TRUNCATION_MODES)}"
            )
        if not isinstance(tokenizer.eos_token_id, int):
            raise DataError("the tokenizer has no EOS token, which ends every response of a pair")
        self.pairs: list[PreferencePair] = []
        self.filtered = self.cut_responses = 0
        self.unteachable: Counter[str] = Counter()
        rows_seen = 0
        for file in self.files:
            records = self._read(file)
            for row, record in enumerate(records):
                try:
                    pair = self._build(record, rows_seen + row)
                except _BadValue as exc:
                    raise DataError(f"{file}: row {row} (0-based), {exc}") from None
                if pair is not None:
                    self.pairs.append(pair)
            rows_seen += len(records)
        settle_unteachable(self.unteachable, rows_seen, max_share, self.files)
        self._report(rows_seen)

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, position: int) -> PreferencePair:
        return self.pairs[position]

    @property
    def pad_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad) if isinstance(pad, int) else int(self.tokenizer.eos_token_id)

    def _read(self, file: str) -> list[dict[str, Any]]:
        table = read_parquet(file, "preference")
        missing = [c for c in RESPONSE_COLUMNS if c not in table.column_names]
        if missing:
            raise DataError(
                f"{file}: missing column(s) {', '.join(missing)}; it has "
                f"{sorted(table.column_names)}. A preference file has {self.prompt_key!r} "
                "(data.prompt_key: chat messages or text; optional when chosen/rejected are "
                "whole conversations), 'chosen' and 'rejected'"
            )
        return table.to_pylist()

    def _build(self, record: dict[str, Any], index: int) -> PreferencePair | None:
        prompt, chosen, rejected = split_pair(record, self.prompt_key)
        why = unteachable_pair(chosen, rejected)
        if why:
            self.unteachable[why] += 1
            return None
        prompt_ids = self._prompt_ids(prompt)
        if len(prompt_ids) > self.max_prompt_length:
            if self.filter_overlong:
                self.filtered += 1
                return None
            if self.truncation == "error":
                raise _BadValue(
                    self.prompt_key,
                    f"at most data.max_prompt_length={self.max_prompt_length} tokens (or set "
                    "data.filter_overlong_prompts=true, or data.truncation=left|right)",
                    f"{len(prompt_ids)} tokens",
                )
            cut = self.max_prompt_length
            prompt_ids = prompt_ids[-cut:] if self.truncation == "left" else prompt_ids[:cut]
        return PreferencePair(
            prompt_ids, self._response_ids(chosen), self._response_ids(rejected), index
        )

    def _prompt_ids(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return list(self.tokenizer(prompt)["input_ids"])
        if not self.apply_chat_template:
            text = "\n".join(m["content"] for m in prompt)
            return list(self.tokenizer(text)["input_ids"])
        if not getattr(self.tokenizer, "chat_template", None):
            raise DataError(
                "the preference prompts are chat messages and data.apply_chat_template=true, but "
                "the tokenizer has no chat template; use a chat model's tokenizer or set "
                "data.apply_chat_template=false"
            )
        text = self.tokenizer.apply_chat_template(
            prompt, add_generation_prompt=True, tokenize=False, **self.template_kwargs
        )
        # The rendered template already holds the model's special tokens (BOS ...).
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _response_ids(self, text: str) -> list[int]:
        ids = [
            *self.tokenizer(text, add_special_tokens=False)["input_ids"],
            self.tokenizer.eos_token_id,
        ]
        if len(ids) > self.max_response_length:
            self.cut_responses += 1
            ids = ids[: self.max_response_length]
        return [int(i) for i in ids]

    def _report(self, rows: int) -> None:
        files = ", ".join(self.files)
        if not self.pairs:
            raise DataError(
                f"no pairs left in {files} ({rows} rows, {self.filtered} with prompts longer than "
                f"data.max_prompt_length={self.max_prompt_length}); raise it or use other files"
            )
        if self.filtered:
            print(
                f"polyrl: dropped {self.filtered} of {rows} pairs whose prompt is longer than "
                f"data.max_prompt_length={self.max_prompt_length} tokens ({files})",
                file=sys.stderr,
            )
        if self.cut_responses:
            print(
                f"polyrl: cut {self.cut_responses} responses to data.max_response_length="
                f"{self.max_response_length} tokens ({files})",
                file=sys.stderr,
            )


def collate_pairs(pairs: Sequence[PreferencePair], pad_token_id: int) -> Any:
    """A :class:`polyrl.api.Batch` with two rows per pair: row ``2i`` is pair ``i``'s chosen
    response, row ``2i + 1`` its rejected one, both after the same prompt.

    Laid out as generated rows are: ``input_ids`` = left-padded prompt + right-padded response,
    ``attention_mask``, ``position_ids`` (0 at the first real token), ``responses`` and
    ``response_mask``; non-tensor ``index`` (the pair's row in its files, on both rows).
    """
    import torch

    from polyrl.api import Batch

    if not pairs:
        raise DataError("cannot collate an empty list of preference pairs")
    rows = [(p.prompt_ids, response) for p in pairs for response in (p.chosen_ids, p.rejected_ids)]
    prompt_width = max(len(prompt) for prompt, _ in rows)
    response_width = max(len(response) for _, response in rows)
    input_ids = torch.full((len(rows), prompt_width + response_width), int(pad_token_id))
    attention_mask = torch.zeros_like(input_ids)
    for row, (prompt, response) in enumerate(rows):
        start, stop = prompt_width - len(prompt), prompt_width + len(response)
        input_ids[row, start:stop] = torch.tensor(prompt + response)
        attention_mask[row, start:stop] = 1
    return Batch(
        tensors={
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "responses": input_ids[:, prompt_width:].clone(),
            "response_mask": attention_mask[:, prompt_width:].clone(),
        },
        non_tensors={"index": [p.index for p in pairs for _ in RESPONSE_COLUMNS]},
    )


class PreferenceLoader(PromptLoader):
    """Batches of ``batch_size`` pairs (``2 x batch_size`` rows, see :func:`collate_pairs`),
    with the prompt loader's epoch order and exact resume."""

    def next_batch(self, count: int | None = None) -> Any:
        pairs = [self.dataset[i] for i in self.next_indices(count)]
        return collate_pairs(pairs, self.dataset.pad_token_id)
