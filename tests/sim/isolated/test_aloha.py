"""The ALOHA family (gym-aloha through its isolated venv): the scripted end-effector policy's pure parts, the
adapter's observations, success, truncation and expert plan on a fake dm_control scene, the host/venv agreement,
and the real venv when it is installed (skipped otherwise)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from policylink.adapters import registry
from policylink.adapters.schema import ENV_STATE_KEY, IMAGE_PREFIX, STATE_KEY, TASK_KEY
from policylink.sim.isolated import aloha, aloha_env, aloha_script
from policylink.sim.isolated.venvs import installed


def test_axis_angle_and_product_match_known_rotations():
    q = aloha_script.axis_angle_quat((0, 1, 0), -60)
    np.testing.assert_allclose(q, [np.cos(np.pi / 6), 0, -np.sin(np.pi / 6), 0])
    q90 = aloha_script.axis_angle_quat((2, 0, 0), 90)  # the axis is normalised
    np.testing.assert_allclose(aloha_script.quat_mul(q90, q90), [0, 1, 0, 0], atol=1e-12)  # 180 deg about x
    np.testing.assert_allclose(aloha_script.quat_mul([1, 0, 0, 0], q), q)
    with pytest.raises(ValueError, match="axis: expected a non-zero 3-vector"):
        aloha_script.axis_angle_quat((0, 0, 0), 10)


def test_transfer_cube_script_goes_to_the_cube_then_the_meeting_point():
    left0 = np.array([-0.31718881, 0.5, 0.29525084, 1, 0, 0, 0])
    right0 = np.array([0.31718881, 0.49999888, 0.29525084, 1, 0, 0, 0])
    cube = np.array([0.1, 0.45, 0.05, 1, 0, 0, 0])
    left, right = aloha_script.transfer_cube_waypoints(left0, right0, cube)
    a0 = aloha_script.ee_action(left, right, 0)
    np.testing.assert_allclose(a0[:7], left0) and np.testing.assert_allclose(a0[8:15], right0)
    assert a0[7] == 0 and a0[15] == 0  # grippers closed at the start
    a130 = aloha_script.ee_action(left, right, 130)  # the right gripper 1.5 cm into the cube, open
    np.testing.assert_allclose(a130[8:11], [0.1, 0.45, 0.035])
    assert a130[15] == 1
    a150 = aloha_script.ee_action(left, right, 150)  # closing: halfway between open (130) and closed (170)
    assert a150[15] == pytest.approx(0.5)
    np.testing.assert_allclose(aloha_script.ee_action(left, right, 220)[8:11], [0, 0.5, 0.25])
    mid = aloha_script.ee_action(left, right, 50)  # left halfway to its approach point, quaternion interpolated
    np.testing.assert_allclose(mid[:3], (left0[:3] + [-0.1, 0.5, 0.23]) / 2)
    np.testing.assert_allclose(mid[3:7], ([1, 0, 0, 0] + aloha_script.axis_angle_quat((1, 0, 0), 90)) / 2)
    with pytest.raises(ValueError, match="t: expected 0..400"):
        aloha_script.ee_action(left, right, 401)


def test_insertion_script_picks_socket_left_and_peg_right():
    start = np.array([0.0, 0.5, 0.3, 1, 0, 0, 0])
    poses = np.array([0.15, 0.5, 0.05, 1, 0, 0, 0, -0.15, 0.45, 0.05, 1, 0, 0, 0])
    left, right = aloha_script.insertion_waypoints(start, start, poses)
    a = aloha_script.ee_action(left, right, 170)
    np.testing.assert_allclose(a[:3], [-0.15, 0.45, 0.02])  # left: down on the socket
    np.testing.assert_allclose(a[8:11], [0.15, 0.5, 0.02])  # right: down on the peg
    end = aloha_script.ee_action(left, right, 400)
    np.testing.assert_allclose(end[:3], [-0.05, 0.5, 0.15])
    np.testing.assert_allclose(end[8:11], [0.05, 0.5, 0.15715])


def test_joint_actions_replace_the_grippers_by_their_commands():
    qpos = np.arange(28, dtype=np.float64).reshape(2, 14)
    close, opened = aloha_script.PUPPET_GRIPPER_POSITION_CLOSE, aloha_script.PUPPET_GRIPPER_POSITION_OPEN
    ctrl = np.array([[close, -close, opened, -opened], [opened, -opened, close, -close]])
    out = aloha_script.joint_actions(qpos, ctrl)
    assert out.dtype == np.float32 and out.shape == (2, 14)
    np.testing.assert_allclose(out[:, [6, 13]], [[0, 1], [1, 0]], atol=1e-6)
    np.testing.assert_array_equal(out[:, :6], qpos[:, :6])
    with pytest.raises(ValueError, match=r"expected \(T, 14\) and \(T, 4\), received \(2, 14\) and \(3, 4\)"):
        aloha_script.joint_actions(qpos, np.zeros((3, 4)))


def test_observation_features_per_mode():
    f = aloha_env.observation_features("transfer_cube", "state", 96, env_state=False)
    assert f[STATE_KEY].shape == (21,) and f[STATE_KEY].names[-7:] == aloha_env.OBJECT_NAMES["transfer_cube"]
    f = aloha_env.observation_features("insertion", "image+proprio", 48, env_state=True)
    assert f[STATE_KEY].shape == (14,) and f[IMAGE_PREFIX + "top"].shape == (48, 64, 3)
    assert f[ENV_STATE_KEY].shape == (14,) and set(f) == {STATE_KEY, IMAGE_PREFIX + "top", ENV_STATE_KEY, TASK_KEY}
    assert set(aloha_env.observation_features("insertion", "image", 30, False)) == {IMAGE_PREFIX + "top", TASK_KEY}
    assert aloha_env.image_shape(480) == (480, 640, 3)
    with pytest.raises(ValueError, match="obs_mode: expected one of"):
        aloha_env.observation_features("insertion", "pointmap+proprio", 30, False)
    with pytest.raises(ValueError, match="image_size: expected a positive number of pixels, received 0"):
        aloha_env.image_shape(0)


class _Unstable(RuntimeError):
    """dm_control's ``PhysicsError`` stand-in."""


