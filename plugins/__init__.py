"""Plugins that make policylink policies and environments usable from other robot-learning frameworks, through
those frameworks' own extension points: :mod:`policylink.plugins.inspect_robots` (inspect-robots' entry-point
groups ``inspect_robots.policies``, ``inspect_robots.embodiments`` and ``inspect_robots.tasks``)."""
