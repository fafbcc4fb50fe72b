"""MetaWorld (Yu et al. 2019, arXiv 1910.10897; ``metaworld`` 3.1.1, v3 tasks) as an EnvAdapter. Runs INSIDE the
MetaWorld venv (``policylink envs install metaworld``), served by :mod:`policylink.sim.isolated.server`: it imports
the contract (``policylink.adapters``), numpy, gymnasium and MuJoCo (the venv's 3.3.0), never torch or our own
MuJoCo tasks. The host side is :mod:`policylink.sim.isolated.metaworld`.

Settings follow the MT10 benchmark: the goal is observable (the last 3 of the 39 state dimensions), each reset
draws a new object/goal configuration, and success is MetaWorld's own ``info["success"]``. Seeded resets reproduce:
``reset(seed=s)`` seeds the env's generator (``env.seed(s)``) before drawing, so the same seed gives the same
initial configuration and, with the same actions, the same episode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from policylink.adapters.env import EnvAdapter
from policylink.adapters.obs_modes import check_obs_mode
from policylink.adapters.schema import (
    IMAGE_PREFIX,
    STATE_KEY,
    TASK_KEY,
    ActionSpec,
    ControlMode,
    EnvSpec,
    FeatureSpec,
)
from policylink.adapters.validation import STEP_BEFORE_RESET, coerce_action

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
"""The ten MT10 tasks (Yu et al. 2019, section 5), v3 in ``metaworld`` 3.x (``<task>-v3``)."""

INSTRUCTIONS: dict[str, str] = {
    "reach": "reach a goal position",
    "push": "push the puck to a goal",
    "pick-place": "pick and place a puck to a goal",
    "door-open": "open a door with a revolving joint",
    "drawer-open": "open a drawer",
    "drawer-close": "push and close a drawer",
    "button-press-topdown": "press a button from the top",
    "peg-insert-side": "insert a peg sideways",
    "window-open": "push and open a window",
    "window-close": "push and close a window",
}
"""Language instruction per task: the task descriptions of the MetaWorld paper (Yu et al. 2019, appendix table of
the 50 tasks), lower-case."""

CAMERAS: tuple[str, ...] = ("corner", "corner2", "corner3", "corner4", "topview", "behindGripper", "gripperPOV")
"""The cameras of MetaWorld's Sawyer scenes (``model.camera(i).name``)."""
UPSIDE_DOWN: frozenset[str] = frozenset({"corner", "corner2", "corner3", "corner4"})
"""Cameras whose MJCF orientation renders the scene upside down (table above the floor); their frames are rotated
180 degrees so the floor is down (checked by eye on ``pick-place``; LeRobot's MetaWorld env flips them too)."""

OBS_MODES: tuple[str, ...] = ("state", "image", "state+image", "image+proprio")
"""The observation modes this env takes (:data:`policylink.adapters.obs_modes.OBS_MODES`' vocabulary)."""

_OBJ = ("x", "y", "z", "qw", "qx", "qy", "qz")
_FRAME = ["hand_x", "hand_y", "hand_z", "gripper_opening"] + [f"obj{i}_{c}" for i in (1, 2) for c in _OBJ]
STATE_NAMES: tuple[str, ...] = tuple(_FRAME + [f"prev_{n}" for n in _FRAME] + ["goal_x", "goal_y", "goal_z"])
"""The 39 state dimensions: this frame's hand position (m), gripper opening (1), two objects' positions (m) and
quaternions (wxyz; zero-padded when a task has fewer objects), the same 18 of the previous frame, the goal (m)."""
_UNITS = (["m"] * 3 + ["1"] + (["m"] * 3 + ["1"] * 4) * 2) * 2 + ["m"] * 3
PROPRIO_DIMS = 4
"""``image+proprio``'s state: the first 4 of :data:`STATE_NAMES` (hand position, m; gripper opening), the
robot's own part; the objects and the goal come only from the pixels."""

EXPERT_OPTION = "expert_actions"
"""The ``reset`` option that turns the expert's action in every info on (True) or off (False)."""
ACTION_SPEC = ActionSpec(
    names=("hand_dx", "hand_dy", "hand_dz", "gripper_effort"),
    control_mode=ControlMode.EE_DELTA,
    units=("cm", "cm", "cm", "1"),
    low=(-1.0, -1.0, -1.0, -1.0),
    high=(1.0, 1.0, 1.0, 1.0),
)
"""MetaWorld's action: mocap displacement per step (``action_scale`` = 1/100 m, so 1 unit = 1 cm) and the gripper
effort in MetaWorld's own convention (-1 open, +1 closed; not the contract's 0/1, so no ``gripper_index``)."""


