"""Observation modes: the one ``obs_mode`` vocabulary shared by env factories (``sim``), recording, training,
checkpoints and evaluation, and the env-factory keyword arguments that select one.

It lives in ``adapters`` because every other part needs it and ``adapters`` is the only part they all may
import (``sim``, ``data`` and ``policies`` import ``adapters`` only; ``runtime`` composes them).
"""

from __future__ import annotations

from typing import Any

OBS_MODES: tuple[str, ...] = (
    "state",
    "image",
    "state+image",
    "image+proprio",
    "pointmap+proprio",
    "image+pointmap+proprio",
)
"""Every observation mode, in order:

- ``state``: ``observation.state`` only (the full low-dimensional state);
- ``image``: camera frames ``observation.images.<camera>`` only;
- ``state+image``: both;
- ``image+proprio``: camera frames plus the robot's own (proprioceptive) part of the state;
- ``pointmap+proprio``: robot-centric pointmaps ``observation.pointmaps.<camera>`` (float32 ``(H, W, 3)``,
  metres, base frame; :mod:`policylink.adapters.pointmaps`) plus the proprioceptive state;
- ``image+pointmap+proprio``: camera frames, pointmaps of the same cameras and the proprioceptive state.

An env factory may support a subset (it names the ones it takes in its error)."""

STATE_ONLY = "state"
"""The mode without images: its env kwargs carry no ``image_size``."""


def obs_mode_parts(obs_mode: str) -> frozenset[str]:
    """The parts a mode names, split at ``+``: ``obs_mode_parts("image+pointmap+proprio") ==
    frozenset({"image", "pointmap", "proprio"})`` (``state`` is the full state, ``proprio`` the robot's part)."""
    return frozenset(obs_mode.split("+"))


def check_obs_mode(obs_mode: str, supported: tuple[str, ...] = OBS_MODES, field: str = "obs_mode") -> str:
    """Return ``obs_mode`` when it is one of ``supported``.

    Raises:
        UnknownNameError: (a ValueError) it is not; the message names ``field``, the supported modes, the received
            value and the closest mode (``did you mean 'state+image'?``).
    """
    from policylink.adapters.registry import UnknownNameError, unknown_name_message

    if obs_mode not in supported:
        raise UnknownNameError(unknown_name_message(field, obs_mode, supported))
    return obs_mode


def obs_mode_env_kwargs(obs_mode: str, image_size: int | None = None) -> dict[str, Any]:
    """Env-factory kwargs selecting ``obs_mode``: ``{"obs_mode": obs_mode}``, plus ``"image_size"`` (int, pixels)
    for the image modes when ``image_size`` is given (a state env takes no image size).

    Example: ``obs_mode_env_kwargs("state", 96) == {"obs_mode": "state"}``;
    ``obs_mode_env_kwargs("image", 64) == {"obs_mode": "image", "image_size": 64}``.
    """
    kw: dict[str, Any] = {"obs_mode": obs_mode}
    if obs_mode != STATE_ONLY and image_size is not None:
        kw["image_size"] = int(image_size)
    return kw


__all__ = ["OBS_MODES", "STATE_ONLY", "check_obs_mode", "obs_mode_env_kwargs", "obs_mode_parts"]
