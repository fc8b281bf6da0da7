"""Built-in verifiable scorers, chosen by a row's ``data_source``.

Every scorer takes the decoded response (``solution_str``), the row's ``ground_truth`` and its
``extra_info`` and returns a float (or a dict with ``score`` and numeric extras). They are plain
functions of strings so that they run the same in a worker process as in the driver.

Heavy optional libraries (``math_verify``, ``reasoning_gym``) are imported inside the functions
that need them: importing this module stays cheap, which matters because every reward worker
process imports it at start. Both are extras of polyrl (``pip install 'polyrl[math]'``,
``pip install 'polyrl[reasoning-gym]'``); scoring a row without its library fails with one line
saying which to install (:func:`missing_extra_for_source`).

Supported ``data_source`` values (see :func:`supported_data_sources`):

- ``exact_match`` (whitespace runs collapsed, case ignored) and ``exact_match/strict`` (only
  surrounding whitespace ignored). The response's ``<answer>...</answer>`` is compared when present.
- ``openai/gsm8k``, ``gsm8k``: the number after the last ``#### `` (strict, the default, as GSM8K's
  reference solutions write it). ``extra_info["answer_extraction"] = "flexible"`` takes the last
  number in the response instead, for models that do not follow the ``####`` format.
- ``math``, ``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``, ``math_dapo`` and other
  ``*MATH*`` sources: equivalence by ``math_verify.parse``/``verify``.
- ``reasoning_gym/<task>`` (or any source starting with ``reasoning_gym``): the task's own scorer.
- ``polyrl/tiny_digits``: the synthetic task of the tiny recipe (dense partial credit).

Installed plugins add scorers for further sources (:class:`polyrl.specs.DataSourceScorerSpec`,
e.g. ``code`` from ``polyrl-reward-code``); :func:`plugin_scorer_refs` collects them in the
driver and the reward workers receive them as import strings (:func:`load_plugin_scorers`).
"""

from __future__ import annotations

import functools
import importlib
import json
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Any

ScoreValue = float | dict[str, Any]
# A plugin scorer with its settings bound: fn(data_source, solution_str, ground_truth, extra_info)
PluginScorer = Callable[[str, str, Any, dict[str, Any]], ScoreValue]

_ANSWER_TAG = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)
# A number as people write it: optional sign, digits with optional thousands commas, decimals.
_NUMBER = re.compile(r"-?\$?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+")
_GSM8K_STRICT = re.compile(r"#### ?(-?\$?\s?[0-9][0-9,]*(?:\.[0-9]+)?)")

GSM8K_SOURCES = ("openai/gsm8k", "gsm8k")
MATH_SOURCES = (
    "math",
    "lighteval/MATH",
    "DigitalLearningGmbH/MATH-lighteval",
    "math_dapo",
    "HuggingFaceH4/MATH-500",
    "aime",
    "math_verify",
)
EXACT_SOURCES = ("exact_match", "exact_match/strict")
TINY_DIGITS_SOURCE = "polyrl/tiny_digits"
#: The built-in scorers that evaluate model output (parse and compute the expressions it
#: writes), which is why ``reward_model.sandbox=auto`` runs the built-in scorers sandboxed.
EVALUATING_SCORERS = (
    "math_verify (the MATH-style sources: math, lighteval/MATH, math_dapo, aime, ...)",
    "reasoning-gym's task scorers (reasoning_gym/<task>)",
)


# ---- answer extraction --------------------------------------------------------------------------
def extract_tagged_answer(text: str, tag: str = "answer") -> str | None:
    """The content of the last ``<tag>...</tag>`` in ``text`` (stripped), or None when absent."""
    pattern = _ANSWER_TAG if tag == "answer" else re.compile(rf"<{tag}>\s?(.*?)\s?</{tag}>", re.S)
    matches = pattern.findall(text)
    return matches[-1].strip() if matches else None


def extract_answer(text: str) -> str:
    """The answer a response gives: its last ``<answer>...</answer>`` if present, else its last
    non-empty line (models that ignore the format often still end with the answer)."""
    tagged = extract_tagged_answer(text)
    if tagged is not None:
        return tagged
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _to_decimal(text: str) -> Decimal | None:
    cleaned = text.replace(",", "").replace("$", "").replace(" ", "").strip().rstrip(".")
    if not cleaned:
        return None
    try:
        return Decimal(cleaned)
    except InvalidOperation:
        return None


def _numbers_equal(a: str, b: str) -> bool:
    da, db = _to_decimal(a), _to_decimal(b)
    if da is None or db is None:
        return False
    return abs(da - db) <= Decimal("1e-6") * max(Decimal(1), abs(db))


# ---- exact match --------------------------------------------------------------------------------
def _normalise(text: str) -> str:
    return " ".join(text.split()).casefold()


