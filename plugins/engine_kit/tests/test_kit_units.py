"""Engine pieces that need no process group: settings resolution, LR schedule, partitioning,
column trimming and the log-prob/entropy maths."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from polyrl.api import ConfigError
from polyrl.api.testing import schema_config
from polyrl_engine_kit.config import resolve_settings
from polyrl_engine_kit.logprob import EntropyMode, token_logprob_entropy
from polyrl_engine_kit.microbatch import (
    equalize_count,
    fixed_partition,
    row_lengths,
    token_budget_partition,
    trim_columns,
)
from polyrl_engine_kit.schedule import lr_factor


def _worker_cfg(**arr):
    """The config as a hybrid worker holds it: the schema with ``actor_rollout_ref`` overrides,
    resolved to plain containers in the driver and rebuilt with ``OmegaConf.create``."""
    cfg = OmegaConf.merge(schema_config(), {"actor_rollout_ref": arr})
    return OmegaConf.create(OmegaConf.to_container(cfg.actor_rollout_ref, resolve=True))


def _nodes(model=None, engine=None):
    """``actor_rollout_ref.model`` and ``.actor`` nodes with ``model``/``engine`` merged in."""
    arr = _worker_cfg(model=model or {}, actor=engine or {})
    return arr.model, arr.actor


def _settings(model=None, engine=None, total_training_steps=10, **kwargs):
    return resolve_settings(*_nodes(model, engine), total_training_steps, **kwargs)


def _optim(**optim):
    return _settings(engine={"optim": optim}).optim


# ---- config -------------------------------------------------------------------------------------
def test_settings_come_from_the_schema_and_total_optimizer_steps():
    model, actor = _nodes({"dtype": "bf16"})
    with_steps = OmegaConf.merge(actor, {"total_optimizer_steps": 24})  # as the hybrid worker
    s = resolve_settings(model, with_steps, 6)
    assert s.dtype == "bfloat16" and s.mixed_precision and s.optim.total_steps == 24
    # the schema's defaults: log-prob micro-batches follow ppo_micro_batch_size_per_gpu
    assert s.micro_batch_size == 4 and s.log_prob_micro_batch_size == 4
    assert s.max_token_len == s.log_prob_max_token_len == 16384
    assert _settings(total_training_steps=6).optim.total_steps == 6
    # lr_warmup_steps=-1 -> ratio x total optimizer steps
    model, actor = _nodes(engine={"optim": {"lr_warmup_steps_ratio": 0.25}})
    s = resolve_settings(model, OmegaConf.merge(actor, {"total_optimizer_steps": 8}), 2)
    assert s.optim.warmup_steps == 2


def test_log_prob_keys_follow_verl_rollout_keys_and_the_ref_node():
    arr = _worker_cfg(
        actor={"ppo_micro_batch_size_per_gpu": 2},
        rollout={"log_prob_micro_batch_size_per_gpu": 16},
        ref={"log_prob_max_token_len_per_gpu": 4096},
    )
    s = resolve_settings(arr.model, arr.actor, 4)
    assert (s.micro_batch_size, s.log_prob_micro_batch_size) == (2, 16)
    ref = resolve_settings(arr.model, OmegaConf.merge(arr.actor, arr.ref), 4, role="ref")
    assert (ref.log_prob_micro_batch_size, ref.log_prob_max_token_len) == (16, 4096)


def test_plain_dicts_are_merged_over_the_schema():
    s = resolve_settings({"dtype": "fp32"}, {"ppo_micro_batch_size_per_gpu": 2}, 4)
    assert s.dtype == "float32" and s.micro_batch_size == s.log_prob_micro_batch_size == 2
    with pytest.raises(ConfigError, match=r"Did you mean actor_rollout_ref\.actor\.entropy_coeff"):
        resolve_settings({}, {"entropy_coef": 0.1}, 4)


def test_lr_scheduler_type_and_the_older_warmup_style():
    assert _optim().warmup_style == "constant"
    assert _optim(lr_scheduler_type="cosine").warmup_style == "cosine"
    assert _optim(lr_scheduler_type="cosine", warmup_style="constant").warmup_style == "constant"


@pytest.mark.parametrize(
    ("model", "engine", "key"),
    [
        ({"dtype": "int8"}, {}, "model.dtype"),
        ({}, {"ppo_micro_batch_size_per_gpu": 0}, "ppo_micro_batch_size_per_gpu"),
        ({}, {"log_prob_max_token_len_per_gpu": 0}, "log_prob_max_token_len_per_gpu"),
        ({}, {"optim": {"warmup_style": "linear"}}, "warmup_style"),
        ({}, {"optim": {"lr_scheduler_type": "linear"}}, "lr_scheduler_type"),
        ({}, {"optim": {"lr_warmup_steps_ratio": 2.0}}, "lr_warmup_steps_ratio"),
        ({}, {"optim": {"betas": [0.9]}}, "betas"),
    ],
)
def test_bad_settings_name_the_key(model, engine, key):
    with pytest.raises(ConfigError, match=key):
        _settings(model, engine, 4)


def test_hybrid_sharding_needs_a_divisor_and_offload_keys_combine():
    with pytest.raises(ConfigError, match="fsdp_size=3 does not divide the 4 ranks"):
        _settings(engine={"fsdp_config": {"fsdp_size": 3}}, world_size=4)
    assert _settings(engine={"fsdp_config": {"fsdp_size": 2}}, world_size=4).fsdp_size == 2
    assert _settings(engine={"fsdp_config": {"fsdp_size": 4}}, world_size=4)
    s = _settings(engine={"fsdp_config": {"optimizer_offload": True}}, world_size=4)
    assert s.param_offload


def test_an_export_carries_the_runs_custom_chat_template(tmp_path):
    """verl's custom_chat_template: the engines' HF exports render chats as the run did."""
    from transformers import AutoTokenizer

    from polyrl.models.tiny import build_tiny_model
    from polyrl_engine_kit.checkpoint import copy_tokenizer

    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    settings = _settings(model={"custom_chat_template": template})
    assert settings.chat_template == template and _settings().chat_template is None
    source = build_tiny_model(str(tmp_path / "model"))
    for folder in ("export", "plain"):
        (tmp_path / folder).mkdir()
    copy_tokenizer(source, str(tmp_path / "export"), False, settings.chat_template)
    exported = AutoTokenizer.from_pretrained(str(tmp_path / "export"))
    assert exported.chat_template == template
    chat = [{"role": "user", "content": "hi"}]
    assert exported.apply_chat_template(chat, tokenize=False) == "<user>hi"
    copy_tokenizer(source, str(tmp_path / "plain"), False)
    assert AutoTokenizer.from_pretrained(str(tmp_path / "plain")).chat_template != template


# ---- LR schedule --------------------------------------------------------------------------------
def test_warmup_then_constant():
    s = _optim(lr_warmup_steps=4, warmup_style="constant")
    assert [lr_factor(k, s) for k in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_warmup_then_cosine_to_min_ratio():
    s = _optim(lr_warmup_steps=2, warmup_style="cosine", min_lr_ratio=0.1)  # 8 decay steps
    assert lr_factor(0, s) == 0.5 and lr_factor(1, s) == 1.0
    assert lr_factor(2, s) == pytest.approx(1.0)
    # halfway through the decay: 0.1 + 0.9 * 0.5 * (1 + cos(pi/2)) = 0.55
    assert lr_factor(6, s) == pytest.approx(0.55)
    assert lr_factor(10, s) == pytest.approx(0.1) and lr_factor(50, s) == pytest.approx(0.1)


# ---- partitioning -------------------------------------------------------------------------------
def _mask(prompt, response, prompt_width=4, response_width=4):
    rows = []
    for p, r in zip(prompt, response):
        rows.append([0] * (prompt_width - p) + [1] * (p + r) + [0] * (response_width - r))
    return torch.tensor(rows)


def test_row_lengths_and_fixed_partition():
    lengths = row_lengths(_mask([4, 1], [2, 3]), response_width=4)
    assert lengths.prompt == [4, 1] and lengths.response == [2, 3] and lengths.total == [6, 4]
    assert fixed_partition(5, 2) == [[0, 1], [2, 3], [4]]


def test_token_budget_partition_groups_similar_rows_within_budget():
    # totals: row0 8, row1 2, row2 7, row3 3
    lengths = row_lengths(_mask([4, 1, 3, 2], [4, 1, 4, 1]), response_width=4)
    # longest first: 0 (4+4) alone since 2 x 8 > 12; 2 (3+4) alone (2 x 7 > 12);
    # then 3 (2+1) and 1 (1+1): 2 x 3 = 6 <= 12.
    assert token_budget_partition(lengths, 12, "k") == [[0], [2], [3, 1]]
    assert token_budget_partition(lengths, 100, "k") == [[0, 2, 3, 1]]
    with pytest.raises(ConfigError, match="raise k"):
        token_budget_partition(lengths, 7, "k")


def test_equalize_count_splits_then_asks_for_dummies():
    # [0..3] -> [0, 1] [2, 3] -> the first largest splits again: [0] [1] [2, 3]
    assert equalize_count([[0, 1, 2, 3]], 3) == ([[0], [1], [2, 3]], 0)
    assert equalize_count([[5], [6]], 4) == ([[5], [6]], 2)
    assert equalize_count([[0, 1]], 1) == ([[0, 1]], 0)


def test_trim_columns_drops_all_padding_columns():
    mask = _mask([2, 1], [1, 2])  # prompt columns 0-1 and response columns 2-3 are padding
    ids = torch.arange(16).reshape(2, 8) * mask
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    responses = ids[:, 4:]
    trimmed = trim_columns(ids, mask, positions, responses)
    assert trimmed.kept_response == 2
    assert torch.equal(trimmed.input_ids, ids[:, 2:6])
    assert torch.equal(trimmed.position_ids, positions[:, 2:6])
    assert torch.equal(trimmed.labels, responses[:, :2])
    # position_ids default to counting real tokens
    assert torch.equal(trim_columns(ids, mask, None, responses).position_ids, positions[:, 2:6])


# ---- log-probs and entropy ----------------------------------------------------------------------
def test_log_prob_and_entropy_by_hand():
    # Two tokens of a 2-word vocabulary: logits (0, ln 3) -> p = (1/4, 3/4).
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]])
    labels = torch.tensor([[1, 0]])
    with torch.no_grad():
        lp, ent = token_logprob_entropy(logits, labels, 1.0, EntropyMode.DETACHED)
    assert lp[0, 0].item() == pytest.approx(math.log(0.75))
    assert lp[0, 1].item() == pytest.approx(math.log(0.5))
    h0 = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert ent[0, 0].item() == pytest.approx(h0) and ent[0, 1].item() == pytest.approx(math.log(2))
    # temperature 0.5 doubles the logits: p = (1/10, 9/10)
    with torch.no_grad():
        lp_t, _ = token_logprob_entropy(logits, labels, 0.5)
    assert lp_t[0, 0].item() == pytest.approx(math.log(0.9))


def test_grad_and_no_grad_paths_agree_and_chunking_is_exact(monkeypatch):
    import polyrl_engine_kit.logprob as logprob

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 3, 11, generator=gen).to(torch.bfloat16)
    labels = torch.randint(0, 11, (5, 3), generator=gen)
    x = logits.clone().requires_grad_(True)
    lp_grad, ent_grad = token_logprob_entropy(x, labels, 0.8, EntropyMode.GRAD)
    (lp_grad.sum() + ent_grad.sum()).backward()
    assert x.grad is not None and torch.isfinite(x.grad.float()).all()
    monkeypatch.setattr(logprob, "_CHUNK_ELEMENTS", 40)  # 1 row (33 elements) per chunk
    with torch.no_grad():
        lp, ent = token_logprob_entropy(logits, labels, 0.8, EntropyMode.DETACHED)
    assert lp.dtype == torch.float32
    torch.testing.assert_close(lp, lp_grad.detach())
    torch.testing.assert_close(ent, ent_grad.detach())
    # with grad, DETACHED gives grad to the log-probs only and a chunked, detached entropy
    lp_d, ent_d = token_logprob_entropy(
        logits.clone().requires_grad_(True), labels, 0.8, EntropyMode.DETACHED
    )
    assert lp_d.requires_grad and not ent_d.requires_grad
    torch.testing.assert_close(ent_d, ent_grad.detach())
    with pytest.raises(ValueError, match="temperature"):
        token_logprob_entropy(logits, labels, 0.0)


def test_sum_pi_squared_by_hand_on_every_path(monkeypatch):
    """verl's sum_pi_squared: ``sum_v p_v^2`` of the tempered distribution, from the no-grad
    chunks, beside a grad path (detached), and without changing the log-probs."""
    import polyrl_engine_kit.logprob as logprob
    from polyrl_engine_kit.logprob import token_scores

    # logits (0, ln 3) -> p = (1/4, 3/4): 1/16 + 9/16 = 10/16; at T = 0.5, p = (1/10, 9/10)
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]])
    labels = torch.tensor([[1, 0]])
    with torch.no_grad():
        scores = token_scores(logits, labels, 1.0, EntropyMode.DETACHED, sum_pi_squared=True)
        tempered = token_scores(logits, labels, 0.5, sum_pi_squared=True)
    assert scores.sum_pi_squared.tolist()[0] == pytest.approx([10 / 16, 0.5])
    assert tempered.sum_pi_squared[0, 0].item() == pytest.approx(0.01 + 0.81)
    assert token_scores(logits, labels).sum_pi_squared is None
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 3, 11, generator=gen)
    labels = torch.randint(0, 11, (5, 3), generator=gen)
    want = (torch.softmax(logits.double() / 0.8, -1) ** 2).sum(-1).float()
    monkeypatch.setattr(logprob, "_CHUNK_ELEMENTS", 40)  # 1 row per chunk
    with torch.no_grad():
        chunked = token_scores(logits, labels, 0.8, sum_pi_squared=True)
    graded = token_scores(logits.requires_grad_(True), labels, 0.8, sum_pi_squared=True)
    for got in (chunked, graded):
        torch.testing.assert_close(got.sum_pi_squared, want)
    assert not graded.sum_pi_squared.requires_grad
    torch.testing.assert_close(chunked.log_prob, graded.log_prob.detach())


def test_engines_that_do_not_compute_sum_pi_squared_refuse_it():
    from polyrl_engine_kit.checks import actor_ref_problems

    cfg = schema_config()
    actor, ref = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.ref
    actor.calculate_sum_pi_squared = True
    lines = [p for p in actor_ref_problems(actor, ref) if "sum_pi_squared" in p]
    assert len(lines) == 1 and "strategy=fsdp2" in lines[0], lines
    assert not [p for p in actor_ref_problems(actor, ref, sum_pi_squared=True) if "sum_pi" in p]
