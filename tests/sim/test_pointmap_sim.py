"""Pointmaps from the MuJoCo tasks: the table plane at z = 0 and the block where the state says, at the nominal
camera and under a camera pose shift; the shift's geometry; and a pointmap policy through record, train, eval
and serve (tiny)."""

import numpy as np
import pytest

from policylink.adapters.pointmaps import POINTMAP_PREFIX, POINTMAP_UNIT
from policylink.adapters.registry import make_env
from policylink.sim.mujoco.cameras import CameraPoseShift, shift_camera_pose
from policylink.sim.mujoco.push import BLOCK_Z_M, T_BOXES, PushEnv
from policylink.sim.mujoco.randomization import NO_RANDOMIZATION

PM = POINTMAP_PREFIX + "top"
BLOCK_TOP_Z = BLOCK_Z_M + 0.015  # the block is 0.03 m tall, its centre at BLOCK_Z_M


@pytest.mark.parametrize("shift", [None, {"yaw_deg": 25.0, "pitch_deg": 15.0, "distance_m": 0.1}])
def test_table_plane_is_at_z0_and_block_top_where_the_state_says(shift):
    env = PushEnv(obs_mode="pointmap+proprio", image_size=48, camera_pose_shift=shift)
    obs, _ = env.reset(seed=3)
    assert env.env_spec.observation_features[PM].dtype == "float32"
    assert env.env_spec.observation_features[PM].unit == POINTMAP_UNIT
    assert sorted(obs) == [PM, "observation.state", "task"]
    pm = obs[PM]
    assert pm.shape == (48, 48, 3) and pm.dtype == np.float32
    table = np.abs(pm[..., 2]) < 0.002  # table top is z = 0
    assert table.mean() > 0.85
    top = np.abs(pm[..., 2] - BLOCK_TOP_Z) < 0.002
    assert top.sum() >= 3
    state = env.privileged_state()  # pusher x, y, block x, y, sin, cos of the block's yaw
    c, s = state[5], state[4]
    d = pm[top][:, :2] - state[2:4]
    local = np.stack([c * d[:, 0] + s * d[:, 1], -s * d[:, 0] + c * d[:, 1]], axis=1)  # in the block frame
    tol = 0.005
    for cx, cy, hx, hy in T_BOXES:
        inside = (np.abs(local[:, 0] - cx) <= hx + tol) & (np.abs(local[:, 1] - cy) <= hy + tol)
        local = local[~inside]
    assert len(local) == 0  # every block-top pixel lies on the T where the state puts it
    env.close()


def test_yaw_90_of_the_top_camera_rotates_the_frame_but_not_the_points():
    kw = dict(obs_mode="image+pointmap+proprio", image_size=32, randomization=NO_RANDOMIZATION)
    nominal, shifted = PushEnv(**kw), PushEnv(**kw, camera_pose_shift={"yaw_deg": 90.0})
    a, _ = nominal.reset(seed=1)
    b, _ = shifted.reset(seed=1)
    # the camera turned +90 deg about the vertical through the centre: the scene turns -90 deg in the image
    rotated = np.rot90(a["observation.images.top"], k=-1)
    assert np.mean(np.abs(rotated.astype(int) - b["observation.images.top"].astype(int)) > 8) < 0.02
    np.testing.assert_allclose(np.rot90(a[PM], k=-1), b[PM], atol=2e-3)
    assert not np.allclose(a["observation.images.top"], b["observation.images.top"])
    nominal.close(), shifted.close()


