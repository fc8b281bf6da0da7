"""polyrl-loss-zoo: the policy losses verl registers beyond PPO and GSPO, under verl's names
(``actor_rollout_ref.actor.policy_loss.loss_mode=<name>``) and with verl's config keys."""
