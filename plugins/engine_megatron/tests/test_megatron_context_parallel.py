"""Context parallelism on the CPU: the load-balanced split covers every token once and gives each
packed sequence's chunk its keys up to the chunk's end; a Qwen2 built by the engine on 2 gloo
ranks of one context-parallel group (megatron-core's parallel state with
``context_parallel_size=2``), or on 4 at TP=2 x CP=2 (sequence-parallel, as the engine runs TP)
or PP=2 x CP=2 (the stages' activations passed by hand: megatron-core's schedule needs CUDA),
each rank running its share of every sequence through the engine's scorer (packed rows and padded
rows, sequence lengths that 2 x CP does not divide, a rank that holds no scored position), gives
the HF model's log-probs, entropy and loss on every rank; the weights' gradients after the
engine's reductions and their global norm equal the HF model's; and ``polyrl validate``'s CP
rules. megatron-core 0.16 (the CPU machine's) has no ``output_processor`` hook: the test hands
the decoder's output to the scorer's hook as 0.19 does."""

from __future__ import annotations

import pytest
import torch
from test_megatron_stages import _hf_model

from polyrl.api import Batch
from polyrl_engine_kit.launch import run_on_ranks
from polyrl_engine_kit.logprob import EntropyMode
from polyrl_engine_megatron.context_parallel import ContextParallel

# real tokens per row (prompt, response): 12 columns, 3 per chunk at CP=2; or 8 columns whose
# only scored one (the response is one token) is on rank 0: rank 1 scores nothing
LENGTHS = {"long": ([5, 3, 6], [4, 6, 1]), "short": ([7, 3, 6], [1, 1, 1])}
TEMPERATURE, ENTROPY_COEFF = 0.8, 0.1


def _batch(lengths: str) -> Batch:
    """Left-padded prompts, right-padded responses (as the rollout writes them)."""
    prompts, responses = LENGTHS[lengths]
    width_p, width_r = max(prompts), max(responses)
    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(1, 64, (len(prompts), width_p + width_r), generator=generator)
    mask = torch.zeros_like(ids)
    for row, (prompt, response) in enumerate(zip(prompts, responses)):
        mask[row, width_p - prompt : width_p + response] = 1
    ids = ids * mask
    return Batch({"input_ids": ids, "attention_mask": mask, "responses": ids[:, width_p:]})


def _loss(log_prob: torch.Tensor, entropy: torch.Tensor, batch: Batch) -> torch.Tensor:
    real = batch["attention_mask"][:, -batch["responses"].shape[1] :].float()
    return -((log_prob - ENTROPY_COEFF * entropy) * real).sum() / real.sum()


