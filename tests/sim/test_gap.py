"""Reality gap (issue 34): presets load and validate, applying a gap sets the model fields by the stated amount
and is reproducible by seed, randomisation stays within its bounds, actions and observations are changed as
documented, and the drawn parameters reach each recorded episode's metadata."""

import dataclasses
import json

import numpy as np
import pytest

from policylink.adapters.registry import UnknownNameError, make_env
from policylink.adapters.schema import REALITY_GAP_INFO, STATE_KEY
from policylink.sim.mujoco.gap import RealityGap, load_gap, preset_names


def test_every_preset_loads_and_round_trips():
    names = preset_names()
    assert {"worn_gantry", "worn_gantry_delayed", "noisy_sensors", "moved_camera", "lab_robot"} <= set(names)
    for name in names:
        gap = load_gap(name)
        assert gap.name == name and gap.description
        assert RealityGap.from_mapping(gap.to_dict()) == gap
    worn, delayed = load_gap("worn_gantry"), load_gap("worn_gantry_delayed")
    assert worn.dynamics.actuator_gain_scale == 0.3 and worn.dynamics.action_delay_steps == 0
    assert delayed.dynamics == dataclasses.replace(worn.dynamics, action_delay_steps=1)  # base: worn_gantry
    assert load_gap("none") is None and load_gap(None) is None


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"dynamics": {"mass_scale": -1.0}}, "dynamics.mass_scale"),
        ({"dynamics": {"action_delay_steps": 1.5}}, "dynamics.action_delay_steps"),
        ({"sensing": {"drop_frame_probability": 2.0}}, "sensing.drop_frame_probability"),
        ({"sensing": {"joint_noise_std": [0.01, 0.001]}}, "sensing.joint_noise_std"),
        ({"dynamics": {"friction_scale": "high"}}, "dynamics.friction_scale"),
        ({"sensing": {"camera_pitch_deg": 120.0}}, "sensing.camera_pitch_deg"),
        ({"dynamics": {"mass": 2.0}}, "mass"),
        ({"physics": {}}, "physics"),
        ({"randomize": -1}, "randomize"),
    ],
)
def test_bad_values_name_the_field(doc, field):
    with pytest.raises(ValueError, match=field):
        RealityGap.from_mapping(doc)


def test_unknown_preset_lists_the_presets(tmp_path):
    with pytest.raises(UnknownNameError, match=r"received 'worn_gantri'; did you mean 'worn_gantry'\?"):
        load_gap("worn_gantri")
    bad = tmp_path / "bad.yaml"
    bad.write_text("dynamics:\n  damping_scale: -3\n")
    with pytest.raises(ValueError, match="bad.yaml.*dynamics.damping_scale"):
        load_gap(str(bad))


