"""The FSDP2 engine on 2 CPU ranks over gloo, checked against plain single-process transformers.

Each ``_scenario_*`` runs inside the spawned ranks (see ``polyrl_engine_kit.launch``) and returns
plain tensors; the tests compare them with references computed here, in the parent process.
Scenarios are module-scoped fixtures so one spawn serves several tests (the machine has 2 cores).
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from fsdp_tiny_model import build_tiny_model, make_batch

from polyrl.batch import Batch
from polyrl.interfaces.training_engine import EngineContext
from polyrl_engine_kit.launch import run_on_ranks

torch.set_num_threads(1)
WORLD = 2
PROMPT_W, RESP_W = 6, 7
# 8 rows: rank 0 gets rows 0-3 (long), rank 1 rows 4-7 (short): unequal dynamic micro-batches.
PROMPT_LENS = [6, 5, 6, 4, 2, 3, 1, 2]
RESP_LENS = [7, 6, 5, 7, 2, 1, 3, 2]
LR = 5e-3


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tiny")
    return {
        "tied": build_tiny_model(str(root / "tied"), tie=True, seed=0),
        "untied": build_tiny_model(str(root / "untied"), tie=False, seed=1),
    }


def _full_batch(seed: int = 0) -> Batch:
    return Batch(make_batch(PROMPT_LENS, RESP_LENS, PROMPT_W, RESP_W, seed=seed))


def _shard(batch: Batch, rank: int) -> Batch:
    return batch.chunk(WORLD)[rank]


def _ctx(rank: int, path: str, **engine_overrides: object) -> EngineContext:
    mixed = bool(engine_overrides.pop("mixed_precision", False))
    device = str(engine_overrides.pop("device", "cpu"))
    checkpointing = bool(engine_overrides.pop("gradient_checkpointing", False))
    optim = {
        "lr": LR,
        "betas": [0.9, 0.99],
        "weight_decay": 0.01,
        "clip_grad": 1.0,
        "lr_warmup_steps": 0,
        "warmup_style": "constant",
    }
    optim.update(engine_overrides.pop("optim", {}))  # type: ignore[arg-type]
    engine = {
        "ppo_micro_batch_size_per_gpu": 2,
        "use_dynamic_bsz": False,
        "ppo_max_token_len_per_gpu": 16384,
        "optim": optim,
        "fsdp_config": {"mixed_precision": mixed, "reshard_after_forward": True},
    }
    engine.update(engine_overrides)
    model = {
        "dtype": "bfloat16" if mixed else "float32",
        "override_config": {},
        "enable_gradient_checkpointing": checkpointing,
    }
    return EngineContext(
        role="actor",
        model_path=path,
        model=model,
        engine=engine,
        device=device,
        rank=rank,
        world_size=WORLD,
        seed=7,
        total_training_steps=8,
    )


def mean_logprob_loss(micro: Batch, log_prob: torch.Tensor, entropy: torch.Tensor | None):
    """-(token-mean log-prob) of this rank's mini-batch, split over micro-batches."""
    mask = micro["response_mask"].float()
    loss = -(log_prob * mask).sum() / micro.meta["mini_batch_response_tokens"]
    return loss, {"actor/pg_loss": float(loss.detach())}


def noisy_logprob_loss(micro: Batch, log_prob: torch.Tensor, entropy: torch.Tensor | None):
    """Like :func:`mean_logprob_loss` with random token weights: resume must restore the RNG."""
    mask = micro["response_mask"].float() * torch.rand(log_prob.shape)
    return -(log_prob * mask).sum() / micro.meta["mini_batch_response_tokens"], {}


