"""A vector env whose sub-envs step on threads of this process (:class:`ThreadVectorEnv`): no pickling, no pipes,
no process wake-ups, while MuJoCo's ``mj_step`` (which releases the GIL) runs the sub-envs' physics in parallel.

Why: gymnasium's ``AsyncVectorEnv`` pays ~130-180 us per vector step on a 2-vCPU VM (pickled actions and results,
two pipes and two process wake-ups per sub-env, info merging and a deep copy in the parent;
``benchmarks/results/sim_throughput.md``), more than a whole MuJoCo control step (75-270 us from state). A thread
hand-off costs a few tens of microseconds, and the Python part of a step (~5 us) is all that holds the GIL.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from copy import deepcopy
from queue import SimpleQueue
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

_STOP = object()


class ThreadVectorEnv(gym.vector.VectorEnv):
    """``n`` sub-envs: sub-env 0 on the caller's thread, each other one built, stepped, reset, rendered and closed on
    its own thread (an EGL rendering context is current on one thread only, so a sub-env never leaves the thread that
    built it; the caller must keep using the vector env from the thread that created it); ``SAME_STEP`` autoreset
    (a finished sub-env is reset inside the same ``step``; its last observation and info are in ``info["final_obs"]``
    / ``info["final_info"]``), as :func:`~policylink.runtime.vector_env.make_vector_env` gives every vector env.

    Returns the same batches as ``gym.vector.SyncVectorEnv(env_fns, autoreset_mode=SAME_STEP)`` for the same calls
    (observations deep-copied out of the batch buffer; rewards float64 ``(n,)``; flags bool ``(n,)``; infos merged
    per key with ``_key`` masks).

    Args:
        env_fns: zero-argument sub-env constructors, each called on its sub-env's thread (the first on the caller's).

    Raises:
        RuntimeError: the sub-envs' observation or action spaces differ (named).
        Exception: whatever a sub-env raises, re-raised in the caller's thread.
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]]):
        super().__init__()
        self.num_envs = len(env_fns)
        self.autoreset_mode = gym.vector.AutoresetMode.SAME_STEP
        self._env0 = env_fns[0]()  # sub-env 0 runs on the caller's thread: one hand-off less per step
        self._requests: list[SimpleQueue] = [SimpleQueue() for _ in env_fns[1:]]
        self._replies: list[SimpleQueue] = [SimpleQueue() for _ in env_fns[1:]]
        self._threads = [
            threading.Thread(target=_serve, args=(fn, q, r), name=f"policylink-env-{i + 1}", daemon=True)
            for i, (fn, q, r) in enumerate(zip(env_fns[1:], self._requests, self._replies, strict=True))
        ]
        for t in self._threads:
            t.start()
        self.closed = False
        try:  # a sub-env constructor that raised on its thread raises here
            spaces = self._all(lambda env: (env.observation_space, env.action_space, env.metadata, env.render_mode))
        except BaseException:
            self.close()
            raise
        self.single_observation_space, self.single_action_space, metadata, self.render_mode = spaces[0]
        for i, (obs_space, act_space, _, _) in enumerate(spaces):
            for name, got, want in (("observation_space", obs_space, self.single_observation_space),
                                    ("action_space", act_space, self.single_action_space)):  # fmt: skip
                if got != want:
                    self.close()
                    raise RuntimeError(f"ThreadVectorEnv: sub-env {i}'s {name} {got} differs from sub-env 0's {want}")
        self.metadata = {**metadata, "autoreset_mode": self.autoreset_mode}
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._observations = create_empty_array(self.single_observation_space, n=self.num_envs, fn=np.zeros)

    def _all(self, fns: Callable[[gym.Env], Any] | Sequence[Callable[[gym.Env], Any]]) -> list[Any]:
        """Run ``fns[i](env_i)`` (or one function on every sub-env) on the sub-envs' threads at once; their results
        in sub-env order. The first sub-env error is re-raised after every thread has answered."""
        fns = [fns] * self.num_envs if callable(fns) else list(fns)
        for q, fn in zip(self._requests, fns[1:], strict=True):
            q.put(fn)
        out = [_answer(fns[0], self._env0)] + [r.get() for r in self._replies]
        for ok, value in out:
            if not ok:
                raise value
        return [value for _, value in out]

    def reset(self, *, seed: int | Sequence[int | None] | None = None, options: dict | None = None):
        """Reset every sub-env (sub-env ``i`` gets ``seed + i`` for an int seed, ``seed[i]`` for a list);
        returns the batched observation and the merged infos."""
        seeds = [None] * self.num_envs if seed is None else seed
        seeds = [seed + i for i in range(self.num_envs)] if isinstance(seeds, int) else list(seeds)
        if len(seeds) != self.num_envs:
            raise ValueError(f"reset seed: expected {self.num_envs} seeds (num_envs), received {len(seeds)}")
        results = self._all([_Reset(s, options) for s in seeds])
        infos: dict = {}
        for i, (_, info) in enumerate(results):
            infos = self._add_info(infos, info, i)
        return self._batch([obs for obs, _ in results]), infos

    def step(self, actions):
        """Step every sub-env on its thread (a finished one is reset in the same call); returns the batched
        observation, rewards float64 ``(n,)``, terminated / truncated bool ``(n,)`` and the merged infos."""
        results = self._all([_Step(a) for a in iterate(self.action_space, actions)])
        rewards = np.zeros(self.num_envs, np.float64)
        terminated = np.zeros(self.num_envs, np.bool_)
        truncated = np.zeros(self.num_envs, np.bool_)
        infos: dict = {}
        observations = []
        for i, (obs, reward, term, trunc, info, final) in enumerate(results):
            rewards[i], terminated[i], truncated[i] = reward, term, trunc
            if final is not None:
                infos = self._add_info(infos, {"final_obs": final[0], "final_info": final[1]}, i)
            infos = self._add_info(infos, info, i)
            observations.append(obs)
        return self._batch(observations), rewards, terminated, truncated, infos

    def _batch(self, observations: list) -> Any:
        self._observations = concatenate(self.single_observation_space, observations, self._observations)
        return deepcopy(self._observations)

    def render(self) -> tuple[Any, ...]:
        """Each sub-env's ``render()``, rendered on its thread."""
        return tuple(self._all(lambda env: env.render()))

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Each sub-env's ``name(*args, **kwargs)`` (or the attribute, when not callable), on its thread."""
        return tuple(self._all(_Call(name, args, kwargs)))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Each sub-env's attribute ``name`` (through wrappers)."""
        return tuple(self._all(lambda env: env.get_wrapper_attr(name)))

    def close_extras(self, **kwargs: Any) -> None:
        """Close every sub-env on its thread and end the threads."""
        for q in self._requests:
            q.put(_STOP)
        self._env0.close()
        for t in self._threads:
            t.join()


