"""Worker processes and the driver's handle on them.

- :mod:`~polyrl.workers.roles`: one class per job a worker hosts (actor, ref, rollout, plugin
  roles such as a critic);
- :mod:`~polyrl.workers.worker`: the process (one per device of a pool) hosting a pool's roles;
- :mod:`~polyrl.workers.placement`: pools from the config, :func:`start_role_workers` and the
  :class:`RoleWorkers` handle the step calls;
- :mod:`~polyrl.workers.dispatch` / :mod:`~polyrl.workers.mesh`: splitting batches over a role's
  data-parallel mesh and gathering the outputs;
- :mod:`~polyrl.workers.worker_group` (Ray) and :mod:`~polyrl.workers.local` (threads, tests):
  SPMD groups that surface the first failing rank at once.
"""
