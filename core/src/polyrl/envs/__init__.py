"""Multi-turn rollouts: environments as a plugin kind, episodes over any rollout engine.

The contract an environment implements is :mod:`polyrl.envs.episode` (``Environment`` opens one
``Episode`` per sampled row; ``start`` / ``step`` / ``finish``, async). The rollout that drives
the episodes is :mod:`polyrl.envs.rollout`; the step's stages that use it are
:mod:`polyrl.step.multi_turn` (they replace ``gen`` and ``reward`` when
``actor_rollout_ref.rollout.multi_turn.enable`` is true).

**The trajectory batch.** Multi-turn generation provides the same keys as single-turn
generation, so every stage after it (old and reference log-probs, values, estimators, losses)
runs unchanged; only what the response part holds differs. Per row (one episode):

- ``input_ids [rows, P + R]``: the episode's first prompt, left-padded to the batch's widest
  (``P``), then everything after it, right-padded to ``R = data.max_response_length``: each
  assistant turn's tokens exactly as the engine sampled them (ending with its end-of-turn token),
  and after each, the chat template's tokens of the environment's answer (tool results, a user
  message) and of the next assistant header.
- ``attention_mask``: 1 on every real token, prompt, assistant and observation alike (the model
  reads all of them); ``position_ids`` number them from 0.
- ``responses [rows, R]``: the part after the prompt.
- ``response_mask [rows, R]``: 1 on assistant tokens only. It is the loss mask: observation
  tokens, which the model did not produce, are never trained on, and the estimators (GAE's
  recursion, GRPO's sums) skip them.
- ``rollout_log_probs [rows, R]``: the engine's log-probs of the sampled tokens, 0 elsewhere.
- ``uid``: rows sampled from one prompt share it, so GRPO groups are per prompt over episodes.
- ``turn_scores [rows, R]`` (:data:`polyrl.step.names.TURN_SCORES`): per-turn rewards of the
  environment on each turn's last token; ``episode_reward`` (floats, None where the environment
  leaves scoring to the reward provider) and ``last_turn_text`` (what the reward provider then
  scores) per row. The ``reward`` stage folds them into ``token_level_scores``, the episode's
  reward on its last assistant token.
"""

from __future__ import annotations

from polyrl.envs.episode import (
    AssistantTurn,
    Environment,
    EnvironmentContext,
    Episode,
    EpisodeResult,
    EpisodeStart,
    Observation,
    ToolCall,
)

__all__ = [
    "AssistantTurn",
    "Environment",
    "EnvironmentContext",
    "Episode",
    "EpisodeResult",
    "EpisodeStart",
    "Observation",
    "ToolCall",
]
