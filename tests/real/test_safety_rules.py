"""Property test of the safety layer against an independent model of its documented rules (real/README.md).

Random sequences of actions (valid in-bounds, valid out-of-bounds and every malformed kind), observations, homes,
resets, motions by hand, e-stops, clock advances that trip the watchdog, and re-arms drive a :class:`SafeRobot` over
a fake arm that tracks its commands exactly. The model keeps its own e-stop latch and watchdog (it never reads the
layer's state) and checks every command the arm receives:

- finite, shape ``(A,)``, within ``[low, high]``;
- within ``max_step`` of the arm's pose *before* the write (pose mode) or of zero (delta mode);
- inside the workspace box (the arm's pose never leaves it: homes and hand motions land inside);
- while latched (e-stop, tripped watchdog) nothing but the hold (no motion) reaches the arm;
- a valid action that already meets every rule reaches the arm unchanged (so refusing everything cannot pass).
"""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from policylink.adapters.schema import ActionSpec, ControlMode, EnvSpec, FeatureSpec
from policylink.real.robot import Robot, SafeRobot
from policylink.real.safety import SafetyConfig

LOW, HIGH, STEP, WATCHDOG = -1.0, 1.0, 0.25, 0.5
WS_LOW, WS_HIGH = (-0.6, -0.8), (0.6, 0.8)
EPS = 1e-5  # float32 rounding of pose +- step
F32_MAX = float(np.finfo(np.float32).max)  # a finite float64 beyond it is malformed (overflow)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


class Arm(Robot):
    """A 2-D arm: pose modes track the command exactly; delta mode adds it to the position."""

    def __init__(self, mode: str):
        self.env_spec = EnvSpec(
            name="arm",
            observation_features={"observation.state": FeatureSpec("float32", (2,))},
            action=ActionSpec(("a0", "a1"), ControlMode(mode), ("rad", "rad"), (LOW, LOW), (HIGH, HIGH)),
            control_frequency=10.0,
            max_episode_steps=1000,
        )
        self.delta = mode == "ee_delta"
        self.pose = np.zeros(2, np.float32)
        self.home_pose = np.zeros(2, np.float32)
        self.writes: list[tuple[np.ndarray, np.ndarray]] = []  # (pose before the write, command)

    def get_observation(self):
        return {"observation.state": self.pose.copy()}

    def measured_pose(self):
        return None if self.delta else self.pose.copy()

    def send_action(self, action):
        cmd = np.array(action, np.float32)
        self.writes.append((self.pose.copy(), cmd))
        self.pose = (self.pose + cmd) if self.delta else cmd
        return cmd

    def home(self):
        self.pose = self.home_pose.copy()


class Rules:
    """The documented latch and watchdog rules, kept apart from the layer."""

    def __init__(self):
        self.estop, self.watchdog, self.last_valid = False, "unarmed", -math.inf

    def poll(self, now: float) -> None:
        if self.watchdog == "armed" and now - self.last_valid > WATCHDOG:
            self.watchdog = "tripped"

    def latched(self) -> bool:
        return self.estop or self.watchdog == "tripped"

    def action(self, now: float, valid: bool) -> None:
        self.poll(now)
        if not self.latched() and valid:
            self.watchdog, self.last_valid = "armed", now

    def session_start(self) -> None:  # home / reset: disarm unless tripped
        if self.watchdog != "tripped":
            self.watchdog = "unarmed"


_inside = st.tuples(st.floats(WS_LOW[0], WS_HIGH[0]), st.floats(WS_LOW[1], WS_HIGH[1]))
_wild = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(-5.0, 5.0))
_malformed = st.one_of(
    st.sampled_from(
        [
            [[0.0], 0.0],
            "0.1 0.2",
            b"\x00",
            None,
            {"a0": 0.0},
            [0.1, 0.2, 0.3],
            np.zeros((2, 2)),
            [1e300, 0.0],
            [10**400, 0],
            [1 + 1j, 0.0],
            [True, False],
            ["0.1", "0.2"],
        ]
    ),
    st.lists(_wild, min_size=0, max_size=3).filter(lambda v: len(v) != 2),  # wrong length (NaN/inf: "wild")
)
_ops = st.one_of(
    st.tuples(st.just("fit"), st.tuples(st.floats(-1.0, 1.0), st.floats(-1.0, 1.0))),
    st.tuples(st.just("wild"), st.lists(_wild, min_size=2, max_size=2)),
    st.tuples(st.just("garbage"), _malformed),
    st.tuples(st.just("home"), _inside),
    st.tuples(st.just("reset"), _inside),
    st.tuples(st.just("hand"), _inside),
    st.tuples(st.just("wait"), st.sampled_from([0.1, 0.3, 0.6])),
    st.tuples(st.just("estop"), st.none()),
    st.tuples(st.just("reset_estop"), st.none()),
    st.tuples(st.just("rearm"), st.none()),
    st.tuples(st.just("hold"), st.none()),
)


