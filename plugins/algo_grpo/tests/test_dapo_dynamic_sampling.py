"""The dynamic sampling stage of recipe=dapo's step, driven round by round.

Real parts: the config, the tiny_digits prompts from the data loader (``next_prompts`` draws
more), the tiny model's tokenizer, the naive reward provider running the tiny_digits scorer (or a
custom reward with an ``acc`` extra), and the reward and overlong stages. The rollout role is
scripted (the logic under test is the filter, not generation): it answers each prompt with
texts chosen by the digit the prompt names, and records what it answered, so the expected
verdicts are worked out from the rewards of those texts, scored independently.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from polyrl.batch import Batch
from polyrl.errors import ConfigError
from polyrl.interfaces import RewardContext
from polyrl.rewards.scorers import tiny_digits_score
from polyrl.step import Stage, StepContext, StepState, policy_gradient_pipeline
from polyrl.step.stages import training_sampling_params
from polyrl.trainer.metrics import step_batch_metrics
from polyrl_algo_grpo.dapo import dapo_pipeline
from polyrl_algo_grpo.dynamic_sampling import DynamicSamplingError, DynamicSamplingStage

torch.set_num_threads(1)


def agreeing(digit: str, n: int) -> list[str]:
    """n identical answers: every sample scores the same, so the group is dropped."""
    return [digit * 3] * n


def mixed(digit: str, n: int) -> list[str]:
    """A right answer, then wrong ones: scores 1.0, 0.0, 0.0 ... (kept)."""
    return [digit * 3] + ["abc"] * (n - 1)


class ScriptedRollout:
    """The rollout role, scripted: ``answer(digit, n)`` gives the texts for a prompt naming
    ``digit``; every call is recorded (prompts seen, sampling params, texts by prompt)."""

    def __init__(self, tokenizer, answer, actor_dp=1):
        self.tokenizer, self.answer, self.actor_dp = tokenizer, answer, actor_dp
        self.calls: list[SimpleNamespace] = []

    def dp_size(self, role):
        return self.actor_dp if role == "actor" else 1

    def call(self, role, method, prompts, params, dispatch=None):
        assert (role, method) == ("rollout", "generate")
        texts = []
        for ids, mask in zip(prompts["input_ids"], prompts["attention_mask"]):
            prompt = self.tokenizer.decode(ids[mask == 1], skip_special_tokens=True)
            digit = re.search(r"\d", prompt).group()
            texts.append(self.answer(digit, params.n))
        self.calls.append(SimpleNamespace(prompts=len(prompts), params=params, texts=texts))
        return self._as_rollout(prompts, [t for group in texts for t in group], params.n)

    def _as_rollout(self, prompts, texts, n):
        eos = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        tokens = [self.tokenizer(t, add_special_tokens=False).input_ids for t in texts]
        tokens = [[*ids, eos] for ids in tokens]
        width = max(len(t) for t in tokens)
        responses = torch.full((len(tokens), width), self.tokenizer.pad_token_id)
        response_mask = torch.zeros(len(tokens), width, dtype=torch.long)
        for row, ids in enumerate(tokens):
            responses[row, : len(ids)] = torch.tensor(ids)
            response_mask[row, : len(ids)] = 1
        prompt_ids = prompts["input_ids"].repeat_interleave(n, 0)
        attention = torch.cat([prompts["attention_mask"].repeat_interleave(n, 0), response_mask], 1)
        return Batch(
            {
                "input_ids": torch.cat([prompt_ids, responses], 1),
                "attention_mask": attention,
                "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
                "responses": responses,
                "response_mask": response_mask,
                "rollout_log_probs": torch.zeros(responses.shape),
            }
        )


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    from transformers import AutoTokenizer

    from polyrl.data.dataset import RLDataset
    from polyrl.models.resolve import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("builtin:tiny"))
    reward_file = Path(tmp_path_factory.mktemp("reward")) / "acc_reward.py"
    reward_file.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    right = float(solution_str.startswith(str(ground_truth)))\n"
        "    return {'score': right + len(solution_str) / 100, 'acc': right}\n"
    )
    return SimpleNamespace(tokenizer=tokenizer, reward_file=reward_file, dataset=RLDataset)


def make_step(parts, *overrides, answer=mixed, actor_dp=1):
    """recipe=dapo's dynamic sampling stage and a context around the scripted rollout."""
    from polyrl.config.loader import load_config
    from polyrl.data.dataset import RLDataset
    from polyrl.data.loader import PromptLoader
    from polyrl.data.sources import resolve_data_files
    from polyrl.rewards.provider import NaiveRewardProvider

    cfg = load_config(["recipe=dapo", "reward_model.num_workers=0", *overrides])
    dataset = RLDataset(
        resolve_data_files(cfg.data.train_files, "train"), parts.tokenizer, cfg.data
    )
    loader = PromptLoader(dataset, int(cfg.data.train_batch_size), seed=5)
    rollout = ScriptedRollout(parts.tokenizer, answer, actor_dp)
    reward = NaiveRewardProvider(RewardContext(cfg.reward_model, cfg.custom_reward_function))
    ctx = StepContext(cfg, rollout, parts.tokenizer, reward, loader.next_batch)
    stage = dapo_pipeline(cfg)["dynamic_sampling"]
    state = StepState(step=3, batch=loader.next_batch())
    return SimpleNamespace(
        cfg=cfg, ctx=ctx, stage=stage, state=state, rollout=rollout, loader=loader
    )


