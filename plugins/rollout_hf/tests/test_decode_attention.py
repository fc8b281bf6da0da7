"""The hf rollout's Triton decode attention (``polyrl_rollout_hf.decode_attention``).

Against SDPA on random tensors (splits, a read end before the cache's, group and head sizes that
are not powers of two) and through the rollout (greedy and drawn samples, continuous batching
round a wrapping ring): on CPU under Triton's interpreter, on CUDA natively (bfloat16 too).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from polyrl_rollout_hf.decode_attention import split_count, unavailable_reason

HERE = Path(__file__).parent
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
TRITON = pytest.mark.skipif(
    unavailable_reason(torch.device("cuda")) == "triton is not installed",
    reason="needs triton",
)


def test_split_count_fills_the_gpu_with_long_parts_only():
    assert split_count(512, 2, 8192, 528) == 1  # enough rows: one pass per row
    assert split_count(8, 2, 65536, 528) == 33  # 16 row-heads x 33 parts fill 528 programs
    assert split_count(8, 2, 8192, 528) == 8  # no part shorter than PART_COLUMNS
    assert split_count(64, 2, 768, 528) == 1  # a short cache: parts would cost more than they save
    assert split_count(0, 2, 64, 528) == 1


@TRITON
def test_kernel_and_rollout_under_the_interpreter(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, str(HERE / "decode_attention_checks.py"), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "decode attention checks passed" in done.stdout


@pytest.mark.gpu
@CUDA
@TRITON
def test_cuda_kernel_and_rollout(tmp_path):
    from decode_attention_checks import check_against_sdpa, check_engine_samples

    check_against_sdpa("cuda", [torch.float32, torch.bfloat16, torch.float16])
    check_engine_samples(str(tmp_path), "cuda")


def test_the_kernel_is_refused_where_it_cannot_run(tmp_path):
    from decode_attention_checks import engine
    from hf_engines import build_gqa_model

    from polyrl.api import ConfigError

    if torch.cuda.is_available():
        pytest.skip("the refusal is for a device without CUDA")
    path = build_gqa_model(str(tmp_path / "gqa"))
    with pytest.raises(ConfigError, match=r"engine_kwargs\.hf\.triton_attention=true, but"):
        engine(path, "cpu", triton_attention="true")
    with pytest.raises(ConfigError, match=r"triton_attention=true, but device 'cpu'"):
        engine(path, "cpu", static_cache="false", triton_attention="true")  # no static step
    assert not engine(path, "cpu").static_decode.fused.attention_kernel  # auto: SDPA on CPU
