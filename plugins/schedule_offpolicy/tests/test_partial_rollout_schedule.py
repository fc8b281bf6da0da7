"""The partial-rollout schedule with fake roles: a rollout that writes the version of its weights
into each token's log-prob, so a test can check that every token kept the version and log-prob
it was sampled with; weight syncs that land in the middle of a batch (``continue`` carries the
samples on, ``abort`` starts them again); staleness per sample and per token within k; every
prompt trained once under one uid, also across a checkpoint taken with samples half done."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from test_one_step_off_schedule import FakeRoles

from polyrl.api import (
    Batch,
    ConfigError,
    Stage,
    StepContext,
    StepPipeline,
    StepState,
    SyncWeightsStage,
    assemble_rollout,
    names,
)
from polyrl_schedule_offpolicy.chunks import TOKEN_VERSION_KEY
from polyrl_schedule_offpolicy.k_step_off import KStepOffSchedule
from polyrl_schedule_offpolicy.partial_rollout import PartialRolloutSchedule

EOS, PAD, FIRST_PROMPT_ID = 0, 99, 100
LENGTHS = (3, 12, 7, 20, 20, 16)  # response length (with EOS) of prompt i: LENGTHS[i % 6]
MAX_NEW, CHUNK, PROMPTS_PER_STEP, N = 20, 4, 2, 2
WAIT_S = 10.0


def cfg(mode: str, k: int, strategy: str = "wait") -> Any:
    return OmegaConf.create(
        {
            "trainer": {
                "seed": 1,
                "off_policy": {
                    "max_off_policy_threshold": k,
                    "max_off_policy_strategy": strategy,
                    "partial_rollout": mode,
                    "partial_rollout_chunk_tokens": CHUNK,
                },
            },
            "data": {"max_response_length": MAX_NEW},
            "actor_rollout_ref": {
                "rollout": {
                    "n": N,
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "top_k": -1,
                    "do_sample": True,
                }
            },
        }
    )


def expected_tokens(index: int) -> list[int]:
    length = LENGTHS[index % len(LENGTHS)]
    return [1 + p for p in range(length - 1)] + [EOS]


@dataclass
class ChunkRoles(FakeRoles):
    """A rollout whose ``generate`` continues prompt ``[100 + i]`` with ``1, 2, ...`` and stops
    with EOS at the prompt's length; the log-prob of position p is ``-(p+1)/4 - version``.
    ``hold(step, sampled, version)`` true: the chunk sets ``holding`` and waits until the
    schedule asks generation to pause (so that a weight sync or a checkpoint lands right after
    it). The update of a step in ``train_waits`` waits for that event first."""

    hold: Callable[[int, int, int], bool] = lambda step, sampled, version: False
    schedule: Any = None
    holding: threading.Event = field(default_factory=threading.Event)
    train_waits: dict[int, threading.Event] = field(default_factory=dict)

    def call(self, role: str, method: str, batch: Batch, params: Any, dispatch: Any = None):
        assert (role, method, params.n) == ("rollout", "generate", 1)
        version, samples = self.rollout, []
        for ids, mask in zip(batch["input_ids"].tolist(), batch["attention_mask"].tolist()):
            sequence = [t for t, m in zip(ids, mask, strict=True) if m]
            index, sampled = sequence[0] - FIRST_PROMPT_ID, len(sequence) - 1
            step = index // PROMPTS_PER_STEP + 1
            if self.hold(step, sampled, version):
                self.holding.set()
                deadline = time.monotonic() + WAIT_S
                while not self.schedule._pause:
                    assert time.monotonic() < deadline, "the trainer never paused generation"
                    time.sleep(0.001)
            full = expected_tokens(index)
            tokens = full[sampled : sampled + params.max_new_tokens]
            lps = [-(p + 1) / 4 - version for p in range(sampled, sampled + len(tokens))]
            samples.append((tokens, lps))
        self.log("chunk", version)
        return assemble_rollout(
            batch, samples, n=1, max_new_tokens=params.max_new_tokens, pad_token_id=PAD
        )


class Gen(Stage):
    """The single-turn generation stage's declaration (the schedule generates in its place)."""

    name, roles = names.STAGE_GEN, ("rollout",)
    provides = ("responses", "response_mask", "rollout_log_probs", "uid")


