"""MetaWorld, host side: the ``metaworld`` env family (``metaworld/<task>`` names, served from the venv that
``policylink envs install metaworld`` builds) and its scripted expert. Imports no MetaWorld; the env itself is
:mod:`policylink.sim.isolated.metaworld_env`, run inside the venv.

``metaworld`` 3.1.1 pins ``mujoco==3.3.0`` (ours is 4.x: its models fail to load, an ``eq_data`` shape error), hence
the venv. Env kwargs (JSON-serialisable, passed to the venv): ``obs_mode`` (``state``, ``image``, ``state+image``,
``image+proprio``: the hand and gripper only), ``image_size``, ``cameras``, ``max_episode_steps``, ``expert_actions``,
``render_mode``; see
:class:`~policylink.sim.isolated.metaworld_env.MetaWorldAdapter`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from policylink.sim.isolated.families import IsolatedFamily
from policylink.sim.isolated.info_expert import InfoExpert

MT10_TASKS: tuple[str, ...] = (
    "reach",
    "push",
    "pick-place",
    "door-open",
    "drawer-open",
    "drawer-close",
    "button-press-topdown",
    "peg-insert-side",
    "window-open",
    "window-close",
)
"""The MT10 tasks (v3); the same tuple as ``metaworld_env.MT10_TASKS`` (a test checks it), kept here so the host
never imports the venv module."""


@dataclass(frozen=True)
class MetaWorldConfig:
    """Keyword arguments of a ``metaworld/<task>`` env (checked on the host before its env server starts; the
    venv's :class:`~policylink.sim.isolated.metaworld_env.MetaWorldAdapter` checks the values).

    Attributes:
        obs_mode: ``"state"``, ``"image"``, ``"state+image"`` or ``"image+proprio"``.
        image_size: side of the square frames, pixels.
        cameras: camera names observed in the image modes.
        expert_actions: put MetaWorld's scripted action in every info from the start (~30 us a step; off: the
            expert made for the env, :func:`make_metaworld_expert`, turns it on, so ``record`` needs no flag).
        max_episode_steps: truncation, steps (None: the benchmark's 500).
        render_mode: None or ``"rgb_array"``.
    """

    obs_mode: str = "state"
    image_size: int = 96
    cameras: tuple[str, ...] = ("corner2",)
    expert_actions: bool = False
    max_episode_steps: int | None = None
    render_mode: str | None = None


METAWORLD = IsolatedFamily(
    name="metaworld",
    requirements=("metaworld==3.1.1",),
    factory="policylink.sim.isolated.metaworld_env:make_metaworld_env",
    tasks=MT10_TASKS,
    check="import metaworld",
    env_config=MetaWorldConfig,
)
"""The ``metaworld`` family (entry point ``policylink.env_families``)."""

NOISE = {"expert": 0.0, "noisy": 0.3, "poor": 0.6}
"""Std of the Gaussian noise added to the scripted action per quality (the action range is [-1, 1])."""


class MetaWorldExpert(InfoExpert):
    """MetaWorld's own scripted policy (``metaworld.policies``), computed in the env process: an env whose expert
    actions are on (:func:`make_metaworld_expert` turns them on; or built with ``expert_actions=True``) carries
    ``expert_action`` in each reset/step info, for the observation it returns.

    Args:
        quality: ``"expert"``, or ``"noisy"``/``"poor"`` (:data:`NOISE` added, clipped to [-1, 1]).
        seed: seeds the noise (:meth:`reset` reseeds it).

    Raises:
        ValueError: unknown ``quality``.
    """

    family = "metaworld"
    noise_table = NOISE
    missing_hint = "make the expert with make_expert(env) (it turns them on) or build the env with expert_actions=True"

    def perturb(self, action: np.ndarray) -> np.ndarray:
        """float32 ``(4,)``: Gaussian noise added, clipped to the action range [-1, 1]."""
        return np.clip(action + self.rng.normal(0.0, self.noise, action.shape).astype(np.float32), -1.0, 1.0)


def make_metaworld_expert(env: Any, quality: str = "expert", seed: int | None = None) -> MetaWorldExpert:
    """The scripted expert for a ``metaworld/<task>`` env (``sim.experts.make_expert`` dispatches here). Unless
    the env's latest info already carries ``expert_action``, it turns the env's expert actions on: one
    ``env.unwrapped.reset(options={"expert_actions": True})`` (the setting holds for later resets; the next
    episode's own reset draws its configuration as before), so only an env that has an expert computes them.

    Raises:
        ValueError: unknown ``quality``.
    """
    expert = MetaWorldExpert(quality, seed)
    u = env.unwrapped
    if "expert_action" not in getattr(u, "last_info", {}):
        u.reset(options={"expert_actions": True})
    return expert
