"""``trainer.log_val_generations``: which validation samples are picked, how validation by
generation returns them, and what each built-in logger makes of them (no Ray: fake roles)."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace
from typing import Any

import torch
from omegaconf import OmegaConf

from polyrl.batch import Batch
from polyrl.data.dataset import PromptItem
from polyrl.data.training import TrainingData, ValidationResult
from polyrl.interfaces import RewardResult
from polyrl.interfaces.logger import LoggerContext, MetricsLogger
from polyrl.loggers import LoggerGroup
from polyrl.loggers.console import ConsoleLogger
from polyrl.loggers.jsonl import GENERATIONS_FILE, JsonlLogger, read_metrics
from polyrl.loggers.tensorboard import GENERATIONS_TAG, TensorboardLogger
from polyrl.step.context import StepContext
from polyrl.trainer.trainer import RLTrainer, validate_by_generation
from polyrl.trainer.val_generations import generation_rows, pick_generations

torch.set_num_threads(1)


def _rows(prompts: list[str]) -> list[dict[str, Any]]:
    return generation_rows(
        ["src"] * len(prompts), prompts, [p.upper() for p in prompts], [0.5] * len(prompts)
    )


def _ctx(tmp_path, resumed: int = 0) -> LoggerContext:
    return LoggerContext("p", "e", str(tmp_path / "run"), total_steps=4, resumed_from_step=resumed)


# ---- selection --------------------------------------------------------------------------------
def test_the_pick_is_sorted_seeded_and_independent_of_row_order() -> None:
    prompts = [f"q{i:02d}" for i in range(20)]
    picked = pick_generations(_rows(prompts), 5, seed=3)
    assert len(picked) == 5
    assert [r["prompt"] for r in picked] == sorted(r["prompt"] for r in picked)
    # the same prompts whatever order the files list them in, and at every validation
    assert pick_generations(_rows(prompts[::-1]), 5, seed=3) == picked
    assert pick_generations(_rows(prompts), 5, seed=3) == picked
    assert pick_generations(_rows(prompts), 5, seed=4) != picked


def test_fewer_rows_than_asked_gives_all_of_them_and_zero_gives_none() -> None:
    assert [r["prompt"] for r in pick_generations(_rows(["b", "a"]), 5, seed=1)] == ["a", "b"]
    assert pick_generations(_rows(["b", "a"]), 0, seed=1) == []


# ---- validation by generation -----------------------------------------------------------------
class _Tokenizer:
    pad_token_id = 0

    def batch_decode(self, rows: list[list[int]], skip_special_tokens: bool) -> list[str]:
        return [" ".join(f"t{t}" for t in row) for row in rows]


class _Rollout:
    """Answers each prompt with its first token, then ``7``, then padding (one sample each)."""

    def call(self, role: str, method: str, batch: Batch, *args: Any, dispatch: Any = None) -> Any:
        assert (role, method) == ("rollout", "generate")
        first = batch["input_ids"][:, -1:]
        responses = torch.cat([first, torch.full_like(first, 7), torch.zeros_like(first)], -1)
        mask = torch.tensor([[1, 1, 0]] * len(batch))
        return Batch(tensors={"responses": responses, "response_mask": mask})

    def dp_size(self, role: str) -> int:
        return 1


class _Reward:
    """Scores an answer by its first token (so each sample's score is known)."""

    def score(self, samples: list[Any]) -> list[RewardResult]:
        return [RewardResult(float(s.solution_str.split()[0][1:])) for s in samples]


def _val_ctx(shown: int) -> StepContext:
    cfg = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "val_kwargs": {
                        "n": 1,
                        "temperature": 0,
                        "top_p": 1.0,
                        "top_k": -1,
                        "do_sample": False,
                    }
                }
            },
            "data": {"max_response_length": 3, "val_batch_size": 2},
            "trainer": {"seed": 1, "log_val_generations": shown},
        }
    )
    return StepContext(cfg, _Rollout(), _Tokenizer(), _Reward(), next_prompts=None)


def _val_set() -> list[PromptItem]:
    return [
        PromptItem([5, token], "src", None, {}, f"prompt {name}", i)
        for i, (name, token) in enumerate([("c", 3), ("a", 1), ("b", 2)])
    ]


def test_validation_returns_the_picked_samples_with_their_texts_and_scores() -> None:
    result = validate_by_generation(_val_set(), _val_ctx(shown=2))
    assert result.metrics["val-core/src/reward/mean@1"] == 2.0
    assert len(result.generations) == 2
    for row in result.generations:
        token = {"prompt a": 1, "prompt b": 2, "prompt c": 3}[row["prompt"]]
        assert row == {
            "data_source": "src",
            "prompt": row["prompt"],
            "output": f"t{token} t7",  # the response's padding is not decoded
            "score": float(token),
        }
    everything = validate_by_generation(_val_set(), _val_ctx(shown=10)).generations
    assert [r["prompt"] for r in everything] == ["prompt a", "prompt b", "prompt c"]


