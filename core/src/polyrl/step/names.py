"""The names a step is made of: batch keys and stage names, as plain ``str`` constants.

A stage's ``requires`` / ``provides``, an estimator's or a loss's ``requires``, and the anchors of
``StepPipeline.insert_after`` / ``insert_before`` / ``replace`` are these strings; a plugin that
spells them through this module gets a ``NameError`` for a typo instead of a chain-check failure
at ``polyrl validate``. Import it as ``from polyrl.api import names``. Batch keys are bare
(``names.RESPONSES``); stage names carry a ``STAGE_`` prefix (``names.STAGE_GEN``), because a
stage and a key may share a word (the critic's ``values`` stage provides the ``values`` key).

Rows are the batch's first dimension; ``[rows, R]`` tensors span the response (``R`` =
``data.max_response_length``) and are zero past each response's end (see ``RESPONSE_MASK``).
"""

from __future__ import annotations

# -- batch keys: what the data loader puts in every step's batch ------------------------------

INPUT_IDS = "input_ids"
"""Token ids ``[rows, P]`` (left-padded prompts); after ``gen``, ``[rows, P + R]``."""
ATTENTION_MASK = "attention_mask"
"""1 on real tokens, 0 on padding; shaped like ``INPUT_IDS``."""
POSITION_IDS = "position_ids"
"""Position of each real token (0, 1, ... in order); shaped like ``INPUT_IDS``."""
DATA_SOURCE = "data_source"
"""Per-row dataset name (object array); selects the reward scorer."""
GROUND_TRUTH = "ground_truth"
"""Per-row reference answer (object array) the reward compares against."""
EXTRA_INFO = "extra_info"
"""Per-row dict of the dataset's ``extra_info`` column (object array)."""
RAW_PROMPT = "raw_prompt"
"""Per-row prompt text after the chat template (object array)."""
INDEX = "index"
"""Per-row position of the prompt in the dataset's files (int array)."""
MESSAGES = "messages"
"""Per-row chat messages of the prompt, before the chat template (object array)."""

# -- batch keys: what generation adds ----------------------------------------------------------

RESPONSES = "responses"
"""Sampled token ids ``[rows, R]`` (right-padded)."""
RESPONSE_MASK = "response_mask"
"""1 on response tokens, 0 past each response's end ``[rows, R]``."""
ROLLOUT_LOG_PROBS = "rollout_log_probs"
"""Log-probs the rollout engine reported for its samples ``[rows, R]`` (when it reports them)."""
UID = "uid"
"""Group id (object array of str): the ``n`` samples of one prompt share it."""

# -- batch keys: what multi-turn generation adds (see polyrl.envs for the trajectory layout) ----

TURN_SCORES = "turn_scores"
"""An environment's per-turn rewards on each assistant turn's last token ``[rows, R]``."""
EPISODE_REWARD = "episode_reward"
"""Per-row reward the environment gave its episode (object array; None: the reward provider
scores ``LAST_TURN_TEXT``)."""
LAST_TURN_TEXT = "last_turn_text"
"""Per-row text of the episode's last assistant turn (object array)."""

# -- batch keys: rewards, log-probs, values, advantages ----------------------------------------

TOKEN_LEVEL_SCORES = "token_level_scores"
"""The reward's score on each response's last token ``[rows, R]``."""
TOKEN_LEVEL_REWARDS = "token_level_rewards"
"""The scores after shaping (KL in reward, overlong penalty ...) ``[rows, R]``."""
RM_SCORES = "rm_scores"
"""A reward model's score on each response's last token ``[rows, R]``."""
OLD_LOG_PROBS = "old_log_probs"
"""Log-probs of the responses under the weights that sampled them ``[rows, R]``."""
REF_LOG_PROB = "ref_log_prob"
"""Log-probs of the responses under the reference model ``[rows, R]``."""
ENTROPYS = "entropys"
"""Per-token entropy of the policy ``[rows, R]``, when ``old_log_prob`` reports it."""
SUM_PI_SQUARED = "sum_pi_squared"
"""Per-token ``sum_v p_v^2`` of the policy's tempered distribution over the vocabulary
``[rows, R]`` (verl's name), from ``old_log_prob`` when
``actor_rollout_ref.actor.calculate_sum_pi_squared`` is true; the optimal-token baselines read
it."""
VALUES = "values"
"""The critic's value estimates ``[rows, R]``."""
REWARD_BASELINES = "reward_baselines"
"""Per-row baseline return (ReMax's greedy response's score) ``[rows]``."""
ROLLOUT_IS_WEIGHTS = "rollout_is_weights"
"""Per-token importance weights on the policy loss ``[rows, R]`` (verl's name): when the batch
has them, the actor multiplies a token-level policy loss by them (verl's rollout correction)."""
ADVANTAGES = "advantages"
"""The advantage estimator's advantages ``[rows, R]``."""
RETURNS = "returns"
"""The advantage estimator's returns (the critic's targets) ``[rows, R]``."""

# -- stage names: the standard policy-gradient step, in order ----------------------------------

STAGE_GEN = "gen"
"""Generation: ``n`` samples per prompt through the rollout role."""
STAGE_REWARD = "reward"
"""Rule-based reward: ``token_level_scores`` and ``token_level_rewards``."""
STAGE_REWARD_MODEL = "reward_model"
"""A reward model's scores folded into the rewards (when ``reward_model.enable``)."""
STAGE_OLD_LOG_PROB = "old_log_prob"
"""The actor's log-probs of the responses before the update."""
STAGE_REF = "ref"
"""The reference model's log-probs (when a KL term is on)."""
STAGE_KL_IN_REWARD = "kl_in_reward"
"""The KL penalty subtracted from ``token_level_rewards`` (``algorithm.use_kl_in_reward``)."""
STAGE_ADV = "adv"
"""The advantage estimator: ``advantages`` and ``returns``."""
STAGE_UPDATE_ACTOR = "update_actor"
"""The policy update over planned mini-batches."""
STAGE_UPDATE_WEIGHTS = "update_weights"
"""The actor's new weights into the rollout engine."""

# -- stage names that first-party algorithm plugins add ----------------------------------------

STAGE_VALUES = "values"
"""PPO: the critic's ``values`` (before ``adv``)."""
STAGE_UPDATE_CRITIC = "update_critic"
"""PPO: the critic's update on ``returns`` (after ``adv``)."""
STAGE_GEN_MAX = "gen_max"
"""ReMax: the greedy baseline generation (before ``gen``)."""
STAGE_DYNAMIC_SAMPLING = "dynamic_sampling"
"""DAPO: group filtering and re-sampling (before ``old_log_prob``)."""
STAGE_OVERLONG_PENALTY = "overlong_penalty"
"""DAPO: the overlong-response penalty on ``token_level_rewards`` (after ``reward``)."""
