"""The HF export writes what transformers loads, without importing DeepSpeed: accelerate's
unwrap inside ``save_pretrained`` would import it (and mlflow, pydantic) in every export of
every engine wherever it is installed."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
from polyrl_engine_kit.checkpoint import write_hf_folder
from polyrl_engine_kit.testing import tiny_model

source = tiny_model("export_")
model = AutoModelForCausalLM.from_pretrained(source)
write_hf_folder(sys.argv[1], model.state_dict(), AutoConfig.from_pretrained(source),
                torch.float32, source)
print("deepspeed" in sys.modules)
reloaded = AutoModelForCausalLM.from_pretrained(sys.argv[1])
ids = torch.tensor([[1, 2, 3, 4]])
print(torch.equal(reloaded(ids).logits, model(ids).logits))
"""


def test_the_export_loads_back_and_leaves_deepspeed_unimported(tmp_path) -> None:
    pytest.importorskip("deepspeed")
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "hf")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False", "True"]
