"""Shared pieces of the isolated-env tests."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from policylink.adapters.schema import STATE_KEY
from policylink.sim.experts import make_expert


def _expert_episode(env, seed: int, max_steps: int) -> tuple[np.ndarray, int, bool]:
    """One episode of the env's scripted expert: ``(first state (D,), steps taken, success)``."""
    expert = make_expert(env)
    obs, _ = env.reset(seed=seed)
    first = obs[STATE_KEY].copy()
    for t in range(1, max_steps + 1):
        obs, _, terminated, truncated, info = env.step(expert.act(obs, env))
        if terminated or truncated:
            return first, t, bool(info["is_success"])
    return first, max_steps, False


@pytest.fixture
def expert_episode() -> Callable[..., tuple[np.ndarray, int, bool]]:
    """``expert_episode(env, seed, max_steps)``: one scripted-expert episode (see :func:`_expert_episode`)."""
    return _expert_episode
