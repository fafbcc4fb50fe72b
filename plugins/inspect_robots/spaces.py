"""The policylink contract in inspect-robots' terms, both ways: an :class:`~policylink.adapters.schema.ActionSpec`
as an action ``Box`` with ``ActionSemantics``, observation features as an ``ObservationSpace`` (cameras and a
``StateSpec``), an observation dict as an ``Observation`` and back (a batch of one), an ``Action`` as the float32
``(A,)`` an env steps with.

The mapping (inspect-robots 0.60.0, ``inspect_robots.spaces`` / ``inspect_robots.types``):

- ``control_mode``: ``ee_delta`` -> ``eef_delta_pos`` (``eef_delta_pose`` when the vector holds a rotation),
  ``ee_position`` -> ``eef_abs_pose``, ``joint_position`` -> ``joint_pos``, ``joint_velocity`` -> ``joint_vel``;
  ``joint_torque`` and ``ee_velocity`` have no inspect-robots equivalent and are refused (an embodiment must not
  claim a control mode it does not have). The rotation convention keeps its name (``quat_wxyz``, ``rot6d``...).
  A gripper dimension is ``continuous`` (policylink's convention: 0 = open, 1 = closed; stated in the docs).
  ``dim_labels`` are the ActionSpec's names; ``low``/``high`` its limits, float64, in its units.
- cameras: ``observation.images.<camera>`` (uint8 ``(H, W, 3)``) is camera ``<camera>`` of ``Observation.images``.
- state: every other numeric feature (``observation.state``, ``observation.environment_state``,
  ``observation.pointmaps.<camera>``) is a ``StateField`` and an ``Observation.state`` entry under its full
  contract key, with its shape, dtype and unit; per-dimension names and units are in the embodiment's docs.
- ``task`` (str) is ``Observation.instruction``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from inspect_robots.spaces import ActionSemantics, Box, CameraSpec, ObservationSpace, StateField, StateSpec
from inspect_robots.types import Action, Observation

from policylink.adapters.schema import (
    IMAGE_PREFIX,
    TASK_KEY,
    ActionError,
    ActionSpec,
    ControlMode,
    EnvSpec,
    FeatureSpec,
    ObservationError,
    RotationConvention,
    SpecError,
)

_CONTROL_MODES = {
    ControlMode.JOINT_POSITION: "joint_pos",
    ControlMode.JOINT_VELOCITY: "joint_vel",
    ControlMode.EE_POSITION: "eef_abs_pose",
    ControlMode.EE_DELTA: "eef_delta_pos",  # eef_delta_pose when the vector holds a rotation
}


def control_mode_of(action: ActionSpec) -> str:
    """inspect-robots' ``ControlMode`` of ``action`` (see the module docstring).

    Raises:
        SpecError: ``joint_torque`` or ``ee_velocity`` (no inspect-robots equivalent), naming the field.
    """
    if action.control_mode not in _CONTROL_MODES:
        raise SpecError(
            [
                f"action.control_mode: expected one of {[m.value for m in _CONTROL_MODES]} (those inspect-robots "
                f"can express), received {action.control_mode.value!r}"
            ],
            "no inspect-robots control mode",
        )
    if action.control_mode == ControlMode.EE_DELTA and action.rotation != RotationConvention.NONE:
        return "eef_delta_pose"
    return _CONTROL_MODES[action.control_mode]


def action_box(action: ActionSpec) -> Box:
    """The action ``Box``: shape ``(A,)``, float64 ``low``/``high`` (the ActionSpec's limits, in its units) and
    ``ActionSemantics`` (control mode, rotation, gripper, ``dim_labels`` = the ActionSpec's names).

    Raises:
        SpecError: a control mode inspect-robots cannot express (:func:`control_mode_of`).
    """
    semantics = ActionSemantics(
        control_mode=control_mode_of(action),  # type: ignore[arg-type]
        rotation_repr=action.rotation.value,  # type: ignore[arg-type]
        gripper="continuous" if action.gripper_index is not None else "none",
        frame="base",
        dim_labels=tuple(action.names),
    )
    return Box(
        shape=(action.dim,),
        low=np.asarray(action.low, dtype=np.float64),
        high=np.asarray(action.high, dtype=np.float64),
        semantics=semantics,
    )


def camera_name(key: str) -> str:
    """``"front"`` for ``"observation.images.front"``."""
    return key[len(IMAGE_PREFIX) :]


def observation_space(features: Mapping[str, FeatureSpec]) -> ObservationSpace:
    """Cameras (one ``CameraSpec`` per image feature) and a ``StateSpec`` (one ``StateField`` per other numeric
    feature, keyed by its contract key, with shape, dtype and unit); ``task`` is the instruction, not a field."""
    cameras = tuple(
        CameraSpec(name=camera_name(k), height=f.shape[0], width=f.shape[1], channels=f.shape[2])
        for k, f in features.items()
        if f.is_image and k.startswith(IMAGE_PREFIX)
    )
    fields = tuple(
        StateField(key=k, shape=tuple(f.shape), unit=f.unit or "", dtype=f.dtype)
        for k, f in features.items()
        if not f.is_string and not (f.is_image and k.startswith(IMAGE_PREFIX))
    )
    return ObservationSpace(cameras=cameras, state=StateSpec(fields=fields) if fields else None)


def to_observation(obs: Mapping[str, Any], features: Mapping[str, FeatureSpec]) -> Observation:
    """One env observation (arrays without batch dim, ``task`` a str) as an inspect-robots ``Observation``: images
    by camera name, every other numeric feature in ``state`` under its contract key (the env's arrays, not
    copies), ``task`` as ``instruction`` (None when the env has no ``task`` feature)."""
    images, state = {}, {}
    for key, feat in features.items():
        if feat.is_string or key not in obs:
            continue
        if feat.is_image and key.startswith(IMAGE_PREFIX):
            images[camera_name(key)] = obs[key]
        else:
            state[key] = obs[key]
    instruction = obs.get(TASK_KEY)
    return Observation(images=images, state=state, instruction=None if instruction is None else str(instruction))


def observation_batch(
    observation: Observation, features: Mapping[str, FeatureSpec], instruction: str | None = None
) -> dict[str, Any]:
    """The observation a policy with ``features`` reads, as a batch of one: arrays ``(1, *shape)`` (numeric state
    converted to the feature's dtype; images as they are), ``task`` a list of one str.

    Args:
        observation: the inspect-robots observation.
        features: the policy's required features.
        instruction: used when ``observation.instruction`` is None (the scene's instruction: embodiments may send
            it with the first observation only).

    Raises:
        ObservationError: a required camera or state entry is missing, a state entry is not numeric, or the policy
            reads ``task`` and there is no instruction; one message naming every such field and what the
            observation holds. Shapes and dtypes are checked by the policy itself (naming the contract key).
    """
    batch: dict[str, Any] = {}
    problems = []
    for key, feat in features.items():
        if feat.is_string:
            text = observation.instruction if observation.instruction is not None else instruction
            if text is None:
                problems.append(f"instruction ({key}): expected a str (the policy reads the task), received None")
            else:
                batch[key] = [str(text)]
        elif feat.is_image and key.startswith(IMAGE_PREFIX):
            cam = camera_name(key)
            if cam not in observation.images:
                problems.append(
                    f"images[{cam!r}] ({key}): missing; the observation has cameras {sorted(observation.images)}"
                )
            else:
                batch[key] = np.asarray(observation.images[cam])[None]
        elif key not in observation.state:
            problems.append(f"state[{key!r}]: missing; the observation has state keys {sorted(observation.state)}")
        else:
            try:
                batch[key] = np.asarray(observation.state[key], dtype=feat.dtype)[None]
            except (TypeError, ValueError) as e:
                problems.append(f"state[{key!r}]: expected numbers of dtype {feat.dtype}, received {e}")
    if problems:
        raise ObservationError(problems)
    return batch


def action_array(action: Action, spec: ActionSpec) -> np.ndarray:
    """``action.data`` as float32 ``(A,)`` for ``env.step`` (values unchanged; the env clips to its limits).

    Raises:
        ActionError: not numeric or not ``A`` values, naming ``action.data`` and the dimension names.
    """
    try:
        a = np.asarray(action.data, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise ActionError([f"action.data: expected {spec.dim} numbers {list(spec.names)}, received {e}"]) from None
    if a.size == spec.dim:
        return a.reshape(spec.dim)
    raise ActionError([f"action.data: expected shape ({spec.dim},) {list(spec.names)}, received {a.shape}"])


def spec_docs(spec: EnvSpec) -> str:
    """The embodiment's operating notes (markdown, for ``EmbodimentInfo.docs``): action dimensions with units and
    limits, the gripper's polarity, each state field's per-dimension names and units, cameras, control rate, the
    instructions the env poses."""
    a = spec.action
    lines = [f"policylink env `{spec.name}` at {spec.control_frequency:g} Hz, episodes of at most "
             f"{spec.max_episode_steps} steps."]  # fmt: skip
    dims = ", ".join(f"{n} [{lo:g}, {hi:g}] {u}" for n, u, lo, hi in zip(a.names, a.units, a.low, a.high))
    lines.append(f"- action ({a.control_mode.value}, rotation {a.rotation.value}): {dims}.")
    if a.gripper_index is not None:
        lines.append(f"- gripper: action dim {a.names[a.gripper_index]} is 0 = open, 1 = closed (fractions close "
                     "partially).")  # fmt: skip
    for key, f in spec.observation_features.items():
        if f.is_string:
            continue
        names = f": {', '.join(f.names)}" if f.names else ""
        lines.append(f"- `{key}` {f.dtype} {tuple(f.shape)} ({f.unit or 'no unit'}){names}.")
    if spec.tasks:
        shown = list(spec.tasks[:3]) + (["..."] if len(spec.tasks) > 3 else [])
        lines.append(f"- instructions ({len(spec.tasks)}): {'; '.join(shown)}.")
    return "\n".join(lines)


__all__ = [
    "action_array",
    "action_box",
    "camera_name",
    "control_mode_of",
    "observation_batch",
    "observation_space",
    "spec_docs",
    "to_observation",
]