class _FakeScene:
    """A dm_control ``control.Environment`` stand-in: 16 arm joints then a free joint; the reward is the number of
    steps taken (so the 4th step succeeds); ``render`` paints the step count."""

    def __init__(self):
        self.physics = SimpleNamespace(
            data=SimpleNamespace(
                qpos=np.zeros(23), ctrl=np.zeros(4), mocap_pos=np.zeros((2, 3)), mocap_quat=np.zeros((2, 4))
            ),
            render=lambda height, width, camera_id: np.full((height, width, 3), self.t, np.uint8),
            model=SimpleNamespace(
                vis=SimpleNamespace(quality=SimpleNamespace(shadowsize=4096, offsamples=4), global_=SimpleNamespace())
            ),
        )
        self.task = SimpleNamespace(max_reward=4, get_qpos=lambda physics: physics.data.qpos[:14].copy())
        self.t, self.pose, self.fail_at = 0, None, -1

    def reset(self):
        self.t = 0
        self.physics.data.qpos[:] = 0
        self.physics.data.qpos[16:] = self.pose

    def step(self, action):
        if self.t == self.fail_at:
            raise _Unstable("mjWARN_BADQACC")
        self.t += 1
        self.physics.data.qpos[:14] = action
        return SimpleNamespace(reward=float(self.t))


def _fake_adapter(**kw):
    scene = _FakeScene()

    def set_pose(p):
        scene.pose = p

    sample = lambda seed: np.r_[np.random.RandomState(seed).uniform(size=3), 1, 0, 0, 0]  # noqa: E731
    return aloha_env.AlohaAdapter(scene, None, "transfer_cube", sample, set_pose, physics_error=_Unstable, **kw), scene


def test_adapter_observes_succeeds_at_max_reward_and_seeds_reproduce():
    env, scene = _fake_adapter(obs_mode="state+image", image_size=12, env_state=True)
    obs, info = env.reset(seed=3)
    expected_pose = np.random.RandomState(3).uniform(size=3)
    np.testing.assert_allclose(obs[STATE_KEY][14:17], expected_pose, rtol=1e-6)
    np.testing.assert_allclose(obs[ENV_STATE_KEY][:3], expected_pose, rtol=1e-6)
    assert obs[IMAGE_PREFIX + "top"].shape == (12, 16, 3) and obs[TASK_KEY] == aloha_env.INSTRUCTIONS["transfer_cube"]
    vis = scene.physics.model.vis  # no shadows nor multisampling, the offscreen buffer sized to the frame
    assert (vis.quality.shadowsize, vis.quality.offsamples, vis.global_.offwidth, vis.global_.offheight) == (
        0,
        0,
        16,
        12,
    )
    assert info == {"is_success": False, "reward_stage": 0.0} and env.env_spec.control_frequency == 50.0
    a = np.full(14, 0.5, np.float32)
    a[0] = 9.0  # clipped to the waist's limit
    for t in range(1, 4):
        obs, reward, terminated, truncated, info = env.step(a)
        assert reward == t and not terminated and not truncated and not info["is_success"]
    assert obs[STATE_KEY][0] == pytest.approx(3.14158)
    obs, reward, terminated, truncated, info = env.step(a)
    assert terminated and info["is_success"] and reward == 4 and not truncated
    with pytest.raises(RuntimeError, match="reset"):
        env.step(a)
    again, _ = env.reset(seed=3)
    np.testing.assert_array_equal(again[STATE_KEY], env.reset(seed=3)[0][STATE_KEY])
    other, _ = env.reset(seed=4)
    assert not np.allclose(other[STATE_KEY][14:17], again[STATE_KEY][14:17])


