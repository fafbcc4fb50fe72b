"""policylink as an inspect-robots plugin (the ``inspect`` extra: ``inspect-robots==0.60.0``).

Registered through inspect-robots' entry-point groups (``pyproject.toml``), so ``inspect-robots list`` shows them
without importing policylink first:

- policy ``policylink`` (:mod:`.policy`): any policy reference :func:`policylink.policies.load_policy` accepts
  (a checkpoint folder, ``tcp://HOST:PORT`` of ``policylink serve``, a registry name...) behind one of policylink's
  chunk executors; ``-P policy=REF``.
- embodiments ``policylink/<task>`` for every MuJoCo task, ``policylink/genesis_reach`` and
  ``policylink/genesis_pick_place`` (Genesis physics), ``policylink/sim_robot`` (the sim-as-real robot, paced in
  real time) and ``policylink`` (any registered env: ``-E env=NAME``) (:mod:`.embodiment`).
- tasks ``policylink/<task>`` (:mod:`.tasks`): seeded scenes of a MuJoCo task, scored by ``success_at_end`` and
  ``episode_length``; they run on any embodiment of that task (MuJoCo, Genesis or the sim-as-real robot).

The contract mapping (action semantics, cameras, state fields, instructions) is :mod:`.spaces`. Importing these
modules imports neither torch nor a simulator; a factory imports what it builds.
"""