class MetaWorldAdapter(EnvAdapter):
    """One MetaWorld task behind the contract.

    Observations: ``observation.state`` float32 ``(39,)`` (:data:`STATE_NAMES`; ``(4,)``, the hand and gripper
    (:data:`PROPRIO_DIMS`), in ``image+proprio``), ``observation.images.<camera>``
    uint8 ``(S, S, 3)`` per camera (rendered once per step with :class:`mujoco.Renderer`, no shadows or
    multisampling), ``task`` (the instruction). ``info["is_success"]`` is MetaWorld's ``info["success"]``; an
    episode terminates at its first success (MetaWorld's ``AutoTerminateOnSuccessWrapper`` behaviour) and is
    truncated at ``max_episode_steps``. With ``expert_actions`` every reset/step info carries
    ``info["expert_action"]``: float32 ``(4,)``, MetaWorld's scripted policy (``metaworld.policies``) on the
    returned observation, clipped to [-1, 1] (~30 us of CPU a step, so off unless asked for: ``reset(options=
    {"expert_actions": True})`` turns it on from that reset on, as the host's expert does, and ``False`` off).

    Args:
        raw_env: a MetaWorld ``SawyerXYZEnv`` (or an object with its API: ``seed``, ``reset``, ``step`` returning
            a 39-d float64 observation and ``info["success"]``, ``dt``, ``max_path_length``, ``model``, ``data``).
        task: the task name (``"push"``), for the spec name ``metaworld/<task>`` and the instruction.
        obs_mode: ``"state"``, ``"image"``, ``"state+image"`` or ``"image+proprio"``.
        image_size: side of the square frames, pixels.
        cameras: camera names (:data:`CAMERAS`) observed in the image modes.
        expert: the scripted policy (``get_action(obs) -> (4,)``), needed for ``expert_actions``.
        expert_actions: put the expert's action in every info from the first reset.
        max_episode_steps: truncation, steps (at most the benchmark's ``max_path_length``, 500).
        render_mode: None or ``"rgb_array"`` (:meth:`render` returns the first camera, or ``corner2``).

    Raises:
        ValueError: unknown ``obs_mode`` or camera, ``image_size < 1``, ``max_episode_steps`` outside
            ``1..max_path_length``, ``expert_actions`` without an ``expert``.
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"]}

    def __init__(
        self,
        raw_env: Any,
        task: str,
        obs_mode: str = "state",
        image_size: int = 96,
        cameras: Sequence[str] = ("corner2",),
        expert: Any = None,
        expert_actions: bool = False,
        max_episode_steps: int | None = None,
        render_mode: str | None = None,
    ):
        check_obs_mode(obs_mode, OBS_MODES)
        if int(image_size) < 1:
            raise ValueError(f"image_size: expected a positive number of pixels, received {image_size}")
        bad = [c for c in cameras if c not in CAMERAS]
        if bad or not cameras:
            raise ValueError(f"cameras: expected a non-empty list of {list(CAMERAS)}, received {list(cameras)}")
        limit = int(raw_env.max_path_length)
        steps = limit if max_episode_steps is None else int(max_episode_steps)
        if not 1 <= steps <= limit:
            raise ValueError(f"max_episode_steps: expected 1..{limit} (the benchmark's limit), received {steps}")
        if expert_actions and expert is None:
            raise ValueError("expert_actions: expected an expert (MetaWorld's scripted policy), received None")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode: expected None or 'rgb_array', received {render_mode!r}")
        self.raw_env, self.task_name, self.obs_mode = raw_env, task, obs_mode
        self.size, self.cameras = int(image_size), tuple(cameras)
        self.expert, self.expert_actions, self.render_mode = expert, bool(expert_actions), render_mode
        self.task = INSTRUCTIONS.get(task, task.replace("-", " "))
        features: dict[str, FeatureSpec] = {}
        n = PROPRIO_DIMS if obs_mode == "image+proprio" else len(STATE_NAMES)
        if obs_mode != "image":
            features[STATE_KEY] = FeatureSpec("float32", (n,), names=STATE_NAMES[:n], unit=",".join(_UNITS[:n]))
        if "image" in obs_mode:
            for cam in self.cameras:
                features[IMAGE_PREFIX + cam] = FeatureSpec("uint8", (self.size, self.size, 3), unit="rgb")
        features[TASK_KEY] = FeatureSpec("string", ())
        self.env_spec = EnvSpec(
            name=f"metaworld/{task}",
            observation_features=features,
            action=ACTION_SPEC,
            control_frequency=1.0 / float(raw_env.dt),
            max_episode_steps=steps,
            tasks=(self.task,),
        )
        self._init_spaces()
        self._renderer: Any = None
        self._t, self._needs_reset = 0, True

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict[str, Any], dict]:
        """Draw a new configuration (from ``seed`` when given: same seed, same configuration); returns
        ``(obs, info)`` with ``info["is_success"] = False``. ``options={"expert_actions": bool}`` turns the expert's
        action in every info on or off from this reset on (other options are ignored).

        Raises:
            ValueError: ``expert_actions`` is not a bool, or True on an adapter without an expert.
        """
        if options and EXPERT_OPTION in options:
            on = options[EXPERT_OPTION]
            if type(on) is not bool or (on and self.expert is None):
                wanted = "a bool" if self.expert is not None else "False (this adapter has no expert)"
                raise ValueError(f"options.{EXPERT_OPTION}: expected {wanted}, received {on!r}")
            self.expert_actions = on
        super().reset(seed=seed)
        if seed is not None:
            self.raw_env.seed(int(seed))
        raw, _ = self.raw_env.reset()
        self._t, self._needs_reset = 0, False
        return self._observation(raw), self._info(raw, False)

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict]:
        """Step with an array-like ``(A,)`` = 4 (clipped to [-1, 1]); returns gymnasium's 5-tuple (reward:
        MetaWorld's v2 shaped reward, 0..10).

        Raises:
            RuntimeError: ``step`` before ``reset``.
            ActionError: ``action`` is not numeric ``(4,)`` or not finite.
        """
        if self._needs_reset:
            raise RuntimeError(STEP_BEFORE_RESET)
        a = coerce_action(ACTION_SPEC, action)
        raw, reward, _, truncated, raw_info = self.raw_env.step(a)
        self._t += 1
        success = bool(raw_info["success"])
        truncated = bool(truncated) or self._t >= self.env_spec.max_episode_steps
        self._needs_reset = success or truncated
        return self._observation(raw), float(reward), success, truncated, self._info(raw, success)

    def render(self) -> np.ndarray:
        """uint8 ``(S, S, 3)``: the first observed camera's frame of the current state."""
        return self._render(self.cameras[0])

    def close(self) -> None:
        """Free the renderer and the MetaWorld env."""
        renderer, self._renderer = self._renderer, None
        if renderer is not None:
            try:
                renderer.close()
            except Exception:  # noqa: BLE001 (its GL context is current on another thread; process exit frees it)
                pass
        self.raw_env.close()

    def _observation(self, raw: np.ndarray) -> dict[str, Any]:
        obs: dict[str, Any] = {}
        if self.obs_mode != "image":
            state = np.asarray(raw, np.float32)
            obs[STATE_KEY] = state[:PROPRIO_DIMS] if self.obs_mode == "image+proprio" else state
        if "image" in self.obs_mode:
            for cam in self.cameras:
                obs[IMAGE_PREFIX + cam] = self._render(cam)
        obs[TASK_KEY] = self.task
        return obs

    def _info(self, raw: np.ndarray, success: bool) -> dict[str, Any]:
        info: dict[str, Any] = {"is_success": success}
        if self.expert_actions:
            a = np.asarray(self.expert.get_action(np.asarray(raw, np.float64)), np.float32)
            info["expert_action"] = np.clip(a, -1.0, 1.0)
        return info

    def _render(self, camera: str) -> np.ndarray:
        if self._renderer is None:  # made on first use, on the thread that renders (a GL context is per thread)
            import importlib.util

            import mujoco

            if importlib.util.find_spec("triton") is not None:  # a host with torch: Triton's LLVM must load before
                import triton  # noqa: F401  llvmpipe's (see sim.mujoco.rendering.load_llvm_before_gl; not imported
                # here: the venv side imports nothing of sim.mujoco); the MetaWorld venv has no Triton

            model = self.raw_env.model
            model.vis.quality.shadowsize = 0  # DESIGN.md 5: no shadows or multisampling, buffer sized to the frame
            model.vis.quality.offsamples = 0
            model.vis.global_.offwidth = max(self.size, int(model.vis.global_.offwidth))
            model.vis.global_.offheight = max(self.size, int(model.vis.global_.offheight))
            self._renderer = mujoco.Renderer(model, self.size, self.size)
        self._renderer.update_scene(self.raw_env.data, camera=camera)
        frame = self._renderer.render()
        return np.ascontiguousarray(frame[::-1, ::-1]) if camera in UPSIDE_DOWN else frame


