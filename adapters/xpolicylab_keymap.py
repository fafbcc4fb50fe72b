"""The key map between XPolicyLab's Observation Format v1.0 and our contract, both directions.

XPolicyLab (README "Standard Data Formats"; ``debug_env_client.py``) sends observations as nested maps::

    {"data_format_version": "v1.0", "instruction": str,
     "vision": {"cam_head": {"color": uint8 (H, W, 3) RGB, ...}, "cam_wrist": {...}, "cam_third_view": {...}},
     "state": {"arm_joint_state": (DOF,), "ee_joint_state": (EEF_DOF,), "ee_pose": (7,) [x y z qw qx qy qz], ...}}

and an action chunk as a list of per-step maps using the same state keys (``[{"arm_joint_state": (DOF,),
"ee_joint_state": (1,)}, ...]``), flattened per step in the order the keys are declared (arm part, then end
effector; XPolicyLab ``utils/process_data.py`` ``pack_robot_state``, inspect-robots-xpolicylab
``_flatten_action``). Our contract has one ``observation.state`` vector, ``observation.images.<camera>``
frames, ``task`` and a flat float32 action ``(A,)``, so a :class:`KeyMap` declares:

- ``cameras``: v1.0 camera slot -> our image key (``cam_head`` -> ``observation.images.front``);
- ``state``: the v1.0 state keys whose values, concatenated in order, are ``observation.state`` (each with its
  length);
- ``action``: the v1.0 keys whose values, concatenated in order, are our action vector (each with its length);
- ``instruction`` <-> ``task``: always (``instructions[0]`` when only the list form is sent).

:meth:`KeyMap.for_spec` derives a default from a :class:`PolicySpec` (see there); every part can be overridden.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from policylink.adapters.schema import (
    IMAGE_PREFIX,
    STATE_KEY,
    TASK_KEY,
    ControlMode,
    EnvSpec,
    PolicySpec,
    RotationConvention,
)
from policylink.adapters.xpolicylab_wire import describe

CAMERA_SLOTS = ("cam_head", "cam_wrist", "cam_third_view", "cam_left_wrist", "cam_right_wrist")
"""v1.0 camera slots (``vision.<slot>.color``)."""

ARM_KEY, EE_KEY, POSE_KEY = "arm_joint_state", "ee_joint_state", "ee_pose"
POSE_DIM = 7  # [x, y, z, qw, qx, qy, qz]


class FieldError(ValueError):
    """A v1.0 observation or action field is missing or mis-shaped.

    Attributes:
        problems: one ``{"field", "expected", "received"}`` map per problem (the first is also ``field``,
            ``expected`` and ``received`` of :attr:`details`).
    """

    def __init__(self, problems: list[dict[str, str]]):
        self.problems = problems
        super().__init__(
            "; ".join(f"{p['field']}: expected {p['expected']}, received {p['received']}" for p in problems)
        )

    @property
    def details(self) -> dict[str, Any]:
        """The ``details`` of a protocol ``error`` frame: the first problem's fields plus ``problems``."""
        return {**self.problems[0], "problems": self.problems}


