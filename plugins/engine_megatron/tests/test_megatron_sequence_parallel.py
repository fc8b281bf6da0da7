"""Sequence parallelism on 2 gloo ranks (CPU), in megatron-core 0.16's own layers: the engine's
model builder, HF weight loading, scoring layout (rows padded to a multiple of TP, the hidden
states gathered before the scored positions are picked), the TP sum of the partial gradients and
the gradient averaging, against the HF model run on each row's real tokens alone.

- a dense Qwen2 at TP=2, with and without sequence parallelism, for the packed row (fused
  vocab-parallel log-probs and logits) and padded rows: log-probs and every weight's gradient
  equal the HF model's;
- Qwen2-MoE and Qwen3-MoE at TP=2 x EP=2 (the smallest layout: expert-parallel ranks are carved
  out of TP x DP, so 2 ranks hold 2 experts each and split the sequence): log-probs, every
  gradient and the grad norm equal the HF model's (the TP=1, EP=1 engine is checked against the
  same reference in ``test_megatron_moe.py``).

gloo has ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` in this torch, so megatron-core's
sequence-parallel collectives run unchanged. The model's forward runs to megatron-core 0.16's
logits (it has no ``output_processor`` hook); the engine's scoring hook is applied to the final
hidden states taken from the decoder, as megatron-core 0.19 hands them to it. The embedding's
sequence-parallel scatter runs under megatron-core's CUDA RNG tracker (for dropout, off here),
whose CUDA state the CPU has not: its fork is pointed at the CPU's one RNG, as the MoE layers'
CUDA calls are (``test_megatron_moe._cpu_moe``).
"""

from __future__ import annotations

import dataclasses
from importlib.util import find_spec

import pytest
import torch
from test_megatron_moe import _cpu_moe
from test_megatron_moe import _model as _moe_model
from test_megatron_stages import _hf_model

from polyrl.api import Batch
from polyrl_engine_kit.logprob import EntropyMode
from polyrl_engine_megatron.sequence_parallel import pad_packed

# Located, not imported: collecting this file must not load megatron into every test process.
pytestmark = pytest.mark.skipif(
    find_spec("megatron") is None, reason="pip install 'polyrl-engine-megatron[cpu]'"
)

PROMPT, RESPONSE = 4, 5


def _micro() -> Batch:
    """3 rows, left-padded prompts and right-padded responses: 19 real tokens, 9 columns
    (odd, so that sequence parallelism pads either layout)."""
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 64, (3, PROMPT + RESPONSE), generator=generator)
    prompt_real = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1]])
    response_real = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    mask = torch.cat([prompt_real, response_real], dim=1)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    ids = ids * mask
    return Batch(
        tensors={
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": positions,
            "responses": ids[:, PROMPT:],
        }
    )


def _hf_log_probs(model: torch.nn.Module, micro: Batch) -> torch.Tensor:
    """``[b, R]`` log-probs of the response tokens, each row's real tokens run alone."""
    out = torch.zeros(micro["responses"].shape)
    for row, (ids, mask) in enumerate(zip(micro["input_ids"], micro["attention_mask"])):
        real = ids[mask.bool()]
        logits = model(real[None]).logits[0, :-1].float()
        log_probs = torch.log_softmax(logits, -1).gather(-1, real[1:, None])[:, 0]
        count = int(mask[PROMPT:].sum())
        out[row, :count] = log_probs[-count:]
    return out


def _loss(log_probs: torch.Tensor, micro: Batch) -> torch.Tensor:
    mask = micro["attention_mask"][:, PROMPT:].float()
    return -(log_probs * mask).sum() / mask.sum()