def test_a_file_inherits_a_preset(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("base: worn_gantry\ndynamics:\n  mass_scale: 3.0\n")
    gap = load_gap(str(f))
    assert gap.dynamics.mass_scale == 3.0 and gap.dynamics.actuator_gain_scale == 0.3


def test_a_relative_base_names_the_file_beside_it(tmp_path, monkeypatch):
    sub = tmp_path / "gaps"
    sub.mkdir()
    (sub / "heavy.yaml").write_text("base: worn_gantry\ndynamics:\n  mass_scale: 3.0\n")
    (sub / "mine.yaml").write_text("base: heavy.yaml\ndynamics:\n  friction_scale: 0.5\n")
    monkeypatch.chdir(tmp_path)  # heavy.yaml is not in the working directory
    gap = load_gap("gaps/mine.yaml")
    assert (gap.dynamics.mass_scale, gap.dynamics.friction_scale, gap.dynamics.actuator_gain_scale) == (3.0, 0.5, 0.3)


def test_a_base_cycle_is_one_error_naming_the_files(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("base: b.yaml\n")
    b.write_text(f"base: {a}\n")
    with pytest.raises(ValueError) as err:
        load_gap(str(a))
    assert str(err.value) == (
        f"gap: {a}: base: expected a chain of files that ends in a preset, received a cycle {a} -> {b} -> {a}"
    )
    (tmp_path / "self.yaml").write_text("base: self.yaml\n")
    with pytest.raises(ValueError, match=r"received a cycle .*self.yaml -> .*self.yaml$"):
        load_gap(str(tmp_path / "self.yaml"))


def test_applying_a_gap_scales_the_model_fields():
    nominal, env = make_env("pick_place"), make_env("pick_place", gap="worn_gantry")
    env.reset(seed=3)
    m0, m = nominal.model, env.model
    np.testing.assert_allclose(m.geom_friction[:, 0], 0.6 * m0.geom_friction[:, 0], rtol=1e-12)
    np.testing.assert_allclose(m.geom_friction[:, 1:], m0.geom_friction[:, 1:])
    np.testing.assert_allclose(m.body_mass[1:], 1.5 * m0.body_mass[1:], rtol=1e-12)
    np.testing.assert_allclose(m.body_inertia[1:], 1.5 * m0.body_inertia[1:], rtol=1e-12)
    np.testing.assert_allclose(m.dof_damping, 2.0 * m0.dof_damping, rtol=1e-12)
    kp0 = m0.actuator_gainprm[:, 0]
    np.testing.assert_allclose(m.actuator_gainprm[:, 0], 0.3 * kp0, rtol=1e-12)
    np.testing.assert_allclose(m.actuator_biasprm[:, 1], -0.3 * kp0, rtol=1e-12)
    np.testing.assert_allclose(m.actuator_biasprm[:, 2], m0.actuator_biasprm[:, 2])  # kv untouched
    env.reset(seed=4)  # from the nominal values again: nothing compounds across episodes
    np.testing.assert_allclose(m.body_mass[1:], 1.5 * m0.body_mass[1:], rtol=1e-12)


def test_camera_shift_and_intrinsics_move_the_cameras():
    nominal = make_env("push", randomization=None)
    gap = {"sensing": {"camera_yaw_deg": 90.0, "camera_fovy_deg": 5.0}}
    env = make_env("push", gap=gap)
    env.reset(seed=0)
    nominal.reset(seed=0)
    np.testing.assert_allclose(env.model.cam_fovy, nominal.model.cam_fovy + 5.0)
    cid = env.model.camera("front").id
    # a 90-degree yaw about the workspace centre maps (x, y) to (-y, x) (position jitter of 5 mm aside)
    x0, y0 = nominal.model.cam_pos[cid, :2] - np.asarray(env.workspace_center[:2])
    x1, y1 = env.model.cam_pos[cid, :2] - np.asarray(env.workspace_center[:2])
    np.testing.assert_allclose([x1, y1], [-y0, x0], atol=0.02)


def test_a_range_draw_is_reproducible_by_seed_and_within_bounds():
    doc = {"seed": 7, "dynamics": {"mass_scale": [0.5, 2.0], "action_delay_steps": [0, 3]}}
    a, b = make_env("reach", gap=doc), make_env("reach", gap=doc)
    draws = []
    for seed in range(40):
        _, ia = a.reset(seed=seed)
        _, ib = b.reset(seed=seed)
        assert ia[REALITY_GAP_INFO] == ib[REALITY_GAP_INFO]
        d = json.loads(ia[REALITY_GAP_INFO])["dynamics"]
        assert 0.5 <= d["mass_scale"] <= 2.0 and d["action_delay_steps"] in (0, 1, 2, 3)
        draws.append(d["mass_scale"])
    assert len(set(draws)) == 40 and np.ptp(draws) > 1.0  # really drawn, over most of the range
    other = make_env("reach", gap={**doc, "seed": 8})
    assert other.reset(seed=0)[1][REALITY_GAP_INFO] != a.reset(seed=0)[1][REALITY_GAP_INFO]


def test_randomize_spreads_from_nominal_past_the_preset():
    gap = load_gap({"base": "worn_gantry_delayed", "randomize": 1.5})
    ranges = gap.ranges()
    assert ranges["dynamics.actuator_gain_scale"] == pytest.approx((0.01, 1.0))  # 1 - 1.5 * 0.7 < 0: clipped
    assert ranges["dynamics.mass_scale"] == pytest.approx((1.0, 1.75))
    assert ranges["dynamics.action_delay_steps"] == pytest.approx((0.0, 1.5))
    rng = np.random.default_rng(0)
    for _ in range(200):
        d = gap.sample(rng).dynamics
        assert 0.01 <= d.actuator_gain_scale <= 1.0
        assert 1.0 <= d.mass_scale <= 1.75 and d.action_delay_steps in (0, 1, 2)
        assert 0.0 <= d.backlash_m <= 0.006 + 1e-12
    assert gap.sample(rng).randomize == 0.0


def test_the_same_seed_gives_the_same_start_with_or_without_a_gap():
    nominal, env = make_env("push"), make_env("push", gap="worn_gantry")
    np.testing.assert_array_equal(nominal.reset(seed=11)[0][STATE_KEY], env.reset(seed=11)[0][STATE_KEY])


def test_deadband_backlash_and_delay_shape_the_executed_action():
    doc = {"dynamics": {"deadband_m": 0.002, "backlash_m": 0.004, "action_delay_steps": 1}}
    env = make_env("pick_place", gap=doc)
    env.reset(seed=0)
    rt = env._gap
    # delay: the first executed action is the hold action; the deadband zeroes the 1 mm x command
    assert rt.action([0.001, 0.01, 0.0, 1.0]) == pytest.approx([0.0, 0.0, 0.0, 0.0])
    # backlash: the first 2 mm of y motion (half the play) went into the slack; gripper untouched
    assert rt.action([0.01, 0.01, 0.0, 1.0]) == pytest.approx([0.0, 0.008, 0.0, 1.0])
    # reversing y: the full 4 mm play is crossed before the axis moves back
    assert rt.action([0.0, -0.01, 0.0, 1.0]) == pytest.approx([0.008, 0.01, 0.0, 1.0])
    assert rt.action([0.0, 0.0, 0.0, 0.0]) == pytest.approx([0.0, -0.006, 0.0, 1.0])


def test_sensing_noise_bias_and_dropped_frames():
    doc = {"seed": 1, "sensing": {"joint_bias": 0.01, "joint_noise_std": 0.0, "object_noise_std": 0.003}}
    env, nominal = make_env("pick_place", gap=doc), make_env("pick_place")
    obs, _ = env.reset(seed=5)
    true = env.privileged_state()
    err = obs[STATE_KEY] - true
    assert np.all(np.abs(err[:4]) <= 0.01 + 1e-6) and np.abs(err[:4]).max() > 1e-4  # constant bias
    obs2, *_ = env.step(np.zeros(4, np.float32))
    np.testing.assert_allclose(obs2[STATE_KEY][:4] - env.privileged_state()[:4], err[:4], atol=1e-6)
    assert 0.0005 < np.std(np.concatenate([obs[STATE_KEY][4:] - true[4:]])) < 0.01
    np.testing.assert_array_equal(nominal.reset(seed=5)[0][STATE_KEY], true)  # privileged state is the truth
    drop = make_env("reach", gap={"sensing": {"drop_frame_probability": 1.0}})
    first, _ = drop.reset(seed=0)
    for _ in range(3):
        obs, *_ = drop.step(np.full(3, 0.02, np.float32))
        np.testing.assert_array_equal(obs[STATE_KEY], first[STATE_KEY])  # every later frame dropped


def test_recorded_episodes_carry_their_gap(tmp_path):
    from policylink.data.buffer import EpisodeStore
    from policylink.runtime.record import RecordConfig, record

    out = str(tmp_path / "gap.zarr")
    record(RecordConfig(env="reach", episodes=3, out=out, seed=0, gap="worn_gantry", randomize=1.0), progress=False)
    metas = EpisodeStore(out, "r").all_meta()
    gaps = [json.loads(m.gap) for m in metas]
    assert [g["name"] for g in gaps] == ["worn_gantry"] * 3
    masses = [g["dynamics"]["mass_scale"] for g in gaps]
    assert len(set(masses)) == 3 and all(1.0 <= v <= 1.5 for v in masses)
    assert all(g["randomize"] == 0.0 for g in gaps)  # the drawn values, not the distribution
    nominal = str(tmp_path / "nominal.zarr")
    record(RecordConfig(env="reach", episodes=1, out=nominal, seed=0), progress=False)
    assert EpisodeStore(nominal, "r").episode_meta(0).gap == ""
