"""verl-format prompt datasets read from parquet with pyarrow.

A row has ``data_source`` (str), the prompt (column ``data.prompt_key``, default ``prompt``: a list
of ``{"role", "content"}`` chat messages), optionally ``ability``, ``reward_model`` (a struct with
``ground_truth`` and usually ``style``) and optionally ``extra_info`` (a struct/dict). These are the
files verl's ``examples/data_preprocess`` scripts write, so they load unchanged.

Every row is checked when the dataset is built: a bad file fails at start-up with its file, row
and column named, not minutes into a run.
"""

from __future__ import annotations

import json
import logging
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polyrl.config.schema import DataConfig
from polyrl.data.chat_template import template_kwargs
from polyrl.data.custom_dataset import custom_dataset_class, custom_records
from polyrl.data.unteachable import settle_unteachable
from polyrl.errors import DataError

logger = logging.getLogger(__name__)

TRUNCATION_MODES = ("error", "left", "right")


@dataclass
class PromptItem:
    """One prompt ready for generation. ``index`` is its position in the dataset's files (before
    filtering), unique within the dataset."""

    input_ids: list[int]
    data_source: str
    ground_truth: Any
    extra_info: dict[str, Any]
    raw_prompt: str
    index: int
    ability: str | None = None
    messages: list[dict[str, str]] = field(default_factory=list)


def _cfg(node: Any, key: str, default: Any) -> Any:
    if node is None:
        return default
    value = node.get(key, default) if isinstance(node, Mapping) else getattr(node, key, default)
    return default if value is None else value


def read_parquet(file: str, what: str) -> Any:
    """The ``pyarrow.Table`` of the parquet file ``file`` (``~`` expanded); a missing or
    unreadable file is a :class:`DataError` naming it (``what``: the kind of file, e.g. "data")."""
    import pyarrow.parquet as pq

    path = Path(file).expanduser()
    if not path.is_file():
        raise DataError(f"{file}: no such {what} file")
    try:
        # one file: ParquetFile reads it without pq.read_table's dataset layer, whose import
        # (pandas with it) costs a run's driver more than reading a prompt file does
        return pq.ParquetFile(path).read()
    except Exception as exc:
        raise DataError(
            f"{file}: not a readable parquet file ({type(exc).__name__}: {exc})"
        ) from exc


