"""verl's curriculum sampler in a real run (``data.sampler.class_path`` / ``class_name``): the
tiny model trains on the prompts a user's stateful curriculum sampler draws, the sampler's
``update(batch)`` runs after every step, and a run resumed from a checkpoint continues bitwise
like the uninterrupted one (the sampler's state is in the checkpoint)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_train_tiny import final_weights, polyrl_train, read_records

pytestmark = pytest.mark.slow

CURRICULUM = '''
import json


class LowestScoreFirst:
    """Each draw takes the prompt with the lowest mean score so far among those not yet drawn
    in this pass (unscored ones count as 0.5, ties by position); update(batch) records the step's
    scores. Stateful, and logs every update to the file the test reads."""

    def __init__(self, data_source, data_config):
        self.size = len(data_source)
        self.scores = {}
        self.drawn = []
        self.log = LOG

    def __iter__(self):
        while len(self.drawn) < self.size:
            left = [i for i in range(self.size) if i not in set(self.drawn)]
            pick = min(left, key=lambda i: (self.scores.get(i, 0.5), i))
            self.drawn.append(pick)
            yield pick
        self.drawn = []

    def __len__(self):
        return self.size

    def update(self, batch):
        sums = {}
        for index, score in zip(batch["index"], batch["token_level_scores"].sum(-1).tolist()):
            sums.setdefault(int(index), []).append(score)
        for index, values in sums.items():
            self.scores[index] = sum(values) / len(values)
        with open(self.log, "a") as f:
            f.write(json.dumps(sorted(sums)) + "\\n")

    def state_dict(self):
        return {"scores": {str(k): v for k, v in self.scores.items()}, "drawn": list(self.drawn)}

    def load_state_dict(self, state):
        self.scores = {int(k): v for k, v in state["scores"].items()}
        self.drawn = list(state["drawn"])
'''


def test_a_curriculum_sampler_steers_the_run_and_resumes_exactly(tmp_path: Path) -> None:
    """3 steps straight (saving each), then the same run resumed from its step-1 checkpoint:
    the resumed run draws, scores and trains exactly as the straight one did."""
    log = tmp_path / "updates.jsonl"
    sampler = tmp_path / "curriculum.py"
    sampler.write_text(f"LOG = {str(log)!r}\n{CURRICULUM}")
    steps = (
        "trainer.total_training_steps=3",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        f"data.sampler.class_path={sampler}",
        "data.sampler.class_name=LowestScoreFirst",
    )
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    polyrl_train(straight, *steps, "trainer.save_freq=1")
    second = polyrl_train(
        resumed,
        *steps,
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={straight / 'global_step_1'}",
    )
    assert "resumed from" in second.stderr
    a, b = final_weights(straight), final_weights(resumed)
    assert [name for name in a if not (a[name] == b[name]).all()] == []
    scores = [r["critic/score/mean"] for r in read_records(straight)]
    assert [r["critic/score/mean"] for r in read_records(resumed)] == scores[1:]
    updates = [json.loads(line) for line in log.read_text().splitlines()]
    # update(batch) after every step, each with a batch's 8 prompts: 3 straight, 2 resumed
    assert len(updates) == 5 and all(len(u) == 8 for u in updates)
    # the first batch is positions 0-7 (nothing scored yet); later ones follow the scores
    assert updates[0] == list(range(8))
    assert updates[1:3] == updates[3:]  # the resumed run drew what the straight run drew