def exact_match_score(solution_str: str, ground_truth: Any, *, normalise: bool = True) -> float:
    """1.0 when the answer equals the ground truth, else 0.0.

    The answer is the response's ``<answer>`` content when tagged, else the whole response.
    ``normalise`` collapses whitespace runs and ignores case; otherwise only surrounding
    whitespace is ignored. A list ground truth accepts any of its items.
    """
    tagged = extract_tagged_answer(solution_str)
    answer = tagged if tagged is not None else solution_str.strip()
    truths = ground_truth if isinstance(ground_truth, list | tuple) else [ground_truth]
    for truth in truths:
        truth = str(truth).strip()
        if (normalise and _normalise(answer) == _normalise(truth)) or answer == truth:
            return 1.0
    return 0.0


# ---- GSM8K --------------------------------------------------------------------------------------
def gsm8k_extract(solution_str: str, method: str = "strict") -> str | None:
    """The final answer of a GSM8K-style response.

    ``strict``: the number after the last ``#### `` (None when the response has none).
    ``flexible``: the last number anywhere in the response.
    """
    if method == "strict":
        matches = _GSM8K_STRICT.findall(solution_str)
        return matches[-1] if matches else None
    if method == "flexible":
        matches = _NUMBER.findall(solution_str)
        return matches[-1] if matches else None
    raise ValueError(f"GSM8K answer extraction must be 'strict' or 'flexible', got {method!r}")


def gsm8k_score(solution_str: str, ground_truth: Any, *, method: str = "strict") -> float:
    """1.0 when the extracted answer equals the ground truth numerically (``1,000`` == ``1000.0``).

    A ground truth that is a whole GSM8K solution (``... #### 72``) is reduced to its final number.
    """
    truth = str(ground_truth)
    if "####" in truth:
        truth = truth.rsplit("####", 1)[1]
    answer = gsm8k_extract(solution_str, method)
    if answer is None:
        return 0.0
    return 1.0 if _numbers_equal(answer, truth.strip()) else 0.0


# ---- math ---------------------------------------------------------------------------------------
def math_score(solution_str: str, ground_truth: Any) -> float:
    """1.0 when ``math_verify`` finds the response's final answer equivalent to the ground truth.

    The ground truth is parsed as ``\\boxed{...}`` (MATH-style answers are bare LaTeX); the response
    is parsed as written (math_verify prefers its last ``\\boxed{}``). math_verify's own timeouts
    use SIGALRM, which only works in a main thread; elsewhere they are off (the reward runner
    enforces its own per-sample timeout).
    """
    _require("scoring MATH-style answers", "math_verify")
    from math_verify import parse, verify

    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    truth = str(ground_truth).strip()
    gold_text = truth if ("$" in truth or "\\boxed" in truth) else f"$\\boxed{{{truth}}}$"
    gold = parse(gold_text, parsing_timeout=timeout)
    if not gold:
        gold = parse(truth, parsing_timeout=timeout)
    if not gold:
        raise ValueError(f"math_verify could not parse the ground truth {truth!r}")
    predicted = parse(solution_str, parsing_timeout=timeout)
    if not predicted:
        return 0.0
    return 1.0 if verify(gold, predicted, timeout_seconds=timeout) else 0.0


# ---- reasoning-gym ------------------------------------------------------------------------------
@lru_cache(maxsize=64)
def _reasoning_gym_scorer(
    task: str, config_json: str = ""
) -> Callable[[str | None, dict[str, Any]], float]:
    """The task's ``score_answer``, bound to a dataset built with the task config the rows were
    generated with: some scorers read their config (decimal_arithmetic's decimal places,
    time_intervals' tolerances), so the default config could score differently."""
    _require(f"scoring data_source 'reasoning_gym/{task}'", "reasoning_gym")
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    if task not in DATASETS:
        raise ValueError(
            f"reasoning-gym has no task {task!r} (data_source 'reasoning_gym/{task}'); "
            "see reasoning_gym.factory.DATASETS for the task names"
        )
    if not config_json:
        return reasoning_gym.get_score_answer_fn(task)
    config = json.loads(config_json)
    return reasoning_gym.create_dataset(task, size=1, seed=0, **config).score_answer


def _reasoning_gym_entry(ground_truth: Any, extra_info: Mapping[str, Any]) -> dict[str, Any]:
    entry = extra_info.get("entry")
    if isinstance(entry, str):
        entry = json.loads(entry)
    if entry is None:
        # Rows written by other tools may carry only the answer; scorers that need the entry's
        # metadata then fail with a KeyError, reported by the runner.
        entry = {"question": "", "answer": str(ground_truth), "metadata": {}}
    if not isinstance(entry, dict):
        raise TypeError(f"extra_info['entry'] must be a dict or JSON object, got {type(entry)}")
    return entry


