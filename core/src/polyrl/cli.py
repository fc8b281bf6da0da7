"""The ``polyrl`` command: list plugins, check and print configs, train, prepare data.

Listing and validating must work on a machine where torch cannot even be imported, so this module
imports only the registry and config machinery at the top; training and data commands import their
(heavy) modules inside their handlers. Errors a user can act on (:class:`polyrl.errors.PolyrlError`)
are printed as one ``error: ...`` line with exit status 2 (what caused them goes to the run's log,
:mod:`polyrl.run_log`), and so is a full disk; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from polyrl import __version__
from polyrl.errors import PolyrlError
from polyrl.run_log import error_line
from polyrl.specs import PluginKind

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_ERROR = 2

OVERRIDES_HELP = "Hydra overrides, e.g. algorithm.adv_estimator=grpo trainer.device=cpu recipe=NAME"


# ---- polyrl plugins ----------------------------------------------------------------------------
def plugin_rows(
    kind: PluginKind | None = None, import_engines: bool = False
) -> list[dict[str, Any]]:
    """One row per registration (and per broken plugin module, and per installed package that
    looks like a plugin but registers nothing), as ``polyrl plugins`` shows them.

    A registration whose ``api_version`` excludes this polyrl's API is ``incompatible``, with
    the reason as its error (its implementation is not imported: it was written for another API).
    Every other one's implementation is resolved: light kinds are imported (with the plugin
    import timeout), engines only located unless ``import_engines`` (their modules import torch,
    vLLM ...). One that does not resolve is ``broken``, with the reason as its error.
    Broken modules and silent packages are listed whatever ``kind`` is: nobody knows what they
    would have provided.
    """
    from polyrl.registry import get_registry

    registry = get_registry()
    rows: list[dict[str, Any]] = []
    for reg in registry.all(kind):
        status, error = "ok", None
        if len(registry.registrations[reg.kind][reg.name]) > 1:
            status = "conflict"
            try:
                registry.get(reg.kind, reg.name)
            except PolyrlError as exc:
                error = str(exc)
        elif reg.incompatibility:
            status, error = "incompatible", reg.incompatibility
        else:
            error = reg.implementation_problem(import_heavy=import_engines)
            status = "broken" if error else "ok"
        rows.append(
            {
                "name": reg.name,
                "kind": reg.kind.value,
                "package": reg.provenance.distribution,
                "version": reg.provenance.version,
                "plugin": reg.provenance.plugin,
                "status": status,
                "capabilities": reg.spec.capability_flags(),
                "description": reg.spec.description,
                "error": error,
            }
        )
    for broken in registry.broken:
        rows.append(
            {
                "name": broken.plugin,
                "kind": None,
                "package": broken.distribution,
                "version": broken.version,
                "plugin": broken.plugin,
                "status": "broken",
                "capabilities": {},
                "description": "",
                "error": broken.error,
            }
        )
    for silent in registry.silent_packages:
        rows.append(
            {
                "name": silent.distribution,
                "kind": None,
                "package": silent.distribution,
                "version": silent.version,
                "plugin": None,
                "status": "registers_nothing",
                "capabilities": {},
                "description": "",
                "error": silent.message(),
            }
        )
    for library in registry.libraries:
        rows.append(
            {
                "name": library.plugin,
                "kind": None,
                "package": library.distribution,
                "version": library.version,
                "plugin": library.plugin,
                "status": "library",
                "capabilities": {},
                "description": "registers no plugin: a library that plugins depend on",
                "error": None,
            }
        )
    return rows


def _format_capabilities(flags: dict[str, Any]) -> str:
    parts = []
    for key, value in flags.items():
        if value is True:
            parts.append(key)
        elif value is False or value in (None, [], ""):
            continue
        elif isinstance(value, list):
            parts.append(f"{key}={'|'.join(map(str, value))}")
        else:
            parts.append(f"{key}={value}")
    return ",".join(parts) or "-"


def _print_table(rows: list[dict[str, Any]]) -> None:
    headers = ("NAME", "KIND", "PACKAGE", "VERSION", "STATUS", "CAPABILITIES", "DESCRIPTION")
    table = [
        (
            r["name"],
            r["kind"],
            r["package"],
            r["version"],
            r["status"],
            _format_capabilities(r["capabilities"]),
            r["description"] if r["status"] == "ok" else (r["error"] or r["description"]),
        )
        for r in rows
        if r["kind"] is not None
    ]
    widths = [max(len(str(row[i])) for row in [headers, *table]) for i in range(len(headers) - 1)]
    for row in [headers, *table]:
        cells = [str(cell).ljust(width) for cell, width in zip(row, widths)]
        print("  ".join([*cells, str(row[-1])]).rstrip())
    broken = [r for r in rows if r["kind"] is None and r["status"] == "broken"]
    if broken:
        print()
        print("Broken plugins (their names cannot be selected until fixed):")
        for r in broken:
            print(f"  {r['name']} from {r['package']} {r['version']}: {r['error']}")
    libraries = [r for r in rows if r["kind"] is None and r["status"] == "library"]
    if libraries:
        print()
        print("Libraries that plugins depend on (they register no plugin of their own):")
        for r in libraries:
            print(f"  {r['package']} {r['version']}")
    silent = [r for r in rows if r["kind"] is None and r["status"] == "registers_nothing"]
    if silent:
        print()
        print("Installed packages that register no polyrl plugin:")
        for r in silent:
            print(f"  {r['error']}")


def cmd_plugins(args: argparse.Namespace) -> int:
    kind = PluginKind(args.kind) if args.kind else None
    rows = plugin_rows(kind, import_engines=args.import_engines)
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    else:
        _print_table(rows)
    return EXIT_OK


# ---- polyrl validate / config / train ----------------------------------------------------------
def command_overrides(args: argparse.Namespace) -> list[str]:
    """The overrides of ``validate``/``config``/``train``: verl's ``--config-path``/
    ``--config-name`` (a verl config or a user's yaml in verl's layout) become overrides placed
    before the command line's, so the command line wins."""
    from polyrl.config.verl_cli import config_file_overrides

    if args.config_path is None and args.config_name is None:
        return list(args.overrides)
    return [*config_file_overrides(args.config_path, args.config_name), *args.overrides]