def _fitting(arm: Arm, u: tuple[float, float]) -> np.ndarray:
    """A valid action meeting every rule: ``u`` in [-1, 1] scaled into the step box around the reference, inside
    the limits and the workspace (with a margin against float32 rounding)."""
    ref = np.zeros(2) if arm.delta else arm.pose.astype(np.float64)
    lo = np.maximum(ref - STEP, LOW) + 1e-3
    hi = np.minimum(ref + STEP, HIGH) - 1e-3
    target_lo, target_hi = np.asarray(WS_LOW) + 1e-3, np.asarray(WS_HIGH) - 1e-3
    if arm.delta:  # workspace bounds position + command
        target_lo, target_hi = target_lo - arm.pose, target_hi - arm.pose
    lo, hi = np.maximum(lo, target_lo), np.minimum(hi, target_hi)
    return (lo + (np.asarray(u) + 1.0) / 2.0 * np.maximum(hi - lo, 0.0)).astype(np.float32)


def _check_write(arm: Arm, pose: np.ndarray, cmd: np.ndarray, latched: bool) -> None:
    assert cmd.shape == (2,) and np.all(np.isfinite(cmd))
    assert np.all(cmd >= LOW) and np.all(cmd <= HIGH)
    ref = np.zeros(2, np.float32) if arm.delta else pose
    assert np.all(np.abs(cmd - ref) <= STEP + EPS), (pose, cmd)
    target = pose + cmd if arm.delta else cmd
    assert np.all(target >= np.asarray(WS_LOW) - EPS) and np.all(target <= np.asarray(WS_HIGH) + EPS)
    if latched:  # nothing but the hold: no motion
        np.testing.assert_array_equal(cmd, np.zeros(2, np.float32) if arm.delta else pose)


def _apply(op: str, arg, safe: SafeRobot, arm: Arm, clock: Clock, rules: Rules) -> None:
    n = len(arm.writes)
    if op in ("fit", "wild", "garbage"):
        action = _fitting(arm, arg) if op == "fit" else arg
        valid = op == "fit" or (op == "wild" and all(math.isfinite(x) and abs(x) <= F32_MAX for x in arg))
        safe.get_observation()  # the robot server's client observes before it acts
        rules.action(clock(), valid)
        latched = rules.latched()
        safe.send_action(action)
        if op == "fit" and not latched:
            assert len(arm.writes) == n + 1
            np.testing.assert_array_equal(arm.writes[-1][1], action)  # passes unchanged
    elif op in ("home", "reset"):
        arm.home_pose[:] = arg
        if rules.estop:
            return  # refused while e-stopped (tested in test_safety.py)
        safe.home() if op == "home" else safe.reset()
        rules.session_start()
    elif op == "hand":
        arm.pose[:] = arg  # moved by something the layer did not command
    elif op == "wait":
        clock.t += arg
        rules.poll(clock())
        safe.poll_watchdog()
    elif op == "estop":
        rules.estop = True
        safe.estop("test")
    elif op == "reset_estop":
        rules.estop, rules.watchdog = False, "unarmed"
        safe.reset_estop()
    elif op == "rearm":
        rules.watchdog = "unarmed"
        safe.rearm()
    else:
        safe.hold()
    for pose, cmd in arm.writes[n:]:
        _check_write(arm, pose, cmd, rules.latched())


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["joint_position", "ee_delta"]), st.lists(_ops, min_size=1, max_size=40))
def test_every_command_reaching_the_arm_meets_the_documented_rules(mode, ops):
    arm, clock, rules = Arm(mode), Clock(), Rules()
    config = SafetyConfig.from_action_spec(
        arm.env_spec.action,
        max_step=STEP,
        workspace_low=WS_LOW,
        workspace_high=WS_HIGH,
        workspace_action=(0, 1),
        workspace_state=(0, 1),
        watchdog_s=WATCHDOG,
    )
    safe = SafeRobot(arm, config, clock=clock, watchdog_thread=False)
    for op, arg in ops:
        _apply(op, arg, safe, arm, clock, rules)
    assert (safe.safety.watchdog.value == "tripped") == (rules.watchdog == "tripped")
    assert safe.safety.estopped == rules.estop
