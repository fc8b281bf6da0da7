"""The FSDP2 engine's value head (a PPO critic) on 2 CPU ranks over gloo, checked against plain
single-process transformers: ``AutoModelForTokenClassification`` with one label on the causal-LM
checkpoint, the engine's fresh head copied into it."""

from __future__ import annotations

import pytest
import torch
from fsdp_tiny_model import build_tiny_model, make_batch

from polyrl.batch import Batch
from polyrl.interfaces.training_engine import EngineContext, ModelHead
from polyrl_engine_kit.launch import run_on_ranks

torch.set_num_threads(1)
WORLD = 2
PROMPT_W, RESP_W = 6, 7
PROMPT_LENS = [6, 5, 6, 4, 2, 3, 1, 2]
RESP_LENS = [7, 6, 5, 7, 2, 1, 3, 2]
LR = 5e-3
TARGET = 1.5


def _full_batch() -> Batch:
    return Batch(make_batch(PROMPT_LENS, RESP_LENS, PROMPT_W, RESP_W, seed=0))


def _ctx(rank: int, path: str, **engine_overrides: object) -> EngineContext:
    engine = {
        "ppo_micro_batch_size_per_gpu": 2,
        "log_prob_micro_batch_size_per_gpu": 3,
        "optim": {"lr": LR, "betas": [0.9, 0.99], "weight_decay": 0.01, "clip_grad": 1.0},
        "fsdp_config": {"mixed_precision": False},
        **engine_overrides,
    }
    return EngineContext(
        role="critic",
        model_path=path,
        model={"dtype": "float32"},
        engine=engine,
        device="cpu",
        rank=rank,
        world_size=WORLD,
        seed=11,
        total_training_steps=4,
        head=ModelHead.VALUE,
    )


def squared_distance_loss(micro: Batch, values: torch.Tensor):
    """Token-mean of ``(v - TARGET)^2`` over this rank's mini-batch."""
    mask = micro["response_mask"].float()
    loss = (((values - TARGET) ** 2) * mask).sum() / micro.meta["mini_batch_response_tokens"]
    return loss, {"fit": float(loss.detach())}


def _scenario(rank: int, world: int, path: str) -> dict:
    from polyrl_engine_fsdp.engine import FSDPEngine

    batch = _full_batch().chunk(world)[rank]
    engine = FSDPEngine(_ctx(rank, path))
    out = {"values": engine.compute_values(batch)}
    out["weights_0"] = {k: v.clone() for k, v in engine.named_weights()}
    out["metrics"] = engine.train_value_step(batch, squared_distance_loss)
    out["weights_1"] = {k: v.clone() for k, v in engine.named_weights()}
    dynamic = FSDPEngine(_ctx(rank, path, use_dynamic_bsz=True, log_prob_max_token_len_per_gpu=20))
    out["dyn_values"] = dynamic.compute_values(batch)
    return out


def _reference(path: str, head: dict[str, torch.Tensor]) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForTokenClassification

    config = AutoConfig.from_pretrained(path, num_labels=1)
    config.classifier_dropout = 0.0
    model = AutoModelForTokenClassification.from_pretrained(
        path, config=config, dtype=torch.float32
    )
    model.score.load_state_dict({"weight": head["score.weight"], "bias": head["score.bias"]})
    return model


def _reference_values(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
    ).logits[:, PROMPT_W - 1 : -1, 0]
    return out * batch["response_mask"].float()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny") / "tied"), tie=True, seed=0)


@pytest.fixture(scope="module")
def ranks(tiny_model: str) -> list[dict]:
    return run_on_ranks(_scenario, WORLD, tiny_model, timeout_s=240)


def test_backbone_from_the_checkpoint_and_a_fresh_scalar_head(tiny_model, ranks):
    from transformers import AutoModelForCausalLM

    causal = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).state_dict()
    weights = ranks[0]["weights_0"]
    assert "lm_head.weight" not in weights
    assert weights["score.weight"].shape == (1, causal["model.embed_tokens.weight"].shape[1])
    backbone = [name for name in weights if name.startswith("model.")]
    assert len(backbone) == len([n for n in causal if n.startswith("model.")])
    for name in backbone:
        assert torch.equal(weights[name], causal[name]), name
    # both ranks initialise the head identically (the same seed), so FSDP shards one model
    assert torch.equal(ranks[1]["weights_0"]["score.weight"], weights["score.weight"])


def test_values_match_plain_transformers(tiny_model, ranks):
    with torch.no_grad():
        expected = _reference_values(_reference(tiny_model, ranks[0]["weights_0"]), _full_batch())
    for key in ("values", "dyn_values"):
        values = torch.cat([r[key] for r in ranks])
        assert values.dtype == torch.float32 and values.shape == (8, RESP_W)
        torch.testing.assert_close(values, expected, atol=2e-5, rtol=1e-5)
    mask = _full_batch()["response_mask"].bool()
    assert (torch.cat([r["values"] for r in ranks])[~mask] == 0).all()


def test_value_step_matches_reference_adamw(tiny_model, ranks):
    """One engine step == single-process AdamW on the mean of the two ranks' losses."""
    model = _reference(tiny_model, ranks[0]["weights_0"])
    losses = []
    for shard in _full_batch().chunk(WORLD):
        shard.meta["mini_batch_response_tokens"] = float(shard["response_mask"].sum())
        losses.append(squared_distance_loss(shard, _reference_values(model, shard))[0])
    (sum(losses) / WORLD).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.99), weight_decay=0.01).step()

    metrics = ranks[0]["metrics"]
    assert metrics["critic/grad_norm"] == pytest.approx(float(norm), rel=1e-4)
    assert metrics["critic/lr"] == pytest.approx(LR)
    # "fit" is averaged over the rank's 2 micro-batches (2 rows each); each is its share of the sum
    assert 2 * metrics["fit"] == pytest.approx(float(losses[0].detach()), rel=1e-5)
    assert ranks[1]["metrics"]["critic/grad_norm"] == metrics["critic/grad_norm"]
    # Adam's first update is ~lr * sign(g): where g is near eps, the order of the cross-rank
    # reduction can move an entry by a fraction of lr; on average the updates must agree closely.
    initial = ranks[0]["weights_0"]
    for name, tensor in model.state_dict().items():
        engine_tensor = ranks[0]["weights_1"][name]
        torch.testing.assert_close(engine_tensor, tensor, atol=LR / 10, rtol=0)
        delta_engine, delta_ref = engine_tensor - initial[name], tensor - initial[name]
        assert (delta_engine - delta_ref).abs().mean() <= 1e-3 * delta_ref.abs().mean() + 1e-9
