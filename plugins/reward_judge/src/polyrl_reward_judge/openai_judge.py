"""The ``openai`` backend: the judge behind an OpenAI-compatible ``/v1/chat/completions``
endpoint (vLLM's or SGLang's server, a hosted API), called with the ``openai`` client.

At most ``max_concurrency`` requests are in flight; each is cut off after ``timeout_s`` and not
retried (a retry would multiply a step's time). A request that times out or fails is an
unparsed verdict with its reason, counted like a reply that does not parse."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from polyrl.api import ConfigError
from polyrl_reward_judge.settings import SECTION
from polyrl_reward_judge.verdict import Unparsed


class OpenAIJudge:
    """The endpoint's settings; a client is opened per step inside that step's event loop (an
    async client's connections belong to the loop that opened them)."""

    def __init__(self, settings: Any) -> None:
        key_env = str(settings.api_key_env)
        self.api_key = os.environ.get(key_env)
        if not self.api_key:
            raise ConfigError(
                f"{SECTION}.api_key_env={key_env!r}: that environment variable is not set; "
                f"export {key_env}=<key> (any non-empty value for a server without keys)"
            )
        self.base_url = str(settings.base_url)
        self.model = str(settings.model)
        self.timeout_s = float(settings.timeout_s)
        self.max_concurrency = int(settings.max_concurrency)
        self.max_new_tokens = int(settings.max_new_tokens)

    def judge(self, prompts: list[str]) -> list[str | Unparsed]:
        """The judge's reply to each prompt (a user message), in order; a failed request is
        :class:`Unparsed` with the reason."""
        return asyncio.run(self._judge_all(prompts))

    async def _judge_all(self, prompts: list[str]) -> list[str | Unparsed]:
        from openai import AsyncOpenAI

        limit = asyncio.Semaphore(self.max_concurrency)
        async with AsyncOpenAI(
            api_key=self.api_key, base_url=self.base_url, max_retries=0, timeout=self.timeout_s
        ) as client:
            return list(await asyncio.gather(*(self._one(client, limit, p) for p in prompts)))

    async def _one(self, client: Any, limit: asyncio.Semaphore, prompt: str) -> str | Unparsed:
        import openai

        async with limit:
            try:
                reply = await asyncio.wait_for(
                    client.chat.completions.create(
                        model=self.model,
                        messages=[{"role": "user", "content": prompt}],
                        max_tokens=self.max_new_tokens,
                        temperature=0.0,
                    ),
                    self.timeout_s,
                )
            except (TimeoutError, openai.APITimeoutError):
                return Unparsed(f"judge request timed out after {self.timeout_s:g}s")
            except openai.OpenAIError as exc:
                return Unparsed(f"judge request failed ({type(exc).__name__})")
        choices = reply.choices or []
        content = choices[0].message.content if choices else None
        if content is None:
            return Unparsed("judge reply has no message content")
        return content

    def attach_workers(self, workers: Any) -> None:
        """The endpoint is not on the run's workers: nothing to attach."""

    def close(self) -> None:
        """Nothing held between steps."""