def reasoning_gym_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any]
) -> float:
    """Score with the reasoning-gym task's own ``score_answer(answer, entry)``.

    The task is the part of ``data_source`` after ``reasoning_gym/``; for a bare ``reasoning_gym``
    source it is ``extra_info["task"]`` or the entry's ``metadata.source_dataset`` (composite
    datasets). The entry (question, answer, metadata) comes from ``extra_info["entry"]`` (a dict
    or its JSON, as :mod:`polyrl.data.generate` writes it), the task's settings from
    ``extra_info["task_config"]`` (dict or JSON; default settings when absent). The answer is the
    response's ``<answer>`` content, else its last line.
    """
    entry = _reasoning_gym_entry(ground_truth, extra_info)
    _, _, task = data_source.partition("/")
    if not task:
        task = extra_info.get("task") or entry.get("metadata", {}).get("source_dataset") or ""
    if not task:
        raise ValueError(
            f"data_source {data_source!r} names no reasoning-gym task: write "
            "'reasoning_gym/<task>' or put the task name in extra_info['task']"
        )
    config = extra_info.get("task_config") or {}
    if isinstance(config, str):
        config = json.loads(config) if config.strip() else {}
    config_json = json.dumps(config, sort_keys=True) if config else ""
    answer = extract_answer(solution_str)
    return float(_reasoning_gym_scorer(task, config_json)(answer, entry))


# ---- the tiny synthetic task --------------------------------------------------------------------
def tiny_digits_score(solution_str: str, ground_truth: Any) -> dict[str, float]:
    """Dense reward of the ``polyrl/tiny_digits`` task: per response character, 1.0 for the target
    digit named in the prompt (``ground_truth``), 0.5 for any other digit, 0.0 otherwise; the score
    is the mean over characters (0.0 for an empty response).

    The partial credit for any digit gives a randomly initialised model a gradient from the first
    step; full credit needs reading the prompt. Extras: ``digit_frac`` and ``target_frac``.
    """
    target = str(ground_truth).strip()
    if len(target) != 1 or not target.isdigit():
        raise ValueError(f"tiny_digits ground truth must be one digit 0-9, got {ground_truth!r}")
    chars = list(solution_str)
    if not chars:
        return {"score": 0.0, "digit_frac": 0.0, "target_frac": 0.0}
    digits = sum(c in "0123456789" for c in chars)
    hits = sum(c == target for c in chars)
    n = len(chars)
    return {
        "score": (hits + 0.5 * (digits - hits)) / n,
        "digit_frac": digits / n,
        "target_frac": hits / n,
    }


# ---- warm-up ------------------------------------------------------------------------------------
#: The optional libraries of the built-in scorers, imported by :func:`preload` by default.
OPTIONAL_MODULES = ("math_verify", "reasoning_gym")


def preload(modules: Iterable[str] | None = None) -> None:
    """Import ``modules`` (default: every optional library of the built-in scorers), where
    installed.

    Reward workers call this at start-up, before they report ready: ``import reasoning_gym``
    takes seconds (10 s on a loaded 2-core machine), and inside a sample's timeout it would make
    the first samples time out, and their replacement workers too. A run whose data sources are
    known imports only theirs (:func:`modules_for_sources`): every worker of every run pays the
    import.
    """
    for module in OPTIONAL_MODULES if modules is None else modules:
        try:
            importlib.import_module(module)
        except ImportError:
            continue


def modules_for_sources(data_sources: Iterable[str]) -> tuple[str, ...]:
    """The optional libraries the built-in scorers of ``data_sources`` need, in a stable order."""
    return tuple(sorted({module for s in data_sources for module in _source_modules(s)}))


# ---- optional libraries -------------------------------------------------------------------------
def _source_modules(data_source: str) -> tuple[str, ...]:
    """The optional libraries the built-in scorer of ``data_source`` needs."""
    source = str(data_source)
    if source in (*EXACT_SOURCES, *GSM8K_SOURCES, TINY_DIGITS_SOURCE):
        return ()
    if source.startswith("reasoning_gym"):
        return ("reasoning_gym",)
    if _is_math_source(source):
        return ("math_verify",)
    return ()


def missing_extra_for_source(data_source: str) -> str | None:
    """None unless the built-in scorer of ``data_source`` needs a library that is not installed;
    then one line naming it and the install command, e.g. ``data_source 'math' needs
    math-verify: pip install 'polyrl[math]'``. Cheap: imports nothing."""
    from polyrl.preflight import missing_extra

    return missing_extra(f"data_source {data_source!r}", _source_modules(data_source))


def _require(what: str, module: str) -> None:
    from polyrl.errors import PolyrlError
    from polyrl.preflight import require_extra

    require_extra(what, (module,), PolyrlError)


