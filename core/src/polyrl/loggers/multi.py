"""The trainer's one handle on every logger selected by ``trainer.logger=[...]``.

The trainer must not care which loggers exist, nor let one logger's failure stop the others from
closing their files: ``LoggerGroup`` builds each selected logger through the plugin registry
(built-ins and third-party packages alike), forwards every ``log`` to all of them, and calls every
``finish`` exactly once, also when the run ends in an exception (use it as a context manager)::

    with LoggerGroup.from_names(cfg.trainer.logger, ctx) as loggers:
        for step in ...:
            loggers.log(metrics, step)
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

from polyrl.errors import ConfigError
from polyrl.interfaces.logger import LoggerContext, MetricsLogger
from polyrl.loggers.values import to_float_metrics

_log = logging.getLogger(__name__)


def _normalise_names(names: str | Iterable[str] | None) -> list[str]:
    """``"console"``, ``["console", "jsonl"]`` or an OmegaConf ListConfig -> unique names, in
    order (verl accepts a bare string too)."""
    if names is None:
        return []
    items = [names] if isinstance(names, str) else list(names)
    out: list[str] = []
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise ConfigError(
                f"trainer.logger must be a list of logger names, e.g. [console,jsonl]; "
                f"got the entry {item!r}"
            )
        name = item.strip()
        if name not in out:
            out.append(name)
    return out


class LoggerGroup:
    """Forwards ``log``/``finish`` to several :class:`MetricsLogger` objects."""

    def __init__(self, loggers: Sequence[MetricsLogger], names: Sequence[str] | None = None):
        self.loggers = list(loggers)
        self.names = list(names) if names is not None else [type(lg).__name__ for lg in loggers]
        self._finished = False

    @classmethod
    def from_names(cls, names: str | Iterable[str] | None, ctx: LoggerContext) -> LoggerGroup:
        """Build the loggers named in ``trainer.logger`` via the plugin registry.

        Unknown or broken names raise the registry's error (it lists the valid names and the pip
        package to install). If building one logger fails, those already built are finished.
        """
        from polyrl.registry import get_registry
        from polyrl.specs import PluginKind

        registry = get_registry()
        return cls.from_registrations(
            [registry.get(PluginKind.LOGGER, name) for name in _normalise_names(names)], ctx
        )

    @classmethod
    def from_registrations(cls, registrations: Iterable[Any], ctx: LoggerContext) -> LoggerGroup:
        """Build the loggers a run plan selected (:attr:`polyrl.plan.RunPlan.loggers`), each
        once. If building one fails, those already built are finished."""
        unique = list({reg.name: reg for reg in registrations}.values())
        built: list[MetricsLogger] = []
        try:
            for reg in unique:
                built.append(reg.load()(ctx))
        except BaseException:
            cls(built, [reg.name for reg in unique[: len(built)]]).finish()
            raise
        return cls(built, [reg.name for reg in unique])

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Send ``metrics`` (converted to floats once, here) to every logger. All loggers get the
        call even if one raises; the first error is re-raised afterwards."""
        floats = to_float_metrics(metrics)
        self._each("log", lambda lg: lg.log(dict(floats), int(step)))

    def log_image(self, name: str, path: str, step: int) -> None:
        """Send the image file at ``path`` to every logger (see
        :meth:`polyrl.interfaces.MetricsLogger.log_image`)."""
        self._each("log_image", lambda lg: lg.log_image(name, path, int(step)))

    def log_generations(self, rows: Sequence[Mapping[str, Any]], step: int) -> None:
        """Send validation samples, each stamped with ``step``, to every logger that has
        ``log_generations`` (:meth:`polyrl.interfaces.MetricsLogger.log_generations`); a logger
        class that does not subclass :class:`MetricsLogger` and lacks it is skipped silently,
        as there is no scalar to fall back to. No rows, no call."""
        if not rows:
            return
        stamped = [{"step": int(step), **row} for row in rows]

        def send(logger: Any) -> None:
            method = getattr(logger, "log_generations", None)
            if method is not None:
                method([dict(row) for row in stamped], int(step))

        self._each("log_generations", send)

    def finish(self) -> None:
        """Finish every logger once; later calls do nothing."""
        if self._finished:
            return
        self._finished = True
        self._each("finish", lambda lg: lg.finish())

    def _each(self, what: str, call: Any) -> None:
        first: BaseException | None = None
        for name, logger in zip(self.names, self.loggers):
            try:
                call(logger)
            except Exception as exc:  # noqa: BLE001 - re-raised below, after the others ran
                exc.add_note(f"in logger {name!r} ({what})")
                first = first or exc
        if first is not None:
            raise first

    def __enter__(self) -> LoggerGroup:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.finish()
            return
        try:
            self.finish()
        except Exception as failure:  # noqa: BLE001 - the run's own exception matters more
            # one line: the run's error follows, and a full disk fails both the same way
            _log.warning(
                "a logger failed to finish while the run was failing: %s",
                " ".join(traceback.format_exception_only(failure)[-1].split()),
            )
