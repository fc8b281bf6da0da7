"""verl's custom dataset class: ``data.custom_cls.path`` / ``data.custom_cls.name``.

verl builds the class (a ``torch.utils.data.Dataset`` subclass, loaded as
:mod:`polyrl.data.user_code` loads it) as ``cls(data_files=..., tokenizer=..., processor=...,
config=<the data section>, max_samples=-1)`` for the train files and again for the val files,
and hands its items to the rollout. An item is verl's row dict: the data file's columns
(``data_source``, ``reward_model`` with ``ground_truth``, ``extra_info`` ...) and
``raw_prompt``, the chat messages the rollout renders with the chat template. polyrl reads the
same items: each becomes a prompt as a parquet row would (:class:`polyrl.data.dataset.RLDataset`
checks, renders and tokenizes it, ``raw_prompt`` standing for the prompt column).

What polyrl cannot honour: ``processor`` is None (text models only), and a class that imports
verl (verl's ``RLHFDataset`` and its subclasses) does not load without verl installed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polyrl.data.user_code import class_problems, load_user_class
from polyrl.errors import ConfigError, DataError

KEY = "data.custom_cls"
PROMPT_FIELD = "raw_prompt"  # verl's item field holding the chat messages


def custom_dataset_problems(node: Any) -> list[str]:
    """What is wrong with the ``data.custom_cls`` node, found without running the user's code."""
    return class_problems(KEY, "path", "name", node, "verl-format parquet files")


def custom_dataset_class(data_cfg: Any) -> type | None:
    """The user's dataset class, checked to be a torch ``Dataset`` (as verl checks); None when
    ``data.custom_cls.path`` is unset."""
    node = _field(data_cfg, "custom_cls")
    path, name = _field(node, "path"), _field(node, "name")
    if path is None:
        return None
    from torch.utils.data import Dataset

    cls = load_user_class(f"{KEY}.path", str(path), str(name))
    if not issubclass(cls, Dataset):
        raise ConfigError(
            f"{KEY}.name={name!r} must subclass torch.utils.data.Dataset (verl's rule)"
        )
    return cls


def _field(node: Any, key: str) -> Any:
    """``node``'s ``key``: a config node, a dict or a dataclass; None for no node."""
    if node is None:
        return None
    return node.get(key) if isinstance(node, Mapping) else getattr(node, key, None)


def custom_records(
    cls: type, file: str, tokenizer: Any, data_cfg: Any, prompt_key: str
) -> list[dict[str, Any]]:
    """The items of ``cls`` built over ``file`` as records of a verl-format file: each item's
    ``raw_prompt`` becomes its ``prompt_key`` column."""
    try:
        dataset = cls(
            data_files=[file], tokenizer=tokenizer, processor=None, config=data_cfg, max_samples=-1
        )
    except Exception as exc:  # the user's class failing: one line naming it
        raise DataError(
            f"{KEY}.name={cls.__name__} failed on {file}: {type(exc).__name__}: {exc}"
        ) from exc
    records = []
    for position in range(len(dataset)):
        item = dataset[position]
        if not isinstance(item, Mapping):
            raise DataError(
                f"{KEY}.name={cls.__name__}: item {position} of {file} is a "
                f"{type(item).__name__}; verl's items are row dicts with {PROMPT_FIELD!r}"
            )
        record = dict(item)
        if PROMPT_FIELD in record:
            record[prompt_key] = record[PROMPT_FIELD]
        records.append(record)
    return records