def by_parity(digit: str, n: int) -> list[str]:
    """Prompts naming an even digit get agreeing answers (dropped), odd ones mixed (kept)."""
    return agreeing(digit, n) if int(digit) % 2 == 0 else mixed(digit, n)


def test_kept_and_dropped_groups_follow_the_rewards(parts):
    step = make_step(parts, "data.train_batch_size=4", "data.gen_batch_size=4", answer=by_parity)
    step.stage.run(step.state, step.ctx)

    # what the rewards imply, round by round: a group is kept iff its scores differ
    kept = dropped = rounds = 0
    for call in step.rollout.calls:
        rounds += 1
        for texts in call.texts:
            digit = re.search(r"\d", texts[0]).group()
            scores = {tiny_digits_score(t, digit)["score"] for t in texts}
            kept, dropped = kept + (len(scores) > 1), dropped + (len(scores) == 1)
        if kept >= 4:
            break
    assert rounds == len(step.rollout.calls) and dropped > 0 and rounds > 1
    assert step.state.metrics["train/num_gen_batches"] == rounds
    assert step.state.metrics["train/num_groups_kept"] == kept
    assert step.state.metrics["train/num_groups_dropped"] == dropped
    assert kept + dropped == 4 * rounds  # every group of every round is counted once

    batch, n = step.state.batch, int(step.cfg.actor_rollout_ref.rollout.n)
    assert len(batch) == 4 * n and len(set(batch["uid"])) == 4  # trimmed to 4 whole groups
    scores = batch["token_level_scores"].sum(-1)
    for uid in set(batch["uid"]):
        assert len(set(scores[batch["uid"] == uid].tolist())) > 1
    assert (np.asarray([int(g) % 2 for g in batch["ground_truth"]]) == 1).all()


def test_rounds_draw_gen_batch_size_prompts_with_their_own_seeds(parts):
    step = make_step(parts, "data.train_batch_size=4", "data.gen_batch_size=6", answer=by_parity)
    position = step.loader.position
    step.stage.run(step.state, step.ctx)

    rounds = step.rollout.calls
    assert [c.prompts for c in rounds] == [6] * len(rounds)
    # the step's own 4 prompts first, then draws from the loader for the rest of each round
    assert step.loader.position - position == 6 * len(rounds) - 4
    first_seed = training_sampling_params(step.cfg, 3).seed
    seeds = [c.params.seed for c in rounds]
    assert seeds[0] == first_seed and len(set(seeds)) == len(seeds)


def test_the_joined_rounds_keep_prompts_and_responses_aligned(parts):
    step = make_step(parts, "data.train_batch_size=4", "data.gen_batch_size=2", answer=mixed)
    step.stage.run(step.state, step.ctx)
    batch = step.state.batch
    assert step.state.metrics["train/num_gen_batches"] == 2
    boundary = batch["input_ids"].shape[1] - batch["responses"].shape[1]
    for row in range(len(batch)):
        ids, mask = batch["input_ids"][row], batch["attention_mask"][row]
        prompt = parts.tokenizer.decode(ids[:boundary][mask[:boundary] == 1])
        response = parts.tokenizer.decode(ids[boundary:][mask[boundary:] == 1])
        assert prompt.startswith("<|im_start|>user") and prompt.endswith("assistant\n")
        assert response in {f"{batch['ground_truth'][row] * 3}<|im_end|>", "abc<|im_end|>"}


def test_hitting_the_limit_is_one_line_naming_the_keys(parts):
    step = make_step(parts, "algorithm.filter_groups.max_num_gen_batches=3", answer=agreeing)
    with pytest.raises(DynamicSamplingError) as info:
        step.stage.run(step.state, step.ctx)
    message = str(info.value)
    assert "\n" not in message and "kept 0 of the 8 groups" in message
    assert "max_num_gen_batches=3" in message and "train_partial_batch=true" in message
    assert len(step.rollout.calls) == 3


