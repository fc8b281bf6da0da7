"""polyrl-reward-code: the code-execution reward (``data_source`` ``code``)."""
