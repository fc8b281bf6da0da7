"""Multi-turn validation of a model on a run config's val split: greedy episodes with the run's
environment, scored by the data's scorer.

A saved model, outside a run: the same multi-turn rollout as training and as the trainer's
validation (:class:`polyrl.envs.rollout.MultiTurnRollout`, the config's environment and
``multi_turn`` keys), greedily, in this process with transformers::

    python -m polyrl_env_tools.evaluate recipe=calc_smollm2                 # the recipe's model
    python -m polyrl_env_tools.evaluate --model <run dir>/hf_model recipe=calc_smollm2

and prints one JSON line: the mean reward, the share of episodes per end reason, and the
environment's metrics (for ``calculator``: ``tool_success``, ``tool_result_correct``).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any


def val_rows(cfg: Any) -> list[dict[str, Any]]:
    """The rows of ``data.val_files`` as an environment's episode gets them."""
    import pyarrow.parquet as pq

    from polyrl.api import resolve_data_files

    rows = []
    for path in resolve_data_files(cfg.data.val_files, "val"):
        for record in pq.read_table(path).to_pylist():
            reward_model = record.get("reward_model") or {}
            rows.append(
                {
                    "messages": list(record["prompt"]),
                    "data_source": record["data_source"],
                    "ground_truth": reward_model.get("ground_truth"),
                    "extra_info": dict(record.get("extra_info") or {}),
                }
            )
    return rows


def hf_generate(model: Any, pad_token_id: int, eos_token_id: int) -> Any:
    """A :data:`polyrl.envs.rollout.GenerateFn` sampling with ``model.generate``."""
    import torch

    from polyrl.api import Batch

    def generate(batch: Batch, params: Any) -> Batch:
        ids, mask = batch["input_ids"], batch["attention_mask"]
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=int(params.max_new_tokens),
                do_sample=not params.greedy,
                temperature=float(params.temperature),
                eos_token_id=eos_token_id,
                pad_token_id=pad_token_id,
            )
        responses = out[:, ids.shape[1] :]
        ended = (responses == eos_token_id).long()
        # 1 up to and including the first end-of-turn token
        response_mask = ((ended.cumsum(-1) - ended) == 0).long()
        return Batch({"responses": responses * response_mask, "response_mask": response_mask})

    return generate


def evaluate(
    cfg: Any, model_path: str, rows: Sequence[Mapping[str, Any]], show: int = 0
) -> dict[str, float]:
    """Greedy episodes of ``rows`` with ``cfg``'s environment: reward and episode metrics;
    ``show`` episodes are printed (what followed the prompt, special tokens kept)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from polyrl.api import (
        ChatTokens,
        EnvironmentContext,
        MultiTurnRollout,
        SamplingParams,
        assemble,
        default_compute_score,
        resolve_model_path,
        use_custom_template,
    )

    model_cfg = cfg.actor_rollout_ref.model
    tokenizer_source = model_cfg.tokenizer_path or model_cfg.path
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(str(tokenizer_source)))
    # the run's chat template (verl's custom_chat_template), so episodes render as in training
    use_custom_template(tokenizer, model_cfg.custom_chat_template)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(
        resolve_model_path(model_path), dtype=torch.float32
    ).eval()
    eos = int(tokenizer.eos_token_id)
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos)
    environment = assemble(cfg).environment.load()(
        EnvironmentContext(config=cfg, seed=int(cfg.trainer.seed))
    )
    rollout = MultiTurnRollout(
        environment,
        ChatTokens(tokenizer, [eos]),
        cfg.actor_rollout_ref.rollout.multi_turn,
        max_response_length=int(cfg.data.max_response_length),
        max_prompt_length=int(cfg.data.max_prompt_length),
    )
    prompts = [[eos] for _ in rows]  # every episode of a tool environment renders its own
    started = time.monotonic()
    trajectories, metrics = rollout.run(
        list(rows), prompts, hf_generate(model, pad, eos), SamplingParams(n=1, greedy=True)
    )
    rewards = []
    for traj in trajectories:
        reward = traj.result.reward
        if reward is None:
            score = default_compute_score(
                str(traj.row["data_source"]),
                traj.last_text,
                traj.row["ground_truth"],
                dict(traj.row.get("extra_info") or {}),
            )
            reward = float(score["score"] if isinstance(score, dict) else score)
        rewards.append(reward)
        if len(rewards) <= show:
            after = tokenizer.decode(traj.prompt_ids[-24:] + traj.tokens)
            print(f"--- reward {reward:.3f}, ground truth {traj.row['ground_truth']}\n...{after}")
    environment.close()
    return {
        "episodes": float(len(rows)),
        "reward/mean": sum(rewards) / max(len(rewards), 1),
        "seconds": time.monotonic() - started,
        **metrics,
    }


def main(argv: Sequence[str] | None = None) -> None:
    from polyrl.api import load_config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model folder (default: the config's model path)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N val rows")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--show", type=int, default=0, help="print the first N episodes")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. recipe=calc_smollm2")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    cfg = load_config(list(args.overrides))
    rows = val_rows(cfg)
    if args.limit:
        rows = rows[: args.limit]
    model = args.model or str(cfg.actor_rollout_ref.model.path)
    metrics = evaluate(cfg, model, rows, args.show)
    print(json.dumps({"model": model, **metrics}, sort_keys=True))


if __name__ == "__main__":
    main()
