"""The reward model: a frozen sequence-classification model that scores prompt + response.

Every worker hosting the role holds the whole model (``reward_model.model.path``, loaded with
``AutoModelForSequenceClassification`` in its stored dtype) and scores its data-parallel share of
the rows in micro-batches of ``reward_model.micro_batch_size_per_gpu``. The model reads the
policy's token ids as they are, so it must use the policy's tokenizer: a reward model folder
with another vocabulary is refused when the role is built. The score of a row is the model's
output at the row's last token that is not padding (Hugging Face's pooling for these models).
"""

from __future__ import annotations

import torch

from polyrl.batch import Batch
from polyrl.errors import ConfigError
from polyrl.step.reward_model import RM_INPUT_KEYS
from polyrl.workers.roles.base import Role, RoleContext


def _check_same_tokenizer(rm_path: str, policy_path: str, trust_remote_code: bool) -> None:
    """Refuse a reward model whose own tokenizer differs from the policy's (it would read the
    policy's ids as other words). A folder without a tokenizer is taken to share the policy's."""
    from transformers import AutoTokenizer

    try:
        rm_tokenizer = AutoTokenizer.from_pretrained(rm_path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return
    policy_tokenizer = AutoTokenizer.from_pretrained(policy_path)
    if rm_tokenizer.get_vocab() != policy_tokenizer.get_vocab():
        raise ConfigError(
            f"reward_model.model.path={rm_path!r} has a tokenizer other than the policy's "
            f"({policy_path}); the reward model reads the policy's tokens, so train it on the "
            f"policy's tokenizer"
        )


class RewardModelRole(Role):
    """``compute_rm_score``: one score per row under the reward model."""

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        from transformers import AutoModelForSequenceClassification

        rm = ctx.cfg.reward_model
        path, remote = str(rm.model.path), bool(rm.model.trust_remote_code)
        _check_same_tokenizer(path, ctx.model_path, remote)
        model = AutoModelForSequenceClassification.from_pretrained(
            path, dtype="auto", trust_remote_code=remote
        )
        if model.config.num_labels != 1:
            raise ConfigError(
                f"reward_model.model.path={path!r} classifies into {model.config.num_labels} "
                f"labels; a reward model has one output, its score"
            )
        if model.config.pad_token_id is None:  # the pooling finds each row's end by it
            model.config.pad_token_id = ctx.pad_token_id
        self.device = torch.device(ctx.device)
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.micro_batch_size = int(rm.micro_batch_size_per_gpu)

    @torch.no_grad()
    def compute_rm_score(self, batch: Batch) -> Batch:
        """``rm_scores`` ``[rows]`` (float32, on the CPU) of this rank's rows."""
        scores = []
        for part in batch.select_keys(RM_INPUT_KEYS).split(self.micro_batch_size):
            mask = part["attention_mask"]
            real = mask.bool().any(dim=0).nonzero().flatten()  # drop all-padding columns
            columns = slice(int(real[0]), int(real[-1]) + 1) if real.numel() else slice(None)
            logits = self.model(
                input_ids=part["input_ids"][:, columns].to(self.device),
                attention_mask=mask[:, columns].to(self.device),
                position_ids=part["position_ids"][:, columns].to(self.device),
            ).logits
            scores.append(logits[:, 0].float().cpu())
        return Batch({"rm_scores": torch.cat(scores)})
