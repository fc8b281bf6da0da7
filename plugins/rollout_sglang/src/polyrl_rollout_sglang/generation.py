"""Requests for ``sglang.Engine.generate`` from polyrl's :class:`~polyrl.interfaces.SamplingParams`,
and the samples read back from its answers (pure Python: testable without SGLang).

A request is token ids in, token ids out (the engine runs with ``skip_tokenizer_init``). Each of
the ``n`` samples of a prompt is its own request, in the order of the rollout layout (prompt ``i``,
sample ``j`` at ``i*n + j``), so that the order never depends on how SGLang fans out ``n``; the
radix cache computes the shared prompt once either way.

Log-prob convention: SGLang reports ``log(softmax(logits / T))`` at the sampled token (unless
``SGLANG_RETURN_ORIGINAL_LOGPROB`` is set, which the plugin refuses), the quantity the trainer
recomputes. Unlike the vLLM plugin it is *not* renormalised over the tokens top-k/top-p keep; it
equals the ``hf`` rollout's value, and with RL's usual ``top_p=1, top_k=-1`` all three agree.
Greedy requests (temperature 0, which SGLang runs as top-k 1) report ``log_softmax(logits)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from polyrl.api import SamplingParams
from polyrl_rollout_sglang.errors import SGLangOutputError


@dataclass(frozen=True)
class GenerateRequest:
    """The arguments of one batched ``Engine.generate(input_ids=..., sampling_params=...)``."""

    input_ids: list[list[int]]
    sampling_params: list[dict[str, Any]]


def build_requests(
    rows: Sequence[Sequence[int]], params: SamplingParams, eos_token_ids: Sequence[int]
) -> GenerateRequest:
    """``n`` requests per prompt. Each sample gets seed ``seed + i*n + j`` so that no two share a
    stream; SGLang honours per-request seeds only with
    ``engine_kwargs.sglang.enable_deterministic_inference=true`` (otherwise its engine-wide
    ``random_seed`` drives sampling). Every request stops at the EOS ids and
    ``params.stop_token_ids`` and keeps the stop token in its output (``no_stop_trim``), as the
    rollout layout has it."""
    if params.n < 1 or params.max_new_tokens < 1:
        raise ValueError(
            f"sampling needs n >= 1 and max_new_tokens >= 1, got n={params.n}, "
            f"max_new_tokens={params.max_new_tokens}"
        )
    greedy = params.greedy or params.temperature <= 0.0
    top_k = params.top_k if params.top_k is not None and params.top_k >= 1 else -1
    shared: dict[str, Any] = {
        "max_new_tokens": int(params.max_new_tokens),
        "temperature": 0.0 if greedy else float(params.temperature),
        "top_p": 1.0 if greedy else float(params.top_p),
        "top_k": -1 if greedy else int(top_k),
        "stop_token_ids": sorted({int(t) for t in (*eos_token_ids, *params.stop_token_ids)}),
        "no_stop_trim": True,
    }
    input_ids: list[list[int]] = []
    sampling_params: list[dict[str, Any]] = []
    for i, tokens in enumerate(rows):
        for j in range(params.n):
            input_ids.append([int(t) for t in tokens])
            request = dict(shared)
            if params.seed is not None:
                request["sampling_seed"] = int(params.seed) + i * params.n + j
            sampling_params.append(request)
    return GenerateRequest(input_ids, sampling_params)


def _meta(output: Any, index: int) -> Mapping[str, Any]:
    if not isinstance(output, Mapping) or not isinstance(output.get("meta_info"), Mapping):
        raise SGLangOutputError(
            f"SGLang answer {index} has no meta_info (got {type(output).__name__}); "
            f"polyrl reads SGLang 0.5's offline Engine.generate output"
        )
    meta = output["meta_info"]
    finish = meta.get("finish_reason")
    if isinstance(finish, Mapping) and finish.get("type") == "abort":
        raise SGLangOutputError(
            f"SGLang aborted request {index}: {finish.get('message') or finish}; a prompt longer "
            f"than data.max_prompt_length or too little GPU memory "
            f"(actor_rollout_ref.rollout.gpu_memory_utilization) are the usual causes"
        )
    return meta


def sample_from_output(output: Any, index: int) -> tuple[list[int], list[float]]:
    """``(token ids, their log-probs)`` of one answer, from ``meta_info.output_token_logprobs``
    (``(log-prob, token id, text)`` per generated token), checked against ``output_ids``."""
    entries = _meta(output, index).get("output_token_logprobs")
    if entries is None:
        raise SGLangOutputError(
            f"SGLang answer {index} has no output_token_logprobs although the request asked for "
            f"them (return_logprob=True)"
        )
    log_probs = [float(entry[0]) for entry in entries]
    tokens = [int(entry[1]) for entry in entries]
    output_ids = output.get("output_ids")
    if output_ids is not None and [int(t) for t in output_ids] != tokens:
        raise SGLangOutputError(
            f"SGLang answer {index}: output_ids {list(output_ids)[:8]}... disagree with the "
            f"tokens of its log-probs {tokens[:8]}...; the rollout layout needs one log-prob "
            f"per generated token"
        )
    return tokens, log_probs


def samples_from_outputs(outputs: Any, expected: int) -> list[tuple[list[int], list[float]]]:
    """The samples of a batched answer, in request order."""
    if not isinstance(outputs, list) or len(outputs) != expected:
        got = len(outputs) if isinstance(outputs, list) else type(outputs).__name__
        raise SGLangOutputError(f"SGLang answered {got} for {expected} requests")
    return [sample_from_output(output, i) for i, output in enumerate(outputs)]


def prompt_log_probs(output: Any, tokens: Sequence[int], index: int) -> list[float]:
    """Teacher-forced ``log p(tokens[t] | tokens[:t])`` for ``t >= 1`` from an answer's
    ``meta_info.input_token_logprobs`` (asked for with ``logprob_start_len=0``)."""
    entries = _meta(output, index).get("input_token_logprobs")
    if entries is None or len(entries) != len(tokens):
        got = "none" if entries is None else len(entries)
        raise SGLangOutputError(
            f"SGLang answer {index} has {got} prompt log-probs for {len(tokens)} prompt tokens"
        )
    if [int(entry[1]) for entry in entries] != [int(t) for t in tokens]:
        raise SGLangOutputError(f"SGLang answer {index} scored other tokens than it was given")
    return [float(entry[0]) for entry in entries[1:]]
