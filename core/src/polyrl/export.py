"""``polyrl export``: a checkpoint folder (``global_step_<N>``) as a Hugging Face folder.

The checkpoint says which engine wrote it and with which model: its ``trainer_state.json``
carries the run config, whose ``actor_rollout_ref.actor.strategy`` selects the training engine
plugin and whose ``actor_rollout_ref.model`` names the model folder and its dtype. The engine's
spec names a ``checkpoint_reader`` that builds the checkpoint's model whole in this process (no
Ray, no process group, whatever number of ranks wrote it); this module writes it with
``save_pretrained`` in the dtype the run trained in, with the tokenizer, then loads the folder
back with ``transformers`` and compares its logits on a few prompts with those of the model as
read (the float32 master weights), so a broken export is caught here and not when it is served.

Nothing of the user's is overwritten: ``--out`` must not exist, or be an earlier export of the
same checkpoint (its ``polyrl_export.json`` says so), which is then replaced atomically. The
export is written beside ``--out`` first and renamed into place.

A LoRA checkpoint holds the adapters only; it exports merged into the base model (the default)
or as the adapter folder peft loads, which ``transformers`` loads too (with peft installed).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from polyrl.checkpoint import (
    ACTOR_SUBDIR,
    MARKER_FILE,
    TRAINER_STATE_FILE,
    is_complete,
    load_driver_state,
    read_marker,
    step_of,
    verify_checkpoint,
)
from polyrl.errors import ConfigError
from polyrl.fsutil import atomic_write_text, fsync_path
from polyrl.lora import lora_rank

EXPORT_RECORD = "polyrl_export.json"
MERGED, ADAPTERS = "merged", "adapters"
# A few short prompts of plain text and code: any tokenizer turns them into several tokens.
CHECK_PROMPTS = ("The cat sat on the mat.", "1 + 2 = 3. 4 + 5 =", "def add(a, b):\n    return")
_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16"}


@dataclass(frozen=True)
class CheckpointToExport:
    """What ``polyrl export`` reads from a checkpoint folder before touching any weights."""

    path: str
    step: int
    run_id: str
    config: dict[str, Any]
    strategy: str

    @property
    def role_dir(self) -> str:
        return os.path.join(self.path, ACTOR_SUBDIR)

    def record(self) -> dict[str, Any]:
        """What the export's ``polyrl_export.json`` holds: which checkpoint it came from."""
        return {"checkpoint": self.path, "run_id": self.run_id, "step": self.step}


@dataclass(frozen=True)
class LogitsCheck:
    """The exported folder's logits against the checkpoint's, on :data:`CHECK_PROMPTS`."""

    max_abs_diff: float
    tolerance: float
    tokens: int

    @property
    def passed(self) -> bool:
        return self.max_abs_diff <= self.tolerance

    def line(self) -> str:
        verdict = "equal" if self.passed else "DIFFER"
        return (
            f"logits {verdict} to the checkpoint's on {len(CHECK_PROMPTS)} prompts "
            f"({self.tokens} tokens): max |diff| {self.max_abs_diff:.3g}, "
            f"tolerance {self.tolerance:.3g}"
        )


@dataclass(frozen=True)
class ExportResult:
    out: str
    mode: str  # MERGED or ADAPTERS
    dtype: str
    check: LogitsCheck


