"""policylink.sim: simulated environments (``sim.mujoco`` tasks, ``sim.gym`` foreign gymnasium envs) and their
scripted experts (``sim.experts.make_expert``)."""