def test_adapter_truncates_and_refuses_bad_options():
    env, _ = _fake_adapter(max_episode_steps=2)
    env.reset(seed=0)
    assert env.step(np.zeros(14))[3] is False and env.step(np.zeros(14))[3] is True
    with pytest.raises(ValueError, match="max_episode_steps: expected 1..400"):
        _fake_adapter(max_episode_steps=401)
    with pytest.raises(ValueError, match="expert_actions: expected the mocap twin env"):
        _fake_adapter(expert_actions=True)
    with pytest.raises(ValueError, match="obs_mode: expected one of"):
        _fake_adapter(obs_mode="images")


def test_unstable_physics_ends_the_episode_as_a_fault_not_a_crash():
    env, scene = _fake_adapter()
    first, _ = env.reset(seed=0)
    scene.fail_at = 1
    obs, _, _, _, _ = env.step(np.zeros(14))
    obs2, reward, terminated, truncated, info = env.step(np.ones(14))
    assert terminated and not truncated and reward == 0.0 and not info["is_success"]
    assert info["fault"].startswith("physics diverged at step 2: mjWARN_BADQACC")
    np.testing.assert_array_equal(obs2[STATE_KEY], obs[STATE_KEY])  # the last good observation
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros(14))
    scene.fail_at = -1
    np.testing.assert_array_equal(env.reset(seed=0)[0][STATE_KEY], first[STATE_KEY])


def test_expert_reads_the_plan_from_the_info_and_adds_arm_noise_only():
    plan = np.linspace(0, 1, 14, dtype=np.float32)
    env = SimpleNamespace(unwrapped=SimpleNamespace(last_info={"expert_action": plan}, env_spec=None))
    np.testing.assert_array_equal(aloha.AlohaExpert().act(None, env), plan)
    noisy = aloha.AlohaExpert("noisy", seed=0).act(None, env)
    assert noisy[6] == plan[6] and noisy[13] == plan[13] and not np.allclose(noisy[:6], plan[:6])
    with pytest.raises(RuntimeError, match="expert_actions=True"):
        aloha.AlohaExpert().act(None, SimpleNamespace(unwrapped=SimpleNamespace(last_info={})))
    with pytest.raises(ValueError, match="quality: expected one of"):
        aloha.AlohaExpert("perfect")


def test_family_is_registered_and_its_kwargs_are_checked():
    assert "aloha" in registry.available_env_families()
    assert {"aloha/transfer_cube", "aloha/insertion"} <= set(registry.available_envs())
    assert aloha.ALOHA_TASKS == aloha_env.TASKS and set(aloha_env.INSTRUCTIONS) == set(aloha.ALOHA_TASKS)
    with pytest.raises(registry.UnknownNameError, match="did you mean 'image_size'"):
        registry.check_env_kwargs("aloha/insertion", {"image_sise": 48})
    with pytest.raises(ValueError, match="env_state: expected bool"):
        registry.check_env_kwargs("aloha/insertion", {"env_state": "yes"})


def test_venv_module_imports_no_torch_nor_our_mujoco_tasks():
    code = (
        "import sys, policylink.sim.isolated.server, policylink.sim.isolated.aloha_env; "
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith(('policylink.sim.mujoco', 'dm_control'))]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif("aloha" not in installed(), reason="needs `policylink envs install aloha`")
def test_real_aloha_through_its_venv(expert_episode):
    env = registry.make_env("aloha/transfer_cube")
    try:
        assert env.env_spec.name == "aloha/transfer_cube" and env.env_spec.max_episode_steps == 400
        first_a, steps_a, ok_a = expert_episode(env, seed=0, max_steps=400)
        first_b, steps_b, ok_b = expert_episode(env, seed=0, max_steps=400)
        assert ok_a and ok_b and steps_a == steps_b
        np.testing.assert_array_equal(first_a, first_b)
        # gym-aloha's sampler on the seed: the cube's initial pose
        np.testing.assert_allclose(
            first_a[14:17], np.random.RandomState(0).uniform([0, 0.4, 0.05], [0.2, 0.6, 0.05]), rtol=1e-5
        )
    finally:
        env.close()
    env = registry.make_env("aloha/insertion", obs_mode="image+proprio", image_size=24, expert_actions=False)
    try:
        obs, _ = env.reset(seed=1)
        assert obs[IMAGE_PREFIX + "top"].shape == (24, 32, 3) and obs[IMAGE_PREFIX + "top"].std() > 0
        assert obs[STATE_KEY].shape == (14,) and obs[TASK_KEY] == aloha_env.INSTRUCTIONS["insertion"]
    finally:
        env.close()