# ---- dispatch -----------------------------------------------------------------------------------
def _is_math_source(source: str) -> bool:
    # Listed MATH sources, and other hub names whose last part is MATH-something (MATH-500 ...).
    return source in MATH_SOURCES or "math" in source.lower().split("/")[-1].split("-")


def supported_data_sources() -> list[str]:
    """The ``data_source`` values :func:`default_compute_score` knows (``<task>``: a pattern)."""
    return [
        *EXACT_SOURCES,
        *GSM8K_SOURCES,
        *MATH_SOURCES,
        "reasoning_gym/<task>",
        TINY_DIGITS_SOURCE,
    ]


# ---- scorers from plugins -----------------------------------------------------------------------
def plugin_scorer_refs(reward_model: Any, registry: Any = None) -> dict[str, list[Any]]:
    """``{data_source: [import string, settings]}`` of every installed plugin's data-source
    scorer, its settings read from ``reward_model.<settings_key>`` (a plain dict): JSON, so that
    it reaches sandboxed reward workers too. Two packages scoring one source: an error naming
    both."""
    from polyrl.errors import ConfigError
    from polyrl.registry import get_registry
    from polyrl.specs import PluginKind

    refs: dict[str, list[Any]] = {}
    owners: dict[str, str] = {}
    for reg in (registry or get_registry()).all(PluginKind.DATA_SOURCE_SCORER):
        spec, owner = reg.spec, f"{reg.name!r} ({reg.provenance.distribution})"
        fn = spec.fn if isinstance(spec.fn, str) else f"{spec.fn.__module__}:{spec.fn.__qualname__}"
        settings = {}
        if spec.settings_key:
            node = reward_model[spec.settings_key]
            settings = {key: node[key] for key in node}
        for source in spec.data_sources:
            if source in owners:
                raise ConfigError(
                    f"data_source {source!r} is scored by two plugins, {owners[source]} and "
                    f"{owner}: uninstall one"
                )
            owners[source] = owner
            refs[source] = [fn, settings]
    return refs


def load_plugin_scorers(refs: Mapping[str, list[Any]]) -> dict[str, PluginScorer]:
    """Resolve :func:`plugin_scorer_refs`' import strings (in a reward worker) and bind each
    scorer's settings."""
    from polyrl.specs import resolve_object

    return {
        source: functools.partial(resolve_object(fn), settings=dict(settings))
        for source, (fn, settings) in refs.items()
    }


def _first_party_package(source: str) -> str | None:
    from polyrl.specs import FIRST_PARTY_PACKAGES, PluginKind

    return FIRST_PARTY_PACKAGES[PluginKind.DATA_SOURCE_SCORER].get(source)


def builtin_scorer(source: str) -> PluginScorer | None:
    """The built-in scorer of ``data_source`` ``source`` (called as a plugin scorer is), or None
    when no built-in scores it."""
    if source in EXACT_SOURCES:
        return lambda src, response, truth, extra: exact_match_score(
            response, truth, normalise=src == "exact_match"
        )
    if source in GSM8K_SOURCES:
        return lambda src, response, truth, extra: gsm8k_score(
            response, truth, method=str(extra.get("answer_extraction", "strict"))
        )
    if source.startswith("reasoning_gym"):
        return reasoning_gym_score
    if source == TINY_DIGITS_SOURCE:
        return lambda src, response, truth, extra: tiny_digits_score(response, truth)
    if _is_math_source(source):
        return lambda src, response, truth, extra: math_score(response, truth)
    return None


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    *,
    plugin_scorers: Mapping[str, PluginScorer] | None = None,
) -> ScoreValue:
    """Score one response with the built-in scorer for its ``data_source``, or with the plugin
    scorer ``plugin_scorers`` holds for it (:func:`load_plugin_scorers`).

    Raises ValueError for an unknown source, listing the supported ones and how to plug in one's
    own function (``custom_reward_function.path``), or naming the package to install for a
    source a first-party plugin scores.
    """
    extra = dict(extra_info or {})
    source = str(data_source)
    plugins = plugin_scorers or {}
    if source in plugins:
        return plugins[source](source, solution_str, ground_truth, extra)
    scorer = builtin_scorer(source)
    if scorer is not None:
        return scorer(source, solution_str, ground_truth, extra)
    package = _first_party_package(source)
    if package:
        raise ValueError(
            f"data_source {source!r} is scored by the plugin package {package}, which is not "
            f"installed: pip install {package}"
        )
    raise ValueError(
        f"no built-in scorer for data_source {source!r}. Built-in: "
        f"{', '.join([*supported_data_sources(), *plugins])}. For another source, write a "
        "function fn(data_source, solution_str, ground_truth, extra_info) -> float | dict and set "
        "custom_reward_function.path=<file.py> (and custom_reward_function.name=<fn>)."
    )