def test_shift_geometry_and_errors():
    # a camera 1 m in front of the centre at the same height, looking at it: yaw 90 moves it to the side
    R = np.eye(3)
    p, R2 = shift_camera_pose(np.array([0.0, -1.0, 0.0]), R, CameraPoseShift(yaw_deg=90.0), np.zeros(3))
    np.testing.assert_allclose(p, [1.0, 0.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(R2 @ np.array([1.0, 0.0, 0.0]), [0.0, 1.0, 0.0], atol=1e-12)
    # a straight-down camera 1 m above the centre (x right = world +x): pitch 30 moves it toward -y, still aimed
    p, R2 = shift_camera_pose(np.array([0.0, 0.0, 1.0]), R, CameraPoseShift(pitch_deg=30.0), np.zeros(3))
    np.testing.assert_allclose(p, [0.0, -0.5, np.sqrt(3) / 2], atol=1e-12)
    np.testing.assert_allclose(R2 @ np.array([0.0, 0.0, -1.0]), -p, atol=1e-12)  # MuJoCo cameras look along -z
    p, _ = shift_camera_pose(np.array([0.0, -1.0, 0.0]), R, CameraPoseShift(distance_m=0.5), np.zeros(3))
    np.testing.assert_allclose(p, [0.0, -1.5, 0.0], atol=1e-12)
    with pytest.raises(ValueError, match=r"camera_pose_shift.distance_m: expected more than -1.000 m"):
        shift_camera_pose(np.array([0.0, -1.0, 0.0]), R, CameraPoseShift(distance_m=-1.0), np.zeros(3))
    with pytest.raises(ValueError, match=r"camera_pose_shift: unknown key\(s\) \['roll_deg'\]: expected keys among"):
        PushEnv(obs_mode="state", camera_pose_shift={"roll_deg": 3})
    with pytest.raises(ValueError, match=r"camera_pose_shift: expected None or a mapping with keys"):
        CameraPoseShift.coerce(20.0)
    with pytest.raises(ValueError, match=r"camera_pose_shift.pitch_deg: expected a value in \[-89, 89\]"):
        CameraPoseShift(pitch_deg=95.0)
    with pytest.raises(ValueError, match=r"^camera_pose_shift.yaw_deg: expected a number, received 'abc'$"):
        CameraPoseShift.coerce({"yaw_deg": "abc"})


def test_gymnasium_env_checker_passes_with_pointmaps():
    from gymnasium.utils.env_checker import check_env

    env = make_env("push", obs_mode="pointmap+proprio", image_size=16)
    check_env(env, skip_render_check=True)
    env.close()


def test_a_pointmap_policy_records_trains_evaluates_and_serves(tmp_path, served):
    """Tiny end to end: 2 recorded episodes (16 px), 3 training steps of a stacked RGB+pointmap diffusion policy,
    1 evaluation episode under a 20-degree camera yaw, and a served copy answering like the in-process one."""
    from policylink.evaluate.nxm import evaluate
    from policylink.policies import load_policy
    from policylink.policies.common.encoder_config import EncoderConfig
    from policylink.policies.common.unet1d import UNetConfig
    from policylink.policies.registry import make_config
    from policylink.runtime.record import RecordConfig, record
    from policylink.train.imitation import DatasetConfig, TrainConfig, train

    mode = "image+pointmap+proprio"
    store = tmp_path / "pm.zarr"
    record(
        RecordConfig(env="push", episodes=2, out=str(store), obs_mode=mode, image_size=16, max_steps=20), progress=False
    )
    keys = ["observation.state", "observation.images.top", PM]
    policy = make_config(
        "diffusion",
        observation_keys=keys,
        chunk_size=8,
        n_action_steps=8,
        unet=UNetConfig(down_dims=[16, 32], time_embed_dim=16),
        encoder=EncoderConfig(vision_backbone="small_conv", crop_ratio=0.9, num_keypoints=4),
    )
    cfg = TrainConfig(
        policy=policy,
        dataset=DatasetConfig(path=str(store), env="push", obs_mode=mode, image_size=16, val_fraction=0.0),
        output_dir=str(tmp_path / "run"),
        steps=3,
        batch_size=4,
        log_every=1,
        val_every=0,
        device="cpu",
        progress=False,
        torch_threads=1,
    )
    train(cfg)
    ckpt = str(tmp_path / "run" / "checkpoints" / "last")
    shift = {"obs_mode": mode, "image_size": 16, "camera_pose_shift": {"yaw_deg": 20.0}}
    (summary,) = evaluate(
        [("pm", ckpt)],
        ["push"],
        episodes=1,
        workers=0,
        shard_episodes=1,
        videos=0,
        out=tmp_path / "eval",
        env_kwargs=shift,
        progress=False,
    )
    assert summary["n_episodes"] == 1 and summary["avg_steps"] > 0

    env = make_env("push", **shift)
    obs, _ = env.reset(seed=0)
    batch = {k: v[None] for k, v in obs.items() if k != "task"} | {"task": [obs["task"]]}
    env.close()
    local, remote = load_policy(ckpt, device="cpu", seed=0), served(load_policy(ckpt, device="cpu", seed=0))
    chunks = []
    for p in (local, remote):
        p.reset()
        p.update_observation(batch)
        chunks.append(p.predict_action_chunk())
    assert chunks[0].shape == (1, 8, 2)
    np.testing.assert_allclose(chunks[0], chunks[1], atol=1e-6)