def checkpoint_to_export(path: str) -> CheckpointToExport:
    """The checkpoint at ``path``, checked: a complete, intact polyrl checkpoint with the run
    config it was saved with and an actor folder; else a one-line :class:`ConfigError`."""
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(path):
        raise ConfigError(f"{path}: no such folder; pass a checkpoint folder (global_step_<N>)")
    if not os.path.isfile(os.path.join(path, TRAINER_STATE_FILE)):
        raise ConfigError(
            f"{path} is not a polyrl checkpoint (no {TRAINER_STATE_FILE}); pass a "
            f"global_step_<N> folder of a run's trainer.default_local_dir"
        )
    if not is_complete(path):
        raise ConfigError(
            f"{path} is an incomplete checkpoint (no readable {MARKER_FILE} marker: its save was "
            f"interrupted); export a complete one"
        )
    problem = verify_checkpoint(path)
    if problem is not None:
        raise ConfigError(f"{problem}; export another checkpoint")
    config = load_driver_state(path, restore_rng=False).get("config")
    if not isinstance(config, dict):
        raise ConfigError(f"{path}/{TRAINER_STATE_FILE} holds no run config to export it with")
    if not os.path.isdir(os.path.join(path, ACTOR_SUBDIR)):
        raise ConfigError(f"{path} has no {ACTOR_SUBDIR}/ folder: it holds no policy to export")
    marker = read_marker(path)
    return CheckpointToExport(
        path=path,
        step=int(marker.get("step", step_of(path) or 0)),
        run_id=str(marker.get("run_id", "")),
        config=config,
        strategy=str(config["actor_rollout_ref"]["actor"]["strategy"]),
    )


def default_out(checkpoint: CheckpointToExport) -> str:
    """``hf_model_step_<N>`` beside the checkpoint: not inside it (its files are checksummed),
    and not the run's own ``hf_model/``."""
    return os.path.join(os.path.dirname(checkpoint.path), f"hf_model_step_{checkpoint.step}")


def check_out(out: str, checkpoint: CheckpointToExport) -> None:
    """Refuse an ``out`` that exists and is not an earlier export of ``checkpoint``."""
    if not os.path.lexists(out):
        return
    try:
        with open(os.path.join(out, EXPORT_RECORD), encoding="utf-8") as fh:
            record = json.load(fh)
    except (OSError, ValueError):
        record = None
    if record != checkpoint.record():
        raise ConfigError(
            f"--out {out} exists and is not an export of {checkpoint.path}; polyrl does not "
            f"replace it. Pass another --out or move it away"
        )


def checkpoint_reader(strategy: str) -> Callable[[str, Any, str], Any]:
    """The ``checkpoint_reader`` of the training engine ``strategy`` names (the registry's
    one-line error, with the package to install, when no installed plugin provides it)."""
    from polyrl.registry import get_registry
    from polyrl.specs import PluginKind, resolve_object

    registration = get_registry().get(PluginKind.TRAINING_ENGINE, strategy)
    package = registration.provenance.distribution
    target = getattr(registration.spec, "checkpoint_reader", None)
    if target is None:
        raise ConfigError(
            f"training engine {strategy!r} (package {package}) names no checkpoint_reader, so "
            f"polyrl export cannot read its checkpoints; export at the end of a run instead "
            f"(trainer.export_hf_model=true)"
        )
    try:
        return resolve_object(target)
    except ImportError as exc:
        raise ConfigError(
            f"training engine {strategy!r}: its checkpoint reader {target!r} failed to import "
            f"({exc}); install what it needs: pip install '{package}'"
        ) from exc


def export_checkpoint(path: str, out: str | None = None, mode: str | None = None) -> ExportResult:
    """Export the checkpoint at ``path`` to ``out`` (default :func:`default_out`); ``mode``
    is :data:`MERGED` (the default) or :data:`ADAPTERS` (LoRA checkpoints only)."""
    from omegaconf import OmegaConf

    from polyrl.models.resolve import resolve_model_path

    checkpoint = checkpoint_to_export(path)
    out = os.path.abspath(os.path.expanduser(out or default_out(checkpoint)))
    check_out(out, checkpoint)
    cfg = OmegaConf.create(checkpoint.config)  # the whole resolved config of the run
    model_cfg = cfg.actor_rollout_ref.model
    is_lora = lora_rank(model_cfg) > 0
    mode = mode or MERGED
    if mode == ADAPTERS and not is_lora:
        raise ConfigError(
            f"--adapters: {checkpoint.path} is not a LoRA checkpoint "
            f"(actor_rollout_ref.model.lora_rank=0); export it without --adapters"
        )
    read = checkpoint_reader(checkpoint.strategy)
    model_path = resolve_model_path(str(model_cfg.path))
    model = read(checkpoint.role_dir, cfg, model_path)
    dtype = _DTYPES.get(str(model_cfg.dtype).lower().replace("torch.", ""), "float32")
    tokenizer = _tokenizer(str(model_cfg.tokenizer_path or model_path), model_cfg)
    reference = _logits(model, tokenizer)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.tmp-", dir=os.path.dirname(out))
    try:
        _write(model, staging, mode, dtype, tokenizer)
        check = compare_logits(staging, reference, tokenizer, dtype, exact=not is_lora)
        atomic_write_text(
            os.path.join(staging, EXPORT_RECORD), json.dumps(checkpoint.record(), indent=2)
        )
        _install(staging, out, checkpoint)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ExportResult(out=out, mode=mode, dtype=dtype, check=check)