def _scored(model, scorer, micro: Batch) -> torch.Tensor:
    """The engine's scoring of ``micro``: its layout through the model, and the scoring hook
    (:meth:`Scorer.forward`'s) on the final hidden states."""
    rows = scorer._rows(micro)
    captured = {}
    hook = model.decoder.register_forward_hook(lambda _m, _i, out: captured.update(out=out))
    model(*rows.inputs, packed_seq_params=rows.layout)
    hook.remove()
    hidden = scorer._full(captured["out"], partial=not scorer.paths.fused)
    log_prob, _ = scorer._score(
        rows.select(hidden), model.output_layer, None, rows.labels, 1.0, EntropyMode.NONE
    )
    return rows.to_response(log_prob.unsqueeze(0))[0]


def _hf_grads(model, shape, ep: int) -> dict[str, torch.Tensor]:
    """Every gradient of ``model`` under its HF name: TP shards and experts gathered."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    from polyrl_engine_megatron.convert import megatron_to_hf, split_dim
    from polyrl_engine_megatron.moe import gathered_experts, is_expert, stack_experts

    tp_group = parallel_state.get_tensor_model_parallel_group()
    out = {}
    for name, param in model.named_parameters():
        grad = param.grad if param.grad is not None else torch.zeros_like(param)
        if is_expert(name) and ep > 1:
            per_rank = shape.moe.num_experts // ep
            group = parallel_state.get_expert_model_parallel_group()
            for expert, tensor in gathered_experts(name, grad, group, ep, per_rank):
                out.update(megatron_to_hf(expert, [tensor], shape))
            continue
        shards = [grad]
        if split_dim(name) is not None:
            shards = [torch.empty_like(grad) for _ in range(2)]
            dist.all_gather(shards, grad.contiguous(), group=tp_group)
        out.update(megatron_to_hf(name, shards, shape))
    return dict(stack_experts(iter(out.items()), shape.moe.num_experts)) if shape.moe else out


def _scenario(rank: int, world: int, path: str, ep: int, layouts: list[tuple]) -> list[dict]:
    """For each ``(packed, fused, sequence_parallel)``: the engine's log-probs of the
    micro-batch and, after its backward and the engine's gradient reductions, the HF-named
    gradients and the grad norm."""
    from contextlib import nullcontext

    from megatron.core import parallel_state, tensor_parallel
    from transformers import AutoConfig

    from polyrl_engine_megatron.convert import GPTShape, pipeline_stages
    from polyrl_engine_megatron.gradients import GradientGroups, average_gradients, global_norm
    from polyrl_engine_megatron.model import build_gpt_model, load_hf_weights
    from polyrl_engine_megatron.scoring import Scorer, ScoringPaths
    from polyrl_engine_megatron.sequence_parallel import (
        has_partial_gradient,
        sum_partial_gradients,
    )
    from polyrl_engine_megatron.transformer_overrides import Recompute

    _cpu_moe()
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *_: nullcontext()
    parallel_state.initialize_model_parallel(
        world, 1, expert_model_parallel_size=ep, expert_tensor_parallel_size=1
    )
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    hf_config = AutoConfig.from_pretrained(path)
    shape = GPTShape.from_hf_config(hf_config, world)
    stage = pipeline_stages(shape.num_layers, 1)[0]
    groups = GradientGroups(
        data_parallel_size=1,
        expert_data_parallel=parallel_state.get_expert_data_parallel_group(),
        expert_data_parallel_size=parallel_state.get_expert_data_parallel_world_size(),
        expert_parallel=parallel_state.get_expert_model_parallel_group() if ep > 1 else None,
        tensor_parallel=parallel_state.get_tensor_model_parallel_group(),
    )
    results = []
    for packed, fused, sequence_parallel in layouts:
        model = build_gpt_model(
            shape,
            hf_config,
            stage,
            pipeline_parallel=1,
            recompute=Recompute(),
            overrides={"sequence_parallel": sequence_parallel},
            device=torch.device("cpu"),
            expert_parallel=ep,
        )
        expert_rank = parallel_state.get_expert_model_parallel_rank()
        load_hf_weights(model, path, shape, stage, tp_rank, False, expert_rank, ep)
        paths = ScoringPaths.choose(
            remove_padding=packed, fused_log_prob=fused, torch_compile=False, tp=world
        )
        paths = dataclasses.replace(paths, sequence_parallel=sequence_parallel)
        scorer = Scorer(
            shape,
            paths,
            torch.float32,
            parallel_state.get_tensor_model_parallel_group(),
            torch.device("cpu"),
        )
        micro = _micro()
        log_probs = _scored(model, scorer, micro)
        _loss(log_probs, micro).backward()
        named = list(model.named_parameters())
        for _, param in named:
            param.grad = param.grad if param.grad is not None else torch.zeros_like(param)
        grads = [param.grad for _, param in named]
        sum_partial_gradients(
            grads, [has_partial_gradient(n, p) for n, p in named], groups.tensor_parallel
        )
        average_gradients([n for n, _ in named], grads, groups)
        norm = global_norm([n for n, _ in named], grads, groups, torch.device("cpu"))
        results.append(
            {"log_probs": log_probs.detach(), "grads": _hf_grads(model, shape, ep), "norm": norm}
        )
    parallel_state.destroy_model_parallel()
    return results


def _check(results: list[list[dict]], hf_model: torch.nn.Module) -> None:
    micro = _micro()
    expected = _hf_log_probs(hf_model, micro)
    _loss(expected, micro).backward()
    grads = {name: param.grad for name, param in hf_model.named_parameters()}
    norm = float(torch.sqrt(sum(g.pow(2).sum() for g in grads.values())))
    for rank_results in results:
        for result in rank_results:
            torch.testing.assert_close(result["log_probs"], expected, rtol=1e-5, atol=1e-5)
            assert result["grads"].keys() == grads.keys()
            for name, grad in grads.items():
                torch.testing.assert_close(
                    result["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name
                )
            assert result["norm"] == pytest.approx(norm, rel=1e-5)


def test_dense_tensor_parallel_with_and_without_sequence_parallelism(tmp_path) -> None:
    """TP=2: packed (fused and logits) and padded rows, sequence-parallel or not, all equal the
    HF model (hence each other)."""
    from transformers import AutoModelForCausalLM

    from polyrl_engine_kit.launch import run_on_ranks

    _hf_model(str(tmp_path), layers=2)
    layouts = [(True, True, True), (True, False, True), (False, False, True), (True, True, False)]
    results = run_on_ranks(_scenario, 2, str(tmp_path), 1, layouts, timeout_s=240)
    _check(results, AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32))


@pytest.mark.parametrize("family", ["qwen2_moe", "qwen3_moe"])
def test_moe_tensor_and_expert_parallel_equal_the_hf_model(tmp_path, family: str) -> None:
    """TP=2 x EP=2 on 2 ranks: each rank routes its half of the sequence's tokens to the
    experts of both ranks (megatron-core's all-to-all dispatcher)."""
    from polyrl_engine_kit.launch import run_on_ranks

    hf_model = _moe_model(family)
    hf_model.save_pretrained(tmp_path)
    layouts = [(True, True, True), (False, False, True)]
    results = run_on_ranks(_scenario, 2, str(tmp_path), 2, layouts, timeout_s=240)
    _check(results, hf_model)


def test_a_packed_row_is_padded_by_one_more_sequence() -> None:
    from polyrl_engine_kit.packing import pack_rows

    micro = _micro()
    packed = pack_rows(micro["input_ids"], micro["attention_mask"], RESPONSE)
    assert packed.input_ids.shape[1] == 19
    assert pad_packed(packed, 1) is packed
    padded = pad_packed(packed, 4)
    assert padded.input_ids.shape[1] == 20
    assert padded.cu_seqlens.tolist() == [*packed.cu_seqlens.tolist(), 20]
    assert padded.position_ids[0, -1] == 0
    assert torch.equal(padded.score_index, packed.score_index)
