"""Worker roles: one class per job a worker can host (see :mod:`polyrl.workers.roles.base`).

Core's roles are imported lazily by name (they import torch and the engines' registry);
:data:`CORE_ROLES` maps each role name to its class's import string.
"""

from polyrl.workers.roles.base import Role, RoleContext

CORE_ROLES = {
    "actor": "polyrl.workers.roles.actor:ActorRole",
    "ref": "polyrl.workers.roles.ref:RefRole",
    "rollout": "polyrl.workers.roles.rollout:RolloutRole",
    "reward_model": "polyrl.workers.roles.reward_model:RewardModelRole",
}

__all__ = ["CORE_ROLES", "Role", "RoleContext"]