class RLDataset:
    """Prompts of one or more verl-format parquet files, tokenized.

    ``data_cfg`` is the ``data`` config node (or any object/dict with its keys):
    ``prompt_key``, ``reward_fn_key`` (the column naming the scorer, default ``data_source``),
    ``max_prompt_length``, ``filter_overlong_prompts``, ``truncation``
    (``error`` | ``left`` | ``right``), ``apply_chat_template`` (with
    ``apply_chat_template_kwargs`` passed to the template), ``max_unteachable_share`` and
    ``custom_cls`` (verl's custom dataset class, whose items replace the files' rows:
    :mod:`polyrl.data.custom_dataset`).

    With ``has_scorer`` (see :func:`polyrl.data.unteachable.scorer_check`), rows whose
    ``data_source`` it rejects cannot teach: they are dropped with a count, or refused above
    ``data.max_unteachable_share`` (:func:`polyrl.data.unteachable.settle_unteachable`).
    """

    def __init__(
        self,
        files: str | Sequence[str],
        tokenizer: Any,
        data_cfg: Any = None,
        *,
        has_scorer: Callable[[str], bool] | None = None,
    ) -> None:
        self.files = [str(files)] if isinstance(files, str | Path) else [str(f) for f in files]
        if not self.files:
            raise DataError("no data files given: set data.train_files / data.val_files")
        self.tokenizer = tokenizer
        self.prompt_key = str(_cfg(data_cfg, "prompt_key", "prompt"))
        # verl's data.reward_fn_key: the column whose value picks the scorer (data_source).
        self.source_key = str(_cfg(data_cfg, "reward_fn_key", "data_source"))
        self.max_prompt_length = int(_cfg(data_cfg, "max_prompt_length", 512))
        self.filter_overlong = bool(_cfg(data_cfg, "filter_overlong_prompts", True))
        self.truncation = str(_cfg(data_cfg, "truncation", "error"))
        self.apply_chat_template = bool(_cfg(data_cfg, "apply_chat_template", True))
        self.template_kwargs = template_kwargs(data_cfg)
        max_share = float(_cfg(data_cfg, "max_unteachable_share", DataConfig.max_unteachable_share))
        self.has_scorer = has_scorer
        self.data_cfg = data_cfg
        # verl's data.custom_cls: the user's dataset class yields the rows (custom_dataset.py)
        self.custom_class = custom_dataset_class(data_cfg)
        self.unteachable: Counter[str] = Counter()
        if self.truncation not in TRUNCATION_MODES:
            raise DataError(
                f"data.truncation={self.truncation!r}: use one of {', '.join(TRUNCATION_MODES)}"
            )
        if self.apply_chat_template and not getattr(tokenizer, "chat_template", None):
            raise DataError(
                "data.apply_chat_template=true but the tokenizer has no chat template; "
                "use a chat/instruct model's tokenizer or set data.apply_chat_template=false"
            )
        self.items: list[PromptItem] = []
        self.filtered = 0
        self.truncated = 0
        offset = 0
        for file in self.files:
            rows = self._read(file)
            for row_number, row in enumerate(rows):
                item = self._build(file, row_number, row, offset + row_number)
                if item is not None:
                    self.items.append(item)
            offset += len(rows)
        settle_unteachable(self.unteachable, offset, max_share, self.files)
        if self.filtered:
            message = (
                f"polyrl: filtered {self.filtered} of {offset} prompts longer than "
                f"data.max_prompt_length={self.max_prompt_length} tokens ({', '.join(self.files)})"
            )
            logger.warning(message)
            print(message, file=sys.stderr)
        if self.truncated:
            logger.warning(
                "truncated %d prompts to %d tokens (%s side)",
                self.truncated,
                self.max_prompt_length,
                self.truncation,
            )
        if not self.items:
            raise DataError(
                f"no prompts left in {', '.join(self.files)} ({offset} rows, {self.filtered} "
                f"longer than data.max_prompt_length={self.max_prompt_length}); raise "
                "data.max_prompt_length or use other files"
            )

    # ---- access ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, position: int) -> PromptItem:
        return self.items[position]

    @property
    def pad_token_id(self) -> int:
        """The tokenizer's pad id, else its EOS id, else 0 (left padding is masked anyway)."""
        for name in ("pad_token_id", "eos_token_id"):
            value = getattr(self.tokenizer, name, None)
            if isinstance(value, int):
                return value
        return 0

    # ---- reading and checking -------------------------------------------------------------------
    def _read(self, file: str) -> list[dict[str, Any]]:
        if self.custom_class is not None:
            return custom_records(
                self.custom_class, file, self.tokenizer, self.data_cfg, self.prompt_key
            )
        table = read_parquet(file, "data")
        columns = set(table.column_names)
        required = (self.source_key, self.prompt_key, "reward_model")
        missing = [c for c in required if c not in columns]
        if missing:
            hint = ""
            if self.prompt_key in missing:
                hint += f" (the prompt column is data.prompt_key={self.prompt_key!r})"
            if self.source_key in missing and self.source_key != "data_source":
                hint += f" (the scorer column is data.reward_fn_key={self.source_key!r})"
            raise DataError(
                f"{file}: missing column(s) {', '.join(repr(m) for m in missing)}{hint}; "
                f"it has {sorted(columns)}. A verl-format file needs {self.source_key}, "
                f"{self.prompt_key} (list of {{role, content}}), reward_model "
                "({style, ground_truth}) and optionally ability and extra_info."
            )
        return table.to_pylist()

    def _build(self, file: str, row: int, record: dict[str, Any], index: int) -> PromptItem | None:
        def bad(column: str, expected: str, got: Any) -> DataError:
            shown = repr(got)
            if len(shown) > 120:
                shown = shown[:117] + "..."
            return DataError(
                f"{file}: row {row} (0-based), column {column!r}: expected {expected}, got {shown}"
            )

        data_source = record.get(self.source_key)
        if not isinstance(data_source, str) or not data_source:
            raise bad(self.source_key, "a non-empty string", data_source)
        if self.has_scorer is not None and not self.has_scorer(data_source):
            self.unteachable[f"no scorer for {self.source_key} {data_source!r}"] += 1
            return None

        messages = record.get(self.prompt_key)
        if isinstance(messages, str):
            # Some tools store the chat as JSON text; accept it when it parses to messages.
            try:
                messages = json.loads(messages)
            except json.JSONDecodeError:
                raise bad(self.prompt_key, "a list of {role, content} messages", messages) from None
        if not isinstance(messages, list) or not messages:
            raise bad(self.prompt_key, "a non-empty list of {role, content} messages", messages)
        for position, message in enumerate(messages):
            if (
                not isinstance(message, Mapping)
                or not isinstance(message.get("role"), str)
                or not isinstance(message.get("content"), str)
            ):
                raise bad(
                    f"{self.prompt_key}[{position}]",
                    "a message {role: str, content: str}",
                    message,
                )
        messages = [{"role": m["role"], "content": m["content"]} for m in messages]

        reward_model = record.get("reward_model")
        if not isinstance(reward_model, Mapping) or "ground_truth" not in reward_model:
            raise bad("reward_model", "a struct {style, ground_truth}", reward_model)
        ground_truth = reward_model["ground_truth"]
        if ground_truth is None:
            raise bad("reward_model.ground_truth", "a value (string, number or list)", None)

        extra_info = record.get("extra_info")
        if isinstance(extra_info, str):
            try:
                extra_info = json.loads(extra_info)
            except json.JSONDecodeError:
                raise bad("extra_info", "a struct/dict (or JSON object text)", extra_info) from None
        if extra_info is None:
            extra_info = {}
        if not isinstance(extra_info, Mapping):
            raise bad("extra_info", "a struct/dict", extra_info)

        ability = record.get("ability")
        if ability is not None and not isinstance(ability, str):
            raise bad("ability", "a string", ability)

        text = self._render(messages)
        ids = self._tokenize(text)
        if len(ids) > self.max_prompt_length:
            if self.filter_overlong:
                self.filtered += 1
                return None
            if self.truncation == "error":
                raise DataError(
                    f"{file}: row {row} (0-based), column {self.prompt_key!r}: the prompt has "
                    f"{len(ids)} tokens, more than data.max_prompt_length="
                    f"{self.max_prompt_length}. Raise data.max_prompt_length, set "
                    "data.filter_overlong_prompts=true, or data.truncation=left|right."
                )
            self.truncated += 1
            cut = self.max_prompt_length
            ids = ids[-cut:] if self.truncation == "left" else ids[:cut]
        return PromptItem(
            input_ids=ids,
            data_source=data_source,
            ground_truth=ground_truth,
            extra_info=dict(extra_info),
            raw_prompt=text,
            index=index,
            ability=ability,
            messages=messages,
        )

    def _render(self, messages: list[dict[str, str]]) -> str:
        if self.apply_chat_template:
            return self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, **self.template_kwargs
            )
        return "\n".join(m["content"] for m in messages)

    def _tokenize(self, text: str) -> list[int]:
        # A rendered chat template already holds the model's special tokens (BOS ...).
        encoded = self.tokenizer(text, add_special_tokens=not self.apply_chat_template)
        ids = encoded["input_ids"]
        return [int(i) for i in ids]


