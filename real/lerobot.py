"""Any LeRobot ``Robot`` (SO-100/101, Koch, ...) as our :class:`~policylink.real.robot.Robot`: its
``observation_features`` / ``action_features`` dicts become an :class:`EnvSpec` (scalar motor features ->
``observation.state`` and ``action`` in the dict's order; ``(H, W, 3)`` camera features ->
``observation.images.<camera>``), and observations / actions are converted on every call. LeRobot is imported
only by :func:`make_lerobot_robot` (the ``lerobot`` extra); the bridge itself works on any object with that API.

A user with an SO-100 arm writes one config::

    robot = make_lerobot_robot("so100_follower", {"port": "/dev/ttyACM0", "id": "arm"},
                               LeRobotBridgeConfig(low=-100.0, high=100.0, unit="%"))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from policylink.adapters.schema import (
    IMAGE_PREFIX,
    STATE_KEY,
    TASK_KEY,
    ActionSpec,
    ControlMode,
    EnvSpec,
    FeatureSpec,
    SpecError,
)
from policylink.real.robot import Robot


@dataclass(frozen=True)
class LeRobotBridgeConfig:
    """How a LeRobot robot's motors map onto the contract.

    Attributes:
        low, high: command limits per motor in ``unit`` (one float for all, or a ``{motor key: value}`` map);
            LeRobot's SO-100/Koch followers use ``-100..100`` (percent of the calibrated range) by default and
            degrees with ``use_degrees=True``.
        unit: the unit string of every motor (``"%"``, ``"deg"``, ``"rad"``).
        control_mode: a ControlMode value (LeRobot followers take joint positions).
        control_frequency: Hz the robot is driven at.
        max_episode_steps: episode cap, steps.
        name: the EnvSpec name (default: the LeRobot robot's ``name``).
        task: the instruction put in every observation's ``task``.
    """

    low: float | Mapping[str, float] = -100.0
    high: float | Mapping[str, float] = 100.0
    unit: str = "%"
    control_mode: str = ControlMode.JOINT_POSITION.value
    control_frequency: float = 30.0
    max_episode_steps: int = 900
    name: str | None = None
    task: str = ""


class LeRobotRobot(Robot):
    """A LeRobot ``Robot`` behind our contract.

    Args:
        robot: the LeRobot robot (``observation_features``, ``action_features``, ``connect``, ``disconnect``,
            ``get_observation`` -> ``{motor key: float, camera: (H, W, 3) uint8}``, ``send_action`` -> the dict sent).
        config: a :class:`LeRobotBridgeConfig`.

    Attributes:
        state_keys: LeRobot keys of ``observation.state`` in order; ``action_keys`` of ``action``;
            ``cameras``: LeRobot camera key -> our image key.

    Raises:
        SpecError: a feature that is neither a scalar nor an ``(H, W, 3)`` image, or an action feature that is not a
            scalar (the message names the key).
    """

    def __init__(self, robot: Any, config: LeRobotBridgeConfig | None = None):
        self.robot, self.config = robot, config or LeRobotBridgeConfig()
        self._pose: dict[str, float] | None = None
        self.state_keys, self.cameras, images = [], {}, {}
        for key, ft in dict(robot.observation_features).items():
            if _is_scalar(ft):
                self.state_keys.append(key)
            elif isinstance(ft, tuple) and len(ft) == 3 and ft[2] == 3:
                self.cameras[key] = IMAGE_PREFIX + key
                images[IMAGE_PREFIX + key] = FeatureSpec("uint8", tuple(int(v) for v in ft), unit="rgb")
            else:
                raise SpecError(f"observation_features[{key!r}]: expected float or (H, W, 3), received {ft!r}")
        self.action_keys = list(dict(robot.action_features))
        for key, ft in dict(robot.action_features).items():
            if not _is_scalar(ft):
                raise SpecError(f"action_features[{key!r}]: expected float, received {ft!r}")
        c = self.config
        features = {}
        if self.state_keys:
            features[STATE_KEY] = FeatureSpec(
                "float32", (len(self.state_keys),), names=tuple(self.state_keys), unit=c.unit
            )
        features.update(images)
        features[TASK_KEY] = FeatureSpec("string", ())
        action = ActionSpec(
            names=tuple(self.action_keys),
            control_mode=ControlMode(c.control_mode),
            units=(c.unit,) * len(self.action_keys),
            low=_per_key(c.low, self.action_keys, "low"),
            high=_per_key(c.high, self.action_keys, "high"),
        )
        self.env_spec = EnvSpec(
            name=c.name or str(getattr(robot, "name", "lerobot")),
            observation_features=features,
            action=action,
            control_frequency=float(c.control_frequency),
            max_episode_steps=int(c.max_episode_steps),
            tasks=(c.task,) if c.task else (),
        )

    def connect(self) -> None:
        """Connect the LeRobot robot (calibrating if it asks to)."""
        if not getattr(self.robot, "is_connected", False):
            self.robot.connect()

    def disconnect(self) -> None:
        """Disconnect the LeRobot robot."""
        if getattr(self.robot, "is_connected", True):
            self.robot.disconnect()

    def get_observation(self) -> dict[str, Any]:
        """``observation.state`` float32 ``(D,)`` in ``state_keys`` order, images uint8 ``(H, W, 3)``, ``task``.

        Raises:
            KeyError: the LeRobot observation lacks a declared key (named)."""
        raw = self.robot.get_observation()
        obs: dict[str, Any] = {}
        if self.state_keys:
            obs[STATE_KEY] = np.array([float(_get(raw, k)) for k in self.state_keys], np.float32)
            self._pose = {k: float(raw[k]) for k in self.state_keys}
        for key, ours in self.cameras.items():
            obs[ours] = np.asarray(_get(raw, key), np.uint8)
        obs[TASK_KEY] = self.config.task
        return obs

    def measured_pose(self) -> np.ndarray | None:
        """The last observed positions of the action's motors, float32 ``(A,)`` (the safety layer's step reference
        in pose modes); None before any observation or when some action key is not observed."""
        if self._pose is None or not set(self.action_keys) <= set(self._pose):
            return None
        return np.array([self._pose[k] for k in self.action_keys], np.float32)

    def hold_action(self) -> np.ndarray | None:
        """The measured pose (holding = commanding the current pose); None when unknown."""
        return self.measured_pose()

    def send_action(self, action: np.ndarray) -> np.ndarray:
        """Send ``{action key: float}``; returns what LeRobot reports it sent (its own clipping included), float32
        ``(A,)``."""
        a = np.asarray(action, np.float32)
        sent = self.robot.send_action({k: float(a[i]) for i, k in enumerate(self.action_keys)})
        return np.array([float(sent.get(k, a[i])) for i, k in enumerate(self.action_keys)], np.float32)


def make_lerobot_robot(
    robot_type: str, robot_kwargs: Mapping[str, Any], config: LeRobotBridgeConfig | None = None
) -> LeRobotRobot:
    """Build LeRobot's robot of ``robot_type`` (its ``RobotConfig`` registry name, e.g. ``"so100_follower"``) from
    ``robot_kwargs`` and bridge it.

    Raises:
        ModuleNotFoundError: lerobot is not installed (``make lerobot``).
        KeyError: an unknown ``robot_type`` (LeRobot's registry lists the known ones).
    """
    from lerobot.robots import RobotConfig, make_robot_from_config

    cfg = RobotConfig.get_choice_class(robot_type)(**dict(robot_kwargs))
    return LeRobotRobot(make_robot_from_config(cfg), config)


def _is_scalar(ft: Any) -> bool:
    return ft in (float, int) or (isinstance(ft, tuple) and len(ft) == 0)


def _per_key(value: float | Mapping[str, float], keys: list[str], name: str) -> tuple[float, ...]:
    if isinstance(value, Mapping):
        missing = [k for k in keys if k not in value]
        if missing:
            raise SpecError(f"{name}: expected a value for every action key {keys}, missing {missing}")
        return tuple(float(value[k]) for k in keys)
    return (float(value),) * len(keys)


def _get(raw: Mapping[str, Any], key: str) -> Any:
    if key not in raw:
        raise KeyError(f"LeRobot observation: expected key {key!r}, received {sorted(raw)}")
    return raw[key]


__all__ = ["LeRobotBridgeConfig", "LeRobotRobot", "make_lerobot_robot"]
