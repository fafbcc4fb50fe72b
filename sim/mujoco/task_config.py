"""The keyword arguments of the MuJoCo tasks (``reach``, ``push``, ``pick_place``, ``insert``, ``memory``,
``multitask``) and of their Genesis twins as config dataclasses, registered with each env factory
(:func:`~policylink.adapters.env_config.with_env_config`), so ``make_env(name, **kwargs)`` checks the keys and types
of a kwargs mapping before building the env (:func:`policylink.adapters.registry.check_env_kwargs`). The env
constructors check the values (ranges, names) themselves; a test keeps these fields equal to their parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policylink.sim.mujoco.cameras import CameraPoseShift
from policylink.sim.mujoco.gap import RealityGap
from policylink.sim.mujoco.perturbations import PerturbationConfig
from policylink.sim.mujoco.randomization import RandomizationConfig


@dataclass(frozen=True)
class RenderedTaskConfig:
    """Keyword arguments every MuJoCo-rendered task takes (see
    :class:`~policylink.sim.mujoco.base.MujocoTaskEnv` for each).

    Attributes:
        obs_mode: one of :data:`policylink.adapters.obs_modes.OBS_MODES` (``"state"``, ``"image"``...).
        image_size: frame side (int) or ``(H, W)``, pixels.
        cameras: camera names observed in the image modes (None: the task's default cameras).
        render_quality: ``"fast"`` or ``"pretty"``.
        perturbation: mid-episode perturbations (a :class:`PerturbationConfig` or a mapping of its fields).
        render_mode: None or ``"rgb_array"``.
        randomization: visual randomisation bounds (a :class:`RandomizationConfig` or a mapping of its fields;
            None: the default bounds).
        render_size: side of the ``render()`` frame, pixels.
    """

    obs_mode: str = "state"
    image_size: int | tuple[int, int] = 96
    cameras: tuple[str, ...] | None = None
    render_quality: str = "fast"
    perturbation: PerturbationConfig | None = None
    render_mode: str | None = None
    randomization: RandomizationConfig | None = None
    render_size: int = 256


@dataclass(frozen=True)
class MujocoTaskConfig(RenderedTaskConfig):
    """Keyword arguments of a MuJoCo task: :class:`RenderedTaskConfig` plus

    Attributes:
        camera_pose_shift: a rigid move of every camera (a :class:`CameraPoseShift` or a mapping of its fields).
        gap: a reality gap: a :class:`RealityGap`, a mapping of its fields (checked by the gap itself: it also
            takes ``base``), a preset name (``"worn_gantry"``) or a YAML file path; None: the nominal simulator.
    """

    camera_pose_shift: CameraPoseShift | None = None
    gap: RealityGap | Mapping[str, Any] | str | Path | None = None


__all__ = ["MujocoTaskConfig", "RenderedTaskConfig"]
