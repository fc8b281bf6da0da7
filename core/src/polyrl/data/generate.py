"""Writers of verl-format train/val parquet files, offline: reasoning-gym tasks and polyrl's tiny
synthetic task.

reasoning-gym is an extra of polyrl (``pip install 'polyrl[reasoning-gym]'``), imported only when
one of its tasks is generated; :data:`GENERATOR_MODULES` says which generator needs which library.

The files are ordinary verl-format parquet (``data_source``, ``prompt``, ``ability``,
``reward_model``, ``extra_info``), so they work with verl too, and polyrl reads verl's files the
same way.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from polyrl.errors import DataError

SPLITS = ("train", "val")

#: The instruction of every reasoning-gym prompt: the scorer reads the ``<answer>`` tag.
ANSWER_FORMAT_SYSTEM = "You give only the final answer, inside <answer></answer> tags."
#: ``fewshot``: solved examples of the same task as first chat turns (small models copy the
#: format of an example far more reliably than they follow an instruction); ``system``: the
#: instruction alone; ``plain``: the task's question alone.
PROMPT_STYLES = ("fewshot", "system", "plain")
#: Solved examples in a fewshot prompt. SmolLM2-135M-Instruct on 2-term one-digit sums, greedy:
#: 7/16 right with two examples, 4/16 with one (examples copy their answer's shape, e.g. a
#: negative example answer draws negative answers).
DEFAULT_NUM_EXAMPLES = 2
#: Seed offset of the few-shot example, so that it is not one of the problems of the splits.
_FEWSHOT_SEED_OFFSET = 1_000_003
#: Larger than any training split (see :func:`write_reasoning_gym`), and apart from the fewshot
#: examples' seed by more than that too.
VAL_SEED_OFFSET = 100_000_007

TINY_DIGITS_SOURCE = "polyrl/tiny_digits"


def write_parquet(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Write ``rows`` to ``path`` atomically (temporary file in the same folder, then rename)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


# ---- reasoning-gym ------------------------------------------------------------------------------
def _create_task_dataset(task: str, size: int, seed: int, task_config: Mapping[str, Any]) -> Any:
    from polyrl.preflight import require_extra

    require_extra(f"the reasoning-gym task {task!r}", ("reasoning_gym",), DataError)
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    if task not in DATASETS:
        raise DataError(
            f"reasoning-gym has no task {task!r}; some of its tasks: "
            f"{', '.join(sorted(DATASETS)[:40])} ... ({len(DATASETS)} in all)"
        )
    try:
        return reasoning_gym.create_dataset(task, size=size, seed=seed, **dict(task_config))
    except (TypeError, AssertionError, ValueError) as exc:
        raise DataError(
            f"reasoning-gym task {task!r} rejected the settings {dict(task_config)} "
            f"(size={size}, seed={seed}): {type(exc).__name__}: {exc}"
        ) from exc


def reasoning_gym_prompt(
    question: str, style: str, examples: Sequence[Mapping[str, Any]] = ()
) -> list[dict[str, str]]:
    """The chat messages of one reasoning-gym problem in the given :data:`PROMPT_STYLES`."""
    if style == "plain":
        return [{"role": "user", "content": question}]
    messages = [{"role": "system", "content": ANSWER_FORMAT_SYSTEM}]
    if style == "fewshot":
        if not examples:
            raise ValueError("the fewshot style needs at least one example entry")
        for example in examples:
            messages += [
                {"role": "user", "content": str(example["question"])},
                {"role": "assistant", "content": f"<answer>{example['answer']}</answer>"},
            ]
    elif style != "system":
        raise DataError(f"prompt style {style!r}: use one of {', '.join(PROMPT_STYLES)}")
    messages.append({"role": "user", "content": question})
    return messages


def reasoning_gym_rows(
    task: str,
    *,
    size: int,
    seed: int,
    split: str,
    task_config: Mapping[str, Any] | None = None,
    prompt_style: str = "fewshot",
    num_examples: int = DEFAULT_NUM_EXAMPLES,
    example_seed: int | None = None,
) -> list[dict[str, Any]]:
    """verl-format rows of ``size`` problems of a reasoning-gym task.

    ``extra_info["entry"]`` holds the whole entry (question, answer, metadata) as JSON text: the
    task's scorer needs it, and JSON keeps the parquet schema uniform across tasks whose metadata
    differ in shape. ``extra_info["task_config"]`` (JSON) holds the task settings, which some
    scorers read. The fewshot examples come from ``example_seed`` (default: derived from
    ``seed``); pass the same one for every split so that train and val prompts match.
    """
    if prompt_style not in PROMPT_STYLES:
        raise DataError(f"prompt style {prompt_style!r}: use one of {', '.join(PROMPT_STYLES)}")
    config = dict(task_config or {})
    dataset = _create_task_dataset(task, size, seed, config)
    examples: list[dict[str, Any]] = []
    if prompt_style == "fewshot":
        if num_examples < 1:
            raise DataError(f"the fewshot prompt style needs num_examples >= 1, got {num_examples}")
        shot_seed = seed + _FEWSHOT_SEED_OFFSET if example_seed is None else example_seed
        shots = _create_task_dataset(task, num_examples, shot_seed, config)
        examples = [shots[i] for i in range(num_examples)]
    category = getattr(dataset, "category", "other")
    rows = []
    for i in range(size):
        entry = dataset[i]
        rows.append(
            {
                "data_source": f"reasoning_gym/{task}",
                "prompt": reasoning_gym_prompt(str(entry["question"]), prompt_style, examples),
                "ability": f"reasoning_gym/{category}",
                "reward_model": {"style": "rule", "ground_truth": str(entry["answer"])},
                "extra_info": {
                    "split": split,
                    "index": i,
                    "task": task,
                    "task_config": json.dumps(config, sort_keys=True),
                    "entry": json.dumps(entry, default=_json_default),
                },
            }
        )
    return rows


def _json_default(value: Any) -> Any:
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def write_reasoning_gym(
    task: str,
    out_dir: str | Path,
    *,
    train_size: int = 512,
    val_size: int = 64,
    seed: int = 1,
    task_config: Mapping[str, Any] | None = None,
    prompt_style: str = "fewshot",
    num_examples: int = DEFAULT_NUM_EXAMPLES,
) -> dict[str, Path]:
    """Write ``train.parquet`` and ``val.parquet`` of a reasoning-gym task into ``out_dir``.

    The validation split's seed is ``seed + VAL_SEED_OFFSET``: reasoning-gym's dataset of seed
    ``s + 1`` is the one of seed ``s`` shifted by one problem, so nearby seeds would validate on
    training problems. On tasks with few distinct problems (one-digit sums: 100) the splits still
    share questions. Both splits use the same fewshot examples.
    """
    sizes = {"train": train_size, "val": val_size}
    seeds = {"train": seed, "val": seed + VAL_SEED_OFFSET}
    paths = {}
    for split in SPLITS:
        rows = reasoning_gym_rows(
            task,
            size=sizes[split],
            seed=seeds[split],
            split=split,
            task_config=task_config,
            prompt_style=prompt_style,
            num_examples=num_examples,
            example_seed=seed + _FEWSHOT_SEED_OFFSET,
        )
        paths[split] = write_parquet(rows, Path(out_dir) / f"{split}.parquet")
    return paths


# ---- the tiny synthetic task --------------------------------------------------------------------
_TINY_TEMPLATES = ("Write the digit {d}:", "Digit {d}, many times:", "Repeat {d}:", "{d}{d}{d}")


def tiny_digits_rows(*, size: int, seed: int, split: str) -> list[dict[str, Any]]:
    """Rows of ``polyrl/tiny_digits``: the prompt names a digit; the reward
    (:func:`polyrl.rewards.scorers.tiny_digits_score`) gives each response character 1.0 if it is
    that digit, 0.5 if it is another digit, 0 otherwise, averaged. A randomly initialised model
    emits digits now and then, so groups of samples differ in reward from the first step and
    GRPO has signal; the full reward needs reading the prompt.
    """
    rng = random.Random(seed)
    rows = []
    for i in range(size):
        digit = str(rng.randrange(10))
        text = rng.choice(_TINY_TEMPLATES).format(d=digit)
        rows.append(
            {
                "data_source": TINY_DIGITS_SOURCE,
                "prompt": [{"role": "user", "content": text}],
                "ability": "synthetic",
                "reward_model": {"style": "rule", "ground_truth": digit},
                "extra_info": {"split": split, "index": i},
            }
        )
    return rows


def tiny_digit_pairs_rows(*, size: int, seed: int, split: str) -> list[dict[str, Any]]:
    """Preference pairs on the tiny task's prompts (``prompt`` messages, ``chosen`` and
    ``rejected`` texts): the chosen response repeats the digit the prompt names, the rejected one
    another digit, as many times. The tiny task's scorer gives them 1.0 and 0.5, so the
    preference is checkable, and learning it needs reading the prompt."""
    rng = random.Random(seed)
    rows = []
    for _ in range(size):
        digit = rng.randrange(10)
        other = (digit + rng.randrange(1, 10)) % 10
        repeats = rng.randint(3, 8)
        rows.append(
            {
                "prompt": [
                    {"role": "user", "content": rng.choice(_TINY_TEMPLATES).format(d=digit)}
                ],
                "chosen": str(digit) * repeats,
                "rejected": str(other) * repeats,
            }
        )
    return rows


def _write_tiny_splits(
    rows_of: Callable[..., list[dict[str, Any]]],
    out_dir: str | Path,
    train_size: int,
    val_size: int,
    seed: int,
) -> dict[str, Path]:
    sizes = {"train": train_size, "val": val_size}
    return {
        split: write_parquet(
            rows_of(size=sizes[split], seed=seed * 2 + offset, split=split),
            Path(out_dir) / f"{split}.parquet",
        )
        for offset, split in enumerate(SPLITS)
    }


def write_tiny_digits(
    out_dir: str | Path, *, train_size: int = 256, val_size: int = 32, seed: int = 1
) -> dict[str, Path]:
    """Write ``train.parquet`` and ``val.parquet`` of the tiny synthetic task into ``out_dir``."""
    return _write_tiny_splits(tiny_digits_rows, out_dir, train_size, val_size, seed)


def write_tiny_digit_pairs(
    out_dir: str | Path, *, train_size: int = 256, val_size: int = 32, seed: int = 1
) -> dict[str, Path]:
    """Write ``train.parquet`` and ``val.parquet`` of the tiny task's preference pairs."""
    return _write_tiny_splits(tiny_digit_pairs_rows, out_dir, train_size, val_size, seed)


