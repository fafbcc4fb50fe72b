"""Contract specs: construction checks, observation validation, compatibility reports, dict round trips."""

import numpy as np
import pytest

from policylink.adapters.compatibility import check_compatible, compatibility_problems
from policylink.adapters.schema import (
    ActionSpec,
    ControlMode,
    EnvSpec,
    FeatureSpec,
    IncompatibleSpecError,
    ObservationError,
    PolicySpec,
    RotationConvention,
    SpecError,
)
from policylink.adapters.validation import batch_size_of, validate_observation

ACTION = ActionSpec(
    names=("x", "y", "gripper"),
    control_mode=ControlMode.EE_DELTA,
    units=("m", "m", "1"),
    low=(-0.05, -0.05, 0.0),
    high=(0.05, 0.05, 1.0),
    gripper_index=2,
)
FEATS = {
    "observation.state": FeatureSpec("float32", (4,), names=("x", "y", "bx", "by"), unit="m"),
    "observation.images.top": FeatureSpec("uint8", (96, 96, 3), unit="rgb"),
}


def make_env_spec(**kw):
    args = dict(
        name="toy",
        observation_features=FEATS,
        action=ACTION,
        control_frequency=10.0,
        max_episode_steps=100,
        tasks=("push the block",),
    )
    args.update(kw)
    return EnvSpec(**args)


def test_feature_spec_is_image_and_string():
    assert FEATS["observation.images.top"].is_image
    assert not FEATS["observation.state"].is_image
    assert FeatureSpec("string", ()).is_string


def test_feature_spec_rejects_bad_dtype_and_names():
    with pytest.raises(SpecError, match="dtype: expected one of"):
        FeatureSpec("float", (3,))
    with pytest.raises(SpecError, match="names: expected 3 names"):
        FeatureSpec("float32", (3,), names=("a", "b"))


def test_action_spec_collects_every_problem():
    with pytest.raises(SpecError) as e:
        ActionSpec(
            names=("a", "b"),
            control_mode="joint_position",
            units=("rad",),
            low=(0.0, 1.0),
            high=(1.0, 0.5),
            gripper_index=5,
        )
    msg = str(e.value)
    assert "units: expected 2 entries" in msg and "received 1" in msg
    assert "gripper_index: expected an index in [0, 2), received 5" in msg
    assert len(e.value.problems) == 2


def test_action_spec_limits_checked_per_dimension():
    ok = np.array([0.01, -0.02, 1.0], dtype=np.float32)
    assert ACTION.validate(ok, check_limits=True) is ok
    bad = np.array([0.2, 0.0, 0.5], dtype=np.float32)
    problems = ACTION.check(bad, check_limits=True)
    assert problems == ["action[0] (x): expected within [-0.05, 0.05] m, received range [0.2, 0.2]"]
    assert "expected dtype float32, received float64" in ACTION.check(ok.astype(np.float64))[0]
    assert "NaN or inf" in ACTION.check(np.array([np.nan, 0, 0], dtype=np.float32))[0]


def test_policy_spec_rejects_action_steps_beyond_chunk():
    with pytest.raises(SpecError, match=r"n_action_steps: expected <= chunk_size \(16\), received 20"):
        PolicySpec(FEATS, ACTION, n_obs_steps=2, chunk_size=16, n_action_steps=20)


def test_validate_observation_lists_missing_shape_and_dtype():
    obs = {"observation.state": np.zeros(5, dtype=np.float64)}
    with pytest.raises(ObservationError) as e:
        validate_observation(FEATS, obs)
    msg = str(e.value)
    assert "observation.state: expected shape (4,), received (5,)" in msg
    assert "observation.state: expected dtype float32, received float64" in msg
    assert "observation.images.top: missing" in msg
    assert len(e.value.problems) == 3


def test_validate_observation_batched_ok_and_extra_keys_allowed():
    obs = {
        "observation.state": np.zeros((3, 4), np.float32),
        "observation.images.top": np.zeros((3, 96, 96, 3), np.uint8),
        "extra": 1,
    }
    assert validate_observation(make_env_spec(), obs, batch_dims=1) is obs
    with pytest.raises(ObservationError, match=r"expected shape \(B, 4\), received \(4,\)"):
        validate_observation(FEATS, {**obs, "observation.state": np.zeros(4, np.float32)}, batch_dims=1)


def test_check_compatible_reports_three_mismatches_at_once():
    policy_feats = {**FEATS, "observation.images.wrist": FeatureSpec("uint8", (96, 96, 3))}
    policy_action = ActionSpec(names=("x", "y"), control_mode="ee_delta", units=("m", "m"), low=(-1, -1), high=(1, 1))
    policy = PolicySpec(
        policy_feats, policy_action, n_obs_steps=2, chunk_size=16, n_action_steps=8, control_frequency=15.0
    )
    env = make_env_spec()
    with pytest.raises(IncompatibleSpecError) as e:
        check_compatible(policy, env)
    msg = str(e.value)
    assert "observation.images.wrist: policy requires this camera" in msg
    assert "action dimension: expected 2 (policy), received 3 (env)" in msg
    assert "control_frequency: expected 15.0 Hz (policy), received 10.0 Hz (env)" in msg
    # the gripper index differs too (None vs 2): every mismatch is listed, nothing stops at the first
    assert "action gripper_index: expected None (policy), received 2 (env)" in msg
    assert len(e.value.problems) == 4


def test_check_compatible_passes_for_matching_specs():
    env = make_env_spec()
    policy = PolicySpec({"observation.state": FEATS["observation.state"]}, ACTION, 2, 16, 8, 10.0)
    check_compatible(policy, env)
    assert compatibility_problems(policy, env) == []


def test_specs_round_trip_through_dicts_and_reject_unknown_fields():
    env = make_env_spec()
    assert EnvSpec.from_dict(env.to_dict()) == env
    policy = PolicySpec(FEATS, ACTION, 2, 16, 8, 10.0)
    assert PolicySpec.from_dict(policy.to_dict()) == policy
    d = ACTION.to_dict()
    d["colour"] = "red"
    with pytest.raises(SpecError, match="colour: unknown field"):
        ActionSpec.from_dict(d)


def test_rotation_convention_is_explicit():
    a = ActionSpec(
        names=("qw", "qx", "qy", "qz"),
        control_mode="ee_position",
        units=("1",) * 4,
        low=(-1,) * 4,
        high=(1,) * 4,
        rotation="quat_wxyz",
    )
    assert a.rotation is RotationConvention.QUAT_WXYZ
    b = ActionSpec.from_dict({**a.to_dict(), "rotation": "quat_xyzw"})
    env = make_env_spec(action=a)
    policy = PolicySpec({}, b, 1, 1, 1, 10.0)
    assert "action rotation: expected quat_xyzw (policy), received quat_wxyz (env)" in compatibility_problems(
        policy, env
    )


def test_batch_size_of_counts_every_feature_and_task():
    obs = {"observation.state": np.zeros((3, 2), np.float32), "task": ["a", "b", "c"]}
    assert batch_size_of(obs) == 3
    assert batch_size_of(obs, ["observation.state", "missing"]) == 3
    with pytest.raises(ObservationError, match=r"received \{'observation.state': 3, 'task': 2\}"):
        batch_size_of({**obs, "task": ["a", "b"]})
    with pytest.raises(ObservationError, match="task: expected a leading batch dim"):
        batch_size_of({"task": "bare"})
    with pytest.raises(ObservationError, match="at least one batched feature"):
        batch_size_of({})
