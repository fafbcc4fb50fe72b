"""policylink.sim.isolated: benchmark environments whose simulator pins clash with ours (MetaWorld pins
``mujoco==3.3.0``), each in a virtual environment of its own behind the env transport.

- :mod:`.families`: what an isolated family is (its pip requirements, its tasks, the factory its venv serves) and
  the one table of known families; ``adapters.registry`` resolves ``<family>/<task>`` through it.
- :mod:`.venvs`: ``policylink envs install/list``: building a family's venv and the JSON record of where it lives.
- :mod:`.process`: starting a family's env server in its venv, the client env (:class:`~.process.IsolatedEnv`),
  and stopping the process at close or exit.
- :mod:`.server`: the entry point run inside the venv (imports the contract and the family's env module only).
- :mod:`.metaworld` (host side, imports no MetaWorld) and :mod:`.metaworld_env` (venv side).
- :mod:`.aloha` (host side) and :mod:`.aloha_env` (venv side: gym-aloha's scenes, pins ``mujoco<3``), with
  :mod:`.aloha_script`, the ACT paper's scripted end-effector policies (numpy only).
"""
