"""Scaffolding of the contract tests of inference-engine rollouts (vLLM, SGLang, hf): the tiny
models, the prompts and sequences the tests feed, the Hugging Face reference (a teacher-forced
forward of the same weights gives the log-probs an engine must report), and the FSDP trainer
whose weight stream an engine must take.

Light at import (no torch, transformers or engine): everything heavy is imported inside the
functions, so a test module imports this wherever it is collected.
"""

from __future__ import annotations

from typing import Any

PAD, EOS = 0, 2
MAX_PROMPT, MAX_RESPONSE = 32, 16
# Left-padded into one batch by left_padded_prompts(): three lengths, no stop token.
PROMPT_ROWS = [[1, 40, 41, 42, 43], [1, 50], [1, 60, 61, 62]]
# Whole prompt+response sequences for score_log_probs(), the second one ending with EOS.
SEQUENCES = [[1, 40, 41, 42, 43, 7, 8, 9, 10, 11], [1, 50, 100, 200, 300, 2]]


def tiny_model_pair(root: Any) -> tuple[str, str]:
    """polyrl's tiny Qwen2 twice under ``root`` (a folder): random weights of seed 0 and 1."""
    import os

    from polyrl.models.tiny import build_tiny_model

    return (
        build_tiny_model(os.path.join(str(root), "seed0"), seed=0),
        build_tiny_model(os.path.join(str(root), "seed1"), seed=1),
    )


def rollout_context(model_path: str, config: Any, **values: Any) -> Any:
    """A :class:`~polyrl.interfaces.RolloutContext` with the contract tests' lengths and special
    tokens; ``values`` sets the rest (``device``, ``rank``, ``world_size``, ``seed``)."""
    from polyrl.interfaces import RolloutContext

    fields: dict[str, Any] = {"device": "cpu", "rank": 0, "world_size": 1, **values}
    return RolloutContext(
        model_path=model_path,
        config=config,
        max_prompt_length=MAX_PROMPT,
        max_response_length=MAX_RESPONSE,
        pad_token_id=PAD,
        eos_token_ids=[EOS],
        **fields,
    )


def left_padded_prompts(rows: list[list[int]] | None = None, pad: int = PAD) -> Any:
    """``rows`` of token ids (default :data:`PROMPT_ROWS`) as a left-padded prompt batch."""
    import torch

    from polyrl.batch import Batch

    rows = PROMPT_ROWS if rows is None else rows
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    return Batch({"input_ids": ids, "attention_mask": mask})


def hf_causal_lm(path: str, device: str = "cpu") -> Any:
    """The Hugging Face model of ``path`` in float32 on ``device``, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()


def _device(model: Any) -> Any:
    return next(model.parameters()).device


def token_log_probs(values: Any, tokens: Any) -> Any:
    """``values[..., token]`` for each token: the entries of ``tokens`` picked from the last dim."""
    return values.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def response_logits(model: Any, out: Any) -> Any:
    """The model's float logits, on the CPU, at the positions that predict the response tokens
    of the batch an engine returned (one forward of ``input_ids`` with its mask and positions)."""
    import torch

    device = _device(model)
    with torch.no_grad():
        logits = model(
            input_ids=out["input_ids"].to(device),
            attention_mask=out["attention_mask"].to(device),
            position_ids=out["position_ids"].to(device),
        ).logits.float()
    width = out["responses"].shape[1]
    return logits[:, -width - 1 : -1].cpu()


def teacher_forced_log_probs(model: Any, out: Any, temperature: float = 1.0) -> Any:
    """log_softmax(logits / T) of the model at each response token of ``out``."""
    logits = response_logits(model, out) / temperature
    return token_log_probs(logits.log_softmax(-1), out["responses"])


def sequence_log_probs(model: Any, sequences: list[list[int]]) -> list[Any]:
    """Per sequence, the model's log-prob of each token after the first (on the CPU): what
    ``score_log_probs`` must return."""
    import torch

    result = []
    for seq in sequences:
        ids = torch.tensor([seq], device=_device(model))
        with torch.no_grad():
            logits = model(input_ids=ids).logits.float()[0, :-1]
        result.append(token_log_probs(logits.log_softmax(-1), ids[0, 1:]).cpu())
    return result


# ---- the trainer's weight stream ---------------------------------------------------------------
def fsdp_actor(model_path: str, device: str, engine: str = "fsdp2") -> Any:
    """A one-rank actor of ``model_path`` on the training engine registered as ``engine``
    (FSDP2 by default; looked up by name, so this kit depends on no engine package) in float32
    (its process group must exist), with a learning rate large enough that one step visibly
    moves the log-probs."""
    from polyrl.interfaces import EngineContext
    from polyrl.registry import get_registry
    from polyrl.specs import PluginKind

    engine_cls = get_registry().load(PluginKind.TRAINING_ENGINE, engine)
    return engine_cls(
        EngineContext(
            role="actor",
            model_path=model_path,
            model={"dtype": "float32"},
            engine={
                "fsdp_config": {"mixed_precision": False},
                "optim": {"lr": 3e-2, "clip_grad": 0.0, "weight_decay": 0.0},
                "ppo_micro_batch_size_per_gpu": 2,
                "log_prob_micro_batch_size_per_gpu": 2,
            },
            device=device,
            rank=0,
            world_size=1,
            seed=0,
        )
    )


def trainer_batch() -> tuple[Any, list[list[int]]]:
    """A fixed batch in the trainer's layout (prompts of 4 tokens, one left-padded; responses of
    5 tokens, one ending with EOS and padded) and its rows without padding, for
    ``score_log_probs``."""
    import torch

    from polyrl.batch import Batch

    prompt = torch.tensor([[1, 40, 41, 42], [0, 1, 50, 51]])
    pmask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])
    resp = torch.tensor([[7, 8, 9, 10, 11], [100, 200, 300, 2, 0]])
    rmask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    mask = torch.cat([pmask, rmask], -1)
    batch = Batch(
        {
            "input_ids": torch.cat([prompt, resp], -1),
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": resp,
            "response_mask": rmask,
        }
    )
    sequences = [
        [t for t, m in zip(row, keep) if m]
        for row, keep in zip(batch["input_ids"].tolist(), mask.tolist())
    ]
    return batch, sequences


def response_nll_loss(micro: Any, log_prob: Any, entropy: Any) -> tuple[Any, dict[str, float]]:
    """The mean negative log-likelihood of the response tokens: a loss_fn for ``train_step``."""
    m = micro["response_mask"].to(log_prob.dtype)
    loss = -(log_prob * m).sum() / m.sum()
    return loss, {"loss": float(loss.detach())}