class Score(Stage):
    """A scoring stage: runs on the finished batch, in the generation thread."""

    name = "reward"
    requires = ("responses",)

    def run(self, state: StepState, ctx: StepContext) -> None:
        state.metrics["reward/mean"] = float(state.batch["response_mask"].sum(-1).double().mean())


class Train(Stage):
    """Records what it trains on and moves the actor one version on."""

    name, roles = "update_actor", ("actor",)

    def run(self, state: StepState, ctx: StepContext) -> None:
        batch = state.batch
        wait = ctx.workers.train_waits.get(state.step)
        assert wait is None or wait.wait(WAIT_S), "generation never reached its hold"
        ctx.workers.log("train", state.step, batch, dict(state.metrics))
        ctx.workers.actor += 1


class Prompts:
    """Batches of 2 prompts ``[100 + i]``, resumable like the real loader."""

    def __init__(self) -> None:
        self.position = 0

    def __call__(self, count: int | None = None) -> Batch:
        rows = list(range(self.position, self.position + (count or PROMPTS_PER_STEP)))
        self.position += len(rows)
        return Batch(
            {
                "input_ids": torch.tensor([[FIRST_PROMPT_ID + r] for r in rows]),
                "attention_mask": torch.ones((len(rows), 1), dtype=torch.long),
            },
            {"index": np.array(rows)},
        )


class Tokenizer:
    eos_token_id, pad_token_id = EOS, PAD


def schedule(mode: str, k: int, strategy: str = "wait") -> PartialRolloutSchedule:
    pipeline = StepPipeline([Gen(), Score(), Train(), SyncWeightsStage()], initial_keys=())
    return PartialRolloutSchedule(cfg(mode, k, strategy), pipeline)


def context(roles: ChunkRoles, prompts: Prompts) -> StepContext:
    return StepContext(
        cfg=None, workers=roles, tokenizer=Tokenizer(), reward=None, next_prompts=prompts
    )


def run_steps(sched: PartialRolloutSchedule, ctx: StepContext, steps: range, last: int) -> None:
    ctx.workers.schedule = sched
    for step in steps:
        sched.run(step, ctx, prefetch_next=step < last)


def trained(roles: ChunkRoles) -> list[tuple[int, Batch, dict[str, float]]]:
    return [event[1:] for event in roles.events if event[0] == "train"]


def check_batches(roles: ChunkRoles, k: int) -> None:
    """Every trained token is the right one, with the log-prob of the version recorded for it,
    at most k versions behind the actor that trained on it."""
    for step, batch, metrics in trained(roles):
        versions, lps = batch[TOKEN_VERSION_KEY], batch["rollout_log_probs"]
        for row in range(len(batch)):
            want = expected_tokens(int(batch["index"][row]))
            length = int(batch["response_mask"][row].sum())
            assert batch["responses"][row, :length].tolist() == want
            positions = torch.arange(length)
            expected_lps = -(positions + 1) / 4 - versions[row, :length]
            assert torch.equal(lps[row, :length], expected_lps.float())
            assert int(batch["policy_version"][row]) == int(versions[row, :length].min())
        assert 0 <= metrics["async/token_staleness/max"] <= k
        assert metrics["async/staleness/max"] <= k
        assert metrics["async/staleness/max"] >= metrics["async/token_staleness/max"]
        assert step - 1 - int(versions[versions >= 0].min()) <= k


def held_in_batch_2() -> ChunkRoles:
    """Batch 2's second chunk (by version 0) starts before step 1's update ends and ends when
    the trainer pauses generation to sync version 1: its long samples (12 and 20 tokens) are
    cut there."""
    roles = ChunkRoles(
        hold=lambda step, sampled, version: (step, sampled, version) == (2, CHUNK, 0)
    )
    roles.train_waits[1] = roles.holding
    return roles