# ---- scenarios (run inside each rank) ---------------------------------------------------------
def _scenario_inference(rank: int, world: int, paths: dict[str, str], export_dir: str) -> dict:
    from polyrl_engine_fsdp.engine import FSDPEngine

    batch = _shard(_full_batch(), rank)
    out: dict = {}
    fixed = FSDPEngine(_ctx(rank, paths["tied"]))
    out["lp"], out["ent"] = fixed.compute_log_prob(batch, temperature=0.7, calculate_entropy=True)
    out["weights"] = {k: v.clone() for k, v in fixed.named_weights()}
    out["micro_batches"] = fixed._micro_batches(batch, training=False)
    fixed.export_hf(export_dir)
    del fixed
    # Budget 20 tokens: rank 0's long rows need 4 micro-batches, rank 1's short rows fewer.
    dynamic = FSDPEngine(
        _ctx(rank, paths["tied"], use_dynamic_bsz=True, ppo_max_token_len_per_gpu=20)
    )
    out["dyn_lp"], out["dyn_ent"] = dynamic.compute_log_prob(
        batch, temperature=0.7, calculate_entropy=True
    )
    groups = dynamic._micro_batches(batch, training=False)
    out["dyn_micro_batches"] = groups
    del dynamic
    untied = FSDPEngine(_ctx(rank, paths["untied"]))
    out["untied_weights"] = {k: v.clone() for k, v in untied.named_weights()}
    return out


def _scenario_train(rank: int, world: int, path: str) -> dict:
    from polyrl_engine_fsdp.engine import FSDPEngine

    batch = _shard(_full_batch(), rank)
    engine = FSDPEngine(_ctx(rank, path))
    before, _ = engine.compute_log_prob(batch)
    metrics = [engine.train_step(batch, mean_logprob_loss)]
    after_one = {k: v.clone() for k, v in engine.named_weights()}
    metrics += [engine.train_step(batch, mean_logprob_loss) for _ in range(2)]
    after, _ = engine.compute_log_prob(batch)
    return {"before": before, "after": after, "metrics": metrics, "weights_1": after_one}


def _scenario_unequal(rank: int, world: int, path: str) -> dict:
    """Rank 1 holds one short row, rank 0 six long ones: with a 14-token budget rank 0 needs six
    micro-batches, rank 1 one, so rank 1 must add dummy passes or FSDP hangs."""
    from polyrl_engine_fsdp.engine import FSDPEngine

    full = _full_batch()
    rows = [0, 1, 2, 3, 0, 1] if rank == 0 else [4]
    batch = full.select_rows(rows)
    engine = FSDPEngine(_ctx(rank, path, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=14))
    groups, dummies = engine._micro_batches(batch, training=True)
    lp, _ = engine.compute_log_prob(batch)
    metrics = engine.train_step(batch, mean_logprob_loss)
    return {"groups": groups, "dummies": dummies, "lp": lp, "metrics": metrics}


def _scenario_resume(rank: int, world: int, path: str, ckpt_dir: str) -> dict:
    from polyrl_engine_fsdp.engine import FSDPEngine

    overrides = {
        "mixed_precision": True,
        "use_dynamic_bsz": True,
        "ppo_max_token_len_per_gpu": 40,
        "optim": {"lr_warmup_steps": 2, "warmup_style": "cosine", "min_lr_ratio": 0.1},
    }
    batches = [_shard(_full_batch(seed=s), rank) for s in range(4)]
    first = FSDPEngine(_ctx(rank, path, **dict(overrides)))
    for b in batches[:2]:
        first.train_step(b, noisy_logprob_loss)
    first.save_checkpoint(ckpt_dir)
    w_saved = {k: v.clone() for k, v in first.named_weights()}
    lrs_1 = [first.train_step(b, noisy_logprob_loss)["actor/lr"] for b in batches[2:]]
    w1 = {k: v.clone() for k, v in first.named_weights()}
    del first
    torch.manual_seed(1234)  # a different RNG state: load_checkpoint must restore it
    second = FSDPEngine(_ctx(rank, path, **dict(overrides)))
    second.load_checkpoint(ckpt_dir)
    step_after_load = second.global_step
    lrs_2 = [second.train_step(b, noisy_logprob_loss)["actor/lr"] for b in batches[2:]]
    w2 = {k: v.clone() for k, v in second.named_weights()}
    return {
        "w_saved": w_saved,
        "w1": w1,
        "w2": w2,
        "lrs_1": lrs_1,
        "lrs_2": lrs_2,
        "step": step_after_load,
    }