def _serve(env_fn: Callable[[], gym.Env], requests: SimpleQueue, replies: SimpleQueue) -> None:
    """A sub-env's thread: build the env, then answer each request ``fn`` with ``(True, fn(env))`` or
    ``(False, exception)`` until :data:`_STOP` (then close the env)."""
    try:
        env = env_fn()
    except BaseException as e:  # reported at the first request
        env, error = None, e
    while True:
        fn = requests.get()
        if fn is _STOP:
            if env is not None:
                env.close()
            return
        if env is None:
            replies.put((False, error))
            continue
        replies.put(_answer(fn, env))


def _answer(fn: Callable[[gym.Env], Any], env: gym.Env) -> tuple[bool, Any]:
    """``(True, fn(env))``, or ``(False, the exception)`` if it raised."""
    try:
        return True, fn(env)
    except BaseException as e:
        return False, e


class _Reset:
    def __init__(self, seed: int | None, options: dict | None):
        self.seed, self.options = seed, options

    def __call__(self, env: gym.Env):
        return env.reset(seed=self.seed, options=self.options)


class _Step:
    """One SAME_STEP autoreset step: ``(obs, reward, terminated, truncated, info, final)``; ``final`` is None or
    the finished episode's ``(last obs, last info)`` (the returned obs and info are then the reset's)."""

    def __init__(self, action: Any):
        self.action = action

    def __call__(self, env: gym.Env):
        obs, reward, terminated, truncated, info = env.step(self.action)
        final = None
        if terminated or truncated:
            final = (obs, info)
            obs, info = env.reset()
        return obs, reward, terminated, truncated, info, final


class _Call:
    def __init__(self, name: str, args: tuple, kwargs: dict):
        self.name, self.args, self.kwargs = name, args, kwargs

    def __call__(self, env: gym.Env):
        attr = env.get_wrapper_attr(self.name)
        return attr(*self.args, **self.kwargs) if callable(attr) else attr


__all__ = ["ThreadVectorEnv"]
