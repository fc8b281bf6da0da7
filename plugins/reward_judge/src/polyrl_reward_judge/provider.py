"""The ``judge`` reward provider: each response is scored by a judge model's verdict.

It runs in the driver and receives the whole step's samples at once, so every judge prompt of
a step goes to the backend together (one generate call per rank of the ``judge`` role, or
requests in parallel). An unparsed
verdict scores ``reward_model.failure_score`` (0.0 by default) with ``RewardResult.error``
set, so polyrl's reward stage counts it (``reward/errors``, and ``max_failure_rate`` over
steps), and ``reward_extra/judge_unparsed/mean`` logs the step's share; a step with more than
``max_unparsed_frac`` unparsed stops the run: training on a judge that does not answer in the
expected form would learn from noise."""

from __future__ import annotations

from typing import Any

from polyrl.api import RewardContext, RewardError, RewardProvider, RewardResult, RewardSample
from polyrl_reward_judge.prompt import render
from polyrl_reward_judge.settings import SECTION
from polyrl_reward_judge.verdict import Unparsed, parse_verdict

EXAMPLE_CHARS = 200


class JudgeReward(RewardProvider):
    """Scores with the backend ``reward_model.judge.backend`` (rollout | openai)."""

    def __init__(self, ctx: RewardContext) -> None:
        super().__init__(ctx)
        self.settings = ctx.reward_model.judge
        self.failure_score = float(ctx.reward_model.failure_score)
        self.backend = make_backend(self.settings)

    def attach_workers(self, workers: Any) -> None:
        super().attach_workers(workers)
        self.backend.attach_workers(workers)

    def score(self, samples: list[RewardSample]) -> list[RewardResult]:
        if not samples:
            return []
        template, rubric = str(self.settings.template), str(self.settings.rubric)
        replies = self.backend.judge([render(template, rubric, s) for s in samples])
        verdicts = [
            r if isinstance(r, Unparsed) else parse_verdict(r, self.settings) for r in replies
        ]
        check_unparsed(replies, verdicts, float(self.settings.max_unparsed_frac))
        return [self._result(v) for v in verdicts]

    def _result(self, verdict: float | Unparsed) -> RewardResult:
        if isinstance(verdict, Unparsed):
            return RewardResult(
                score=self.failure_score, extra={"judge_unparsed": 1.0}, error=verdict.reason
            )
        return RewardResult(score=verdict, extra={"judge_unparsed": 0.0})

    def close(self) -> None:
        self.backend.close()


def make_backend(settings: Any) -> Any:
    """The backend object: ``judge(prompts) -> list[str | Unparsed]``,
    ``attach_workers(workers)`` and ``close()``."""
    if settings.backend == "openai":
        from polyrl_reward_judge.openai_judge import OpenAIJudge

        return OpenAIJudge(settings)
    from polyrl_reward_judge.worker_judge import WorkerJudge

    return WorkerJudge()


def check_unparsed(
    replies: list[str | Unparsed], verdicts: list[float | Unparsed], max_frac: float
) -> None:
    """Raise :class:`RewardError` when more than ``max_frac`` of the verdicts are unparsed,
    naming the share, the setting and one example (the reply, or the reason there was none)."""
    failed = [i for i, v in enumerate(verdicts) if isinstance(v, Unparsed)]
    frac = len(failed) / len(verdicts)
    if frac <= max_frac:
        return
    first = failed[0]
    reply = replies[first]
    example = verdicts[first].reason if isinstance(reply, Unparsed) else reply[:EXAMPLE_CHARS]
    raise RewardError(
        f"{len(failed)} of {len(verdicts)} judge verdicts ({frac:.0%}) could not be parsed, "
        f"more than {SECTION}.max_unparsed_frac={max_frac:g}; e.g. ({verdicts[first].reason}) "
        f"{example!r}. Make the judge's template ask for the form {SECTION}.verdict parses, "
        f"fix the pattern, or raise {SECTION}.max_unparsed_frac"
    )