def test_no_samples_by_default() -> None:
    assert validate_by_generation(_val_set(), _val_ctx(shown=0)).generations == []


def test_the_trainer_takes_a_plain_metrics_dict_as_a_validation_without_samples() -> None:
    trainer = object.__new__(RLTrainer)  # only what validate() uses
    trainer.schedule = SimpleNamespace(before_validation=lambda ctx: None)
    trainer.context = None
    trainer.data = TrainingData(loader=None, validate=lambda ctx: {"val-aux/loss": 1.0})
    assert trainer.validate() == ValidationResult({"val-aux/loss": 1.0}, [])
    trainer.data = TrainingData(loader=None)
    assert trainer.validate() == ValidationResult({}, [])


# ---- loggers ----------------------------------------------------------------------------------
class _Recorder(MetricsLogger):
    def __init__(self, ctx: LoggerContext) -> None:
        super().__init__(ctx)
        self.calls: list[tuple[list[dict[str, Any]], int]] = []

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Scalars are not what these tests look at."""

    def log_generations(self, rows: list[dict[str, Any]], step: int) -> None:
        self.calls.append((rows, step))


class _ScalarsOnly:
    """A logger that does not subclass MetricsLogger and has no log_generations."""

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Scalars only."""


class _BaseDefault(MetricsLogger):
    """A MetricsLogger that keeps MetricsLogger's log_generations (which ignores the rows)."""

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Scalars only."""


def test_the_group_stamps_the_step_and_skips_loggers_without_the_method(tmp_path) -> None:
    recorder = _Recorder(_ctx(tmp_path))
    group = LoggerGroup([_ScalarsOnly(), recorder, _BaseDefault(_ctx(tmp_path))])
    group.log_generations(_rows(["q"]), 3)
    expected = [{"step": 3, "data_source": "src", "prompt": "q", "output": "Q", "score": 0.5}]
    assert recorder.calls == [(expected, 3)]
    assert list(expected[0]) == ["step", "data_source", "prompt", "output", "score"]
    group.log_generations([], 4)  # no rows: no call
    assert len(recorder.calls) == 1


def test_jsonl_writes_val_generations_beside_metrics_and_truncates_on_resume(tmp_path) -> None:
    logger = JsonlLogger(_ctx(tmp_path))
    logger.log({"a": 1.0}, 1)
    assert not (tmp_path / "run" / GENERATIONS_FILE).exists()  # created by the first samples
    for step in (2, 4):
        rows = [{"step": step, **row} for row in _rows(["é\nq", "r"])]
        rows[1]["score"] = float("nan")
        logger.log_generations(rows, step)
    logger.finish()
    path = tmp_path / "run" / GENERATIONS_FILE
    records = read_metrics(str(path))
    assert [(r["step"], r["prompt"], r["score"]) for r in records] == [
        (2, "é\nq", 0.5),
        (2, "r", None),
        (4, "é\nq", 0.5),
        (4, "r", None),
    ]
    assert records[0]["output"] == "É\nQ"
    JsonlLogger(_ctx(tmp_path, resumed=3)).finish()  # resumed from step 3: step 4 goes
    assert [r["step"] for r in read_metrics(str(path))] == [2, 2]
    JsonlLogger(_ctx(tmp_path)).finish()  # a fresh run: the earlier file moved aside
    assert not path.exists()
    assert [p.name.startswith("val_generations.") for p in (tmp_path / "run").iterdir()].count(
        True
    ) == 1


def test_console_prints_one_clipped_line_per_sample(tmp_path) -> None:
    stream = io.StringIO()
    logger = ConsoleLogger(_ctx(tmp_path), stream=stream, live=False)
    long_prompt = "system text " * 20 + "What is 2+2?"
    logger.log_generations(
        [{"step": 5, "data_source": "gsm8k", "prompt": long_prompt, "output": "4\n", "score": 1}],
        5,
    )
    lines = stream.getvalue().splitlines()
    assert lines[0] == "[polyrl] validation samples, step 5:"
    assert lines[1].startswith("    1.000  gsm8k  '…") and "What is 2+2?' -> '4'" in lines[1]
    assert len(lines) == 2


def test_tensorboard_writes_a_text_table(tmp_path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorboardLogger(_ctx(tmp_path))
    logger.log_generations([{"step": 2, **row} for row in _rows(["a|b"])], 2)
    logger.finish()
    events = EventAccumulator(logger.log_dir, size_guidance={"tensors": 0})
    events.Reload()
    (event,) = events.Tensors(f"{GENERATIONS_TAG}/text_summary")
    text = event.tensor_proto.string_val[0].decode()
    assert event.step == 2
    assert "| 0.500 | src | a\\|b | A\\|B |" in text


def test_rows_are_json(tmp_path) -> None:
    """What every logger receives can be written as JSON as it is (no tensors, no numpy)."""
    result = validate_by_generation(_val_set(), _val_ctx(shown=3))
    json.dumps(result.generations, allow_nan=False)
