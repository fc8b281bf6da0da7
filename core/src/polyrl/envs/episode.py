"""The environment kind: what a multi-turn environment implements and what it exchanges.

An environment plugin registers an :class:`~polyrl.specs.EnvironmentSpec` whose ``environment``
is a subclass of :class:`Environment`, selected by
``actor_rollout_ref.rollout.multi_turn.environment=<name>`` when
``actor_rollout_ref.rollout.multi_turn.enable=true``. One instance lives in the driver for the
whole run. For every sampled row it opens an :class:`Episode`; the multi-turn rollout
(:mod:`polyrl.envs.rollout`) then drives all live episodes of the batch together::

    start = await episode.start()             # the first messages and the tools' schemas
    while the episode is live:
        (all live episodes sample one assistant turn together, on any rollout engine)
        obs = await episode.step(turn)        # tool results or a user message, or done
    result = await episode.finish(reason)     # the reward (None: the reward provider scores)

Why async: environments wait on tools, sandboxes, servers and other models; the rollout runs the
steps of every live episode concurrently on one event loop, each call under
``multi_turn.env_timeout_s``, so a slow episode costs its own time, not the batch's. Blocking
work belongs in a thread (``asyncio.to_thread``) or a sandboxed process
(:func:`polyrl.api.run_program`), never on the loop itself.

Why the environment sees text and never builds tokens: the rollout keeps the token ids the
engine sampled for assistant turns and appends the chat template's tokens of each observation
(:mod:`polyrl.envs.chat`), so the trajectory trains on exactly the tokens the model produced; an
environment that re-rendered the conversation would silently change them.

Failures end one episode, never the step: an exception or a timeout of ``start``/``step``, a
tool that fails inside the environment (which reports it with ``Observation.end_reason``), the
turn and token limits. The reason is counted in the step's metrics
(``multi_turn/end/<reason>``) and ``finish`` still runs, so the episode gets its reward.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Why an episode ended (``finish(reason)``, ``multi_turn/end/<reason>``). An environment may end
# an episode with a reason of its own (``Observation.end_reason``: "tool_timeout", ...).
END_DONE = "done"  # the environment said so (Observation.done)
END_MAX_ASSISTANT_TURNS = "max_assistant_turns"
END_MAX_USER_TURNS = "max_user_turns"
END_TRUNCATED = "truncated"  # the episode's token budget (data.max_response_length) ran out
END_ENV_ERROR = "env_error"  # start or step raised
END_ENV_TIMEOUT = "env_timeout"  # start or step ran past multi_turn.env_timeout_s


@dataclass(frozen=True)
class ToolCall:
    """One tool call parsed from an assistant turn (``multi_turn.format``). ``id`` is unique
    within the episode; a tool's result message carries it as ``tool_call_id``."""

    name: str
    arguments: Mapping[str, Any]
    id: str


@dataclass(frozen=True)
class AssistantTurn:
    """One sampled assistant turn. ``text`` is its tokens decoded without special tokens
    (after the episode's :attr:`EpisodeStart.prefill` on the first turn);
    ``tool_calls`` what the format's parser found in it, ``tool_call_errors`` one line per call
    that did not parse. ``finished``: it ended with an end-of-turn token (False: the token budget
    cut it). ``index`` counts the episode's assistant turns from 0."""

    index: int
    text: str
    token_ids: tuple[int, ...]
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_errors: tuple[str, ...] = ()
    finished: bool = True


@dataclass
class EpisodeStart:
    """How an episode begins. ``messages``: the chat so far (``{"role", "content"}`` dicts),
    rendered with the tokenizer's chat template and ``tools`` (JSON schemas in the OpenAI
    ``{"type": "function", "function": {...}}`` form); None keeps the prompt's tokens exactly as
    the data loader made them (then ``tools`` are not shown to the model).

    ``prefill``: text the first assistant turn starts with, written after the assistant header
    (e.g. the opening of a tool call, for a model whose template ignores tools). Its tokens are
    the end of the first prompt: the model reads them, never samples them, and they are never
    trained on. The turn's :attr:`AssistantTurn.text` (what is parsed for tool calls, and
    scored when it is the last turn) is the prefill followed by what the model wrote."""

    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    prefill: str = ""


@dataclass
class Observation:
    """What the environment answers to an assistant turn. ``messages`` (``role`` ``"tool"`` with
    ``content`` and ``tool_call_id``, or ``"user"``) are appended to the conversation, their
    tokens masked out of the loss. ``done`` ends the episode (``end_reason`` names why, default
    ``"done"``; e.g. ``"tool_timeout"`` when a tool hung). ``reward``: an optional reward of this
    turn, placed on its last token. ``metrics``: numbers summed over the episode and averaged
    over the batch's episodes (``multi_turn/<key>/mean``; ``tool_calls`` and ``tool_errors`` are
    the conventional names)."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    end_reason: str | None = None
    reward: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class EpisodeResult:
    """How the episode scored: ``reward`` on its last assistant token, or None to have the run's
    reward provider score the last assistant turn's text against the row's ``ground_truth``
    (the data's usual scorer: a verl tool-agent dataset keeps its reward). ``metrics`` as in
    :class:`Observation`."""

    reward: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)


class Episode(ABC):
    """One conversation of an environment with the policy, for one sampled row."""

    @abstractmethod
    async def start(self) -> EpisodeStart:
        """The first messages and tools (called once, before the first assistant turn)."""

    @abstractmethod
    async def step(self, turn: AssistantTurn) -> Observation:
        """Answer an assistant turn: run its tool calls, or speak as the user, or end."""

    async def finish(self, reason: str) -> EpisodeResult:
        """Called once when the episode ended, whatever ended it (``reason``: one of the
        ``END_*`` names or an environment's own ``end_reason``). Default: no reward of its
        own, the reward provider scores the last turn."""
        return EpisodeResult()


@dataclass(frozen=True)
class EnvironmentContext:
    """What an environment is built from: the composed run config (read-only; an environment
    reads its own section there) and the run's seed."""

    config: Any
    seed: int = 0


class Environment(ABC):
    """A multi-turn environment: builds one :class:`Episode` per sampled row."""

    def __init__(self, ctx: EnvironmentContext) -> None:
        self.ctx = ctx

    @abstractmethod
    def episode(self, row: Mapping[str, Any]) -> Episode:
        """The episode of ``row``: the prompt's fields (``messages``, ``data_source``,
        ``ground_truth``, ``extra_info`` — verl's ``extra_info.tools_kwargs`` included —
        ``index``, ``raw_prompt``) and ``uid`` (rows of one prompt share it) and ``sample``
        (which of its ``rollout.n`` samples, from 0)."""

    def close(self) -> None:
        """Release what the environment holds, at the end of the run."""
