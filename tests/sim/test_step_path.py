"""The MuJoCo step's fast paths give exactly what the contract's slow paths give: the action check and clip on Python
floats equals :func:`coerce_action` (values and errors), and the gantry controller writes the same actuator commands
from Python floats as from a float32 array (the step passes floats; the Genesis mirror passes arrays)."""

from __future__ import annotations

import numpy as np
import pytest

from policylink.adapters import registry
from policylink.adapters.schema import ActionError
from policylink.adapters.validation import coerce_action

TASKS = ("reach", "push", "pick_place", "insert", "multitask", "memory")


def _edge_actions(low: np.ndarray, high: np.ndarray) -> list:
    """Actions at and around the limits: exactly on them, 1e-9 beyond in float64 (rounds onto the float32 limit),
    one float32 ulp beyond, signed zeros, and random values over twice the range as float64, float32 and lists."""
    rng = np.random.default_rng(0)
    lo64, hi64 = low.astype(np.float64), high.astype(np.float64)
    actions = [
        lo64,
        hi64,
        lo64 - 1e-9,
        hi64 + 1e-9,
        np.nextafter(low, np.float32(-np.inf)),
        np.nextafter(high, np.float32(np.inf)),
        -np.zeros_like(lo64),
        np.zeros_like(lo64),
    ]
    for _ in range(200):
        a = rng.uniform(2 * lo64 - 0.01, 2 * hi64 + 0.01)
        actions += [a, a.astype(np.float32), a.tolist()]
    return actions


@pytest.mark.parametrize("name", TASKS)
def test_fast_action_path_is_coerce_action(name):
    env = registry.make_env(name)
    try:
        spec = env.env_spec.action
        for a in _edge_actions(env.action_space.low, env.action_space.high):
            got = env._clipped_action(a)
            want = coerce_action(spec, a)
            assert type(got) is list and all(type(v) is float for v in got)
            np.testing.assert_array_equal(np.array(got, np.float32), want)  # same float32 values, bit for bit
            assert np.array_equal(np.signbit(np.array(got)), np.signbit(want))  # -0.0 stays -0.0, as in np.clip
    finally:
        env.close()


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # 1e300 -> float32 inf
@pytest.mark.parametrize(
    "action, message",
    [
        (None, r"action: expected an array-like of 3 floats .* received None"),
        ("abc", r"action: expected an array-like of 3 floats .* received str"),
        ([0.0, 0.0], r"action: expected shape \(3,\) .* received shape \(2,\)"),
        ([[0.0, 0.0, 0.0]], r"action: expected shape \(3,\) .* received shape \(1, 3\)"),
        ([0.0, np.nan, 0.0], r"action\[1\] \(dy\): expected a finite value, received nan"),
        ([np.inf, 0.0, -np.inf], r"action\[0\] \(dx\): expected a finite value, received inf"),
        ([1e300, 0.0, 0.0], r"action\[0\] \(dx\): expected a finite value, received inf"),  # inf once float32
    ],
)
def test_fast_action_path_raises_the_contract_errors(action, message):
    env = registry.make_env("reach")
    try:
        env.reset(seed=0)
        with pytest.raises(ActionError, match=message):
            env.step(action)
        with pytest.raises(ActionError, match=message):
            coerce_action(env.env_spec.action, action)
    finally:
        env.close()


@pytest.mark.parametrize("name", ["reach", "push", "pick_place"])
def test_controller_writes_the_same_commands_from_floats_and_arrays(name):
    """``GantryController.command`` on Python floats (the step) and on a float32 array (other callers): equal
    actuator commands and targets, for deltas that do and do not hit the workspace limits."""
    a, b = registry.make_env(name), registry.make_env(name)
    try:
        rng = np.random.default_rng(1)
        for seed in range(20):
            a.reset(seed=seed)
            b.reset(seed=seed)
            n = a.robot.n_axes
            delta = rng.uniform(-0.5, 0.5, n).astype(np.float32)  # large: often clipped to the workspace
            grip = float(rng.uniform(0.0, 1.0)) if a.robot.has_gripper else None
            a.robot.command(delta.tolist(), grip=grip)
            b.robot.command(delta, grip=grip)
            np.testing.assert_array_equal(a.data.ctrl, b.data.ctrl)
            np.testing.assert_array_equal(a.robot.target, b.robot.target)
            assert a.robot.target.dtype == np.float64
            # the target is the measured ee plus the delta, clipped to the workspace (the controller's contract)
            ee = a.robot.ee_position[:n]
            expected = np.clip(ee + delta.astype(np.float64), a.robot.low, a.robot.high)
            np.testing.assert_array_equal(a.robot.target, expected)
    finally:
        a.close()
        b.close()