def _tokenizer(source: str, model_cfg: Any) -> Any:
    from transformers import AutoTokenizer

    from polyrl.data.chat_template import use_custom_template

    trust = bool(model_cfg.trust_remote_code)
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust)
    # The exported folder renders chats as the run did.
    return use_custom_template(tokenizer, model_cfg.get("custom_chat_template"))


def _write(model: Any, folder: str, mode: str, dtype: str, tokenizer: Any) -> None:
    """``model`` (float32; a peft model for LoRA) into ``folder`` as ``mode`` asks."""
    import torch

    from polyrl.models.saving import save_hf_model

    if hasattr(model, "merge_and_unload") and mode == MERGED:
        model = model.merge_and_unload()
    if mode == ADAPTERS:
        model.save_pretrained(folder)  # adapter_config.json naming the base model folder
    else:
        model.config.use_cache = True  # the engines train without a KV cache
        save_hf_model(model.to(getattr(torch, dtype)), folder)
    tokenizer.save_pretrained(folder)


def _logits(model: Any, tokenizer: Any) -> list[Any]:
    """Float32 logits of ``model`` on each check prompt (one unpadded row each)."""
    import torch

    outputs = []
    with torch.no_grad():
        for prompt in CHECK_PROMPTS:
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            outputs.append(model(input_ids=ids).logits.float())
    return outputs


def compare_logits(
    folder: str, reference: list[Any], tokenizer: Any, dtype: str, exact: bool
) -> LogitsCheck:
    """Load ``folder`` with ``transformers`` and compare its logits with ``reference``. The
    tolerance: none for a float32 export of the same weights (``exact``), the rounding of
    the export dtype, relative to the logits' size, otherwise."""
    import torch
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype))
    diff, scale = 0.0, 0.0
    for want, got in zip(reference, _logits(loaded, tokenizer)):
        diff = max(diff, float((want - got).abs().max()))
        scale = max(scale, float(want.abs().max()))
    rounding = {"float32": 1e-5, "bfloat16": 2.0**-6, "float16": 2.0**-9}[dtype]
    tolerance = 0.0 if exact and dtype == "float32" else rounding * max(scale, 1.0)
    tokens = sum(int(r.shape[1]) for r in reference)
    return LogitsCheck(max_abs_diff=diff, tolerance=tolerance, tokens=tokens)


def _install(staging: str, out: str, checkpoint: CheckpointToExport) -> None:
    """Put ``staging`` at ``out``; an earlier export of the same checkpoint there is moved aside
    first and deleted after, so a crash leaves one complete export."""
    check_out(out, checkpoint)  # nothing else took the name meanwhile
    aside = None
    if os.path.lexists(out):
        aside = staging.replace(".tmp-", ".old-")
        os.rename(out, aside)
    os.rename(staging, out)
    fsync_path(os.path.dirname(out))
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def describe(result: ExportResult) -> str:
    """What ``polyrl export`` prints."""
    what = "LoRA adapters" if result.mode == ADAPTERS else f"model ({result.dtype})"
    return f"polyrl: exported {what} to {result.out}\npolyrl: {result.check.line()}"