def make_metaworld_env(task: str, expert_actions: bool = False, **kwargs: Any) -> MetaWorldAdapter:
    """Build MetaWorld's ``<task>-v3`` env with the MT10 settings (goal observable, a new configuration each
    reset, drawn from the env's seeded generator) and wrap it with its scripted policy as the expert;
    ``expert_actions`` (default off: ~30 us a step that only an expert reads; the host's
    :func:`~policylink.sim.isolated.metaworld.make_metaworld_expert` turns it on through ``reset``) and ``kwargs`` as
    :class:`MetaWorldAdapter`.

    Raises:
        ValueError: ``task`` is no MetaWorld v3 task (names the MT10 tasks), or the adapter's errors.
        ImportError: ``metaworld`` is not installed (run ``policylink envs install metaworld``).
    """
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS
    from metaworld.policies import ENV_POLICY_MAP

    name = f"{task}-v3"
    if name not in ALL_V3_ENVIRONMENTS:
        raise ValueError(f"task: expected a MetaWorld v3 task, e.g. one of {list(MT10_TASKS)}, received {task!r}")
    raw = ALL_V3_ENVIRONMENTS[name]()
    raw._partially_observable = False  # the MT10 setting: the goal is part of the observation
    raw._freeze_rand_vec = False  # draw a new configuration at each reset ...
    raw.seeded_rand_vec = True  # ... from the env's seeded generator (env.seed), not numpy's global one
    raw._set_task_called = True
    del raw.sawyer_observation_space  # a cached property that depends on _partially_observable
    raw.seed(0)
    return MetaWorldAdapter(raw, task, expert=ENV_POLICY_MAP[name](), expert_actions=expert_actions, **kwargs)
