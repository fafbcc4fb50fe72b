"""The step's observation is exactly the physics state it reports, bit for bit, on any machine: each step of a seeded
episode (actions over 1.5x the limits, float64 and float32, so clipping is exercised) is compared with the float32 cast
of the MjData fields the task's state is documented to hold, read here by name with numpy and no policylink code; the
progress in the info with the vectorised :meth:`goal_distance` of the same float32 states; reward, terminated and
truncated with the info's success and the episode length.

Unlike ``test_step_reference.py`` (values recorded once, compared within tolerances) nothing here is recorded: both
sides are computed from the same physics in the same process, so they are equal to the last bit wherever they run,
and any change of the per-step path that moves a value shows up as an inequality."""

from __future__ import annotations

import math

import mujoco
import numpy as np
import pytest

from policylink.adapters import registry
from policylink.adapters.schema import STATE_KEY, TASK_KEY
from policylink.sim.mujoco.insert import HOLE_TOP_M
from policylink.sim.mujoco.robot import GRIPPER_OPEN_M

STEPS = 130  # beyond reach's 50-step episodes (a reset inside the loop) and a long stretch of the others


def _ee(m: mujoco.MjModel, d: mujoco.MjData) -> list[float]:
    return d.site_xpos[m.site("ee").id].tolist()


def _opening(m: mujoco.MjModel, d: mujoco.MjData) -> float:
    left, right = (d.qpos[m.joint(n).qposadr[0]] for n in ("finger_left", "finger_right"))
    return float((left + right) / (2.0 * GRIPPER_OPEN_M))


def _mocap(m: mujoco.MjModel, d: mujoco.MjData, body: str) -> list[float]:
    return d.mocap_pos[m.body(body).mocapid[0]].tolist()


def _xpos(m: mujoco.MjModel, d: mujoco.MjData, body: str) -> list[float]:
    return d.xpos[m.body(body).id].tolist()


def _push_state(m: mujoco.MjModel, d: mujoco.MjData) -> list[float]:
    adr = m.jnt_qposadr[m.body("block").jntadr[0]]
    x, y, _, w, qx, qy, qz = d.qpos[adr : adr + 7].tolist()
    yaw = math.atan2(2.0 * (w * qz + qx * qy), 1.0 - 2.0 * (qy * qy + qz * qz))  # rotation about world z
    return [*_ee(m, d)[:2], x, y, math.sin(yaw), math.cos(yaw)]


# the module docstrings' state layouts, from MjData by name
EXPECTED_STATE = {
    "reach": lambda m, d: _ee(m, d) + _mocap(m, d, "target"),
    "push": _push_state,
    "pick_place": lambda m, d: [*_ee(m, d), _opening(m, d), *_xpos(m, d, "cube"), *_mocap(m, d, "target")],
    "insert": lambda m, d: [*_ee(m, d), _opening(m, d), *_xpos(m, d, "peg"), *_mocap(m, d, "hole")[:2], HOLE_TOP_M],
    "multitask": lambda m, d: [
        *_ee(m, d),
        _opening(m, d),
        *(v for c in ("red", "green", "blue") for v in _xpos(m, d, f"cube_{c}")),
    ],
}


def _distance(env, state: np.ndarray) -> float | None:
    """The vectorised goal distance of one float32 state, or None for a task without one (no progress)."""
    d = env.goal_distance(state[None])
    return None if d is None else float(d[0])


@pytest.mark.parametrize("name", sorted(EXPECTED_STATE))
def test_step_observation_is_the_physics_state_bit_for_bit(name):
    env = registry.make_env(name)
    expected_state = EXPECTED_STATE[name]
    try:
        rng = np.random.default_rng(11)
        low, high = env.action_space.low, env.action_space.high
        obs, info = env.reset(seed=5)
        d0 = _distance(env, obs[STATE_KEY])
        t = 0
        for i in range(STEPS):
            a = rng.uniform(1.5 * low - 0.01, 1.5 * high + 0.01)
            obs, reward, terminated, truncated, info = env.step(a if i % 2 else a.astype(np.float32))
            t += 1
            where = f"{name} step {i}"
            state = obs[STATE_KEY]
            assert state.dtype == np.float32 and sorted(obs) == [STATE_KEY, TASK_KEY], where
            np.testing.assert_array_equal(state, np.array(expected_state(env.model, env.data), np.float32), where)
            success = info["is_success"]
            assert type(success) is bool and terminated is success, where
            assert type(reward) is float and reward == (1.0 if success else 0.0), where
            assert truncated is (t >= env.max_episode_steps), where
            if d0 is None:
                assert sorted(info) == ["is_success"], where
            else:
                d = _distance(env, state)
                assert info["progress"] == (1.0 - d / d0 if d0 > 0 else 1.0), where
            if terminated or truncated:
                obs, info = env.reset()
                d0, t = _distance(env, obs[STATE_KEY]), 0
                np.testing.assert_array_equal(obs[STATE_KEY], np.array(expected_state(env.model, env.data), np.float32))
    finally:
        env.close()
