"""ReMax's ``gen_max`` stage on real parts: the tiny model in the HF rollout engine, tiny_digits
prompts from the data loader, and the naive reward provider running a custom reward function.
The expected baselines are computed independently: a greedy generate on the engine, decoded and
scored by the same function."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from polyrl.api import build_pipeline
from polyrl.interfaces import RewardContext, RolloutContext, SamplingParams
from polyrl.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID, build_tiny_model
from polyrl.step import StepContext, StepState
from polyrl_algo_reinforce.remax import BASELINE_KEY, GreedyBaselineStage

torch.set_num_threads(1)

# A reward that differs per prompt and per response (a random model rarely writes digits).
REWARD_FN = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(ground_truth) + len(set(solution_str)) / 10.0
"""
PROMPTS, N, MAX_NEW = 4, 3, 8


class OneRankRoles:
    """The rollout role on one data-parallel rank, in this process: ``call`` runs the real
    engine's method and records the sampling parameters it was given."""

    def __init__(self, engine):
        self.engine = engine
        self.params: list[SamplingParams] = []

    def call(self, role, method, batch, params, dispatch=None):
        assert (role, method) == ("rollout", "generate")
        self.params.append(params)
        return self.engine.generate(batch.select_keys(("input_ids", "attention_mask")), params)

    def dp_size(self, role):
        return 1


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from transformers import AutoTokenizer

    from polyrl.config.loader import load_config
    from polyrl.data.dataset import RLDataset
    from polyrl.data.loader import PromptLoader
    from polyrl.data.sources import resolve_data_files
    from polyrl.rewards.provider import NaiveRewardProvider
    from polyrl_rollout_hf.engine import HFRolloutEngine

    tmp = tmp_path_factory.mktemp("remax")
    model = build_tiny_model(str(tmp / "model"), seed=0)
    reward_file = Path(tmp / "reward.py")
    reward_file.write_text(REWARD_FN)
    cfg = load_config(
        [
            "recipe=tiny",
            "algorithm.adv_estimator=remax",
            f"actor_rollout_ref.model.path={model}",
            f"actor_rollout_ref.rollout.n={N}",
            f"data.max_response_length={MAX_NEW}",
            "reward_model.num_workers=0",
            f"custom_reward_function.path={reward_file}",
        ]
    )
    tokenizer = AutoTokenizer.from_pretrained(model)
    dataset = RLDataset(resolve_data_files(cfg.data.train_files, "train"), tokenizer, cfg.data)
    engine = HFRolloutEngine(
        RolloutContext(
            model_path=model,
            config=cfg.actor_rollout_ref.rollout,
            device="cpu",
            rank=0,
            world_size=1,
            pad_token_id=PAD_TOKEN_ID,
            eos_token_ids=[EOS_TOKEN_ID],
        )
    )
    reward = NaiveRewardProvider(RewardContext(cfg.reward_model, cfg.custom_reward_function))
    loader = PromptLoader(dataset, PROMPTS, seed=3)
    roles = OneRankRoles(engine)
    ctx = StepContext(cfg, roles, tokenizer, reward, loader.next_batch)
    return SimpleNamespace(cfg=cfg, ctx=ctx, roles=roles, loader=loader, engine=engine)


def test_the_baseline_is_the_reward_of_the_greedy_response(setup):
    prompts = setup.loader.next_batch()
    state = StepState(step=1, batch=prompts)
    GreedyBaselineStage().run(state, setup.ctx)

    params = setup.roles.params[-1]
    assert params.greedy and params.n == 1 and params.max_new_tokens == MAX_NEW
    greedy = setup.engine.generate(
        prompts, SamplingParams(n=1, greedy=True, max_new_tokens=MAX_NEW)
    )
    texts = setup.ctx.tokenizer.batch_decode(
        [
            row[: int(n)]
            for row, n in zip(greedy["responses"].tolist(), greedy["response_mask"].sum(-1))
        ],
        skip_special_tokens=True,
    )
    truths = [float(g) for g in prompts["ground_truth"]]
    expected = [g + len(set(t)) / 10.0 for g, t in zip(truths, texts)]
    assert len(set(expected)) > 1, f"want distinct baselines to compare, got {texts}"
    assert [float(b) for b in state.batch[BASELINE_KEY]] == pytest.approx(expected)
    assert state.metrics["remax/baseline_score/mean"] == pytest.approx(np.mean(expected))


def test_each_sample_carries_its_prompts_baseline_into_the_estimator(setup):
    """gen_max, then the standard gen, reward and adv stages of the remax step: every sampled
    row holds its own prompt's baseline, and the advantage is its score minus that baseline."""
    step = build_pipeline(setup.cfg)  # bound to the run plan, as the trainer builds it
    state = StepState(step=2, batch=setup.loader.next_batch())
    for name in ("gen_max", "gen", "reward", "adv"):
        step[name].run(state, setup.ctx)

    batch = state.batch
    assert len(batch) == PROMPTS * N
    baselines = np.asarray(batch[BASELINE_KEY], dtype=float)
    for group in np.unique(batch["uid"]):
        rows = np.flatnonzero(batch["uid"] == group)
        assert len(rows) == N and len(set(baselines[rows])) == 1
    scores = batch["token_level_rewards"].sum(-1)
    first_token_adv = batch["advantages"][:, 0]  # returns-to-go at t=0 is the whole score
    torch.testing.assert_close(first_token_adv, (scores - torch.tensor(baselines)).float())
    sampled, greedy = setup.roles.params[-1], setup.roles.params[-2]
    assert not sampled.greedy and sampled.n == N and greedy.greedy and greedy.n == 1
