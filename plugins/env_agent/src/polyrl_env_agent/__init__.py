"""The ``agent`` environment: a user's agent function drives episodes through an
OpenAI-compatible endpoint on loopback (see :mod:`polyrl_env_agent.environment`)."""