def test_a_partial_batch_keeps_whole_groups_that_split_over_the_ranks(parts):
    calls = []

    def one_kept_group_per_round(digit, n):
        calls.append(digit)
        return mixed(digit, n) if len(calls) % 8 == 1 else agreeing(digit, n)

    step = make_step(
        parts,
        "actor_rollout_ref.rollout.n=3",
        "algorithm.filter_groups.max_num_gen_batches=3",
        "algorithm.filter_groups.train_partial_batch=true",
        answer=one_kept_group_per_round,
        actor_dp=2,
    )
    step.stage.run(step.state, step.ctx)
    # 3 rounds kept 3 groups of 3 rows: 9 rows do not split over 2 ranks, 2 groups do
    assert step.state.metrics["train/num_groups_kept"] == 3
    assert step.state.metrics["train/num_groups_dropped"] == 21
    assert len(step.state.batch) == 6 and len(set(step.state.batch["uid"])) == 2


def test_filtering_on_a_reward_extra(parts):
    """The custom reward's score grows with the length, its acc extra is 1 for a right answer:
    groups of right answers of different lengths differ in score but not in acc."""

    def right_answers_or_mixed(digit, n):
        if int(digit) % 2:
            return mixed(digit, n)
        return [digit * (k + 1) for k in range(n)]

    overrides = ("data.train_batch_size=2", "data.gen_batch_size=2")
    custom = f"custom_reward_function.path={parts.reward_file}"
    for metric, dropped_some in (("acc", True), ("score", False)):
        step = make_step(
            parts,
            *overrides,
            custom,
            f"algorithm.filter_groups.metric={metric}",
            answer=right_answers_or_mixed,
        )
        step.stage.run(step.state, step.ctx)
        assert (step.state.metrics["train/num_groups_dropped"] > 0) == dropped_some, metric
        if dropped_some:
            odd = np.asarray([int(g) % 2 for g in step.state.batch["ground_truth"]])
            assert (odd == 1).all()

    step = make_step(parts, *overrides, "algorithm.filter_groups.metric=acc", answer=mixed)
    with pytest.raises(ConfigError, match=r"metric='acc'.*digit_frac"):
        step.stage.run(step.state, step.ctx)


class CountingStage(Stage):
    """A scoring stage with state: how many rounds it has scored."""

    name = "counting"
    requires = ("token_level_scores",)

    def __init__(self):
        self.rounds = 0

    def run(self, state, ctx):
        self.rounds += 1

    def state_dict(self):
        return {"rounds": self.rounds}

    def load_state_dict(self, state):
        self.rounds = state["rounds"]


def test_checkpoints_hold_the_state_of_the_stages_it_runs(parts):
    step = make_step(parts, "data.train_batch_size=4", "data.gen_batch_size=2", answer=mixed)
    standard = policy_gradient_pipeline(step.cfg)
    stage = DynamicSamplingStage(step.cfg, standard["gen"], [standard["reward"], CountingStage()])
    stage.run(step.state, step.ctx)
    saved = stage.state_dict()
    assert saved["counting"] == {"rounds": 2}

    standard = policy_gradient_pipeline(step.cfg)
    resumed = DynamicSamplingStage(step.cfg, standard["gen"], [standard["reward"], CountingStage()])
    resumed.load_state_dict(saved)
    assert resumed.state_dict() == saved


def test_scores_are_reported_for_the_sampled_responses_and_the_kept_ones(parts):
    """2 groups of 4 per round. Round 1: A mixed (1, 0, 0, 0, kept), B all wrong (0 x 4,
    dropped); round 2: C mixed (kept), D all right (1 x 4, dropped). Sampled: 6 of 16 responses
    right (mean 0.375); kept: A and C, 2 of 8 (mean 0.25)."""
    answers = iter(
        [mixed, lambda d, n: ["abc"] * n, mixed, agreeing]  # one per group, in order
    )
    step = make_step(
        parts,
        "data.train_batch_size=2",
        "data.gen_batch_size=2",
        "actor_rollout_ref.rollout.n=4",
        answer=lambda digit, n: next(answers)(digit, n),
    )
    step.stage.run(step.state, step.ctx)
    metrics = step.state.metrics
    assert metrics["train/num_gen_batches"] == 2 and metrics["train/num_groups_dropped"] == 2
    assert metrics["critic/score/mean"] == pytest.approx(6 / 16)
    assert (metrics["critic/score/max"], metrics["critic/score/min"]) == (1.0, 0.0)

    kept = step_batch_metrics(step.state.batch, metrics)
    assert kept["critic/kept_score/mean"] == pytest.approx(2 / 8)
    assert "critic/score/mean" not in kept


def test_without_dropped_rows_the_score_is_the_batchs_own(parts):
    step = make_step(parts, "data.train_batch_size=2", "data.gen_batch_size=2", answer=mixed)
    step.stage.run(step.state, step.ctx)
    assert "critic/score/mean" not in step.state.metrics  # the final batch is the sampled one

    n = int(step.cfg.actor_rollout_ref.rollout.n)
    batch_metrics = step_batch_metrics(step.state.batch, step.state.metrics)
    assert batch_metrics["critic/score/mean"] == pytest.approx(1 / n)  # one right per group
    assert "critic/kept_score/mean" not in batch_metrics
