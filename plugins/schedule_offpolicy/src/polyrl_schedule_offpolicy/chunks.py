"""The bookkeeping of partial rollouts: one batch's samples generated a chunk of new tokens at a
time through the rollout engine's ordinary ``generate``, so that a weight sync can come between
two chunks.

A chunk continues each unfinished sample from its prompt plus the tokens sampled so far, given
to the engine as token ids (never text: decoding and encoding again could change them), and
appends what the engine returns: the sampled ids, their log-probs exactly as the engine reported
them, and the policy version that sampled them. Every unfinished sample of a batch has the same
length (they start together and each chunk gives each one the same budget, or finishes it), so
one ``max_new_tokens`` serves the whole chunk. Pure Python and torch: no Ray, no engine.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from polyrl.api import Batch, assemble_rollout, strip_left_padding

TOKEN_VERSION_KEY = "token_policy_version"
# A response position without a token (right padding) in the per-token version matrix.
NO_TOKEN = -1


@dataclass
class PartialSamples:
    """The ``B * n`` samples of one batch (``n`` per prompt, rows ``i*n .. i*n+n-1`` for prompt
    ``i``, as the engine orders them), each a list of sampled ids, their log-probs and versions.

    ``chunks`` counts the generate calls made (it seeds the next one); ``aborted`` counts the
    samples restarted from their prompt by :meth:`abort_unfinished`."""

    prompts: Batch
    n: int
    max_new_tokens: int
    tokens: list[list[int]]
    log_probs: list[list[float]]
    versions: list[list[int]]
    done: list[bool]
    chunks: int = 0
    aborted: int = 0

    @classmethod
    def start(cls, prompts: Batch, n: int, max_new_tokens: int) -> PartialSamples:
        rows = range(len(prompts) * int(n))
        return cls(
            prompts,
            int(n),
            int(max_new_tokens),
            tokens=[[] for _ in rows],
            log_probs=[[] for _ in rows],
            versions=[[] for _ in rows],
            done=[False for _ in rows],
        )

    def unfinished(self) -> list[int]:
        return [row for row, done in enumerate(self.done) if not done]

    def complete(self) -> bool:
        return all(self.done)

    def budget(self, chunk_tokens: int) -> int:
        """New tokens the next chunk asks for: ``chunk_tokens``, or what is left of the limit."""
        longest = max(len(self.tokens[row]) for row in self.unfinished())
        return min(int(chunk_tokens), self.max_new_tokens - longest)

    def continuation(self, rows: Sequence[int], pad_token_id: int) -> Batch:
        """Left-padded ``input_ids``/``attention_mask`` of ``rows``: each row's prompt tokens
        followed by the tokens it has sampled so far."""
        prompts = self.prompts
        prompt_tokens = strip_left_padding(prompts["input_ids"], prompts["attention_mask"])
        sequences = [prompt_tokens[row // self.n] + self.tokens[row] for row in rows]
        width = max(len(seq) for seq in sequences)
        ids = torch.full((len(rows), width), int(pad_token_id), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=prompts["attention_mask"].dtype)
        for position, seq in enumerate(sequences):
            ids[position, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            mask[position, width - len(seq) :] = 1
        return Batch({"input_ids": ids, "attention_mask": mask})

    def record(
        self,
        rows: Sequence[int],
        out: Batch,
        budget: int,
        version: int,
        stop_token_ids: Collection[int],
    ) -> None:
        """Append the chunk ``out`` (one output row per entry of ``rows``, asked for ``budget``
        new tokens) sampled by policy ``version``. A sample is finished when it stopped short of
        the budget, ended on a stop token, or reached ``max_new_tokens``."""
        lengths = out["response_mask"].sum(-1).tolist()
        responses, log_probs = out["responses"].tolist(), out["rollout_log_probs"].tolist()
        for position, row in enumerate(rows):
            length = int(lengths[position])
            if length > budget:
                raise ValueError(
                    f"the rollout returned {length} tokens for a chunk of {budget}: it must "
                    f"honour SamplingParams.max_new_tokens"
                )
            sampled = responses[position][:length]
            self.tokens[row] += sampled
            self.log_probs[row] += log_probs[position][:length]
            self.versions[row] += [int(version)] * length
            self.done[row] = (
                length < budget
                or (length > 0 and sampled[-1] in stop_token_ids)
                or len(self.tokens[row]) >= self.max_new_tokens
            )
        self.chunks += 1

    def abort_unfinished(self) -> int:
        """Throw away what the unfinished samples have sampled: they start again from their
        prompt (with the weights of the next chunk). Returns how many had begun."""
        rows = [row for row in self.unfinished() if self.tokens[row]]
        for row in rows:
            self.tokens[row], self.log_probs[row], self.versions[row] = [], [], []
        self.aborted += len(rows)
        return len(rows)

    def restart(self) -> None:
        """Every sample starts again from its prompt (a batch staler than the threshold)."""
        self.done = [False] * len(self.done)
        self.abort_unfinished()

    def assemble(self, pad_token_id: int) -> Batch:
        """The finished batch in the layout the engine's ``generate`` returns for the prompts
        (:func:`polyrl.api.assemble_rollout`), plus the version of every response token
        (``token_policy_version``, ``-1`` on padding)."""
        if not self.complete():
            raise ValueError(f"{len(self.unfinished())} samples are unfinished")
        samples = list(zip(self.tokens, self.log_probs, strict=True))
        batch = assemble_rollout(
            self.prompts,
            samples,
            n=self.n,
            max_new_tokens=self.max_new_tokens,
            pad_token_id=pad_token_id,
        )
        versions = torch.full((len(self.tokens), self.max_new_tokens), NO_TOKEN, dtype=torch.long)
        for row, row_versions in enumerate(self.versions):
            versions[row, : len(row_versions)] = torch.tensor(row_versions, dtype=torch.long)
        batch[TOKEN_VERSION_KEY] = versions
        return batch

    def state_dict(self) -> dict[str, Any]:
        """Everything but the prompts, as plain Python (a checkpoint's ``meta``)."""
        return {
            "n": self.n,
            "max_new_tokens": self.max_new_tokens,
            "tokens": self.tokens,
            "log_probs": self.log_probs,
            "versions": self.versions,
            "done": self.done,
            "chunks": self.chunks,
            "aborted": self.aborted,
        }

    @classmethod
    def from_state_dict(cls, prompts: Batch, state: dict[str, Any]) -> PartialSamples:
        return cls(
            prompts,
            int(state["n"]),
            int(state["max_new_tokens"]),
            tokens=[list(map(int, t)) for t in state["tokens"]],
            log_probs=[list(map(float, p)) for p in state["log_probs"]],
            versions=[list(map(int, v)) for v in state["versions"]],
            done=[bool(d) for d in state["done"]],
            chunks=int(state["chunks"]),
            aborted=int(state["aborted"]),
        )
