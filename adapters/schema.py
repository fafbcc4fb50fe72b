"""The observation/action contract: feature, action, policy and environment specs, and their checks.

Keys follow LeRobot's naming: ``observation.state`` (float32 ``(D,)``), ``observation.images.<camera>``
(uint8 RGB ``(H, W, 3)``), ``observation.environment_state`` (optional), ``task`` (str), ``action``
(float32 ``(A,)``); ``observation.pointmaps.<camera>`` (float32 ``(H, W, 3)``, metres, robot base frame) is ours
(:mod:`policylink.adapters.pointmaps`). Every check collects *all* problems and raises one error naming each field with
its expected and received value. Checks of whole observations and env actions (``validate_observation``,
``batch_size_of``, ``coerce_action``) are in :mod:`policylink.adapters.validation`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

STATE_KEY = "observation.state"
ENV_STATE_KEY = "observation.environment_state"
IMAGE_PREFIX = "observation.images."
TASK_KEY = "task"
ACTION_KEY = "action"
REALITY_GAP_INFO = "reality_gap"  # reset-info key: the episode's reality-gap parameters (JSON), recorded in its meta
FAULT_INFO = "fault"  # step-info key: why the episode ended as a failure on diverged physics (a robot fault)

# Numeric dtypes of the contract, in a fixed order (the wire codec numbers them by this order).
NUMERIC_DTYPES: tuple[str, ...] = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
)
_NUMERIC_DTYPES = frozenset(NUMERIC_DTYPES)
_STRING_DTYPE = "string"


class SpecError(ValueError):
    """Base class of every contract violation; the message lists each problem on its own line."""

    def __init__(self, problems: list[str], what: str):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{what}: {len(self.problems)} problem(s)\n{lines}")


class ObservationError(SpecError):
    """An observation does not match its spec (missing key, wrong dtype/shape, bad image scale)."""

    def __init__(self, problems: list[str]):
        super().__init__(problems, "invalid observation")


class ActionError(SpecError):
    """An action (or action chunk) does not match its ActionSpec."""

    def __init__(self, problems: list[str]):
        super().__init__(problems, "invalid action")


class IncompatibleSpecError(SpecError):
    """A policy cannot run on an environment (or with the executor settings given); raised by
    :func:`check_compatible` and the run, eval and deploy commands before any episode."""

    def __init__(self, problems: list[str]):
        super().__init__(problems, "policy, environment and executor settings are incompatible")


class ControlMode(StrEnum):
    """What an action vector commands. Units are given per dimension in :class:`ActionSpec`."""

    JOINT_POSITION = "joint_position"
    JOINT_VELOCITY = "joint_velocity"
    JOINT_TORQUE = "joint_torque"
    EE_POSITION = "ee_position"  # absolute end-effector pose
    EE_DELTA = "ee_delta"  # end-effector displacement per control step
    EE_VELOCITY = "ee_velocity"


class RotationConvention(StrEnum):
    """How rotations inside an action or state are written (see ``policylink.adapters.rotations``)."""

    NONE = "none"
    QUAT_WXYZ = "quat_wxyz"
    QUAT_XYZW = "quat_xyzw"
    ROT6D = "rot6d"
    AXIS_ANGLE = "axis_angle"
    EULER_XYZ = "euler_xyz"


@dataclass(frozen=True)
class FeatureSpec:
    """One observation feature.

    Attributes:
        dtype: numpy dtype name (``"float32"``, ``"uint8"``...) or ``"string"`` for text.
        shape: per-step shape without batch/time dims, e.g. ``(D,)`` or ``(H, W, 3)``; ``()`` for text.
        names: optional per-dimension names (length ``shape[-1]``), e.g. joint names.
        unit: physical unit of the values (``"rad"``, ``"m"``, ``"m/s"``...); images use ``"rgb"``.
    """

    dtype: str
    shape: tuple[int, ...]
    names: tuple[str, ...] | None = None
    unit: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if self.names is not None:
            object.__setattr__(self, "names", tuple(self.names))
        if self.dtype != _STRING_DTYPE and self.dtype not in _NUMERIC_DTYPES:
            raise SpecError(
                [f"dtype: expected one of {sorted(_NUMERIC_DTYPES | {_STRING_DTYPE})}, received {self.dtype!r}"],
                "invalid FeatureSpec",
            )
        if self.names is not None and self.shape and len(self.names) != self.shape[-1]:
            raise SpecError(
                [f"names: expected {self.shape[-1]} names (shape {self.shape}), received {len(self.names)}"],
                "invalid FeatureSpec",
            )

    @property
    def is_image(self) -> bool:
        """True for HWC uint8 RGB frames (``(H, W, 3)``, dtype uint8)."""
        return self.dtype == "uint8" and len(self.shape) == 3 and self.shape[-1] == 3

    @property
    def is_string(self) -> bool:
        """True for text features such as ``task``."""
        return self.dtype == _STRING_DTYPE

    def check(self, key: str, value: Any, batch_dims: int = 0) -> list[str]:
        """Return the problems of ``value`` against this spec (empty when it conforms).

        Args:
            key: the feature's name, used in messages.
            value: the value; numpy array (or str / list of str for text features).
            batch_dims: number of leading batch/time dims that precede the per-step shape.
        """
        if self.is_string:
            return _check_string(key, value, batch_dims)
        if not isinstance(value, np.ndarray):
            return [f"{key}: expected numpy array of dtype {self.dtype}, received {type(value).__name__}"]
        problems = []
        if value.ndim != batch_dims + len(self.shape) or tuple(value.shape[batch_dims:]) != self.shape:
            dims = ["B"] * batch_dims + [str(s) for s in self.shape]
            expected = "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"
            problems.append(f"{key}: expected shape {expected}, received {tuple(value.shape)}")
        if value.dtype != np.dtype(self.dtype):
            problems.append(f"{key}: expected dtype {self.dtype}, received {value.dtype}")
        elif value.dtype.kind == "f" and not np.isfinite(value).all():
            problems.append(f"{key}: expected finite values, received {int((~np.isfinite(value)).sum())} NaN/inf")
        return problems

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (for YAML, JSON, msgpack)."""
        return {
            "dtype": self.dtype,
            "shape": list(self.shape),
            "names": list(self.names) if self.names is not None else None,
            "unit": self.unit,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FeatureSpec:
        """Inverse of :meth:`to_dict`. Raises SpecError on unknown fields."""
        _reject_unknown("FeatureSpec", d, {"dtype", "shape", "names", "unit"})
        return cls(
            dtype=d["dtype"],
            shape=tuple(d["shape"]),
            names=tuple(d["names"]) if d.get("names") is not None else None,
            unit=d.get("unit"),
        )


@dataclass(frozen=True)
class ActionSpec:
    """The action vector an environment accepts and a policy emits, float32 ``(A,)``.

    Attributes:
        names: one name per dimension (``A`` of them).
        control_mode: what the vector commands (:class:`ControlMode`).
        units: one unit per dimension (``"rad"``, ``"m"``, ``"1"`` for the gripper...).
        low, high: per-dimension limits in those units; actions outside are clipped by envs.
        rotation: convention of any rotation block inside the vector (:class:`RotationConvention`).
        gripper_index: index of the gripper dimension, or None. Convention: 0 = open, 1 = closed.
    """

    names: tuple[str, ...]
    control_mode: ControlMode
    units: tuple[str, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    rotation: RotationConvention = RotationConvention.NONE
    gripper_index: int | None = None

    def __post_init__(self) -> None:
        for attr in ("names", "units", "low", "high"):
            object.__setattr__(self, attr, tuple(getattr(self, attr)))
        object.__setattr__(self, "control_mode", ControlMode(self.control_mode))
        object.__setattr__(self, "rotation", RotationConvention(self.rotation))
        a = len(self.names)
        problems = [
            f"{attr}: expected {a} entries (one per action dimension), received {len(getattr(self, attr))}"
            for attr in ("units", "low", "high")
            if len(getattr(self, attr)) != a
        ]
        if not problems:
            problems += [
                f"low/high[{i}] ({self.names[i]}): expected low < high, received {lo} >= {hi}"
                for i, (lo, hi) in enumerate(zip(self.low, self.high))
                if not lo < hi
            ]
        if self.gripper_index is not None and not 0 <= self.gripper_index < a:
            problems.append(f"gripper_index: expected an index in [0, {a}), received {self.gripper_index}")
        if problems:
            raise SpecError(problems, "invalid ActionSpec")

    @property
    def dim(self) -> int:
        """Action dimension ``A``."""
        return len(self.names)

    @property
    def low_array(self) -> np.ndarray:
        """Lower limits, float32 ``(A,)``."""
        return np.asarray(self.low, dtype=np.float32)

    @property
    def high_array(self) -> np.ndarray:
        """Upper limits, float32 ``(A,)``."""
        return np.asarray(self.high, dtype=np.float32)

    def check(self, action: Any, batch_dims: int = 0, check_limits: bool = False) -> list[str]:
        """Problems of an action array ``(*batch, A)`` against this spec (shape, dtype, finiteness, limits)."""
        if not isinstance(action, np.ndarray):
            return [f"action: expected numpy float32 array, received {type(action).__name__}"]
        problems = []
        if action.ndim != batch_dims + 1 or action.shape[-1] != self.dim:
            problems.append(
                f"action: expected shape (..., {self.dim}) with {batch_dims} batch dims, received {tuple(action.shape)}"
            )
        if action.dtype != np.float32:
            problems.append(f"action: expected dtype float32, received {action.dtype}")
        if not problems and not np.all(np.isfinite(action)):
            problems.append("action: expected finite values, received NaN or inf")
        if not problems and check_limits:
            tol = 1e-6
            for i, name in enumerate(self.names):
                col = action[..., i]
                if np.any(col < self.low[i] - tol) or np.any(col > self.high[i] + tol):
                    problems.append(
                        f"action[{i}] ({name}): expected within [{self.low[i]}, {self.high[i]}] "
                        f"{self.units[i]}, received range [{col.min():.4g}, {col.max():.4g}]"
                    )
        return problems

    def validate(self, action: Any, batch_dims: int = 0, check_limits: bool = False) -> np.ndarray:
        """Return ``action`` unchanged if it conforms; raise :class:`ActionError` listing every problem."""
        problems = self.check(action, batch_dims, check_limits)
        if problems:
            raise ActionError(problems)
        return action

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (for YAML, JSON, msgpack)."""
        return {
            "names": list(self.names),
            "control_mode": self.control_mode.value,
            "units": list(self.units),
            "low": list(self.low),
            "high": list(self.high),
            "rotation": self.rotation.value,
            "gripper_index": self.gripper_index,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ActionSpec:
        """Inverse of :meth:`to_dict`. Raises SpecError on unknown fields."""
        _reject_unknown("ActionSpec", d, {"names", "control_mode", "units", "low", "high", "rotation", "gripper_index"})
        return cls(
            names=tuple(d["names"]),
            control_mode=ControlMode(d["control_mode"]),
            units=tuple(d["units"]),
            low=tuple(d["low"]),
            high=tuple(d["high"]),
            rotation=RotationConvention(d.get("rotation", "none")),
            gripper_index=d.get("gripper_index"),
        )


@dataclass(frozen=True)
class PolicySpec:
    """What a policy needs and what it emits.

    Attributes:
        observation_features: required features by key (a subset of what the env provides).
        action: the ActionSpec of emitted chunks.
        n_obs_steps: observation horizon (history window length, steps).
        chunk_size: prediction horizon ``H``; ``predict_action_chunk`` returns ``(B, H, A)``.
        n_action_steps: default action horizon executed before replanning (``<= chunk_size``).
        control_frequency: control rate the policy was trained at, Hz.
    """

    observation_features: Mapping[str, FeatureSpec]
    action: ActionSpec
    n_obs_steps: int = 1
    chunk_size: int = 1
    n_action_steps: int = 1
    control_frequency: float = 10.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "observation_features", dict(self.observation_features))
        problems = []
        for name in ("n_obs_steps", "chunk_size", "n_action_steps"):
            if int(getattr(self, name)) < 1:
                problems.append(f"{name}: expected >= 1, received {getattr(self, name)}")
        if self.n_action_steps > self.chunk_size:
            problems.append(
                f"n_action_steps: expected <= chunk_size ({self.chunk_size}), received {self.n_action_steps}"
            )
        if not self.control_frequency > 0:
            problems.append(f"control_frequency: expected > 0 Hz, received {self.control_frequency}")
        if problems:
            raise SpecError(problems, "invalid PolicySpec")

    @property
    def requires_task(self) -> bool:
        """True when the policy reads the ``task`` instruction."""
        return TASK_KEY in self.observation_features

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (sent in the wire protocol's ``hello`` reply, saved in checkpoints)."""
        return {
            "observation_features": {k: v.to_dict() for k, v in self.observation_features.items()},
            "action": self.action.to_dict(),
            "n_obs_steps": self.n_obs_steps,
            "chunk_size": self.chunk_size,
            "n_action_steps": self.n_action_steps,
            "control_frequency": self.control_frequency,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PolicySpec:
        """Inverse of :meth:`to_dict`. Raises SpecError on unknown fields."""
        _reject_unknown(
            "PolicySpec",
            d,
            {
                "observation_features",
                "action",
                "n_obs_steps",
                "chunk_size",
                "n_action_steps",
                "control_frequency",
            },
        )
        return cls(
            observation_features={k: FeatureSpec.from_dict(v) for k, v in d["observation_features"].items()},
            action=ActionSpec.from_dict(d["action"]),
            n_obs_steps=int(d["n_obs_steps"]),
            chunk_size=int(d["chunk_size"]),
            n_action_steps=int(d["n_action_steps"]),
            control_frequency=float(d["control_frequency"]),
        )


@dataclass(frozen=True)
class EnvSpec:
    """What an environment provides and accepts.

    Attributes:
        name: registry name of the environment (``"push"``, ``"reacher"``...).
        observation_features: provided features by key.
        action: the ActionSpec accepted by ``step``.
        control_frequency: control rate, Hz (one ``step`` = ``1 / control_frequency`` seconds).
        max_episode_steps: episode length limit (truncation), steps.
        tasks: language instructions this env can pose (empty for single-task envs).
    """

    name: str
    observation_features: Mapping[str, FeatureSpec]
    action: ActionSpec
    control_frequency: float
    max_episode_steps: int
    tasks: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        object.__setattr__(self, "observation_features", dict(self.observation_features))
        object.__setattr__(self, "tasks", tuple(self.tasks))
        problems = []
        if not self.control_frequency > 0:
            problems.append(f"control_frequency: expected > 0 Hz, received {self.control_frequency}")
        if int(self.max_episode_steps) < 1:
            problems.append(f"max_episode_steps: expected >= 1, received {self.max_episode_steps}")
        if problems:
            raise SpecError(problems, f"invalid EnvSpec {self.name!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (sent by env servers' ``hello``)."""
        return {
            "name": self.name,
            "observation_features": {k: v.to_dict() for k, v in self.observation_features.items()},
            "action": self.action.to_dict(),
            "control_frequency": self.control_frequency,
            "max_episode_steps": self.max_episode_steps,
            "tasks": list(self.tasks),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EnvSpec:
        """Inverse of :meth:`to_dict`. Raises SpecError on unknown fields."""
        _reject_unknown(
            "EnvSpec",
            d,
            {"name", "observation_features", "action", "control_frequency", "max_episode_steps", "tasks"},
        )
        return cls(
            name=d["name"],
            observation_features={k: FeatureSpec.from_dict(v) for k, v in d["observation_features"].items()},
            action=ActionSpec.from_dict(d["action"]),
            control_frequency=float(d["control_frequency"]),
            max_episode_steps=int(d["max_episode_steps"]),
            tasks=tuple(d.get("tasks", ())),
        )


def _check_string(key: str, value: Any, batch_dims: int) -> list[str]:
    if batch_dims == 0:
        return [] if isinstance(value, str) else [f"{key}: expected str, received {type(value).__name__}"]
    if isinstance(value, np.ndarray) and value.dtype.kind == "U":
        return []
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return []
    return [f"{key}: expected a list of str (one per batch element), received {type(value).__name__}"]


def _reject_unknown(what: str, d: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise SpecError([f"{k}: unknown field (allowed: {sorted(allowed)})" for k in unknown], f"invalid {what}")
