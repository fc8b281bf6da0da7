"""Offline DPO's data (``AlgorithmSpec.data``): preference pairs of ``data.train_files`` in
batches of ``data.train_batch_size`` pairs, and TRL's evaluation on ``data.val_files``.

Validation scores held-out pairs under the current policy (the actor) and the reference, with
the training loss (``val-aux/loss``) and TRL's metrics (:class:`~polyrl_algo_dpo.loss.PairTerms`):
``val-core/rewards/accuracies`` and ``val-core/rewards/margins`` are the headline figures (both
0 before training, when the policy is the reference); ``val-aux/rewards/chosen``,
``val-aux/rewards/rejected``, ``val-aux/logps/chosen`` and ``val-aux/logps/rejected``. Runs in
the driver.
"""

from __future__ import annotations

import math
from typing import Any

from polyrl.api import MODEL_INPUT_KEYS, StepContext, TrainingData, training_data_from_files
from polyrl_algo_dpo.config import LOSS_TYPES, dpo_settings
from polyrl_algo_dpo.preference import PreferenceDataset, PreferenceLoader, collate_pairs

HEADLINE_METRICS = ("rewards/accuracies", "rewards/margins")


def preference_data(cfg: Any, tokenizer: Any) -> TrainingData:
    """The loader of training pairs and, with ``data.val_files``, the validation on pairs."""
    return training_data_from_files(
        cfg, tokenizer, PreferenceDataset, PreferenceLoader, validate_preferences
    )


def validate_preferences(val_set: PreferenceDataset, ctx: StepContext) -> dict[str, float]:
    """The preference loss and metrics over every pair of ``val_set``, in chunks of
    ``data.val_batch_size`` pairs (default: all at once)."""
    from polyrl_algo_dpo.loss import PairTerms, pair_terms

    beta = dpo_settings(ctx.cfg).beta
    loss_type = LOSS_TYPES[str(ctx.cfg.actor_rollout_ref.actor.policy_loss.loss_mode)]
    ranks = math.lcm(ctx.workers.dp_size("actor"), ctx.workers.dp_size("ref"))
    size = int(ctx.cfg.data.val_batch_size or len(val_set))
    terms = []
    for start in range(0, len(val_set), size):
        pairs = [val_set[i] for i in range(start, min(start + size, len(val_set)))]
        rows = 2 * len(pairs)
        # Whole pairs, repeated at the end, until every rank of either role gets as many rows.
        padded = pairs + pairs[-1:] * (-len(pairs) % ranks)
        batch = collate_pairs(padded, val_set.pad_token_id).select_keys(MODEL_INPUT_KEYS)
        log_probs = {
            role: ctx.workers.call(role, "compute_log_prob", batch)["log_probs"][:rows]
            for role in ("actor", "ref")
        }
        mask = batch["response_mask"][:rows]
        terms.append(pair_terms(log_probs["actor"], log_probs["ref"], mask, beta, loss_type))
    every_pair = PairTerms.concat(terms)
    metrics = {
        f"val-{'core' if name in HEADLINE_METRICS else 'aux'}/{name}": value
        for name, value in every_pair.metrics().items()
    }
    metrics["val-aux/loss"] = float(every_pair.losses.mean())
    return metrics
