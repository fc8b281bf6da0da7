"""``reward_model.judge``: the settings of the LLM judge. Light on purpose (standard library
only): it is imported whenever a config is composed, whichever reward manager is selected."""

from __future__ import annotations

from dataclasses import dataclass

SECTION = "reward_model.judge"
BACKENDS = ("rollout", "openai")
VERDICTS = ("score", "pass_fail", "json")
PLACEHOLDERS = ("question", "response", "reference", "rubric")
# The role's batch fields (text): the rendered judge prompts in, the judge's replies out.
PROMPT_KEY, REPLY_KEY = "judge_prompt", "judge_reply"

DEFAULT_TEMPLATE = (
    "You are grading a response to a question.\n"
    "Question:\n{question}\n\n"
    "Reference answer:\n{reference}\n\n"
    "Response:\n{response}\n\n"
    "Grading rubric:\n{rubric}\n\n"
    'Reply with one line of the form "Score: <n>", where <n> is an integer from 0 to 10.'
)
DEFAULT_RUBRIC = "10: correct and complete; 0: wrong, missing or off-topic."


@dataclass
class JudgeSettings:
    """How each response is judged. The judge reads ``template`` filled with the sample's
    prompt (``{question}``), response (``{response}``), ground truth (``{reference}``) and
    ``rubric``; its reply (the verdict) is parsed by ``verdict``. A verdict that cannot be
    parsed scores 0.0 but is counted, never hidden: over ``max_unparsed_frac`` of a step's
    verdicts unparsed stops the run."""

    # rollout: a judge model served by a polyrl rollout engine in the worker role `judge`
    # (placed by trainer.role_pools.judge; the actor's pool by default) | openai: an
    # OpenAI-compatible endpoint (vLLM, SGLang, a hosted API) through /v1/chat/completions
    backend: str = "rollout"
    # rollout backend: the rollout engine by name (default: the policy's)
    rollout: str = "${actor_rollout_ref.rollout.name}"
    # rollout backend: the judge model, any form actor_rollout_ref.model.path accepts
    model_path: str | None = None
    dtype: str = "float32"  # rollout backend: the judge engine's dtype
    # openai backend: the endpoint (e.g. http://127.0.0.1:8000/v1), the served model's name,
    # and the environment variable holding the API key (the key itself never enters a config)
    base_url: str | None = None
    model: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    # the judge's prompt: placeholders {question} {response} {reference} {rubric}
    template: str = DEFAULT_TEMPLATE
    rubric: str = DEFAULT_RUBRIC
    # score: a number matched by score_pattern, mapped linearly from [score_min, score_max]
    # to [0, 1] | pass_fail: 1 when pass_pattern matches, 0 when fail_pattern does |
    # json: the number at json_field of the first JSON object in the verdict
    verdict: str = "score"
    score_pattern: str = r"Score:\s*(-?\d+(?:\.\d+)?)"  # a regex with exactly one group
    score_min: float = 0.0
    score_max: float = 10.0
    json_field: str = "score"
    pass_pattern: str = r"\bPASS\b"
    fail_pattern: str = r"\bFAIL\b"
    max_new_tokens: int = 32  # the verdict's length limit, in judge tokens
    max_prompt_tokens: int = 2048  # rollout backend: a longer judge prompt is cut from the left
    timeout_s: float = 60.0  # openai backend: the limit of one request
    max_concurrency: int = 8  # openai backend: requests in flight at once
    # a step whose share of unparsed verdicts is above this stops with an error (0..1)
    max_unparsed_frac: float = 0.5
