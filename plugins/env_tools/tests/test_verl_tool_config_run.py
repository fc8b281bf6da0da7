"""A verl tool-config YAML and verl-format multi-turn parquet rows drive a training run: the
YAML's class is built per episode with the row's ``extra_info.tools_kwargs`` (verl's
``create_kwargs``), its ``execute`` answers the call, and the episode ends with the answer.

The tiny random model cannot write a JSON call itself, so every episode's first turn is
prefilled with a whole hermes call (``multi_turn.prefill``, prompt tokens); what the model
writes after it is parsed with it, as for any model."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from polyrl.api.testing import IN_PROCESS_OVERRIDES, run_polyrl_here

TOOL_MODULE = '''
import json, os

class SecretTool:
    """verl's BaseTool shape: create / execute / release."""

    def __init__(self, config, tool_schema):
        self.log, self.secrets = config["log"], {}

    async def create(self, instance_id, ground_truth=None, **kwargs):
        self.secrets[instance_id] = ground_truth
        with open(self.log, "a") as handle:
            handle.write(json.dumps({"created": ground_truth}) + "\\n")
        return instance_id

    async def execute(self, instance_id, parameters, **kwargs):
        return f"secret {self.secrets[instance_id]}", 0.0, {}

    async def release(self, instance_id):
        self.secrets.pop(instance_id, None)
'''
SCHEMA = {
    "type": "function",
    "function": {
        "name": "secret",
        "description": "Tells the secret digit.",
        "parameters": {"type": "object", "properties": {}, "required": []},
    },
}
CALL = '<tool_call>{"name": "secret", "arguments": {}}</tool_call>'


def _rows(count: int) -> pa.Table:
    """Rows as verl's multi-turn preprocessing writes them (gsm8k_multiturn_w_tool.py)."""
    digits = [str(i % 10) for i in range(count)]
    return pa.table(
        {
            "data_source": ["polyrl/tiny_digits"] * count,
            "prompt": [
                [
                    {"role": "system", "content": "Use the secret tool."},
                    {"role": "user", "content": "What is the secret digit?"},
                ]
                for _ in digits
            ],
            "ability": ["digits"] * count,
            "reward_model": [{"style": "rule", "ground_truth": d} for d in digits],
            "extra_info": [
                {
                    "split": "train",
                    "index": i,
                    "need_tools_kwargs": True,
                    "tools_kwargs": {"secret": {"create_kwargs": {"ground_truth": d}}},
                }
                for i, d in enumerate(digits)
            ],
        }
    )


def test_a_verl_tool_config_and_verl_rows_drive_a_run(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "verl_secret_tool.py").write_text(TOOL_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    log = tmp_path / "created.jsonl"
    config = tmp_path / "tool_config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "tools": [
                    {
                        "class_name": "verl_secret_tool.SecretTool",
                        "config": {"type": "native", "log": str(log)},
                        "tool_schema": SCHEMA,
                    }
                ]
            }
        )
    )
    data = tmp_path / "train.parquet"
    pq.write_table(_rows(16), data)
    out = tmp_path / "run"
    multi_turn = "actor_rollout_ref.rollout.multi_turn"
    done = run_polyrl_here(
        "train",
        "recipe=tiny",
        *IN_PROCESS_OVERRIDES,
        f"data.train_files={data}",
        f"data.val_files={data}",
        "data.train_batch_size=8",
        "data.max_prompt_length=256",
        "data.max_response_length=128",
        f"{multi_turn}.enable=true",
        f"{multi_turn}.format=hermes",
        f"{multi_turn}.tool_config_path={config}",
        f"{multi_turn}.max_assistant_turns=2",
        f"{multi_turn}.max_tokens_per_turn=8",
        f"{multi_turn}.prefill='{CALL}'",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.export_hf_model=false",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={out}",
    )
    assert done.returncode == 0, done.stderr[-4000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert record["multi_turn/tool_calls/mean"] == 1.0, record
        assert record["multi_turn/tool_errors/mean"] == 0.0, record
        assert record["multi_turn/assistant_turns/mean"] == 2.0, record
        assert record["multi_turn/end/done"] == 1.0, record  # answered, not truncated
    created = [json.loads(line)["created"] for line in log.read_text().splitlines()]
    assert len(created) == 2 * 8 * 4  # 2 steps x 8 prompts x rollout.n=4 episodes
    assert set(created) <= {str(i) for i in range(10)} and len(set(created)) > 1
