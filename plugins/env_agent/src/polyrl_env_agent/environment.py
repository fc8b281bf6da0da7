"""The ``agent`` environment: the user's own agent code drives each episode with ``openai``.

The function named by ``multi_turn.agent_function`` (``async def rollout(client, row)``) runs as
one task per episode with an ``openai.AsyncOpenAI`` client pointed at the loopback server
(:mod:`polyrl_env_agent.server`). Each ``/v1/chat/completions`` request is one assistant turn:

- the first request's ``messages`` and ``tools`` are the episode's start (rendered with the chat
  template once, as for any environment);
- the answer is the turn the rollout sampled for it, as an OpenAI chat completion: ``content``
  is the turn's text as sampled (tool-call markup included), ``tool_calls`` what
  ``multi_turn.format`` parsed from it, with ids, ``finish_reason`` ``tool_calls``, ``stop`` or
  ``length``;
- every later request must extend the conversation: the previous request's messages, then the
  assistant message as returned, then new messages (tool results, a user turn), which become the
  turn's observation. A request that rewrites the history ends its episode
  (``agent_history_mismatch``): the trajectory is one token sequence holding exactly what was
  sampled, and a rewritten history could only be trained on by re-tokenizing it.

polyrl keeps the sampled ids and log-probs itself (the rollout's trajectory), so nothing the
agent sends back is ever re-tokenized into the assistant part. Sampling parameters in requests
(``temperature``, ``max_tokens``, ...) are ignored: the trainer's sampling parameters hold for
every turn, as on-policy training needs; ``n`` other than 1 and ``stream`` are refused.

The function's return ends the episode: a float reward, a dict with ``reward`` (and optional
``metrics``), or None (the run's reward provider scores the last turn). An exception or
``agent_timeout_s`` ends only its episode (``agent_error`` / ``agent_timeout``), reward 0.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from polyrl.api import (
    AssistantTurn,
    ConfigError,
    Environment,
    EnvironmentContext,
    Episode,
    EpisodeResult,
    EpisodeStart,
    Observation,
    import_user_file,
)
from polyrl_env_agent.server import LoopbackServer
from polyrl_env_agent.settings import check_config
from polyrl_env_agent.slots import Slots

END_AGENT_ERROR = "agent_error"
END_AGENT_TIMEOUT = "agent_timeout"
END_HISTORY_MISMATCH = "agent_history_mismatch"
END_AGENT_RETURNED = "done"
AgentFunction = Callable[[Any, dict[str, Any]], Awaitable[Any]]


def load_agent_function(spec: str) -> AgentFunction:
    """``module:function`` or ``path/to/file.py:function``, checked to be an async function."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise ConfigError(
            f"multi_turn.agent_function={spec!r}: write module:function or path/to/file.py:function"
        )
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise ConfigError(f"multi_turn.agent_function: no file {where} (give an existing path)")
        module = import_user_file(path, "polyrl_agent")
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise ConfigError(f"multi_turn.agent_function: cannot import {where} ({exc})") from exc
    function = getattr(module, name, None)
    if not asyncio.iscoroutinefunction(function):
        raise ConfigError(
            f"multi_turn.agent_function: {name} in {where} must be `async def {name}(client, row)`"
        )
    return function


def _normal(message: Mapping[str, Any]) -> tuple[Any, ...]:
    """A message as compared between requests: what the chat template reads of it."""
    calls = tuple(
        (c.get("id"), c["function"]["name"], json.loads(c["function"]["arguments"] or "{}"))
        for c in message.get("tool_calls") or ()
    )
    return (message.get("role"), message.get("content") or "", message.get("tool_call_id"), calls)


def _plain(message: Mapping[str, Any]) -> dict[str, Any]:
    """A request message as the chat template gets it (OpenAI's null fields dropped)."""
    return {k: v for k, v in message.items() if v is not None}


