"""The ``judge`` worker role of the rollout backend: the judge model served by a polyrl rollout
engine (``reward_model.judge.rollout``, the policy's engine by default) on the workers of its
pool, like any role placed by ``trainer.role_pools`` (the global pool, beside the actor, unless
``trainer.role_pools.judge`` gives it a pool of its own).

Each data-parallel rank gets its share of a step's judge prompts as text, renders them with the
judge tokenizer's chat template and answers them in one greedy ``generate`` call; the engine
batches them as it batches a policy's prompts. Between calls the engine sleeps, so an actor
sharing the device gets its memory back for the update."""

from __future__ import annotations

import numpy as np

from polyrl.api import (
    Batch,
    ConfigError,
    DataParallelRank,
    PluginKind,
    Role,
    RoleContext,
    RolloutContext,
    SamplingParams,
    resolve_model_path,
)
from polyrl_reward_judge.settings import PROMPT_KEY, REPLY_KEY, SECTION


class JudgeRole(Role):
    """``judge``: the judge's greedy reply to each prompt of the batch."""

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        from transformers import AutoTokenizer

        settings = ctx.cfg.reward_model.judge
        path = resolve_model_path(str(settings.model_path))
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if not self.tokenizer.chat_template:
            raise ConfigError(
                f"{SECTION}.model_path={settings.model_path!r}: its tokenizer has no chat "
                "template, so the judge prompt cannot be rendered; use an instruct/chat model"
            )
        eos = self.tokenizer.eos_token_id
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = int(eos if pad is None else pad)
        self.max_prompt_tokens = int(settings.max_prompt_tokens)
        self.max_new_tokens = int(settings.max_new_tokens)
        engine_cls = ctx.plan.load(PluginKind.ROLLOUT_ENGINE, str(settings.rollout))
        self.engine = engine_cls(
            RolloutContext(
                model_path=path,
                config={"dtype": str(settings.dtype)},
                device=ctx.device,
                rank=ctx.rank,
                world_size=ctx.world_size,
                seed=int(ctx.cfg.trainer.seed),
                max_prompt_length=self.max_prompt_tokens,
                max_response_length=self.max_new_tokens,
                pad_token_id=self.pad_token_id,
                eos_token_ids=[] if eos is None else [int(eos)],
            )
        )

    def data_parallel_rank(self) -> DataParallelRank:
        return self.engine.data_parallel_rank()

    def judge(self, prompts: Batch) -> Batch:
        """``judge_reply`` (text) for each ``judge_prompt`` (a user message), in order."""
        import torch

        rows = [self._tokens(str(p)) for p in prompts[PROMPT_KEY]]
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):  # left padding, as the engines expect
            input_ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            attention_mask[i, width - len(row) :] = 1
        self.engine.wake_up()
        try:
            out = self.engine.generate(
                Batch({"input_ids": input_ids, "attention_mask": attention_mask}),
                SamplingParams(n=1, greedy=True, max_new_tokens=self.max_new_tokens),
            )
        finally:
            self.engine.sleep(level=1)
        lengths = out["response_mask"].sum(-1).tolist()
        replies = self.tokenizer.batch_decode(
            [row[: int(n)] for row, n in zip(out["responses"].tolist(), lengths)],
            skip_special_tokens=True,
        )
        return Batch(non_tensors={REPLY_KEY: np.array(replies, dtype=object)})

    def _tokens(self, prompt: str) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids[-self.max_prompt_tokens :]

    def shutdown(self) -> None:
        self.engine.close()
