"""polyrl-reward-judge: LLM-as-judge rewards (``reward_model.reward_manager=judge``)."""
