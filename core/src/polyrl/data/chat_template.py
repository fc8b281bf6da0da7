"""How the policy's tokenizer renders chats: verl's ``actor_rollout_ref.model.custom_chat_template``
(a Jinja template that replaces the tokenizer's own) and ``data.apply_chat_template_kwargs``
(extra keyword arguments of ``apply_chat_template`` when prompts are rendered, read by the
template: ``enable_thinking`` for Qwen3, ``reasoning_effort`` for gpt-oss).

Why one place: the template is set on the tokenizer once, where the policy's tokenizer is
loaded (the trainer, the exporter), so every rendering that tokenizer does (prompts, multi-turn
observations, the saved tokenizer of an exported model) uses it; the keyword arguments are
checked here and read by the datasets. Light (jinja2 only): ``polyrl validate`` imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TEMPLATE_KEY = "actor_rollout_ref.model.custom_chat_template"
KWARGS_KEY = "data.apply_chat_template_kwargs"


def template_problem(template: Any) -> str | None:
    """One line when ``template`` (the config's value) is neither unset nor a Jinja template
    that parses; None when it is usable."""
    if template is None:
        return None
    if not isinstance(template, str) or not template.strip():
        return f"{TEMPLATE_KEY}={template!r} must be a Jinja chat template string (or null)"
    import jinja2

    try:
        jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError as exc:
        return (
            f"{TEMPLATE_KEY} is not a valid Jinja template (line {exc.lineno}: {exc.message}); "
            f"fix the template or set it to null for the tokenizer's own"
        )
    return None


def kwargs_problem(kwargs: Any) -> str | None:
    """One line when ``data.apply_chat_template_kwargs`` is not a mapping of names to values."""
    if kwargs is None or (isinstance(kwargs, Mapping) and all(isinstance(k, str) for k in kwargs)):
        return None
    return (
        f"{KWARGS_KEY}={kwargs!r} must be a mapping of keyword arguments for the chat template, "
        f"e.g. {KWARGS_KEY}={{enable_thinking:false}}"
    )


def use_custom_template(tokenizer: Any, template: str | None) -> Any:
    """``tokenizer`` with ``template`` as its chat template (unchanged when None); returned for
    chaining. A template that does not parse is a :class:`~polyrl.errors.ConfigError`."""
    if template is None:
        return tokenizer
    from polyrl.errors import ConfigError

    problem = template_problem(template)
    if problem:
        raise ConfigError(problem)
    tokenizer.chat_template = str(template)
    return tokenizer


def template_kwargs(data_cfg: Any) -> dict[str, Any]:
    """``data.apply_chat_template_kwargs`` of a ``data`` node (a config node, a dict or None) as
    a plain dict; a value that is not a mapping is a :class:`~polyrl.errors.DataError`."""
    from polyrl.errors import DataError

    if data_cfg is None:
        return {}
    if isinstance(data_cfg, Mapping):
        kwargs = data_cfg.get("apply_chat_template_kwargs")
    else:
        kwargs = getattr(data_cfg, "apply_chat_template_kwargs", None)
    problem = kwargs_problem(kwargs)
    if problem:
        raise DataError(problem)
    return {str(k): _plain(v) for k, v in (kwargs or {}).items()}


def _plain(value: Any) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value
