"""Benchmarks of the MuJoCo tasks as inspect-robots tasks: entry points ``policylink/<task>`` of the
``inspect_robots.tasks`` group (``-T num_scenes=N -T seed=S -T epochs=E``).

Scene ``i`` has ``init_seed = seed + i``, the env's instruction (``multitask`` cycles through its 18) and the target
kind ``policylink/<task>``, which the embodiments of that task realise (``policylink/<task>``, its Genesis twin,
``policylink/sim_robot -E task=<task>``); inspect-robots' compatibility check refuses the scenes of another task.
Scored by ``success_at_end`` (the env terminated on success) and ``episode_length``; the horizon is the env's
``max_episode_steps``. inspect-robots resets each trial with ``derive_seed(eval seed, init_seed, epoch)``; the
policylink policy records that seed in each trial's metadata (``policylink.seed``).
"""

from __future__ import annotations

from collections.abc import Callable

from inspect_robots.errors import ConfigError
from inspect_robots.scene import Scene, Target
from inspect_robots.scorer import episode_length, success_at_end
from inspect_robots.task import Task

from policylink.plugins.inspect_robots.embodiment import MUJOCO_TASKS, target_kind

DEFAULT_SEED = 100_000
"""First scene seed: ``policylink run``'s default, away from the seeds ``policylink record`` uses (``0..N-1``)."""


def task_for(env: str, num_scenes: int = 10, seed: int = DEFAULT_SEED, epochs: int = 1) -> Task:
    """The inspect-robots task of MuJoCo task ``env``: ``num_scenes`` seeded scenes, ``epochs`` repeats.

    Raises:
        ConfigError: ``num_scenes`` or ``epochs`` below 1, or ``env`` not one of the MuJoCo tasks (names the field).
    """
    if env not in MUJOCO_TASKS:
        raise ConfigError(f"env: expected one of {list(MUJOCO_TASKS)}, received {env!r}")
    for name, value in (("num_scenes", num_scenes), ("epochs", epochs)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name}: expected an integer >= 1, received {value!r}")
    from policylink.adapters.registry import make_env

    probe = make_env(env)  # the MuJoCo task: a fraction of a second, no renderer
    spec = probe.env_spec
    probe.close()
    kind = target_kind(env)
    scenes = [
        Scene(
            id=f"seed-{seed + i}",
            instruction=spec.tasks[i % len(spec.tasks)],
            target=Target(kind=kind),
            init_seed=seed + i,
            metadata={"env": env},
        )
        for i in range(num_scenes)
    ]
    return Task(
        name=kind,
        scenes=scenes,
        scorer=[success_at_end(), episode_length()],
        max_steps=int(spec.max_episode_steps),
        epochs=epochs,
        metadata={"env": env, "control_frequency_hz": spec.control_frequency},
    )


def _registered(env: str) -> Callable[..., Task]:
    def factory(num_scenes: int = 10, seed: int = DEFAULT_SEED, epochs: int = 1) -> Task:
        return task_for(env, num_scenes=num_scenes, seed=seed, epochs=epochs)

    factory.__name__ = factory.__qualname__ = env
    factory.__doc__ = f"Entry point ``policylink/{env}``: :func:`task_for` of ``{env}``."
    return factory


reach, push, pick_place, insert, memory, multitask = (_registered(t) for t in MUJOCO_TASKS)

__all__ = ["DEFAULT_SEED", "task_for"]
