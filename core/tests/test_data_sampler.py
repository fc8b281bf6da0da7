"""verl's custom sampler (``data.sampler.class_path`` / ``class_name``): batches come in the
sampler's order, a curriculum sampler's ``update(batch)`` steers the next ones, a stateful
sampler resumes to the exact batch, a stateless one is refused resume in one line, and bad
settings are one line in validate."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from polyrl.config import load_config
from polyrl.config.validate import validate_config
from polyrl.data.sampler import SamplerLoader, after_step, build_sampler, sampler_problems
from polyrl.errors import ConfigError, DataError

SAMPLERS = '''
class Reversed:
    """Positions from the last to the first: a fixed order, no state."""

    def __init__(self, data_source, data_config):
        self.size = len(data_source)

    def __iter__(self):
        return iter(range(self.size - 1, -1, -1))

    def __len__(self):
        return self.size


class HardestFirst:
    """A curriculum: each draw re-sorts; positions whose score was low come first, and
    update(batch) records the scores of the rows it trained on. Stateful (torchdata's
    convention): the state holds the scores and where the current pass stands."""

    def __init__(self, data_source, data_config):
        self.size = len(data_source)
        self.scores = {}
        self.served = 0
        self.updates = 0

    def __iter__(self):
        while self.served < self.size:
            order = sorted(range(self.size), key=lambda i: (self.scores.get(i, 0.5), i))
            self.served += 1
            yield order[self.served - 1]
        self.served = 0

    def __len__(self):
        return self.size

    def update(self, batch):
        self.updates += 1
        for index, score in zip(batch["index"], batch["score"]):
            self.scores[int(index)] = float(score)

    def state_dict(self):
        return {"scores": dict(self.scores), "served": self.served}

    def load_state_dict(self, state):
        self.scores, self.served = dict(state["scores"]), int(state["served"])
'''


class Dataset:
    pad_token_id = 0

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        return i


@pytest.fixture
def samplers(tmp_path: Path) -> Path:
    path = tmp_path / "samplers.py"
    path.write_text(SAMPLERS)
    return path


def loader(path: Path, name: str, batch_size: int = 3) -> SamplerLoader:
    data = OmegaConf.create({"sampler": {"class_path": str(path), "class_name": name}})
    return SamplerLoader(Dataset(), batch_size, sampler=build_sampler(data, Dataset()))


def test_batches_follow_the_samplers_order_and_drop_a_passs_tail(samplers: Path) -> None:
    batches = loader(samplers, "Reversed")
    assert len(batches) == 2  # 8 positions in batches of 3
    drawn = [batches.next_indices() for _ in range(3)]
    assert drawn == [[7, 6, 5], [4, 3, 2], [7, 6, 5]]  # [1, 0] dropped; a new pass
    assert batches.epoch == 1


def test_a_curriculum_samplers_update_steers_the_next_batches(samplers: Path) -> None:
    batches = loader(samplers, "HardestFirst", batch_size=2)
    assert batches.next_indices() == [0, 1]
    # the step trained on rows 0 and 1, which scored 0.9 and 0.1; row 1 was hard
    after_step(batches, {"index": [0, 1], "score": [0.9, 0.1]})
    assert batches.user_sampler.updates == 1
    assert batches.next_indices() == [3, 4]  # re-sorted [1, 2, 3, 4, ..., 0], from its 3rd
    batches.next_indices(), batches.next_indices()  # the rest of the pass
    assert batches.next_indices() == [1, 2]  # the new pass starts with the hard row


def test_a_stateful_sampler_resumes_to_the_exact_batch(samplers: Path) -> None:
    run = loader(samplers, "HardestFirst", batch_size=2)
    run.next_indices()
    after_step(run, {"index": [0, 1], "score": [0.9, 0.1]})
    run.next_indices()
    saved = run.state_dict()
    rest = [run.next_indices() for _ in range(4)]
    resumed = loader(samplers, "HardestFirst", batch_size=2)
    resumed.load_state_dict(saved)
    assert [resumed.next_indices() for _ in range(4)] == rest
    assert (resumed.epoch, resumed.position) == (run.epoch, run.position)


def test_a_sampler_without_state_is_refused_resume_in_one_line(samplers: Path) -> None:
    run = loader(samplers, "Reversed")
    run.next_indices()
    with pytest.raises(DataError, match=r"the sampler Reversed .* has no state_dict\(\)"):
        loader(samplers, "Reversed").load_state_dict(run.state_dict())


def test_the_sampler_is_loaded_as_verl_loads_it(samplers: Path) -> None:
    data = OmegaConf.create({"sampler": {"class_path": f"file://{samplers}", "class_name": "x"}})
    with pytest.raises(
        ConfigError, match=r"'x' is not a class in data\.sampler\.class_path='file://"
    ):
        build_sampler(data, Dataset())
    module = {"class_path": "pkg://polyrl/data/sampler", "class_name": "SamplerLoader"}
    assert sampler_problems(OmegaConf.create(module)) == []  # verl's pkg:// with slashes


@pytest.mark.parametrize(
    ("sampler", "expected"),
    [
        ({"class_path": "/no/such.py", "class_name": "S"}, "no such file"),
        ({"class_path": "pkg://no_such_pkg_xyz.mod", "class_name": "S"}, "cannot import"),
        ({"class_path": None, "class_name": "S"}, "go together"),
    ],
)
def test_bad_sampler_settings_are_one_line_in_validate(sampler: dict, expected: str) -> None:
    overrides = [f"data.sampler.{k}={'null' if v is None else v}" for k, v in sampler.items()]
    problems = validate_config(load_config(["recipe=tiny", *overrides]))
    assert len(problems) == 1 and expected in problems[0], problems