# ---- registry of generators (for builtin: sources and the CLI) ----------------------------------
def _tiny_options(name: str, params: dict[str, Any], task: str | None) -> dict[str, int]:
    if task:
        raise DataError(f"builtin:{name} takes no task, got '{name}/{task}'")
    known = {"train_size", "val_size", "seed"}
    unknown = set(params) - known
    if unknown:
        raise DataError(
            f"builtin:{name}: unknown option(s) {sorted(unknown)}; it takes {sorted(known)}"
        )
    return {k: int(v) for k, v in params.items()}


def _gen_tiny_digits(out_dir: Path, params: dict[str, Any], task: str | None) -> dict[str, Path]:
    return write_tiny_digits(out_dir, **_tiny_options("tiny_digits", params, task))


def _gen_tiny_digit_pairs(
    out_dir: Path, params: dict[str, Any], task: str | None
) -> dict[str, Path]:
    return write_tiny_digit_pairs(out_dir, **_tiny_options("tiny_digit_pairs", params, task))


def _gen_reasoning_gym(out_dir: Path, params: dict[str, Any], task: str | None) -> dict[str, Path]:
    if not task:
        raise DataError(
            "builtin:reasoning_gym needs a task: builtin:reasoning_gym/<task>?train_size=512"
        )
    options = dict(params)
    sizes = {k: int(options.pop(k)) for k in ("train_size", "val_size", "seed") if k in options}
    style = str(options.pop("prompt_style", "fewshot"))
    shots = int(options.pop("num_examples", DEFAULT_NUM_EXAMPLES))
    config = options.pop("task_config", None) or {}
    if isinstance(config, str):
        config = json.loads(config)
    config.update(options)  # every other option is a setting of the task's config
    return write_reasoning_gym(
        task, out_dir, task_config=config, prompt_style=style, num_examples=shots, **sizes
    )


GENERATORS: dict[str, Callable[[Path, dict[str, Any], str | None], dict[str, Path]]] = {
    "tiny_digits": _gen_tiny_digits,
    "tiny_digit_pairs": _gen_tiny_digit_pairs,
    "reasoning_gym": _gen_reasoning_gym,
}
#: The optional libraries (keys of :data:`polyrl.preflight.CORE_EXTRAS`) each generator needs, to
#: write its rows and to score them: checked before generating and by ``polyrl validate``.
GENERATOR_MODULES: dict[str, tuple[str, ...]] = {"reasoning_gym": ("reasoning_gym",)}