def _scenario_load_on_one_rank(rank: int, world: int, path: str, ckpt_dir: str) -> dict:
    """DCP reshards: a checkpoint written by 2 ranks loads into 1 rank."""
    from polyrl_engine_fsdp.engine import FSDPEngine

    ctx = _ctx(rank, path, mixed_precision=True)
    ctx.world_size = world
    engine = FSDPEngine(ctx)
    engine.load_checkpoint(ckpt_dir)
    return {"weights": dict(engine.named_weights()), "step": engine.global_step}


# ---- references (single process, plain transformers) ------------------------------------------
def _hf_model(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def _hf_logprob_entropy(model, batch: Batch, temperature: float = 1.0):
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
    ).logits
    logits = logits[:, PROMPT_W - 1 : -1].float() / temperature
    log_p = torch.log_softmax(logits, dim=-1)
    mask = batch["attention_mask"][:, PROMPT_W:].float()
    lp = log_p.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1) * mask
    ent = -(log_p.exp() * log_p).sum(-1) * mask
    return lp, ent


# ---- tests ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def inference(tiny_models, tmp_path_factory):
    export_dir = str(tmp_path_factory.mktemp("export") / "hf")
    results = run_on_ranks(_scenario_inference, WORLD, tiny_models, export_dir, timeout_s=240)
    return results, export_dir


def test_log_probs_and_entropy_match_plain_transformers(tiny_models, inference):
    results, _ = inference
    with torch.no_grad():
        lp_ref, ent_ref = _hf_logprob_entropy(_hf_model(tiny_models["tied"]), _full_batch(), 0.7)
    lp = torch.cat([r["lp"] for r in results])
    ent = torch.cat([r["ent"] for r in results])
    assert lp.dtype == torch.float32 and lp.shape == (8, RESP_W) and lp.device.type == "cpu"
    torch.testing.assert_close(lp, lp_ref, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ent_ref, atol=2e-5, rtol=1e-5)
    # Padding positions are zero; real ones are proper log-probs of a 272-token vocabulary.
    mask = _full_batch()["response_mask"].bool()
    assert (lp[~mask] == 0).all() and (lp[mask] < 0).all()
    assert ent[mask].max() <= math.log(272) + 1e-4


def test_dynamic_batching_gives_same_log_probs(inference):
    results, _ = inference
    for r in results:
        torch.testing.assert_close(r["dyn_lp"], r["lp"], atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(r["dyn_ent"], r["ent"], atol=2e-5, rtol=1e-5)
    # Rank 0's rows (13, 11, 11, 11 tokens) each fill a 20-token budget alone; rank 1's short
    # rows (4, 4, 4, 4 tokens) fit in one group of widths 3+3=6 -> 3 rows (18 tokens) + 1.
    # Rank 1 splits its groups to reach rank 0's count, so neither needs a dummy pass.
    groups_0, dummies_0 = results[0]["dyn_micro_batches"]
    groups_1, dummies_1 = results[1]["dyn_micro_batches"]
    assert len(groups_0) == len(groups_1) == 4 and dummies_0 == dummies_1 == 0
    assert sorted(i for g in groups_1 for i in g) == [0, 1, 2, 3]


def test_named_weights_equal_hf_state_dict(tiny_models, inference):
    results, _ = inference
    for key in ("tied", "untied"):
        reference = _hf_model(tiny_models[key]).state_dict()
        for r in results:
            weights = r["weights" if key == "tied" else "untied_weights"]
            assert list(weights) == list(reference)
            for name, tensor in reference.items():
                assert torch.equal(weights[name], tensor), name
    assert "lm_head.weight" in results[0]["untied_weights"]


def test_export_hf_loads_with_transformers(inference):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    results, export_dir = inference
    assert os.path.isfile(os.path.join(export_dir, "model.safetensors"))
    loaded = AutoModelForCausalLM.from_pretrained(export_dir)
    tokenizer = AutoTokenizer.from_pretrained(export_dir)
    assert tokenizer.decode(tokenizer("the cat sat")["input_ids"]) == "the cat sat"
    # The engine ran in float32 (dtype float32), so the export keeps float32 and is exact.
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, results[0]["weights"][name]), name
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()


@pytest.fixture(scope="module")
def training(tiny_models):
    return run_on_ranks(_scenario_train, WORLD, tiny_models["tied"], timeout_s=240)


