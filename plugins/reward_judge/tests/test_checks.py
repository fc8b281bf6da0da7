"""The judge's config check: each bad key is one line naming it; the defaults (with a model)
pass. Checked on the whole composed schema, as ``polyrl validate`` checks it."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from polyrl.api.testing import schema_config
from polyrl_reward_judge.checks import check_config


def problems(**judge) -> list[str]:
    return check_config(OmegaConf.merge(schema_config(), {"reward_model": {"judge": judge}}))


def test_defaults_with_a_model_pass():
    assert problems(model_path="builtin:tiny") == []


def test_openai_backend_needs_its_keys():
    found = problems(backend="openai", max_concurrency=0, timeout_s=0.0)
    assert len(found) == 4
    assert found[0].startswith("reward_model.judge.base_url is not set")
    assert found[1].startswith("reward_model.judge.model is not set")
    assert "timeout_s=0.0 is out of range" in found[2]
    assert "max_concurrency=0 is out of range" in found[3]


def test_rollout_backend_needs_a_model_and_an_installed_engine():
    found = problems(rollout="nosuchengine")
    assert found[0].startswith("reward_model.judge.model_path is not set")
    assert "rollout='nosuchengine' is not an installed rollout engine" in found[1]
    assert "hf" in found[1]


@pytest.mark.parametrize(
    ("judge", "expected"),
    [
        ({"template": "{question} {answer}"}, "unknown placeholder(s) answer"),
        ({"template": "{question} only"}, "has no {response}"),
        ({"score_pattern": "Score: (\\d"}, "is not a valid regex"),
        ({"score_pattern": "Score: \\d+"}, "has 0 capture groups; it needs exactly 1"),
        ({"score_pattern": "(S)core: (\\d+)"}, "has 2 capture groups"),
        ({"score_min": 10.0, "score_max": 10.0}, "score_min=10.0 must be below score_max=10.0"),
        ({"verdict": "pass_fail", "fail_pattern": "["}, "fail_pattern='[' is not a valid regex"),
        ({"verdict": "json", "json_field": " "}, "json_field is empty"),
        ({"verdict": "stars"}, "verdict='stars' is not one of score, pass_fail, json"),
        ({"backend": "openia"}, "Did you mean 'openai'?"),
        ({"max_unparsed_frac": 1.5}, "max_unparsed_frac=1.5 is out of range"),
        ({"max_new_tokens": 0}, "max_new_tokens=0 is out of range"),
    ],
)
def test_one_line_per_bad_key(judge, expected):
    found = problems(model_path="builtin:tiny", **judge)
    assert len(found) == 1 and expected in found[0], found


def test_a_json_example_in_the_template_is_not_a_placeholder():
    template = 'Grade {response}. Answer as {"score": 3}.'
    assert problems(model_path="builtin:tiny", template=template, verdict="json") == []