@dataclass(frozen=True)
class KeyMap:
    """How one policy's contract travels in XPolicyLab's format.

    Attributes:
        cameras: ``(slot, our image key)`` pairs, e.g. ``(("cam_head", "observation.images.front"),)``.
        state: ``(v1.0 state key, length)`` pairs; concatenated in order they are ``observation.state`` ``(D,)``.
        action: ``(v1.0 action key, length)`` pairs; concatenated in order they are our action ``(A,)``.
    """

    cameras: tuple[tuple[str, str], ...] = ()
    state: tuple[tuple[str, int], ...] = ()
    action: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "cameras", tuple((str(s), str(k)) for s, k in self.cameras))
        object.__setattr__(self, "state", tuple((str(k), int(n)) for k, n in self.state))
        object.__setattr__(self, "action", tuple((str(k), int(n)) for k, n in self.action))
        bad = [
            f"cameras: expected a slot in {list(CAMERA_SLOTS)}, received {s!r}"
            for s, _ in self.cameras
            if s not in CAMERA_SLOTS
        ]
        for part in ("state", "action"):
            bad += [f"{part}: expected a length >= 1 for {k!r}, received {n}" for k, n in getattr(self, part) if n < 1]
        if bad:
            raise ValueError("key map: " + "; ".join(bad))

    @classmethod
    def for_spec(
        cls,
        spec: PolicySpec,
        cameras: Mapping[str, str] | str | None = None,
        state: Sequence[tuple[str, int]] | str | None = None,
        action: Sequence[tuple[str, int]] | str | None = None,
    ) -> KeyMap:
        """The key map of ``spec``, each part given or defaulted.

        Defaults: cameras by name (a camera named like a slot takes it; a name containing ``wrist`` takes
        ``cam_wrist``; others take ``cam_head`` then ``cam_third_view``); ``observation.state`` ``(D,)`` is
        ``arm_joint_state`` ``(D-1,)`` + ``ee_joint_state`` ``(1,)`` when its last name contains ``gripper``,
        else ``arm_joint_state`` ``(D,)``; the action ``(A,)`` is ``arm_joint_state`` (or ``ee_pose`` for an
        absolute ``quat_wxyz`` pose of 7) ``(A-1,)`` + ``ee_joint_state`` ``(1,)`` when the gripper is the last
        dimension, else ``arm_joint_state`` ``(A,)``.

        Args:
            cameras: slot -> camera (``{"cam_head": "front"}``, or ``"cam_head:front,cam_wrist:wrist"``); a camera
                may be given as its full key ``observation.images.front``.
            state, action: ``[("arm_joint_state", 6), ("ee_joint_state", 1)]`` or ``"arm_joint_state:6,..."``.

        Raises:
            ValueError: a part that does not fit the spec (lengths not summing to ``D`` / ``A``, an unknown
                camera, more cameras than slots), naming the part, expected and received values.
        """
        images = [k for k, f in spec.observation_features.items() if k.startswith(IMAGE_PREFIX) and f.is_image]
        cams = _default_cameras(images) if cameras is None else _camera_pairs(parse_pairs(cameras, "cameras"))
        unknown = [k for _, k in cams if k not in images]
        if unknown:
            raise ValueError(f"key map cameras: expected cameras among {images}, received {unknown}")
        d = spec.observation_features[STATE_KEY].shape[0] if STATE_KEY in spec.observation_features else 0
        names = spec.observation_features[STATE_KEY].names if d else None
        st = _default_state(d, names) if state is None else _int_pairs(parse_pairs(state, "state"))
        act = _default_action(spec) if action is None else _int_pairs(parse_pairs(action, "action"))
        for part, pairs, want in (("state", st, d), ("action", act, spec.action.dim)):
            if sum(n for _, n in pairs) != want:
                raise ValueError(
                    f"key map {part}: expected lengths summing to {want} (the policy's {part}), received "
                    f"{', '.join(f'{k}:{n}' for k, n in pairs) or 'none'}"
                )
        return cls(tuple(cams), tuple(st), tuple(act))

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (sent in our ``hello_ack`` under ``policylink.key_map``)."""
        return {
            "cameras": dict(self.cameras),
            "state": [[k, n] for k, n in self.state],
            "action": [[k, n] for k, n in self.action],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> KeyMap:
        """Inverse of :meth:`to_dict`."""
        return cls(
            tuple(dict(d.get("cameras", {})).items()),
            tuple(map(tuple, d.get("state", ()))),
            tuple(map(tuple, d.get("action", ()))),
        )

    # -- server side: v1.0 in, our batch out; our chunk out as per-step dicts --------------------------------

    def to_batch(self, obs: Any, spec: PolicySpec, instruction: str | None = None) -> dict[str, Any]:
        """A ``B = 1`` observation batch of ``spec`` from one v1.0 observation map.

        ``instruction`` is used when the observation carries none (the case's, from ``prepare_case``).

        Every feature of ``spec`` the map carries is checked here (dtype, shape, finite state values), so the
        batch conforms to ``spec``.

        Raises:
            FieldError: every missing, mis-shaped or non-finite field, named by its v1.0 path (``observation.vision.
                cam_head.color``, ``observation.state.ee_joint_state``, ``observation.instruction``).
        """
        if not isinstance(obs, Mapping):
            raise FieldError([_problem("observation", "a map (Observation Format v1.0)", obs)])
        problems: list[dict[str, str]] = []
        feats, batch = spec.observation_features, {}
        vision = obs.get("vision") if isinstance(obs.get("vision"), Mapping) else {}
        for slot, key in self.cameras:
            cam = vision.get(slot)
            color = cam.get("color") if isinstance(cam, Mapping) else None
            f = feats[key]
            if _array_ok(color, f.dtype, f.shape):
                batch[key] = color[None]
            else:
                problems.append(_problem(f"observation.vision.{slot}.color", f"{f.dtype} array {f.shape}", color))
        if self.state:
            state = obs.get("state") if isinstance(obs.get("state"), Mapping) else {}
            parts = []
            for k, n in self.state:
                v = state.get(k)
                v = np.asarray(v) if isinstance(v, (list, tuple)) else v
                if isinstance(v, np.ndarray) and v.shape == (n,) and v.dtype.kind in "biuf":
                    if v.dtype.kind == "f" and not np.isfinite(v).all():
                        problems.append(
                            {"field": f"observation.state.{k}", "expected": "finite values", "received": "NaN/inf"}
                        )
                    parts.append(v)
                else:
                    problems.append(_problem(f"observation.state.{k}", f"numeric array ({n},)", v))
            if len(parts) == len(self.state):
                dtype = feats[STATE_KEY].dtype
                batch[STATE_KEY] = np.concatenate(parts).astype(dtype, copy=False)[None]
        if TASK_KEY in feats:
            text = obs.get("instruction")
            if text is None and isinstance(obs.get("instructions"), (list, tuple)) and obs["instructions"]:
                text = obs["instructions"][0]
            text = instruction if text is None else text
            if isinstance(text, str):
                batch[TASK_KEY] = [text]
            else:
                problems.append(_problem("observation.instruction", "str (or a prepare_case instruction)", text))
        if problems:
            raise FieldError(problems)
        return batch

    def to_actions(self, chunk: np.ndarray) -> list[dict[str, np.ndarray]]:
        """Per-step action maps of one chunk float32 ``(H, A)``: ``H`` maps of ``{key: float32 (n,)}`` (views).
        The server encodes the same maps directly (:func:`~policylink.adapters.xpolicylab_wire.
        encode_actions_reply`)."""
        bounds = np.cumsum([0, *(n for _, n in self.action)])
        return [{k: row[bounds[i] : bounds[i + 1]] for i, (k, _) in enumerate(self.action)} for row in chunk]

    # -- client side: our observation row out as v1.0; per-step dicts in as a chunk -------------------------

    def to_observation(self, row: Mapping[str, Any], task: str | None) -> dict[str, Any]:
        """A v1.0 observation from one episode's latest observation (our keys, unbatched arrays)."""
        out: dict[str, Any] = {"data_format_version": "v1.0"}
        if task is not None:
            out["instruction"] = task
        if self.cameras:
            out["vision"] = {slot: {"color": row[key]} for slot, key in self.cameras}
        if self.state:
            vec, start, state = np.asarray(row[STATE_KEY]), 0, {}
            for k, n in self.state:
                state[k] = vec[start : start + n]
                start += n
            out["state"] = state
        return out

    def to_chunk(self, actions: Any, where: str = "actions") -> np.ndarray:
        """float32 ``(H, A)`` from a reply's list of per-step action maps.

        Raises:
            FieldError: not a non-empty list of maps, or a step missing a key or with the wrong length.
        """
        if not isinstance(actions, (list, tuple)) or not actions:
            raise FieldError([_problem(where, "a non-empty list of per-step action maps", actions)])
        rows, problems = [], []
        for h, step in enumerate(actions):
            if not isinstance(step, Mapping):
                problems.append(_problem(f"{where}[{h}]", f"a map with keys {[k for k, _ in self.action]}", step))
                continue
            parts = []
            for k, n in self.action:
                v = step.get(k)
                v = np.asarray(v) if isinstance(v, (list, tuple, float, int)) else v
                if isinstance(v, np.ndarray) and v.size == n and v.dtype.kind in "biuf":
                    parts.append(v.reshape(n))
                else:
                    problems.append(_problem(f"{where}[{h}].{k}", f"numeric ({n},)", v))
            if len(parts) == len(self.action):
                rows.append(np.concatenate(parts))
        if problems:
            raise FieldError(problems)
        return np.stack(rows).astype(np.float32, copy=False)


def spec_from_env(
    env_spec: EnvSpec,
    chunk_size: int = 1,
    n_action_steps: int | None = None,
    cameras: Mapping[str, str] | str | None = None,
    state: Sequence[tuple[str, int]] | str | None = None,
    action: Sequence[tuple[str, int]] | str | None = None,
) -> PolicySpec:
    """The spec of a remote XPolicyLab policy running on ``env_spec``: the env's action and control frequency, and
    the observation features the key map carries (mapped cameras, ``observation.state``, ``task`` when the env
    gives one), with ``n_obs_steps = 1`` (the server keeps its own history).

    Raises:
        ValueError: a key map part that does not fit the env (see :meth:`KeyMap.for_spec`).
    """
    feats = env_spec.observation_features
    kept = {k: f for k, f in feats.items() if k in (STATE_KEY, TASK_KEY) or (k.startswith(IMAGE_PREFIX) and f.is_image)}
    full = PolicySpec(kept, env_spec.action, 1, chunk_size, n_action_steps or chunk_size, env_spec.control_frequency)
    km = KeyMap.for_spec(full, cameras, state, action)
    used = {k for _, k in km.cameras} | ({STATE_KEY} if km.state else set()) | {TASK_KEY}
    return PolicySpec(
        {k: f for k, f in kept.items() if k in used},
        full.action,
        1,
        full.chunk_size,
        full.n_action_steps,
        full.control_frequency,
    )


def parse_pairs(value: Mapping[str, Any] | Sequence[Any] | str, what: str) -> list[tuple[str, str]]:
    """``"a:b,c:d"`` (or a mapping, or pairs) as ``[("a", "b"), ("c", "d")]``. Raises ValueError naming ``what``."""
    if isinstance(value, Mapping):
        return [(str(k), str(v)) for k, v in value.items()]
    items: Iterable[Any] = value.split(",") if isinstance(value, str) else value
    out = []
    for item in items:
        if isinstance(item, str):
            if not item.strip():
                continue
            k, sep, v = item.strip().partition(":")
        else:
            k, v = item
            sep = ":"
        if not sep or not str(k).strip() or not str(v).strip():
            raise ValueError(
                f"key map {what}: expected 'key:value' entries such as 'arm_joint_state:6', received {item!r}"
            )
        out.append((str(k).strip(), str(v).strip()))
    return out


def _int_pairs(pairs: list[tuple[str, str]]) -> list[tuple[str, int]]:
    try:
        return [(k, int(n)) for k, n in pairs]
    except ValueError:
        raise ValueError(f"key map: expected 'key:length' entries with integer lengths, received {pairs}") from None


def _camera_pairs(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(slot, cam if cam.startswith(IMAGE_PREFIX) else IMAGE_PREFIX + cam) for slot, cam in pairs]


def _default_cameras(images: list[str]) -> list[tuple[str, str]]:
    free, out, rest = list(CAMERA_SLOTS), [], []
    for key in images:
        name = key[len(IMAGE_PREFIX) :]
        slot = name if name in free else next((s for s in ("cam_wrist",) if "wrist" in name and s in free), None)
        if slot is None:
            rest.append(key)
        else:
            out.append((slot, key))
            free.remove(slot)
    for key in rest:
        slot = next((s for s in ("cam_head", "cam_third_view") if s in free), None)
        if slot is None:
            raise ValueError(f"key map cameras: no free v1.0 slot for {key} (cameras {images}); pass cameras=")
        out.append((slot, key))
        free.remove(slot)
    return out


def _default_state(d: int, names: tuple[str, ...] | None) -> list[tuple[str, int]]:
    if d == 0:
        return []
    if d > 1 and names and "gripper" in names[-1].lower():
        return [(ARM_KEY, d - 1), (EE_KEY, 1)]
    return [(ARM_KEY, d)]


def _default_action(spec: PolicySpec) -> list[tuple[str, int]]:
    a, act = spec.action.dim, spec.action
    if a > 1 and act.gripper_index == a - 1:
        pose = act.control_mode == ControlMode.EE_POSITION and act.rotation == RotationConvention.QUAT_WXYZ
        return [(POSE_KEY if pose and a - 1 == POSE_DIM else ARM_KEY, a - 1), (EE_KEY, 1)]
    return [(ARM_KEY, a)]


def _array_ok(value: Any, dtype: str, shape: tuple[int, ...]) -> bool:
    return isinstance(value, np.ndarray) and value.dtype == np.dtype(dtype) and value.shape == tuple(shape)


def _problem(field: str, expected: str, received: Any) -> dict[str, str]:
    got = received if isinstance(received, str) else describe(received)
    return {"field": field, "expected": expected, "received": got}


__all__ = ["CAMERA_SLOTS", "FieldError", "KeyMap", "parse_pairs", "spec_from_env"]