def cmd_validate(args: argparse.Namespace) -> int:
    from polyrl.config import load_config
    from polyrl.config.validate import summarize, validate_config

    cfg = load_config(command_overrides(args))
    problems = validate_config(cfg)
    if problems:
        print(f"config is invalid ({len(problems)} problem(s)):", file=sys.stderr)
        for problem in problems:
            print(f"  - {problem}", file=sys.stderr)
        return EXIT_INVALID
    print(summarize(cfg))
    print("config OK")
    return EXIT_OK


def cmd_config(args: argparse.Namespace) -> int:
    from omegaconf import OmegaConf

    from polyrl.config import load_config

    print(OmegaConf.to_yaml(load_config(command_overrides(args))), end="")
    return EXIT_OK


def cmd_doctor(args: argparse.Namespace) -> int:
    """Exit 0 when every check passed, 1 when one found a problem."""
    from polyrl.config import load_config
    from polyrl.doctor import diagnose

    output_dir = str(load_config(args.overrides).trainer.default_local_dir)
    findings = diagnose(output_dir)
    if args.json:
        print(json.dumps([f.__dict__ for f in findings], indent=2))
    else:
        width = max(len(f.name) for f in findings)
        for f in findings:
            print(f"{'ok ' if f.ok else 'BAD'} {f.name:<{width}}  {f.value}")
    return EXIT_OK if all(f.ok for f in findings) else EXIT_INVALID


def cmd_train(args: argparse.Namespace) -> int:
    from polyrl.trainer.main import train_from_overrides

    return int(train_from_overrides(command_overrides(args)) or 0)


# ---- polyrl export ---------------------------------------------------------------------------
def cmd_export(args: argparse.Namespace) -> int:
    """Exit 0 when the export's logits equal the checkpoint's, 1 when they differ."""
    from polyrl.export import ADAPTERS, MERGED, describe, export_checkpoint

    mode = ADAPTERS if args.adapters else MERGED
    result = export_checkpoint(args.checkpoint, args.out, mode)
    print(describe(result))
    return EXIT_OK if result.check.passed else EXIT_INVALID


def _add_export_command(subparsers: argparse._SubParsersAction) -> None:
    text = "a checkpoint (global_step_N of any engine) as a Hugging Face folder, logits checked"
    p = subparsers.add_parser("export", help=text, description=text)
    p.add_argument("checkpoint", help="a checkpoint folder, e.g. <run folder>/global_step_40")
    p.add_argument(
        "--out",
        help="the folder to write (must not exist, or be an earlier export of this checkpoint); "
        "default: hf_model_step_N beside the checkpoint",
    )
    lora = p.add_mutually_exclusive_group()
    lora.add_argument(
        "--merge-lora",
        action="store_true",
        help="a LoRA checkpoint merged into its base model (the default)",
    )
    lora.add_argument(
        "--adapters", action="store_true", help="a LoRA checkpoint as peft's adapter folder"
    )
    p.set_defaults(func=cmd_export)


# ---- polyrl data (provided by polyrl.data.commands, loaded only when asked for) ----------------
def _add_data_command(subparsers: argparse._SubParsersAction, load: bool) -> None:
    """Add ``polyrl data``. Its module may import heavy libraries, so it is imported only when the
    user runs ``polyrl data ...``; a failure to import it breaks only that command."""
    if load:
        try:
            from polyrl.data.commands import add_subcommand

            add_subcommand(subparsers)
            return
        except Exception as exc:  # noqa: BLE001 - any failure disables only this command
            reason = f"{type(exc).__name__}: {exc}"
    else:
        reason = None
    parser = subparsers.add_parser(
        "data", help="prepare datasets (polyrl data --help)", add_help=False
    )
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    parser.set_defaults(func=lambda _args: _data_unavailable(reason))


