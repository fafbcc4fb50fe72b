"""Env keyword arguments given as mappings (``--env_kwargs`` from YAML/JSON) checked against the config dataclass
they stand for (``perturbation`` -> :class:`~policylink.sim.mujoco.perturbations.PerturbationConfig`,
``camera_pose_shift`` -> :class:`~policylink.sim.mujoco.cameras.CameraPoseShift`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any


def checked_mapping(cls: type, value: Any, name: str) -> dict[str, Any] | None:
    """``value`` as a dict of fields of dataclass ``cls`` (the caller builds ``cls`` from it), or None when
    ``value`` is None or already a ``cls``.

    Raises:
        ValueError: ``value`` is no mapping, or has keys that are no fields of ``cls`` (the message names the
            kwarg ``name``, the unknown keys and the valid ones).
    """
    if value is None or isinstance(value, cls):
        return None
    names = tuple(f.name for f in fields(cls))
    if not isinstance(value, Mapping):
        raise ValueError(f"{name}: expected None or a mapping with keys among {names}, received {value!r}")
    unknown = sorted(map(str, set(value) - set(names)))
    if unknown:
        raise ValueError(f"{name}: unknown key(s) {unknown}: expected keys among {names}, received {dict(value)!r}")
    return dict(value)
