"""The driver's side of the weight sync: versions, the transport between pools, the probe.

Colocated roles (one pool) keep the fast path: each worker streams the actor's tensors into its
own rollout engine in memory (:meth:`polyrl.workers.worker.Worker.sync_weights`). Roles in two
pools go through a channel (:mod:`polyrl.workers.transport`), opened at the first sync: the
actor's pool sends and the rollout's pool receives at the same time, each call bounded by
``actor_rollout_ref.rollout.weight_sync.timeout_s``; when either side fails or does not finish,
the error names the pools and ranks, in one line.

Every sync has a version (1, 2, ... per source and target, counted here); the receiving workers
record it and refuse one that is not newer, and a receiver that gets another version than the
one the driver announced raises. After each sync the probe checks that the weights arrived
intact: the rollout samples ``probe_tokens`` tokens of a fixed prompt on every data-parallel
rank, and the actor scores the same tokens (``compute_log_prob``).

Why sample instead of greedy decoding or scoring: a rollout engine's interface can only
generate, and its recorded log-probs are ``log_softmax(logits / temperature)`` of the chosen
token before top-k/top-p truncation (the convention :mod:`polyrl.interfaces.rollout_engine`'s
engines follow so that on-policy importance ratios start at 1). The actor computes exactly that
at the rollout's temperature, so sampling at that temperature with top-k/top-p off, seeded
(the engine's own random stream is untouched), compares like with like; greedy decoding would
record temperature-1 log-probs, which match the actor's only at temperature 1. The difference
is then only numerics (dtype, kernels): ``probe_tolerance`` is that budget, and a larger one
means the rollout does not run the trainer's weights.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from polyrl.errors import PolyrlError
from polyrl.workers.transport import WeightSyncError

if TYPE_CHECKING:
    from polyrl.workers.group import SPMDGroup
    from polyrl.workers.placement import RoleWorkers

PROBE_SEED = 20240611  # any fixed seed: the probe must not depend on the run's random state
PROBE_PROMPT_LENGTH = 8
#: Probe rows per data-parallel rank of the rollout. Two, not one: the probe is often a rollout
#: engine's first call, and a compiler traces a single row as a constant size (torch's dynamo
#: keeps sizes 0 and 1 specialised), so a one-row probe would leave the run's real batches a
#: second trace of every compiled function to pay in the first step.
PROBE_ROWS_PER_RANK = 2
_SYNC_KEY = "actor_rollout_ref.rollout.weight_sync"


@dataclass(frozen=True)
class WeightSyncSettings:
    """The sync's knobs (``actor_rollout_ref.rollout.weight_sync``,
    ``update_weights_bucket_megabytes``, ``temperature``) and the token ids to avoid in the probe
    prompt (pad and end-of-sequence)."""

    timeout_s: float = 600.0
    bucket_bytes: int = 512 * 2**20
    probe_tokens: int = 0
    probe_tolerance: float = 5.0
    temperature: float = 1.0
    special_ids: tuple[int, ...] = ()

    @classmethod
    def from_config(cls, cfg: Any, tokens: dict[str, Any]) -> WeightSyncSettings:
        rollout = cfg.actor_rollout_ref.rollout
        sync = rollout.weight_sync
        special = [tokens.get("pad_token_id"), *tokens.get("eos_token_ids", ())]
        return cls(
            timeout_s=float(sync.timeout_s),
            bucket_bytes=int(rollout.update_weights_bucket_megabytes) * 2**20,
            probe_tokens=int(sync.probe_tokens),
            probe_tolerance=float(sync.probe_tolerance),
            temperature=float(rollout.temperature),
            special_ids=tuple(int(t) for t in special if t is not None),
        )


def probe_prompt(special_ids: Sequence[int]) -> list[int]:
    """A fixed prompt of :data:`PROBE_PROMPT_LENGTH` small token ids (present in any
    vocabulary), skipping pad and end-of-sequence ids so that it reads like text."""
    ids = (i for i in range(1, 1000) if i not in set(special_ids))
    return [next(ids) for _ in range(PROBE_PROMPT_LENGTH)]


def run_together(
    calls: Sequence[tuple[SPMDGroup, str, list[tuple[Any, ...]]]], timeout_s: float
) -> list[list[Any]]:
    """Run each ``(group, method, per-rank args)`` at once (the two sides of one collective)
    and wait for all of them, each bounded by ``timeout_s``; the outputs per call, or a
    :class:`PolyrlError` joining every side's failure."""
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = [
            pool.submit(group.run, method, args, what=method, timeout_s=timeout_s)
            for group, method, args in calls
        ]
        failures = [f.exception() for f in futures]
    problems = [str(e) for e in failures if e is not None]
    if problems:
        raise PolyrlError("; ".join(problems))
    return [f.result() for f in futures]


