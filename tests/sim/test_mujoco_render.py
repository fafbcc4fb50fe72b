"""Rendered frames: upright and not mirrored (a known red object lands in the known image half), uint8 RGB of
the requested size, fast vs pretty settings, and env.render() for videos."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from policylink.adapters import registry
from policylink.sim.mujoco.randomization import NO_RANDOMIZATION

TOP = "observation.images.top"


def _red_centroid(frame: np.ndarray) -> tuple[float, float]:
    r, g, b = (frame[..., i].astype(int) for i in range(3))
    mask = (r > 120) & (g < 60) & (b < 60)
    assert mask.sum() > 10, "the red block is not visible"
    rows, cols = np.nonzero(mask)
    return rows.mean(), cols.mean()


@pytest.mark.parametrize(
    ("xy", "right", "top"),
    [
        ((0.18, 0.18), True, True),
        ((-0.18, 0.18), False, True),
        ((0.18, -0.18), True, False),
        ((-0.18, -0.18), False, False),
    ],
)
def test_top_camera_is_upright_and_not_mirrored(xy, right, top):
    """World +x is image right (columns grow), world +y is image up (rows shrink)."""
    env = registry.make_env("push", obs_mode="image", image_size=64, randomization=NO_RANDOMIZATION)
    env.reset(seed=0)
    for geom in ("block_bar", "block_stem"):
        env.model.geom(geom).rgba = (1.0, 0.0, 0.0, 1.0)
    env.set_free_body("block", np.array([xy[0], xy[1], 0.0155]))
    env.robot.reset(np.array([-xy[0], -xy[1]]))  # pusher on the opposite side, out of the way
    mujoco.mj_forward(env.model, env.data)
    frame = env._observation()[TOP]
    assert frame.shape == (64, 64, 3) and frame.dtype == np.uint8
    row, col = _red_centroid(frame)
    assert (col > 32) == right and (row < 32) == top


def test_front_camera_left_right_matches_world_x():
    env = registry.make_env(
        "reach", obs_mode="image", cameras=("front",), image_size=64, randomization=NO_RANDOMIZATION
    )
    env.reset(seed=0)
    env.model.geom("target").rgba = (1.0, 0.0, 0.0, 1.0)
    env.data.mocap_pos[env.model.body("target").mocapid[0]] = (0.15, 0.0, 0.05)
    env.robot.reset(np.array([-0.15, 0.0, 0.25]))
    mujoco.mj_forward(env.model, env.data)
    _, col = _red_centroid(env._observation()["observation.images.front"])
    assert col > 32


def test_fast_and_pretty_settings_and_video_frames():
    fast = registry.make_env("reach", obs_mode="image", image_size=40)
    assert fast.model.vis.quality.shadowsize == 0 and fast.model.vis.quality.offsamples == 0
    assert (fast.model.vis.global_.offwidth, fast.model.vis.global_.offheight) == (40, 40)
    assert fast.render() is None  # no render_mode
    pretty = registry.make_env("reach", render_quality="pretty", render_mode="rgb_array", render_size=80)
    assert pretty.model.vis.quality.shadowsize > 0 and pretty.model.vis.quality.offsamples > 0
    frame = pretty.render()
    assert frame.shape == (80, 80, 3) and frame.dtype == np.uint8 and frame.std() > 1.0
