"""``trainer.logger=[console]``: a live progress bar with the step's key figures.

On a terminal a tqdm bar on stderr counts steps from the resumed step to ``total_steps`` and its
postfix shows reward, KL, response length, seconds per step and the last validation reward. When
stderr is not a terminal (CI, ``nohup``, a log file) a redrawn bar turns into thousands of
carriage-return fragments, so the logger writes one concise line per logged step instead.
``POLYRL_PROGRESS=bar|lines`` overrides the detection. Validation samples
(``trainer.log_val_generations``) are printed as a few lines each validation, above the bar.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

from polyrl.interfaces.logger import LoggerContext, MetricsLogger
from polyrl.loggers.values import (
    KL_KEYS,
    RESPONSE_LENGTH_KEY,
    STEP_TIME_KEY,
    TRAIN_REWARD_KEY,
    first_present,
    to_float_metrics,
    val_rewards,
)

PROGRESS_ENV = "POLYRL_PROGRESS"
# How much of a validation sample's prompt and output one console line shows.
PROMPT_CHARS = 60
OUTPUT_CHARS = 80


def _clip(text: str, limit: int, *, keep_end: bool) -> str:
    """``text`` on one line (whitespace runs as one space), cut to ``limit`` characters with an
    ellipsis where it was cut."""
    flat = " ".join(str(text).split())
    if len(flat) <= limit:
        return flat
    return "…" + flat[-(limit - 1) :] if keep_end else flat[: limit - 1] + "…"


def key_figures(metrics: dict[str, float], last_val: float | None = None) -> list[tuple[str, str]]:
    """The (label, formatted value) pairs shown for one step, in display order.

    ``last_val`` is the most recent validation reward, shown when this step has none of its own
    (validation runs every ``trainer.test_freq`` steps, the bar should keep showing it). With
    several validation data sources the mean over them is shown.
    """
    figures: list[tuple[str, str]] = []
    if TRAIN_REWARD_KEY in metrics:
        figures.append(("reward", format(metrics[TRAIN_REWARD_KEY], ".3f")))
    kl = first_present(metrics, KL_KEYS)
    if kl is not None:
        figures.append(("kl", format(kl, ".3g")))
    if RESPONSE_LENGTH_KEY in metrics:
        figures.append(("resp_len", format(metrics[RESPONSE_LENGTH_KEY], ".1f")))
    if STEP_TIME_KEY in metrics:
        figures.append(("s/step", format(metrics[STEP_TIME_KEY], ".2f")))
    vals = val_rewards(metrics)
    val = sum(vals.values()) / len(vals) if vals else last_val
    if val is not None:
        figures.append(("val", format(val, ".3f")))
    return figures


class ConsoleLogger(MetricsLogger):
    """Progress bar (terminal) or one line per step (anything else), both on stderr.

    ``stream`` and ``live`` exist for tests and embedding; the trainer passes only ``ctx``.
    """

    def __init__(
        self, ctx: LoggerContext, *, stream: TextIO | None = None, live: bool | None = None
    ) -> None:
        super().__init__(ctx)
        self._stream = stream if stream is not None else sys.stderr
        self._live = self._decide_live(live)
        self._total = ctx.total_steps if ctx.total_steps and ctx.total_steps > 0 else None
        self._last_val: float | None = None
        self._bar: Any = None
        self._closed = False
        if self._live:
            from tqdm import tqdm

            self._bar = tqdm(
                total=self._total,
                initial=max(0, ctx.resumed_from_step),
                file=self._stream,
                desc=ctx.experiment_name or "polyrl",
                unit="step",
                dynamic_ncols=True,
                leave=True,
            )

    def _decide_live(self, live: bool | None) -> bool:
        if live is not None:
            return live
        forced = os.environ.get(PROGRESS_ENV, "").strip().lower()
        if forced in ("bar", "lines"):
            return forced == "bar"
        isatty = getattr(self._stream, "isatty", None)
        return bool(isatty and isatty())

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self._closed:
            return
        floats = to_float_metrics(metrics)
        figures = key_figures(floats, self._last_val if self._live else None)
        vals = val_rewards(floats)
        if vals:
            self._last_val = sum(vals.values()) / len(vals)
        if self._bar is not None:
            # postfix first, then advance: one redraw per step, with this step's figures
            self._bar.set_postfix_str(", ".join(f"{k}={v}" for k, v in figures), refresh=False)
            if step > self._bar.n:
                self._bar.update(step - self._bar.n)
            else:
                self._bar.refresh()
        else:
            self._stream.write(self._line(step, figures) + "\n")
            self._stream.flush()

    def log_generations(self, rows: list[dict[str, Any]], step: int) -> None:
        """A compact table of the validation samples: score, source, the prompt's end (after a
        chat template's system text, the question is there) and the output's start, each on
        one line; printed above the bar on a terminal."""
        if self._closed:
            return
        text = "\n".join(
            [f"[polyrl] validation samples, step {step}:"]
            + [
                f"  {row['score']:>7.3f}  {row['data_source']}  "
                f"{_clip(row['prompt'], PROMPT_CHARS, keep_end=True)!r} -> "
                f"{_clip(row['output'], OUTPUT_CHARS, keep_end=False)!r}"
                for row in rows
            ]
        )
        if self._bar is not None:
            self._bar.write(text, file=self._stream)
        else:
            self._stream.write(text + "\n")
            self._stream.flush()

    def _line(self, step: int, figures: list[tuple[str, str]]) -> str:
        if self._total:
            head = f"[polyrl] step {step}/{self._total} ({100 * step / self._total:.0f}%)"
        else:
            head = f"[polyrl] step {step}"
        return " | ".join([head, *(f"{label} {value}" for label, value in figures)])

    def finish(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        else:
            self._stream.flush()