def test_continue_carries_samples_across_a_mid_batch_weight_sync() -> None:
    roles = held_in_batch_2()
    sched = schedule("continue", k=2)
    run_steps(sched, context(roles, Prompts()), range(1, 7), last=6)
    check_batches(roles, k=2)
    steps = trained(roles)
    assert [step for step, _, _ in steps] == list(range(1, 7))
    batch2, metrics2 = steps[1][1], steps[1][2]
    # the 20-token samples of prompt 3: one chunk by version 0, the rest by version 1
    row = list(batch2["index"]).index(3)
    assert batch2[TOKEN_VERSION_KEY][row].tolist() == [0] * 2 * CHUNK + [1] * (MAX_NEW - 2 * CHUNK)
    assert metrics2["async/partial/continued_samples"] >= 2
    assert metrics2["async/staleness/max"] == 1.0  # trained by version 1: oldest token 0
    assert metrics2["async/token_staleness/max"] == 1.0
    assert metrics2["async/token_staleness/mean"] < 1.0
    assert [e[1] for e in roles.events if e[0] == "sync"] == [1, 2, 3, 4, 5]  # every update
    uids = [u for _, batch, _ in steps for u in set(batch["uid"].tolist())]
    assert len(uids) == len(set(uids)) == 6 * PROMPTS_PER_STEP
    indices = sorted(int(i) for _, batch, _ in steps for i in set(batch["index"].tolist()))
    assert indices == list(range(6 * PROMPTS_PER_STEP))


def test_abort_starts_cut_samples_again_with_the_new_weights() -> None:
    roles = held_in_batch_2()
    run_steps(schedule("abort", k=2), context(roles, Prompts()), range(1, 5), last=4)
    check_batches(roles, k=2)
    batch2, metrics2 = trained(roles)[1][1:]
    assert metrics2["async/partial/aborted_samples"] == 2  # prompt 3's, 8 tokens in
    assert metrics2["async/partial/continued_samples"] == 0
    for row in range(len(batch2)):  # no sample mixes versions
        versions = batch2[TOKEN_VERSION_KEY][row]
        assert len(set(versions[versions >= 0].tolist())) == 1
    long_row = list(batch2["index"]).index(3)
    assert batch2[TOKEN_VERSION_KEY][long_row].unique().tolist() == [1]


def test_generation_waits_for_weights_within_k() -> None:
    # k=1: batch 3 may start only once version 1 (after step 1) is in the rollout
    roles = ChunkRoles()
    run_steps(schedule("continue", k=1), context(roles, Prompts()), range(1, 6), last=5)
    check_batches(roles, k=1)
    for step, batch, _ in trained(roles):
        assert int(batch[TOKEN_VERSION_KEY][batch[TOKEN_VERSION_KEY] >= 0].min()) >= step - 2


@pytest.mark.parametrize("mode", ["continue", "abort"])
def test_a_checkpoint_with_samples_half_done_resumes_each_prompt_once(
    tmp_path: Path, mode: str
) -> None:
    # every chunk of batch 3 after its first waits for a pause: at most 2 (the syncs after
    # steps 1 and 2) come before the checkpoint, so its 20-token samples are half done in it
    roles, prompts = (
        ChunkRoles(hold=lambda step, sampled, _: step == 3 and sampled >= CHUNK),
        Prompts(),
    )
    first = schedule(mode, k=2)
    run_steps(first, context(roles, prompts), range(1, 3), last=6)
    deadline = time.monotonic() + WAIT_S  # abort: the sync after step 2 threw batch 3's away
    while not any(first._flight[0].samples.tokens):
        assert time.monotonic() < deadline, "batch 3 never started"
        time.sleep(0.001)
    driver_state = {"step": 2, **first.save(str(tmp_path))}
    saved = driver_state["off_policy"]
    assert saved["partial"] == [3, 4] and saved["ahead"] == [] and saved["last_drawn"] == 4
    partial = first._flight[0].samples
    assert partial.chunks >= 1 and any(partial.tokens) and not partial.complete()
    saved_versions, saved_done = [list(v) for v in partial.versions], list(partial.done)

    resumed_roles = ChunkRoles(actor=2, rollout=0)
    resumed = schedule(mode, k=2)
    resumed.load(str(tmp_path), driver_state)
    resumed_prompts = Prompts()
    resumed_prompts.position = prompts.position
    run_steps(resumed, context(resumed_roles, resumed_prompts), range(3, 7), last=6)
    check_batches(resumed_roles, k=2)
    assert resumed_roles.events[0] == ("sync", 2)  # the actor's weights before any chunk
    steps = trained(roles) + trained(resumed_roles)
    assert [step for step, _, _ in steps] == list(range(1, 7))
    uids = [u for _, batch, _ in steps for u in set(batch["uid"].tolist())]
    assert len(uids) == len(set(uids)) == 6 * PROMPTS_PER_STEP  # none lost, none twice
    indices = sorted(int(i) for _, batch, _ in steps for i in set(batch["index"].tolist()))
    assert indices == list(range(6 * PROMPTS_PER_STEP))
    batch3 = trained(resumed_roles)[0][1]
    for row, versions in enumerate(saved_versions):
        now = batch3[TOKEN_VERSION_KEY][row]
        if mode == "continue" or saved_done[row]:  # carried on from the checkpoint
            assert now[: len(versions)].tolist() == versions
        else:  # started again by the weights synced at the resume
            assert now[now >= 0].unique().tolist() == [2]


