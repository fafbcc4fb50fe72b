"""Seeded visual randomisation of a MuJoCo scene: object colours, lighting and small camera jitter.

Every reset draws fresh values around the model's *nominal* values (saved once at construction), so nothing
accumulates from one episode to the next. Object and goal poses are sampled by each task itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np

from policylink.sim.mujoco.env_kwargs import checked_mapping


@dataclass(frozen=True)
class RandomizationConfig:
    """How much the visual scene varies per episode (all draws uniform, from the env's seeded generator).

    Attributes:
        color: per-channel RGB offset bound added to each randomised geom's nominal colour (0 disables);
            small enough (default 0.08) that a red block stays recognisably red.
        table_color: per-channel offset bound for the table colour.
        light: relative bound on the key light's diffuse intensity (0.2 = +-20 %) and, in radians, on the
            tilt of its direction.
        camera_position: bound on each camera's position offset per axis, metres (default 5 mm).
    """

    color: float = 0.08
    table_color: float = 0.06
    light: float = 0.2
    camera_position: float = 0.005

    def __post_init__(self) -> None:
        for name in ("color", "table_color", "light", "camera_position"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"RandomizationConfig.{name}: expected a value in [0, 1], received {value}")

    @classmethod
    def coerce(cls, value: RandomizationConfig | Mapping[str, Any] | None) -> RandomizationConfig:
        """A config from itself, a mapping of its fields (env kwargs from YAML/JSON: ``{color: 0.0}``), or the
        default bounds for None.

        Raises:
            ValueError: another type, an unknown field (the message lists the fields), or a value outside [0, 1].
        """
        if value is None:
            return cls()
        checked = checked_mapping(cls, value, "randomization")
        return value if checked is None else cls(**checked)


NO_RANDOMIZATION = RandomizationConfig(color=0.0, table_color=0.0, light=0.0, camera_position=0.0)


class SceneRandomizer:
    """Applies a :class:`RandomizationConfig` to a model at each reset.

    Args:
        model: the compiled model (changed in place: ``geom_rgba``, ``light_diffuse``, ``light_dir``,
            ``cam_pos``).
        config: the bounds.
        object_geoms: names of the geoms whose colour varies (task objects).

    Raises:
        KeyError: a geom name is not in the model.
    """

    def __init__(self, model: mujoco.MjModel, config: RandomizationConfig, object_geoms: Sequence[str]):
        self.model, self.config = model, config
        self._object_ids = np.array([_geom_id(model, n) for n in object_geoms], dtype=np.int64)
        self._table_id = _geom_id(model, "table")
        self._rgba = model.geom_rgba.copy()
        self._light_diffuse = model.light_diffuse.copy()
        self._light_dir = model.light_dir.copy()
        self._cam_pos = model.cam_pos.copy()

    def apply(self, rng: np.random.Generator) -> None:
        """Draw and set this episode's colours, lights and camera positions (from the nominal values)."""
        m, c = self.model, self.config
        m.geom_rgba[:] = self._rgba
        if len(self._object_ids):
            jitter = rng.uniform(-c.color, c.color, (len(self._object_ids), 3))
            m.geom_rgba[self._object_ids, :3] = np.clip(self._rgba[self._object_ids, :3] + jitter, 0.0, 1.0)
        m.geom_rgba[self._table_id, :3] = np.clip(
            self._rgba[self._table_id, :3] + rng.uniform(-c.table_color, c.table_color, 3), 0.0, 1.0
        )
        scale = 1.0 + rng.uniform(-c.light, c.light, (m.nlight, 1))
        m.light_diffuse[:] = np.clip(self._light_diffuse * scale, 0.0, 1.0)
        tilt = rng.uniform(-c.light, c.light, (m.nlight, 3)) * np.array([1.0, 1.0, 0.0])
        direction = self._light_dir + tilt
        m.light_dir[:] = direction / np.linalg.norm(direction, axis=1, keepdims=True)
        m.cam_pos[:] = self._cam_pos + rng.uniform(-c.camera_position, c.camera_position, self._cam_pos.shape)


def _geom_id(model: mujoco.MjModel, name: str) -> int:
    gid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, name)
    if gid < 0:
        raise KeyError(f"geom: expected a geom of model {model.names[:20]!r}..., received unknown name {name!r}")
    return gid
