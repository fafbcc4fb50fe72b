"""The vector env side of the rollout loop: planned episodes per slot (:class:`EpisodePlan`), the one vector-env
factory (:func:`make_vector_env`, SAME_STEP autoreset), the round-robin episode plan, registry env constructors
and the EnvSpec lookup through wrappers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from policylink.adapters.schema import EnvSpec
from policylink.runtime.thread_vector_env import ThreadVectorEnv

EPISODE_INDEX = "policylink_episode"  # reset-info key: index of the planned episode (-1 = padding)
EPISODE_SEED = "policylink_seed"  # reset-info key: its reset seed (-1 = none)
FINAL_FRAME_INFO = "policylink_final_frame"  # final-info key: uint8 (H, W, 3) render of an episode's last state


class EpisodePlan(gym.Wrapper):
    """Gives one vector-env slot its planned episodes: the k-th reset uses the k-th ``(index, seed)``; resets
    after the plan is exhausted are padding (index -1). Truncates episodes at ``max_episode_steps`` (default:
    the env's ``env_spec.max_episode_steps``).

    The reset info carries ``policylink_episode`` and ``policylink_seed`` (ints) so the loop knows which
    planned episode a slot is running, with any vector env and autoreset.

    Raises:
        TypeError: ``max_episode_steps`` is None and the env has no ``env_spec``.
    """

    def __init__(self, env: gym.Env, plan: Sequence[tuple[int, int]], max_episode_steps: int | None = None):
        super().__init__(env)
        self._plan = list(plan)
        self._next = 0
        self._max_steps = int(env_spec_of(env).max_episode_steps if max_episode_steps is None else max_episode_steps)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Reset with the next planned seed (the ``seed`` argument is ignored: the plan decides)."""
        index, seed = self._plan[self._next] if self._next < len(self._plan) else (-1, None)
        self._next += 1
        self._t = 0
        obs, info = self.env.reset(seed=seed, options=options)
        info = dict(info)
        info[EPISODE_INDEX] = int(index)
        info[EPISODE_SEED] = -1 if seed is None else int(seed)
        return obs, info

    def step(self, action):
        """Step, truncating at ``max_episode_steps``; the step ending an episode of an ``rgb_array`` env carries
        its render under :data:`FINAL_FRAME_INFO` (the vector env resets the slot within the same step)."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._t += 1
        truncated = truncated or self._t >= self._max_steps
        if (terminated or truncated) and self.render_mode == "rgb_array":
            frame = self.env.render()
            if frame is not None:
                info = {**info, FINAL_FRAME_INFO: np.asarray(frame, np.uint8)}
        return obs, reward, terminated, truncated, info


class BorrowedEnv(gym.Wrapper):
    """An env the caller keeps: closing the vector env around it leaves it open (``close`` is a no-op)."""

    def close(self) -> None:
        """Do nothing: the env belongs to the caller."""


def make_vector_env(
    env_fn: Callable[[], gym.Env],
    plans: Sequence[Sequence[tuple[int, int]]] | int,
    max_episode_steps: int | None = None,
    asynchronous: bool = False,
    threads: bool = False,
) -> gym.vector.VectorEnv:
    """The one vector-env factory: a ``SyncVectorEnv`` (or ``AsyncVectorEnv``, or a
    :class:`~policylink.runtime.thread_vector_env.ThreadVectorEnv`) with ``AutoresetMode.SAME_STEP`` (a finished slot
    is reset inside the same ``step`` call).

    Args:
        env_fn: zero-argument env constructor (picklable for ``asynchronous``).
        plans: per-slot episode plans (slot ``j`` runs ``plans[j]`` through :class:`EpisodePlan`, truncated at
            ``max_episode_steps``, default the env's), or an int ``n`` for ``n`` unplanned copies (reset seeds
            are the caller's).
        max_episode_steps: step cap of planned episodes (None: ``env_spec.max_episode_steps``).
        asynchronous: one subprocess per slot, with pipes instead of shared memory (gymnasium's shared-memory
            buffers garble ``Text`` observations such as ``task``) and the ``forkserver`` start method (a child
            forked from a process that already holds an EGL context hangs on its first render).
        threads: slots on threads of this process, slot 0 on the caller's (MuJoCo's physics runs in parallel,
            without the pipes and pickling of ``asynchronous``; the envs' Python code shares the GIL).

    Raises:
        ValueError: both ``asynchronous`` and ``threads``.
    """
    if asynchronous and threads:
        raise ValueError("make_vector_env: expected at most one of asynchronous and threads, received both")
    if isinstance(plans, int):
        fns: list[Callable[[], gym.Env]] = [env_fn] * plans
    else:
        fns = [_PlannedEnvFn(env_fn, plan, max_episode_steps) for plan in plans]
    mode = gym.vector.AutoresetMode.SAME_STEP
    if threads:
        return ThreadVectorEnv(fns)
    if asynchronous:
        return gym.vector.AsyncVectorEnv(fns, shared_memory=False, context="forkserver", autoreset_mode=mode)
    return gym.vector.SyncVectorEnv(fns, autoreset_mode=mode)


def plan_episodes(n_episodes: int, seed: int, num_envs: int, first_index: int = 0) -> list[list[tuple[int, int]]]:
    """Round-robin plan: episode ``i`` (seed ``seed + i``) runs in slot ``(i - first_index) % num_envs``."""
    plans: list[list[tuple[int, int]]] = [[] for _ in range(num_envs)]
    for k in range(n_episodes):
        i = first_index + k
        plans[k % num_envs].append((i, seed + i))
    return plans


class RegistryEnvFn:
    """Picklable ``() -> EnvAdapter`` for an environment registry name and factory kwargs."""

    def __init__(self, name: str, **kwargs: Any):
        self.name, self.kwargs = name, dict(kwargs)

    def __call__(self) -> gym.Env:
        from policylink.adapters.registry import make_env

        return make_env(self.name, **self.kwargs)


def env_spec_of(env: gym.Env) -> EnvSpec:
    """The :class:`EnvSpec` of an EnvAdapter (``env.env_spec``, through gymnasium wrappers).

    Raises:
        TypeError: the env carries no ``env_spec``.
    """
    try:
        return env.get_wrapper_attr("env_spec")
    except AttributeError:
        raise TypeError(
            f"env: expected an EnvAdapter with an env_spec attribute, received {type(env).__name__}"
        ) from None


class _PlannedEnvFn:
    """Picklable env constructor for vector envs (AsyncVectorEnv sends it to a subprocess)."""

    def __init__(self, env_fn: Callable[[], gym.Env], plan: Sequence[tuple[int, int]], max_episode_steps: int | None):
        self.env_fn, self.plan, self.max_episode_steps = env_fn, list(plan), max_episode_steps

    def __call__(self) -> gym.Env:
        return EpisodePlan(self.env_fn(), self.plan, self.max_episode_steps)
