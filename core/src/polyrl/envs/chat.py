"""Tokens of a conversation that grows by turns, without re-tokenizing what the model sampled.

The prompt is rendered once with the tokenizer's chat template (and the tools' schemas). After
that, the rollout appends the engine's sampled ids of each assistant turn unchanged and, for
each observation, only the tokens the template puts after an assistant turn: the rest of the
turn's closing (Qwen's newline after ``<|im_end|>``), the observation messages, and the next
assistant header. Those are found by rendering a fixed two-message chat with and without the
observation and taking the difference, so any template that renders a prefix of a conversation
as a prefix of its rendering works (ChatML for Qwen2/2.5 and SmolLM2, Llama 3's headers); one
that does not is refused in one line at the first observation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from polyrl.errors import ConfigError

# A stand-in conversation ending with an assistant turn: what an observation is appended to.
_BASE = ({"role": "user", "content": "?"}, {"role": "assistant", "content": "!"})


class ChatTokens:
    """Renders prompts and observations of one tokenizer to token ids."""

    def __init__(self, tokenizer: Any, eos_token_ids: Sequence[int]) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(int(i) for i in eos_token_ids)
        self._closing: str | None = None
        self._end_of_turn = -1
        self._base: str | None = None  # the stand-in chat rendered (the same at every call)

    def encode(self, text: str) -> list[int]:
        return self.encode_many([text])[0]

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's ids, from one tokenizer call (a fast tokenizer encodes them in parallel)."""
        if not texts:
            return []
        encoded = self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        return [[int(i) for i in ids] for ids in encoded]

    def render(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] = (), **kw: Any
    ) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages), tools=list(tools) or None, tokenize=False, **kw
        )

    def prompt_ids(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]
    ) -> list[int]:
        """The first prompt: the chat and the tools, ending with the assistant header."""
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def observation_ids(
        self, messages: Sequence[dict[str, Any]], *, close: bool = False
    ) -> list[int]:
        """Tokens to append after a sampled assistant turn (which ends with its end-of-turn
        token, or, with ``close``, was cut before it: then the token comes first): the
        observation ``messages`` and the next assistant header."""
        return self.observations_ids([(messages, close)])[0]

    def observations_ids(
        self, observations: Sequence[tuple[Sequence[dict[str, Any]], bool]]
    ) -> list[list[int]]:
        """:meth:`observation_ids` of each ``(messages, close)``, encoded together."""
        if self._base is None:
            self._base = self.render(_BASE)
        base = self._base
        closing = self._turn_closing(base)
        texts = []
        for messages, _close in observations:
            full = self.render([*_BASE, *messages], add_generation_prompt=True)
            if not full.startswith(base):
                raise ConfigError(
                    "the tokenizer's chat template does not render a conversation's start as the "
                    "start of its rendering, so observations cannot be appended to sampled turns; "
                    "use a chat template that does (ChatML, Llama 3) for multi-turn rollouts"
                )
            texts.append(closing + full[len(base) :])
        return [
            [self._end_of_turn, *ids] if close else ids
            for ids, (_messages, close) in zip(self.encode_many(texts), observations, strict=True)
        ]

    def _turn_closing(self, base: str) -> str:
        """What the template writes after an assistant turn's end-of-turn token (sampled by the
        model, so not repeated here)."""
        if self._closing is None:
            ends = [self.tokenizer.convert_ids_to_tokens(i) for i in self.eos_token_ids]
            positions = [(base.rfind(t), t) for t in ends if t and base.rfind(t) >= 0]
            if not positions:
                raise ConfigError(
                    "the chat template does not end an assistant turn with an end-of-turn token "
                    f"the model stops at ({sorted(self.eos_token_ids)}); a multi-turn rollout "
                    "needs one to know where a sampled turn ends"
                )
            at, token = max(positions)
            self._closing = base[at + len(token) :]
            self._end_of_turn = int(self.tokenizer.convert_tokens_to_ids(token))
        return self._closing
