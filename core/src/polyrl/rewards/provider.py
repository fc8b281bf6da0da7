"""The ``naive`` reward provider: one scoring function per run (the user's, else the built-in
dispatcher by ``data_source``), run by :class:`polyrl.rewards.runner.RewardRunner`."""

from __future__ import annotations

import sys
from typing import Any

from polyrl.config.nodes import schema_node
from polyrl.interfaces.reward import RewardContext, RewardProvider, RewardResult, RewardSample
from polyrl.rewards._worker import ScorerRef
from polyrl.rewards.custom import check_custom_function
from polyrl.rewards.runner import RewardRunner
from polyrl.rewards.sandbox import SandboxLimits
from polyrl.rewards.scorers import EVALUATING_SCORERS, modules_for_sources, plugin_scorer_refs


class NaiveRewardProvider(RewardProvider):
    """Scores each sample with ``custom_reward_function`` when its ``path`` is set, else with
    :func:`polyrl.rewards.scorers.default_compute_score`.

    Config: ``reward_model.num_workers`` (0: in the driver, or one sandboxed child when the
    scorers are sandboxed), ``.timeout_s``, ``.failure_score``,
    ``.on_error`` (``score`` | ``raise``), ``.sandbox`` (which scorers run sandboxed, see
    :func:`sandbox_limits`); installed plugins' data-source scorers read their own keys. The
    worker pool starts here and lives until :meth:`close`. The context's nodes are read by
    attribute; a plain or partial dict (or None) is first merged over the schema's node, so
    every default comes from the schema.
    """

    def __init__(self, ctx: RewardContext) -> None:
        super().__init__(ctx)
        custom: Any = schema_node(ctx.custom_reward_function, "custom_reward_function")
        rm: Any = schema_node(ctx.reward_model, "reward_model")
        path, name = custom.path, str(custom.name)
        if path:
            # Load once, in a throwaway process, so that a wrong path or name -- or a file that
            # exits or hangs at import -- fails now with a clear message, rather than inside
            # every worker or by taking the driver down.
            check_custom_function(path, name, float(custom.load_timeout_s))
        plugins = {} if path else plugin_scorer_refs(rm)
        sources = getattr(ctx, "data_sources", None)  # a duck-typed context may lack it
        scorer = ScorerRef(
            path=str(path) if path else None,
            name=name,
            plugins=plugins,
            preload=None if sources is None else modules_for_sources(sources),
        )
        if str(rm.sandbox) == "never" and not path:
            print(unsandboxed_line(int(rm.num_workers), plugins), file=sys.stderr, flush=True)
        self.runner = RewardRunner(
            scorer,
            num_workers=int(rm.num_workers),
            timeout_s=float(rm.timeout_s),
            failure_score=float(rm.failure_score),
            on_error=str(rm.on_error),
            max_consecutive_timeouts=int(rm.max_consecutive_timeouts),
            sandbox=sandbox_limits(rm, custom=bool(path)),
        )

    def score(self, samples: list[RewardSample]) -> list[RewardResult]:
        return self.runner.score(samples)

    def close(self) -> None:
        self.runner.close()


def sandbox_limits(rm: Any, *, custom: bool) -> SandboxLimits | None:
    """The limits of sandboxed reward workers, or None for plain ones: ``reward_model.sandbox``
    ``never``, or ``auto`` with a custom function (the user's own code, which may need the
    network or files: mark it untrusted with ``always``). ``num_workers=0`` does not lift the
    sandbox: the runner then scores in one sandboxed child instead of the driver."""
    mode = str(rm.sandbox)
    if mode == "never" or (mode == "auto" and custom):
        return None
    return SandboxLimits(memory_mb=int(rm.sandbox_memory_mb))


def unsandboxed_line(num_workers: int, plugins: dict[str, Any]) -> str:
    """The one line a run with ``reward_model.sandbox=never`` prints: which scorers then
    evaluate model output outside the sandbox, and where."""
    where = "in the driver process" if num_workers == 0 else "in plain reward worker processes"
    scorers = [*EVALUATING_SCORERS]
    if plugins:
        scorers.append(f"the installed plugins' scorers of {', '.join(sorted(plugins))}")
    return (
        f"polyrl: reward_model.sandbox=never: model output is evaluated without the sandbox, "
        f"{where}, by {', '.join(scorers)}; set reward_model.sandbox=auto to sandbox them"
    )