class AgentEpisode(Episode):
    """One row's run of the agent function; its requests are the episode's turns."""

    def __init__(self, env: AgentEnvironment, row: Mapping[str, Any]) -> None:
        self.env = env
        self.row = dict(row)
        self.token = uuid.uuid4().hex
        self.history: list[tuple[Any, ...]] = []
        self.requests: asyncio.Queue[tuple[dict[str, Any], asyncio.Future[Any]]] | None = None
        self.reply: asyncio.Future[Any] | None = None
        self.task: asyncio.Task[Any] | None = None
        self.client: Any = None
        self.failure: str | None = None
        self.slot = env.slots.holder()

    async def start(self) -> EpisodeStart:
        import openai

        loop = asyncio.get_running_loop()
        self.requests = asyncio.Queue()
        self.env.server.register(self.token, loop, self._request)
        self.client = openai.AsyncOpenAI(
            base_url=self.env.server.base_url(self.token),
            api_key="polyrl-loopback",
            max_retries=0,
            timeout=self.env.timeout_s,
            http_client=openai.DefaultAsyncHttpxClient(trust_env=False),  # no proxy for loopback
        )
        self.task = asyncio.create_task(asyncio.wait_for(self._agent(), self.env.timeout_s))
        body = await self._next_request()
        if body is None:
            raise RuntimeError(f"the agent function ended before its first request: {self.failure}")
        messages = [_plain(m) for m in body["messages"]]
        self.history = [_normal(m) for m in messages]
        return EpisodeStart(messages=messages, tools=list(body.get("tools") or []))

    async def _agent(self) -> Any:
        """The user's function, holding a slot whenever it is not waiting for a completion."""
        await self.slot.take()
        try:
            return await self.env.function(self.client, self.row)
        finally:
            self.slot.give()

    async def step(self, turn: AssistantTurn) -> Observation:
        assert self.reply is not None
        message = _assistant_message(turn)
        self.reply.set_result((200, _completion(message, turn, self.token)))
        self.history.append(_normal(message))
        body = await self._next_request()
        if body is None:
            return Observation(done=True, end_reason=self.failure or END_AGENT_RETURNED)
        messages = list(body["messages"])
        seen = [_normal(m) for m in messages[: len(self.history)]]
        if seen != self.history:
            assert self.reply is not None
            self.reply.set_result(
                (
                    400,
                    _error(
                        "the messages do not extend the conversation: send the previous "
                        "messages, the assistant message as returned, then new ones"
                    ),
                )
            )
            return Observation(done=True, end_reason=END_HISTORY_MISMATCH)
        new = [_plain(m) for m in messages[len(self.history) :]]
        self.history += [_normal(m) for m in new]
        return Observation(messages=new, metrics={"agent_requests": 1.0})

    async def finish(self, reason: str) -> EpisodeResult:
        self.env.server.unregister(self.token)
        self.slot.close()
        if self.reply is not None and not self.reply.done():
            self.reply.set_result((409, _error(f"the episode ended ({reason})")))
        outcome: Any = None
        if self.task is not None:
            if not self.task.done():
                self.task.cancel()
            # The agent's own failure or cancellation is already counted (self.failure); a
            # cancellation of this finish itself still propagates.
            (outcome,) = await asyncio.gather(self.task, return_exceptions=True)
            if isinstance(outcome, BaseException):
                outcome = None
        if self.client is not None:
            await self.client.close()
        if self.failure is not None:
            return EpisodeResult(reward=0.0, metrics={self.failure: 1.0})
        if isinstance(outcome, Mapping):
            return EpisodeResult(
                reward=None if outcome.get("reward") is None else float(outcome["reward"]),
                metrics={str(k): float(v) for k, v in (outcome.get("metrics") or {}).items()},
            )
        return EpisodeResult(reward=None if outcome is None else float(outcome))

    async def _request(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """One HTTP request of the agent, on the rollout's loop: waits for its sampled turn."""
        if body.get("stream"):
            return 400, _error("stream=true is not served: ask for the whole completion")
        if int(body.get("n") or 1) != 1:
            return 400, _error("n must be 1: each request is one turn of this episode")
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return 400, _error("messages must be a list of message objects")
        if self.reply is not None and not self.reply.done():
            return 409, _error("one request at a time per episode: await the previous one")
        assert self.requests is not None
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        await self.requests.put((body, reply))
        self.slot.give()  # the agent waits for its turn to be sampled
        answer = await reply
        await self.slot.take()
        return answer

    async def _next_request(self) -> dict[str, Any] | None:
        """The agent's next request, or None when its function ended (``failure`` says how)."""
        assert self.requests is not None and self.task is not None
        getter = asyncio.ensure_future(self.requests.get())
        await asyncio.wait({getter, self.task}, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            body, self.reply = getter.result()
            return body
        getter.cancel()
        if self.task.cancelled():
            self.failure = END_AGENT_ERROR
        elif isinstance(self.task.exception(), TimeoutError):
            self.failure = END_AGENT_TIMEOUT
        elif self.task.exception() is not None:
            self.failure = END_AGENT_ERROR
        return None


def _assistant_message(turn: AssistantTurn) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": turn.text}
    if turn.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(dict(call.arguments))},
            }
            for call in turn.tool_calls
        ]
    return message


def _completion(message: dict[str, Any], turn: AssistantTurn, token: str) -> dict[str, Any]:
    reason = "tool_calls" if turn.tool_calls else ("stop" if turn.finished else "length")
    return {
        "id": f"chatcmpl-{token}-{turn.index}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "polyrl-policy",
        "choices": [{"index": 0, "message": message, "finish_reason": reason, "logprobs": None}],
    }


def _error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error"}}


class AgentEnvironment(Environment):
    """Loads the agent function and starts the loopback server once, for the whole run."""

    def __init__(self, ctx: EnvironmentContext) -> None:
        super().__init__(ctx)
        problems = check_config(ctx.config)
        if problems:
            raise ConfigError(problems[0])
        settings = ctx.config.actor_rollout_ref.rollout.multi_turn
        self.function = load_agent_function(str(settings.agent_function))
        self.timeout_s = float(settings.agent_timeout_s)
        self.slots = Slots(settings.agent_max_concurrency)
        self.server = LoopbackServer()

    def episode(self, row: Mapping[str, Any]) -> Episode:
        return AgentEpisode(self, row)

    def close(self) -> None:
        self.server.close()