class WeightSync:
    """Versions and transport channels of one run's syncs (held by
    :class:`~polyrl.workers.placement.RoleWorkers`)."""

    def __init__(self, settings: WeightSyncSettings | None = None) -> None:
        self.settings = settings or WeightSyncSettings()
        self.versions: dict[tuple[str, str], int] = {}
        self._channels: set[tuple[str, str]] = set()

    def sync(self, workers: RoleWorkers, source: str, target: str) -> dict[str, float]:
        """``source``'s weights into every worker of ``target``, then the probe; the metrics:
        ``bytes`` (per receiving worker), ``seconds`` (slowest worker) and ``weight_sync/*``."""
        version = self.versions.get((source, target), 0) + 1
        pools = (workers.pool_of(source), workers.pool_of(target))
        if pools[0] == pools[1]:
            group = workers.groups[pools[0]]
            results = group.run(
                "sync_weights",
                [(source, target, version)] * group.world_size,
                what=f"sync_weights {source} -> {target}",
                timeout_s=workers.call_timeout_s,
            )
            moved, seconds = results[0]["bytes"], max(r["seconds"] for r in results)
        else:
            moved, seconds = self._between_pools(workers, source, target, version, pools)
        self.versions[(source, target)] = version
        metrics = {
            "bytes": float(moved),
            "seconds": float(seconds),
            "weight_sync/version": float(version),
            "weight_sync/bytes": float(moved),
            "weight_sync/seconds": float(seconds),
        }
        if self.settings.probe_tokens > 0:
            start = time.perf_counter()
            diff = self.probe(workers, source, target)
            metrics["weight_sync/probe_seconds"] = time.perf_counter() - start
            if diff is not None:
                metrics["weight_sync/probe_logprob_max_diff"] = diff
                if not diff <= self.settings.probe_tolerance:
                    raise WeightSyncError(
                        f"weight sync v{version} {source} -> {target}: the rollout's log-probs "
                        f"of the probe differ from the {source}'s by up to {diff:.4g} nats, "
                        f"more than {_SYNC_KEY}.probe_tolerance={self.settings.probe_tolerance}:"
                        f" the rollout does not run the trainer's weights (or the two compute "
                        f"in dtypes that far apart; raise the tolerance only then)"
                    )
        return metrics

    def _between_pools(
        self,
        workers: RoleWorkers,
        source: str,
        target: str,
        version: int,
        pools: tuple[str, str],
    ) -> tuple[float, float]:
        senders, receivers = workers.groups[pools[0]], workers.groups[pools[1]]
        timeout = self.settings.timeout_s
        where = (
            f"{source} (pool {pools[0]!r}, {senders.world_size} rank(s)) -> {target} (pool "
            f"{pools[1]!r}, {receivers.world_size} rank(s))"
        )
        try:
            if (source, target) not in self._channels:
                self._open_channel(senders, receivers, timeout)
                self._channels.add((source, target))
            sent, received = run_together(
                [
                    (
                        senders,
                        "send_weights",
                        [(source, version, self.settings.bucket_bytes)] * senders.world_size,
                    ),
                    (receivers, "receive_weights", [(target, version)] * receivers.world_size),
                ],
                timeout,
            )
        except PolyrlError as exc:
            raise WeightSyncError(
                f"weight sync v{version} {where} failed: {exc} (timeout {_SYNC_KEY}.timeout_s="
                f"{timeout:g})"
            ) from exc
        return sent[0]["bytes"], max(r["seconds"] for r in [*sent, *received])

    @staticmethod
    def _open_channel(senders: SPMDGroup, receivers: SPMDGroup, timeout: float) -> None:
        """A transport group: the senders' rank 0 (channel rank 0) and every receiver."""
        endpoints = senders.run(
            "open_weight_channel", [(timeout,)] * senders.world_size, timeout_s=timeout
        )
        address, size = endpoints[0], 1 + receivers.world_size
        run_together(
            [
                (
                    senders,
                    "join_weight_channel",
                    [
                        (address, 0 if r == 0 else None, size, timeout)
                        for r in range(senders.world_size)
                    ],
                ),
                (
                    receivers,
                    "join_weight_channel",
                    [(address, 1 + r, size, timeout) for r in range(receivers.world_size)],
                ),
            ],
            timeout,
        )

    def probe(self, workers: RoleWorkers, source: str, target: str) -> float | None:
        """Max |log-prob difference| between ``target``'s sampling log-probs of the probe and
        ``source``'s ``compute_log_prob`` of the same tokens, over every data-parallel rank of
        ``target``; None when the engine reports no log-probs."""
        import torch

        from polyrl.batch import Batch
        from polyrl.interfaces import SamplingParams

        rows = PROBE_ROWS_PER_RANK * workers.dp_size(target)
        ids = torch.tensor([probe_prompt(self.settings.special_ids)] * rows)
        params = SamplingParams(
            n=1,
            temperature=self.settings.temperature,
            top_p=1.0,
            top_k=-1,
            max_new_tokens=self.settings.probe_tokens,
            seed=PROBE_SEED,
        )
        prompts = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
        sampled = workers.call(target, "generate", prompts, params)
        if "rollout_log_probs" not in sampled:
            return None
        scorers = workers.dp_size(source)
        padded = math.ceil(rows / scorers) * scorers
        scored = workers.call(
            source,
            "compute_log_prob",
            sampled.select_rows([min(i, rows - 1) for i in range(padded)]),
        )
        mask = sampled["response_mask"].bool()
        diff = (scored["log_probs"][:rows].float() - sampled["rollout_log_probs"].float()).abs()
        return float(diff[mask].max()) if mask.any() else 0.0
