"""The rollout batch layout of :meth:`polyrl.interfaces.RolloutEngine.generate`, shared by the
engine plugins: it lives in :mod:`polyrl.rollout_layout` (pure torch, no vLLM)."""

from polyrl.api import assemble_rollout, position_ids_for, strip_left_padding

__all__ = ["assemble_rollout", "position_ids_for", "strip_left_padding"]
