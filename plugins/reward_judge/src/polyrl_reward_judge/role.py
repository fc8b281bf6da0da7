"""The ``rollout`` backend: the judge model served in the driver by a polyrl rollout engine,
looked up by name in the registry (``reward_model.judge.rollout``), so any installed engine
(hf on CPU, vLLM on a GPU) can judge. All of a step's judge prompts go to one greedy
``generate`` call: the engine batches them as it batches a policy's prompts."""

from __future__ import annotations

from typing import Any

from polyrl.api import (
    Batch,
    ConfigError,
    PluginKind,
    RolloutContext,
    SamplingParams,
    get_registry,
    resolve_model_path,
)
from polyrl_reward_judge.settings import SECTION


class RolloutJudge:
    """One rollout engine holding the judge model, and its tokenizer for the chat template."""

    def __init__(self, settings: Any, seed: int) -> None:
        from transformers import AutoTokenizer

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
        engine_cls = get_registry().load(PluginKind.ROLLOUT_ENGINE, str(settings.rollout))
        self.engine = engine_cls(
            RolloutContext(
                model_path=path,
                config={"dtype": str(settings.dtype)},
                device=str(settings.device),
                rank=0,
                world_size=1,
                seed=seed,
                max_prompt_length=self.max_prompt_tokens,
                max_response_length=self.max_new_tokens,
                pad_token_id=self.pad_token_id,
                eos_token_ids=[] if eos is None else [int(eos)],
            )
        )

    def judge(self, prompts: list[str]) -> list[str]:
        """The judge's reply to each prompt (a user message), greedy, in order."""
        import torch

        rows = [self._tokens(p) for p in prompts]
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):  # left padding, as the engines expect
            input_ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            attention_mask[i, width - len(row) :] = 1
        out = self.engine.generate(
            Batch(tensors={"input_ids": input_ids, "attention_mask": attention_mask}),
            SamplingParams(n=1, greedy=True, max_new_tokens=self.max_new_tokens),
        )
        lengths = out["response_mask"].sum(-1).tolist()
        return self.tokenizer.batch_decode(
            [row[: int(n)] for row, n in zip(out["responses"].tolist(), lengths)],
            skip_special_tokens=True,
        )

    def _tokens(self, prompt: str) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids[-self.max_prompt_tokens :]

    def close(self) -> None:
        self.engine.close()