def _data_unavailable(reason: str | None) -> int:
    raise PolyrlError(
        f"`polyrl data` is unavailable: polyrl.data.commands failed to load ({reason}). "
        f"Reinstall polyrl (pip install -e core) or fix that module."
    )


# ---- parser and entry point --------------------------------------------------------------------
def _first_command(argv: Sequence[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="polyrl",
        description="RL post-training for LLMs, assembled from plugins.",
    )
    parser.add_argument("--version", action="version", version=f"polyrl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("plugins", help="list installed plugins: package, version, status")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--kind", choices=[k.value for k in PluginKind], help="only this kind")
    p.add_argument(
        "--import-engines",
        action="store_true",
        help="also import the engines' implementations (slow: torch, vLLM ...); by default "
        "their modules are only located",
    )
    p.set_defaults(func=cmd_plugins)

    for name, func, text in (
        ("validate", cmd_validate, "check a config without touching a device (exit 1: invalid)"),
        ("config", cmd_config, "print the resolved config as YAML"),
        ("train", cmd_train, "run training"),
    ):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("overrides", nargs="*", help=OVERRIDES_HELP)
        p.add_argument("--config-path", help="verl's form: the folder of --config-name's yaml")
        p.add_argument(
            "--config-name",
            help="verl's form: ppo_trainer, ppo_megatron_trainer or a yaml in verl's layout",
        )
        p.set_defaults(func=func)

    p = sub.add_parser(
        "doctor",
        help="versions, plugin health, devices, Ray, free disk: the start of a bug report",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("overrides", nargs="*", help=OVERRIDES_HELP)
    p.set_defaults(func=cmd_doctor)

    _add_export_command(sub)
    _add_data_command(sub, load=_first_command(argv) == "data")
    return parser


class Terminated(BaseException):
    """SIGTERM, turned into an exception so that ``finally`` blocks stop the workers (a
    BaseException: no ``except Exception`` on the way may swallow it)."""


#: How long stopping after Ctrl-C or SIGTERM may take (workers shut down, threads joined)
#: before the process ends anyway with the same status: a stop must never hang.
STOP_GRACE_S = 45.0


def _arm_stop_deadline(name: str, code: int) -> None:
    """End the process ``STOP_GRACE_S`` after a stop signal if unwinding has not by then (a
    shutdown waiting on a worker call that never returns). Checkpoints are unaffected: they are
    complete or staged, and the run lock is released first."""

    def expire() -> None:
        from polyrl.checkpoint import release_held_run_locks

        time.sleep(STOP_GRACE_S)
        release_held_run_locks()
        print(
            f"polyrl: stopped by {name}; shutting the workers down took over "
            f"{STOP_GRACE_S:.0f} s, exiting without waiting. Checkpoints written so far are "
            f"complete: the same command resumes from the last one (trainer.resume_mode=auto)",
            file=sys.stderr,
            flush=True,
        )
        os._exit(code)

    threading.Thread(target=expire, name="polyrl-stop-deadline", daemon=True).start()


def _raise_terminated(signum: int, frame: object) -> None:
    _arm_stop_deadline("SIGTERM", 143)
    raise Terminated


def _raise_interrupt(signum: int, frame: object) -> None:
    _arm_stop_deadline("Ctrl-C", 130)
    raise KeyboardInterrupt


def _interruption(exc: BaseException) -> tuple[str, int] | None:
    """``(signal name, exit status)`` when ``exc`` is, or was raised while handling, Ctrl-C or
    SIGTERM (inside native code such as Ray's waits the signal surfaces wrapped in another
    exception, with the interruption as its context)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, Terminated):
            return "SIGTERM", 143
        if isinstance(current, KeyboardInterrupt):
            return "Ctrl-C", 130
        current = current.__cause__ or current.__context__
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``polyrl``; returns the exit status (130 after Ctrl-C, 143 after SIGTERM)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    try:
        args, extra = parser.parse_known_args(argv)
        # Overrides after verl's --config-name are left over by argparse; any other leftover
        # is a usage error, which parse_args reports.
        if extra and (not hasattr(args, "config_name") or any(a.startswith("-") for a in extra)):
            parser.parse_args(argv)
        if extra:
            args.overrides = [*args.overrides, *extra]
    except SystemExit as exc:  # --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    previous_int = signal.signal(signal.SIGINT, _raise_interrupt)
    try:
        return int(args.func(args))
    except PolyrlError as exc:
        print(f"error: {error_line(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except BaseException as exc:
        stop = _interruption(exc)
        if stop is None:
            line = error_line(exc)  # a full disk, named as such
            if line is None:
                raise
            print(f"error: {line}", file=sys.stderr)
            return EXIT_ERROR
        name, code = stop
        print(
            f"polyrl: stopped by {name}; workers shut down. Checkpoints written so far are "
            f"complete: the same command resumes from the last one (trainer.resume_mode=auto)",
            file=sys.stderr,
        )
        return code
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
