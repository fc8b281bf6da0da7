"""verl's MoE router replay R2 (``actor_rollout_ref.actor.router_replay.mode=R2``): the experts
each token is routed to while the actor computes the old log-probs are recorded, and the
update's forward passes route every token to those experts again, so that the policy ratio
compares two forwards through the same experts (the update's weights still move the router's
probabilities, which the replayed experts' weights are gathered from).

megatron-core does the routing part (``moe_enable_routing_replay``: each MoE layer's router gets
a ``RouterReplay`` that records its top-k indices, or takes them as given). What the engine adds
is the bookkeeping between the two passes, whose micro-batches differ (the update splits
mini-batches otherwise, and shuffles): each row's routing is kept under its real tokens
(identical rows route alike), per MoE layer of this rank, as ``[real tokens, top-k]``, and laid
out again in the token order of whatever micro-batch the row is in (a packed row's real tokens,
or padded rows' columns; with sequence parallelism the layer sees this TP rank's slice of them,
so the record is gathered over the TP group and the replay takes the rank's slice).

A step that skips the old log-prob pass (polyrl does so when the update is one optimizer step on
the rollout's weights, on-policy) has nothing recorded: the update then routes as the current
weights do, which is what the recording would have given.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from polyrl.api import Batch
from polyrl_engine_kit.errors import EngineUsageError
from polyrl_engine_kit.scoring import model_inputs
from polyrl_engine_megatron.sequence_parallel import pad_columns, padding_for


def token_order(
    micro: Batch, packed: bool, multiple: int, device: torch.device
) -> tuple[torch.Tensor, int, list[int]]:
    """Where the MoE layers see ``micro``'s real tokens: their flat indices in the layers'
    ``[s, b]`` token order (row by row, in each row's order), the number of tokens the layers
    see (padding included) and each row's count of real tokens."""
    mask = micro["attention_mask"].to(device)
    lengths = mask.sum(dim=1).tolist()
    real = int(sum(lengths))
    if packed:  # one row of the real tokens, row after row, padded at its end
        return torch.arange(real, device=device), real + padding_for(real, multiple), lengths
    trimmed, _, _ = model_inputs(micro, device)
    _, _, padding = pad_columns(
        trimmed.input_ids, trimmed.position_ids, trimmed.attention_mask, multiple
    )
    rows, columns = padding.bool().nonzero(as_tuple=True)  # row-major
    return columns * padding.shape[0] + rows, padding.numel(), lengths


def row_keys(micro: Batch) -> list[bytes]:
    """Each row's real token ids, as the key of its recorded routing."""
    ids, mask = micro["input_ids"].cpu(), micro["attention_mask"].cpu().bool()
    return [row[keep].numpy().tobytes() for row, keep in zip(ids, mask)]


class RouterReplayR2:
    """Records and replays the routing of this rank's MoE layers (``modules``: its model
    chunks, built with ``moe_enable_routing_replay``)."""

    def __init__(
        self,
        modules: Sequence[torch.nn.Module],
        *,
        packed: bool,
        tp_group: Any,
        tp: int,
        device: torch.device,
    ) -> None:
        self.routers = {
            id(module): [
                sub.router_replay
                for sub in module.modules()
                if getattr(sub, "router_replay", None) is not None
            ]
            for module in modules
        }
        self.packed, self.tp_group, self.tp, self.device = packed, tp_group, tp, device
        self.rank = dist.get_rank(tp_group) if tp > 1 else 0
        # row key -> (chunk id, layer) -> [real tokens, top-k] expert indices (host)
        self.record: dict[bytes, dict[tuple[int, int], torch.Tensor]] = {}
        self.recording = False
        self.replaying = False
        self.stale = False  # an update ran since the record was made: the next pass replaces it

    @contextmanager
    def recording_pass(self) -> Iterator[None]:
        """The old log-prob pass: every micro-batch's routing recorded (the previous step's
        record dropped)."""
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        if self.stale:
            self.record, self.stale = {}, False
        with self._action(RouterReplayAction.RECORD):
            self.recording = True
            try:
                yield
            finally:
                self.recording = False

    @contextmanager
    def replaying_pass(self) -> Iterator[None]:
        """An update: every micro-batch routed as recorded (routed afresh if nothing is)."""
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        self.stale = True
        if not self.record:
            yield
            return
        with self._action(RouterReplayAction.REPLAY_FORWARD):
            self.replaying = True
            try:
                yield
            finally:
                self.replaying = False

    @contextmanager
    def forward(self, module: torch.nn.Module, micro: Batch) -> Iterator[None]:
        """Around one micro-batch's forward through model chunk ``module``: its recorded
        routing set before it when replaying, its routing kept after it when recording."""
        routers = self.routers.get(id(module), [])
        if not routers or not (self.recording or self.replaying):
            yield
            return
        index, total, lengths = token_order(micro, self.packed, self.tp, self.device)
        keys = row_keys(micro)
        if self.replaying:
            self._set_targets(id(module), routers, keys, index, total)
        yield
        if self.recording:
            self._keep(id(module), routers, keys, index, lengths)

    def _keep(
        self,
        chunk: int,
        routers: list[Any],
        keys: list[bytes],
        index: torch.Tensor,
        lengths: list[int],
    ) -> None:
        for layer, router in enumerate(routers):
            seen = router.get_recorded_indices()
            if self.tp > 1:  # each TP rank routed its slice of the sequence
                parts = [torch.empty_like(seen) for _ in range(self.tp)]
                dist.all_gather(parts, seen.contiguous(), group=self.tp_group)
                seen = torch.cat(parts)
            rows = seen[index].to("cpu", torch.int16).split(lengths)
            for key, row in zip(keys, rows):
                self.record.setdefault(key, {})[(chunk, layer)] = row

    def _set_targets(
        self,
        chunk: int,
        routers: list[Any],
        keys: list[bytes],
        index: torch.Tensor,
        total: int,
    ) -> None:
        missing = sum(key not in self.record for key in keys)
        if missing:
            raise EngineUsageError(
                f"router replay R2 replays the routing recorded by the actor's old log-prob "
                f"pass, which did not score {missing} of this micro-batch's rows; compute the "
                f"old log-probs of the batch the update trains on"
            )
        for layer, router in enumerate(routers):
            recorded = torch.cat([self.record[key][(chunk, layer)] for key in keys])
            topk = recorded.shape[1]
            # padding tokens take experts 0..k-1 (their outputs are never read)
            full = torch.arange(topk, device=self.device).expand(total, topk).clone()
            full[index] = recorded.to(self.device, torch.long)
            router.set_target_indices(full.chunk(self.tp)[self.rank])

    @contextmanager
    def _action(self, action: Any) -> Iterator[None]:
        replays = [router for routers in self.routers.values() for router in routers]
        for router in replays:
            router.set_router_replay_action(action)
        try:
            yield
        finally:
            for router in replays:
                router.clear_router_replay_action()
                router.clear_indices()
