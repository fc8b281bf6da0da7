"""Real verifiers environments for the tests, built the way a user writes one: a dataset, reward
functions in a Rubric, and (for the multi-turn ones) an env_response or tools. Importable as
``vf_envs:<function>`` (the tests put this folder on the path) for ``multi_turn.verifiers_env``."""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset

QUESTIONS = [
    {"question": "What is 2 + 3?", "answer": "5"},
    {"question": "What is 4 + 4?", "answer": "8"},
    {"question": "What is 7 + 6?", "answer": "13"},
]


def last_text(completion: vf.Messages) -> str:
    """The text of the last assistant message of a completion."""
    return next(m["content"] or "" for m in reversed(completion) if m["role"] == "assistant")


def says_answer(completion: vf.Messages, answer: str) -> float:
    """1.0 when the last assistant message contains the answer."""
    return float(answer in last_text(completion))


def brevity(completion: vf.Messages) -> float:
    """1 / (1 + words of the last assistant message): short answers earn more."""
    return 1.0 / (1.0 + len(last_text(completion).split()))


def turns_left(completion: vf.Messages) -> float:
    """1 / assistant turns taken: answering sooner earns more."""
    return 1.0 / sum(m["role"] == "assistant" for m in completion)


def single_turn() -> vf.Environment:
    rubric = vf.Rubric(funcs=[says_answer, brevity], weights=[1.0, 0.5])
    return vf.SingleTurnEnv(
        dataset=Dataset.from_list(QUESTIONS), system_prompt="Answer briefly.", rubric=rubric
    )


class RetryEnv(vf.MultiTurnEnv):
    """The user says "Wrong, try again." until the assistant says the answer."""

    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs) -> vf.Messages:
        return [{"role": "user", "content": "Wrong, try again."}]

    @vf.stop
    async def answered(self, state: vf.State) -> bool:
        trajectory = state["trajectory"]
        return bool(trajectory) and state["answer"] in last_text(trajectory[-1]["completion"])


def multi_turn(max_turns: int = 3) -> vf.Environment:
    rubric = vf.Rubric(funcs=[says_answer, turns_left], weights=[1.0, 1.0])
    return RetryEnv(dataset=Dataset.from_list(QUESTIONS), rubric=rubric, max_turns=max_turns)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def tool_env() -> vf.Environment:
    rubric = vf.Rubric(funcs=[says_answer], weights=[2.0])
    return vf.ToolEnv(dataset=Dataset.from_list(QUESTIONS), tools=[add], rubric=rubric, max_turns=4)