def collate(items: Sequence[PromptItem], pad_token_id: int) -> Any:
    """A :class:`polyrl.batch.Batch` of prompts, left-padded (generation appends on the right).

    Tensors: ``input_ids``, ``attention_mask`` (1 on tokens), ``position_ids`` (0 at each prompt's
    first real token, 0 on padding). Non-tensors: ``data_source``, ``ground_truth``,
    ``extra_info``, ``raw_prompt``, ``index``, ``messages`` (the chat before the template: what
    a multi-turn environment starts from).
    """
    import torch

    from polyrl.batch import Batch

    if not items:
        raise DataError("cannot collate an empty list of prompts")
    width = max(len(item.input_ids) for item in items)
    input_ids = torch.full((len(items), width), int(pad_token_id), dtype=torch.long)
    attention_mask = torch.zeros((len(items), width), dtype=torch.long)
    for row, item in enumerate(items):
        n = len(item.input_ids)
        input_ids[row, width - n :] = torch.tensor(item.input_ids, dtype=torch.long)
        attention_mask[row, width - n :] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return Batch(
        tensors={
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
        },
        non_tensors={
            "data_source": [item.data_source for item in items],
            "ground_truth": [item.ground_truth for item in items],
            "extra_info": [item.extra_info for item in items],
            "raw_prompt": [item.raw_prompt for item in items],
            "index": [item.index for item in items],
            "messages": [item.messages for item in items],
        },
    )