def test_train_step_matches_reference_adamw(tiny_models, training):
    """One engine step == single-process AdamW on the mean of the two ranks' losses."""
    model = _hf_model(tiny_models["tied"])
    full = _full_batch()
    losses = []
    for rank in range(WORLD):
        shard = _shard(full, rank)
        lp, _ = _hf_logprob_entropy(model, shard)
        tokens = shard["response_mask"].sum()
        losses.append(-(lp * shard["response_mask"]).sum() / tokens)
    (sum(losses) / WORLD).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.99), weight_decay=0.01).step()

    first = training[0]["metrics"][0]
    assert first["actor/grad_norm"] == pytest.approx(float(norm), rel=1e-4)
    assert first["actor/lr"] == pytest.approx(LR)
    assert training[1]["metrics"][0]["actor/grad_norm"] == first["actor/grad_norm"]
    # Adam's first update is ~lr * sign(g) (m / sqrt(v)); for entries whose gradient is close to
    # eps the order of the reductions (cross-rank, and packed vs padded attention) can move it by
    # a fraction of lr, so compare with a tolerance of lr / 5 per entry and require the updates
    # to agree closely on average.
    initial = _hf_model(tiny_models["tied"]).state_dict()
    for name, tensor in model.state_dict().items():
        engine_tensor = training[0]["weights_1"][name]
        torch.testing.assert_close(engine_tensor, tensor, atol=LR / 5, rtol=0)
        delta_engine, delta_ref = engine_tensor - initial[name], tensor - initial[name]
        assert (delta_engine - delta_ref).abs().mean() <= 1e-3 * delta_ref.abs().mean() + 1e-9


def test_train_steps_raise_log_probs(training):
    for r in training:
        before, after = r["before"], r["after"]
        assert set(r["metrics"][0]) >= {"actor/pg_loss", "actor/grad_norm", "actor/lr"}
        assert all(math.isfinite(m["actor/grad_norm"]) for m in r["metrics"])
        losses = [m["actor/pg_loss"] for m in r["metrics"]]
        assert losses[0] > losses[1] > losses[2]
        assert after.sum() > before.sum() + 1.0


def test_unequal_micro_batch_counts_do_not_hang(tiny_models):
    results = run_on_ranks(_scenario_unequal, WORLD, tiny_models["tied"], timeout_s=180)
    groups_0, dummies_0 = results[0]["groups"], results[0]["dummies"]
    groups_1, dummies_1 = results[1]["groups"], results[1]["dummies"]
    assert len(groups_0) == 6 and dummies_0 == 0
    assert groups_1 == [[0]] and dummies_1 == 5
    with torch.no_grad():
        lp_ref, _ = _hf_logprob_entropy(
            _hf_model(tiny_models["tied"]), _full_batch().select_rows([4])
        )
    torch.testing.assert_close(results[1]["lp"], lp_ref, atol=2e-5, rtol=1e-5)
    assert results[0]["metrics"]["actor/grad_norm"] == results[1]["metrics"]["actor/grad_norm"]


def test_checkpoint_resume_is_bitwise_identical(tiny_models, tmp_path):
    results = run_on_ranks(
        _scenario_resume, WORLD, tiny_models["tied"], str(tmp_path / "ckpt"), timeout_s=300
    )
    assert sorted(os.listdir(tmp_path / "ckpt")) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "extra_state_rank_0.pt",
        "extra_state_rank_1.pt",
    ]
    for r in results:
        assert r["step"] == 2
        assert r["lrs_1"] == r["lrs_2"]
        # Warm-up of 2 steps then cosine over 8: steps 2 and 3 decay below the base rate.
        assert r["lrs_1"][0] == pytest.approx(LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(0))))
        assert r["lrs_1"][1] < r["lrs_1"][0]
        assert list(r["w1"]) == list(r["w2"])
        for name in r["w1"]:
            assert torch.equal(r["w1"][name], r["w2"][name]), name
    one = run_on_ranks(
        _scenario_load_on_one_rank, 1, tiny_models["tied"], str(tmp_path / "ckpt"), timeout_s=120
    )[0]
    assert one["step"] == 2
    for name, tensor in results[0]["w_saved"].items():
        assert torch.equal(one["weights"][name], tensor), name
