"""Evaluating a language-conditioned policy on instructions of your own: an instruction file maps a goal key
(``"<colour>/<side>"`` for ``multitask``, the env's ``goal`` tuple joined by ``/``) to a list of phrasings. The
env draws its episode (goal included) from the seed as usual; the policy is told one of the file's phrasings for
that goal instead of the env's own instruction (held-out paraphrases, ``policylink eval --instructions FILE``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from policylink.adapters.schema import TASK_KEY


def load_instruction_file(path: str | Path) -> dict[str, list[str]]:
    """The goal-key -> instructions table of a JSON file (``{"red/left": ["...", ...], ...}``).

    Raises:
        FileNotFoundError: no such file. ValueError: not a JSON object of non-empty lists of non-empty str
        (names the file and the key).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"instructions: file not found: {str(path)!r}")
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"instructions {str(path)!r}: expected JSON, received a parse error: {e}") from None
    if not isinstance(doc, dict) or not doc:
        raise ValueError(f"instructions {str(path)!r}: expected a JSON object goal key -> list of instructions")
    for key, texts in doc.items():
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t.strip() for t in texts):
            raise ValueError(
                f"instructions {str(path)!r}[{key!r}]: expected a non-empty list of non-empty str, received {texts!r}"
            )
    return {str(k): list(v) for k, v in doc.items()}


def goal_key(env: gym.Env) -> str:
    """The current episode's goal key: the unwrapped env's ``goal`` tuple joined by ``/`` (``"red/left"``).

    Raises:
        TypeError: the env has no ``goal`` tuple of str.
    """
    goal = getattr(env.unwrapped, "goal", None)
    if not isinstance(goal, tuple) or not all(isinstance(g, str) for g in goal):
        raise TypeError(
            f"instructions: env {type(env.unwrapped).__name__} has no goal tuple to key an instruction file by "
            f"(expected e.g. ('red', 'left') as env.goal, received {goal!r})"
        )
    return "/".join(goal)


def instruction_problems(env: gym.Env, table: Mapping[str, list[str]]) -> list[str]:
    """Why ``table`` cannot serve every episode of ``env`` (empty when it can): keys that are not goals of the
    env, and goals the env can draw that the table lacks. Envs that do not list ``goal_keys`` are not checked."""
    goals = getattr(env.unwrapped, "goal_keys", None)
    if goals is None:
        return []
    problems = []
    unknown = sorted(set(table) - set(goals))
    if unknown:
        problems.append(f"instructions: expected goal keys among {list(goals)}, received unknown {unknown}")
    missing = [g for g in goals if g not in table]
    if missing:
        problems.append(f"instructions: expected every goal the env can draw, missing {missing}")
    return problems


class InstructionOverride(gym.Wrapper):
    """Replaces ``obs["task"]`` with a phrasing from ``table[goal_key(env)]``, chosen by the reset seed (the same
    seed gives the same phrasing), for the whole episode. ``info["goal_key"]`` carries the episode's goal key.

    Raises (on reset):
        KeyError: the episode's goal key is not in the table (names it and the keys the table has).
    """

    def __init__(self, env: gym.Env, table: Mapping[str, list[str]]):
        super().__init__(env)
        self.table = {k: list(v) for k, v in table.items()}
        self._task: str | None = None
        self._resets = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        key = goal_key(self.env)
        if key not in self.table:
            raise KeyError(f"instructions: goal {key!r} of this episode is not in the file (keys {sorted(self.table)})")
        texts = self.table[key]
        rng = np.random.default_rng([self._resets if seed is None else int(seed), 0x1A5])
        self._resets += 1
        self._task = texts[int(rng.integers(len(texts)))]
        return {**obs, TASK_KEY: self._task}, {**info, "goal_key": key}

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return {**obs, TASK_KEY: self._task}, reward, terminated, truncated, info


class InstructionEnvFn:
    """Picklable ``() -> env``: ``env_fn()`` wrapped in :class:`InstructionOverride` with the file's table
    (read once, here, so a bad file fails before any episode)."""

    def __init__(self, env_fn: Callable[[], gym.Env], path: str | Path):
        self.env_fn, self.path = env_fn, str(path)
        self.table = load_instruction_file(path)

    def __call__(self) -> gym.Env:
        return InstructionOverride(self.env_fn(), self.table)

    def __getattr__(self, name: str) -> Any:  # the wrapped constructor's attributes (e.g. its registry name)
        if name in ("env_fn", "path", "table"):
            raise AttributeError(name)
        return getattr(self.env_fn, name)


__all__ = ["InstructionEnvFn", "InstructionOverride", "goal_key", "instruction_problems", "load_instruction_file"]
