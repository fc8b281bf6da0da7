"""End to end: a policy learns what the judge prefers. The judge's preference is made known
first: ``builtin:tiny`` fine-tuned in plain torch to reply "Score: 1" to a judge prompt whose
response contains the digit 7 and "Score: 0" otherwise. Then ``polyrl train recipe=tiny
reward_model.reward_manager=judge`` runs with that judge served by the hf rollout engine in the
worker role ``judge``. Beside the actor, the judged score of the policy's samples must rise: that
run's point is the reward, not Ray, so it trains one worker in the test's own process
(``IN_PROCESS_OVERRIDES``, ``run_polyrl_here``). On a pool of its own, which is Ray's placement,
the judge must give the same verdicts: that run is over Ray (a worker for the actor, one for the
judge).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
from pathlib import Path

import pytest
import torch

from polyrl.api import resolve_model_path
from polyrl.api.testing import IN_PROCESS_OVERRIDES, run_polyrl, run_polyrl_here

pytestmark = pytest.mark.slow

TEMPLATE = "Does this contain a seven? {response}"
STEPS = 10
SCORE = "critic/score/mean"


def judge_prompt(tokenizer, response: str) -> list[int]:
    """The judge prompt's tokens exactly as the rollout backend builds them."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": TEMPLATE.format(response=response)}],
        tokenize=False,
        add_generation_prompt=True,
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def random_response(tokenizer, rng: random.Random, seven_id: int) -> str:
    """Random tokens of the vocabulary, as an untrained policy writes; half get a 7."""
    specials = set(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in specials and i != seven_id]
    ids = [rng.choice(vocab) for _ in range(rng.randint(1, 16))]
    if rng.random() < 0.5:
        ids[rng.randrange(len(ids))] = seven_id
    return tokenizer.decode(ids)


def make_judge(out_dir: Path, *, steps: int = 100, batch_size: int = 16, lr: float = 2e-3) -> Path:
    """``builtin:tiny`` fine-tuned to answer the judge prompt of a response with "Score: 1" when
    it contains a 7, else "Score: 0". (At lr 5e-3 the fine-tune settled on one constant answer.
    At lr 2e-3, 100 steps keep a margin over what grading held-out responses right needs.)"""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shutil.copytree(resolve_model_path("builtin:tiny"), out_dir)
    (out_dir / "polyrl_tiny.json").unlink(missing_ok=True)  # no longer the built-in's weights
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    seven_id = tokenizer.convert_tokens_to_ids("7")
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    rng = random.Random(0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        model.train()
        for _ in range(steps):
            batch = []
            for _ in range(batch_size):
                response = random_response(tokenizer, rng, seven_id)
                verdict = f"Score: {int('7' in response)}"
                batch.append((judge_prompt(tokenizer, response), tokenizer.encode(verdict)))
            width = max(len(p) + len(v) + 1 for p, v in batch)
            ids = torch.full((batch_size, width), pad)
            labels = torch.full((batch_size, width), -100)
            mask = torch.zeros((batch_size, width), dtype=torch.long)
            for i, (prompt, verdict) in enumerate(batch):
                sequence = [*prompt, *verdict, eos]
                ids[i, : len(sequence)] = torch.tensor(sequence)
                mask[i, : len(sequence)] = 1
                labels[i, len(prompt) : len(sequence)] = ids[i, len(prompt) : len(sequence)]
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def judge_accuracy(judge: Path, n: int = 64) -> float:
    """Share of held-out random responses the judge grades right, through the provider and the
    ``judge`` role built in this process."""
    from judge_testing import judge_role, on_role, samples
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(judge)
    rng = random.Random(1)
    seven = tokenizer.convert_tokens_to_ids("7")
    responses = [random_response(tokenizer, rng, seven) for _ in range(n)]
    settings = {"model_path": str(judge), "template": TEMPLATE, "max_new_tokens": 6}
    role = judge_role(**settings)
    reward, _ = on_role(role, score_max=1.0, max_unparsed_frac=1.0, **settings)
    try:
        results = reward.score(samples(responses))
    finally:
        role.shutdown()
    return sum(r.score == float("7" in t) for r, t in zip(results, responses)) / n


@pytest.fixture(scope="module")
def judge(tmp_path_factory) -> Path:
    made = make_judge(tmp_path_factory.mktemp("judge") / "judge")
    accuracy = judge_accuracy(made)
    print(f"\njudge accuracy {accuracy:.0%}", file=sys.stderr)
    assert accuracy > 0.9, f"the judge itself grades only {accuracy:.0%} right"
    return made


def train(judge: Path, out: Path, steps: int, *placement: str, over_ray: bool = False) -> list:
    """``polyrl train recipe=tiny`` judged by ``judge`` for ``steps`` steps; its metrics.
    ``over_ray``: ``python -m polyrl`` with Ray's workers, placed by ``placement``; otherwise one
    worker in this process (``IN_PROCESS_OVERRIDES``), every role colocated in it."""
    args = (
        "train",
        "recipe=tiny",
        "reward_model.reward_manager=judge",
        f"reward_model.judge.model_path={judge}",
        f"reward_model.judge.template='{TEMPLATE}'",
        "reward_model.judge.score_max=1.0",
        "reward_model.judge.max_new_tokens=6",
        *(() if over_ray else IN_PROCESS_OVERRIDES),
        *placement,
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={out}",
    )
    if over_ray:
        proc = run_polyrl({**os.environ, "PYTHONUNBUFFERED": "1"}, *args, timeout=300)
    else:
        # one torch thread, as each of Ray's workers gets (OMP_NUM_THREADS=1 from polyrl)
        proc = run_polyrl_here(*args, env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-6000:])
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def shared_pool_run(judge, tmp_path_factory) -> list[dict]:
    """The judge role beside the actor, rollout and reference in the one worker of the global
    pool (the default placement), in this process."""
    return train(judge, tmp_path_factory.mktemp("shared") / "run", STEPS)


def test_the_policy_learns_what_the_judge_prefers(shared_pool_run) -> None:
    records = shared_pool_run
    scores = [r[SCORE] for r in records if SCORE in r]
    unparsed = [r["reward_extra/judge_unparsed/mean"] for r in records if SCORE in r]
    print(f"\njudged score per step {scores}", file=sys.stderr)
    assert len(scores) == STEPS and max(unparsed) <= 0.1, unparsed
    first, last = sum(scores[:3]) / 3, sum(scores[-3:]) / 3
    assert last > first + 0.2, scores


def test_the_judge_runs_on_a_pool_of_its_own(judge, shared_pool_run, tmp_path) -> None:
    """``trainer.role_pools.judge`` puts the judge on a Ray worker of its own (the actor on
    another): the same samples (same seeds) get the same verdicts as from the judge beside the
    actor in the in-process run, step by step. Two steps: with one actor worker, step 1's 32
    samples held no 7 (score 0, which a judge stuck on "Score: 0" would match too); step 2's
    held one."""
    own = (
        "trainer.n_gpus_per_node=1",
        "trainer.role_pools.judge=judge_pool",
        "trainer.resource_pools.judge_pool=1",
    )
    records = train(judge, tmp_path / "run", 2, *own, over_ray=True)
    assert len(records) == 2 and any(r[SCORE] > 0 for r in records), records
    for record, colocated in zip(records, shared_pool_run):
        assert record[SCORE] == pytest.approx(colocated[SCORE], abs=1e-6)
        unparsed = "reward_extra/judge_unparsed/mean"
        assert record[unparsed] == colocated[unparsed]