@pytest.mark.parametrize(("size", "multiple"), [(1, 1), (2, 1), (3, 1), (2, 2)])
def test_split_covers_each_token_once_in_balanced_chunks(size: int, multiple: int) -> None:
    """``multiple``: each chunk's length a multiple of it (sequence parallelism over TP)."""
    step = 2 * size * multiple
    splits = [ContextParallel(None, size, rank, torch.device("cpu")) for rank in range(size)]
    padded = [split.split_padded(7, multiple) for split in splits]
    assert padded[0].padded == step * (-(-7 // step))
    held = torch.cat([split.local for split in padded])
    assert torch.equal(held.sort().values, torch.arange(padded[0].padded))
    assert torch.equal(held, padded[0].gathered)
    chunk = padded[0].padded // (2 * size)
    assert padded[0].local[:chunk].tolist() == list(range(chunk))  # rank 0: first and last
    assert padded[0].local[chunk:].tolist() == list(
        range(padded[0].padded - chunk, padded[0].padded)
    )

    cu = torch.tensor([0, 5, 6, 13], dtype=torch.int32)  # lengths 5, 1, 7
    packed = [split.split_packed(cu, multiple) for split in splits]
    lengths = [-(-n // step) * step for n in (5, 1, 7)]
    starts = [0, lengths[0], lengths[0] + lengths[1]]
    assert packed[0].real.tolist() == [
        start + i for start, n in zip(starts, (5, 1, 7)) for i in range(n)
    ]
    gathered = torch.cat([split.local for split in packed])
    assert torch.equal(gathered.sort().values, torch.arange(sum(lengths)))
    for split in packed:
        positions = [i for n in lengths for i in range(n)]
        assert split.positions.tolist() == [positions[t] for t in split.local]
        # each query segment's keys: its sequence from the start to the segment's end
        keys = gathered[split.key_index]
        q_bounds, k_bounds = split.cu_seqlens_q.tolist(), split.cu_seqlens_kv.tolist()
        for segment in range(len(q_bounds) - 1):
            queries = split.local[q_bounds[segment] : q_bounds[segment + 1]]
            segment_keys = keys[k_bounds[segment] : k_bounds[segment + 1]]
            sequence = segment // 2
            assert segment_keys.tolist() == list(range(starts[sequence], queries[-1] + 1))


class _ScoringHook(torch.nn.Module):
    """megatron-core 0.19's ``output_processor`` on 0.16's GPTModel (the CPU machine's): the
    final hidden states (the decoder's output, after its final norm) handed to the hook with
    the output layer, as 0.19 hands them."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs, packed_seq_params, output_processor) -> torch.Tensor:
        if not self.model.post_process:  # an earlier pipeline stage: its activations
            return self.model(*inputs, packed_seq_params=packed_seq_params)
        captured = {}
        decoder = self.model.decoder
        hook = decoder.register_forward_hook(lambda _m, _i, out: captured.update(out=out))
        self.model(*inputs, packed_seq_params=packed_seq_params)
        hook.remove()
        return output_processor(
            hidden_states=captured["out"], output_layer=self.model.output_layer, output_weight=None
        )


def _scenario(rank: int, world: int, path: str, packed: bool, lengths: str, tp: int) -> dict:
    """This rank's share of the micro-batch through the engine's scorer and its gradient
    reductions (at TP > 1 sequence-parallel, as the engine runs it): its scores (the whole
    micro-batch's), loss, HF-named gradients and grad norm."""
    from contextlib import nullcontext

    from megatron.core import parallel_state, tensor_parallel
    from test_megatron_sequence_parallel import _hf_grads
    from transformers import AutoConfig

    from polyrl_engine_megatron.convert import GPTShape, megatron_to_hf, pipeline_stages
    from polyrl_engine_megatron.gradients import GradientGroups, average_gradients, global_norm
    from polyrl_engine_megatron.model import build_gpt_model, load_hf_weights
    from polyrl_engine_megatron.scoring import Scorer, ScoringPaths
    from polyrl_engine_megatron.sequence_parallel import (
        has_partial_gradient,
        sum_partial_gradients,
    )
    from polyrl_engine_megatron.transformer_overrides import Recompute

    # megatron-core's sequence-parallel buffers and RNG fork are CUDA's: pointed at the CPU
    torch.cuda.current_device = lambda: "cpu"
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *_: nullcontext()
    parallel_state.initialize_model_parallel(tp, 1, context_parallel_size=world // tp)
    hf_config = AutoConfig.from_pretrained(path)
    shape = GPTShape.from_hf_config(hf_config, tp)
    stage = pipeline_stages(shape.num_layers, 1)[0]
    cpu = torch.device("cpu")
    model = build_gpt_model(
        shape, hf_config, stage, pipeline_parallel=1, recompute=Recompute(), device=cpu
    )
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    load_hf_weights(model, path, shape, stage, tp_rank, False)
    paths = ScoringPaths.choose(
        remove_padding=packed, fused_log_prob=packed, torch_compile=False, tp=tp
    )
    context = ContextParallel(
        parallel_state.get_context_parallel_group(),
        world // tp,
        parallel_state.get_context_parallel_rank(),
        cpu,
    )
    tp_group = parallel_state.get_tensor_model_parallel_group()
    scorer = Scorer(shape, paths, torch.float32, tp_group, cpu, context=context)
    batch = _batch(lengths)
    scores, to_response = scorer.forward(
        _ScoringHook(model), batch, temperature=TEMPERATURE, entropy=EntropyMode.GRAD
    )
    log_prob, entropy = to_response(scores)
    loss = _loss(log_prob, entropy, batch)
    loss.backward()
    named = list(model.named_parameters())
    for _, param in named:
        param.grad = param.grad if param.grad is not None else torch.zeros_like(param)
    names, grads = [name for name, _ in named], [param.grad for _, param in named]
    groups = GradientGroups.from_parallel_state()
    if tp > 1:
        partial = [has_partial_gradient(name, param) for name, param in named]
        sum_partial_gradients(grads, partial, groups.tensor_parallel)
    average_gradients(names, grads, groups)
    norm = global_norm(names, grads, groups, cpu)
    with torch.no_grad():  # a critic's values through the same split (its head replicated)
        values, to_values = scorer.forward_values(_ScoringHook(model), batch, _value_head())
        values = to_values(values)[0]
    hf_grads = (
        _hf_grads(model, shape, 1)
        if tp > 1
        else {
            hf_name: tensor
            for name, grad in zip(names, grads)
            for hf_name, tensor in megatron_to_hf(name, [grad], shape)
        }
    )
    parallel_state.destroy_model_parallel()
    return {
        "log_prob": log_prob.detach(),
        "entropy": entropy.detach(),
        "loss": float(loss),
        "norm": norm,
        "grads": hf_grads,
        "values": values,
    }


def _value_head() -> torch.nn.Linear:
    torch.manual_seed(5)
    return torch.nn.Linear(32, 1)  # the test model's hidden size


def _hf_values(path: str, lengths: str) -> torch.Tensor:
    """A value head on the HF model's final hidden states at the positions that predict each
    response token, ``[b, R]``, zero on padding."""
    from transformers import AutoModelForCausalLM

    from polyrl_engine_kit.scoring import model_inputs, pad_to_response

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    trimmed, kwargs, response_attention = model_inputs(_batch(lengths), torch.device("cpu"))
    keys = ("input_ids", "attention_mask", "position_ids")
    with torch.no_grad():
        hidden = hf.model(**{key: kwargs[key] for key in keys}).last_hidden_state
        kept = trimmed.kept_response
        values = _value_head()(hidden[:, -(kept + 1) : -1])[..., 0]
    return pad_to_response(values, None, response_attention, kept)[0]


def _hf_reference(path: str, lengths: str) -> tuple:
    """The HF model's response scores of the batch (the FSDP engine's scoring), its loss and
    every weight's gradient of it."""
    from transformers import AutoModelForCausalLM

    from polyrl_engine_kit.scoring import response_log_probs

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    batch = _batch(lengths)
    scores = response_log_probs(
        hf,
        batch,
        torch.device("cpu"),
        temperature=TEMPERATURE,
        entropy=EntropyMode.GRAD,
        logits_to_keep=False,
    )
    loss = _loss(scores.log_prob, scores.entropy, batch)
    loss.backward()
    return scores, loss, {name: param.grad for name, param in hf.named_parameters()}


@pytest.mark.parametrize(
    ("packed", "lengths", "tp"),
    [
        (True, "long", 1),
        (False, "long", 1),
        (False, "short", 1),
        (True, "long", 2),
        (False, "long", 2),
    ],
    ids=["packed", "padded", "padded-rank-without-scores", "packed-tp2", "padded-tp2"],
)
def test_context_parallel_equals_the_hf_model(
    tmp_path, packed: bool, lengths: str, tp: int
) -> None:
    """CP=2 on 2 ranks, or TP=2 x CP=2 (sequence-parallel) on 4."""
    pytest.importorskip("megatron.core")
    _hf_model(str(tmp_path), layers=2)
    results = run_on_ranks(_scenario, 2 * tp, str(tmp_path), packed, lengths, tp, timeout_s=300)
    scores, loss, expected = _hf_reference(str(tmp_path), lengths)
    norm = torch.sqrt(sum(grad.pow(2).sum() for grad in expected.values()))
    values = _hf_values(str(tmp_path), lengths)
    for result in results:  # every rank of the group scores the whole micro-batch
        torch.testing.assert_close(result["values"], values, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            result["log_prob"], scores.log_prob.detach(), atol=1e-5, rtol=1e-5
        )
        torch.testing.assert_close(result["entropy"], scores.entropy.detach(), atol=1e-5, rtol=1e-5)
        assert result["loss"] == pytest.approx(loss.item(), abs=1e-5)
        assert result["norm"] == pytest.approx(float(norm), rel=1e-5)
        assert result["grads"].keys() == expected.keys()
        for name, grad in expected.items():
            torch.testing.assert_close(result["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)


def _pipeline_scenario(rank: int, world: int, path: str) -> dict:
    """PP=2 x CP=2 on 4 ranks, a packed row: each stage runs its CP rank's tokens, the first
    stage's activations and their gradients passed by hand to the same CP rank of the other
    stage (megatron-core's pipeline schedule needs CUDA); this rank's scores (last stage),
    HF-named gradients and the grad norm after the engine's reductions."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from transformers import AutoConfig

    from polyrl_engine_megatron.convert import GPTShape, megatron_to_hf, pipeline_stages
    from polyrl_engine_megatron.gradients import GradientGroups, average_gradients, global_norm
    from polyrl_engine_megatron.model import build_gpt_model, load_hf_weights
    from polyrl_engine_megatron.scoring import Scorer, ScoringPaths
    from polyrl_engine_megatron.transformer_overrides import Recompute

    parallel_state.initialize_model_parallel(1, 2, context_parallel_size=2)
    hf_config = AutoConfig.from_pretrained(path)
    shape = GPTShape.from_hf_config(hf_config, 1)
    stage = pipeline_stages(shape.num_layers, 2)[parallel_state.get_pipeline_model_parallel_rank()]
    cpu = torch.device("cpu")
    model = build_gpt_model(
        shape, hf_config, stage, pipeline_parallel=2, recompute=Recompute(), device=cpu
    )
    load_hf_weights(model, path, shape, stage, 0, False)
    paths = ScoringPaths.choose(remove_padding=True, fused_log_prob=True, torch_compile=False, tp=1)
    context = ContextParallel(
        parallel_state.get_context_parallel_group(),
        2,
        parallel_state.get_context_parallel_rank(),
        cpu,
    )
    tp_group = parallel_state.get_tensor_model_parallel_group()
    scorer = Scorer(shape, paths, torch.float32, tp_group, cpu, context=context)
    batch = _batch("long")
    peer = (rank + 2) % 4  # the same CP rank of the other stage (megatron-core's rank order)
    result: dict = {}
    if stage.is_first:
        output, _ = scorer.forward(
            _ScoringHook(model), batch, temperature=TEMPERATURE, entropy=EntropyMode.GRAD
        )
        dist.send(torch.tensor(output.shape), dst=peer)
        dist.send(output.detach().contiguous(), dst=peer)
        grad = torch.empty_like(output)
        dist.recv(grad, src=peer)
        output.backward(grad)
    else:
        shape_of = torch.zeros(3, dtype=torch.long)
        dist.recv(shape_of, src=peer)
        received = torch.empty(tuple(shape_of.tolist()))
        dist.recv(received, src=peer)
        received.requires_grad_(True)
        model.set_input_tensor(received)
        scores, to_response = scorer.forward(
            _ScoringHook(model), batch, temperature=TEMPERATURE, entropy=EntropyMode.GRAD
        )
        log_prob, entropy = to_response(scores)
        loss = _loss(log_prob, entropy, batch)
        loss.backward()
        dist.send(received.grad.contiguous(), dst=peer)
        result.update(log_prob=log_prob.detach(), entropy=entropy.detach(), loss=loss.item())
    named = list(model.named_parameters())
    names, grads = [name for name, _ in named], [param.grad for _, param in named]
    groups = GradientGroups.from_parallel_state()
    average_gradients(names, grads, groups)
    result["norm"] = global_norm(names, grads, groups, cpu)
    result["grads"] = {
        hf_name: tensor
        for name, grad in zip(names, grads)
        for hf_name, tensor in megatron_to_hf(stage.global_name(name), [grad], shape)
    }
    parallel_state.destroy_model_parallel()
    return result


def test_context_parallel_over_pipeline_stages_equals_the_hf_model(tmp_path) -> None:
    pytest.importorskip("megatron.core")
    _hf_model(str(tmp_path), layers=2)
    results = run_on_ranks(_pipeline_scenario, 4, str(tmp_path), timeout_s=300)
    scores, loss, expected = _hf_reference(str(tmp_path), "long")
    norm = torch.sqrt(sum(grad.pow(2).sum() for grad in expected.values()))
    for first, last in ((results[0], results[2]), (results[1], results[3])):
        torch.testing.assert_close(last["log_prob"], scores.log_prob.detach(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(last["entropy"], scores.entropy.detach(), atol=1e-5, rtol=1e-5)
        assert last["loss"] == pytest.approx(loss.item(), abs=1e-5)
        grads = {**first["grads"], **last["grads"]}
        assert grads.keys() == expected.keys()
        for name, grad in expected.items():
            torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
        for result in (first, last):
            assert result["norm"] == pytest.approx(float(norm), rel=1e-5)


CP = "actor_rollout_ref.actor.megatron.context_parallel_size"


def _cfg(*overrides: str):
    from omegaconf import OmegaConf

    from polyrl.api.testing import schema_config

    return OmegaConf.merge(schema_config(), OmegaConf.from_dotlist(list(overrides)))


def test_context_parallel_counts_against_the_pools() -> None:
    from polyrl_engine_megatron.checks import check_config

    tp = "actor_rollout_ref.actor.megatron.tensor_model_parallel_size"
    assert check_config(_cfg("trainer.n_gpus_per_node=4", f"{CP}=2", f"{tp}=2")) == []
    (line,) = check_config(_cfg("trainer.n_gpus_per_node=4", f"{CP}=2", f"{tp}=3"))
    assert line.startswith(f"{tp}=3 x context_parallel_size=2 does not divide the 4 workers")
    (line,) = check_config(_cfg(f"{CP}=0"))
    assert line == f"{CP} must be a positive integer, got 0"
    # the reference follows the actor's split; on the actor's pool it cannot differ
    (line,) = check_config(
        _cfg(
            "trainer.n_gpus_per_node=4",
            f"{CP}=2",
            "actor_rollout_ref.ref.megatron.context_parallel_size=1",
        )
    )
    assert "1 x 1 differs from the actor's 1 x 1 (context parallel 2)" in line
    (line,) = check_config(
        _cfg("trainer.n_gpus_per_node=4", f"{CP}=2", "critic.megatron.context_parallel_size=1")
    )
    assert line.startswith("critic.megatron.context_parallel_size=1 differs from the actor's 2")


def test_a_token_budget_is_per_gpu_so_a_micro_batch_holds_cp_times_it() -> None:
    """As verl's Megatron actor: ``ppo_max_token_len_per_gpu`` x ``context_parallel_size``."""
    from polyrl.api import ConfigError
    from polyrl_engine_kit.config import resolve_settings
    from polyrl_engine_kit.microbatch import plan_micro_batches
    from polyrl_engine_kit.testing import ragged_batch

    # real lengths 9, 8, 5, 4 in rows 11 wide; packed, each rank's share is half of its micro-batch
    batch = ragged_batch([5, 2, 4, 1], [4, 6, 1, 3], 5, 6, torch.Generator().manual_seed(0))

    def plan(budget: int, context: int) -> list[list[int]]:
        keys = {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": budget}
        settings = resolve_settings({}, keys, total_training_steps=1)
        return plan_micro_batches(
            batch,
            settings,
            training=True,
            packed=True,
            sequence_parallel=context,
            split_by="megatron.context_parallel_size",
        )

    assert plan(13, 1) == [[0, 3], [1, 2]]
    assert plan(13, 2) == [[0, 1, 2, 3]]  # 26 tokens, 13 per CP rank
    with pytest.raises(ConfigError, match=r"megatron\.context_parallel_size 2=8; raise"):
        plan(4, 2)  # the 9-token row does not fit 2 x 4