def test_a_step_whose_generation_cannot_be_chunked_is_refused() -> None:
    class Episodes(Stage):
        name, roles, provides = names.STAGE_GEN, ("rollout",), ("responses",)

    pipeline = StepPipeline([Episodes(), Train(), SyncWeightsStage()], initial_keys=())
    with pytest.raises(ConfigError, match="partial_rollout=off"):
        PartialRolloutSchedule(cfg("continue", 2), pipeline)


def test_validation_holds_generation_with_the_rollout_at_the_actors_weights() -> None:
    roles, sched = ChunkRoles(), schedule("continue", k=2)
    ctx = context(roles, Prompts())
    run_steps(sched, ctx, range(1, 3), last=6)
    sched.before_validation(ctx)
    assert roles.rollout == roles.actor == 2 and sched._pause
    chunks = sum(event[0] == "chunk" for event in roles.events)
    time.sleep(0.2)
    assert sum(event[0] == "chunk" for event in roles.events) == chunks
    run_steps(sched, ctx, range(3, 7), last=6)  # the next step lets generation go on
    check_batches(roles, k=2)
    assert [step for step, _, _ in trained(roles)] == list(range(1, 7))


def test_the_round_schedule_refuses_a_checkpoint_with_samples_half_done(tmp_path: Path) -> None:
    pipeline = StepPipeline([Gen(), Score(), Train(), SyncWeightsStage()], initial_keys=())
    rounds = KStepOffSchedule(None, pipeline, threshold=2)
    saved = {"actor_version": 2, "ahead": [], "partial": [3, 4], "last_drawn": 4}
    with pytest.raises(ConfigError, match="partial_rollout=continue or abort"):
        rounds.load(str(tmp_path), {"step": 2, "off_policy": saved})


@pytest.mark.parametrize("strategy", ["wait", "drop"])
def test_a_batch_staler_than_a_smaller_threshold_is_replaced(tmp_path: Path, strategy: str) -> None:
    # k=3: batches 2-4 drawn at step 1 and generated by version 0, all finished before the
    # checkpoint; resumed with k=1, batches 3 and 4 (2 versions behind) are replaced
    roles, prompts = ChunkRoles(), Prompts()
    first = schedule("continue", k=3)
    roles.train_waits[1] = generated = threading.Event()  # step 1 trains once 2-4 are done

    def watch() -> None:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and not generated.is_set():
            flights = list(first._flight)
            if len(flights) == 3 and all(flight.result.done() for flight in flights):
                generated.set()
            time.sleep(0.001)

    threading.Thread(target=watch, daemon=True).start()
    run_steps(first, context(roles, prompts), range(1, 2), last=6)
    driver_state = {"step": 1, **first.save(str(tmp_path))}
    assert driver_state["off_policy"]["ahead"] == [2, 3, 4]

    resumed_roles = ChunkRoles(actor=1, rollout=0)
    resumed = schedule("continue", k=1, strategy=strategy)
    resumed.load(str(tmp_path), driver_state)
    resumed_prompts = Prompts()
    resumed_prompts.position = prompts.position
    run_steps(resumed, context(resumed_roles, resumed_prompts), range(2, 7), last=6)
    check_batches(resumed_roles, k=1)
    steps = trained(resumed_roles)
    indices = [sorted(set(batch["index"].tolist())) for _, batch, _ in steps]
    dropped = [metrics.get("async/dropped_samples", 0.0) for _, _, metrics in steps]
    if strategy == "wait":  # the same prompts, generated again
        assert indices == [[2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]
        assert dropped == [0.0] * 5
    else:  # new prompts in their place (step 4 draws step 5's first); 4-7 out of this epoch
        assert indices == [[2, 3], [8, 9], [12, 13], [10, 11], [14, 15]]
        assert dropped == [0.0, 4.0, 4.0, 0.0, 0.0]
