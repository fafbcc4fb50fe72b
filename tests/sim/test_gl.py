"""Headless OpenGL backend choice (sim/gl.py) and the CLI rendering with MUJOCO_GL unset."""

import os
import subprocess
import sys

import numpy as np
import pytest

from policylink.sim.gl import library_loads, select_gl_backend


def test_explicit_backend_wins():
    env = {"MUJOCO_GL": "osmesa"}
    assert select_gl_backend(env, loads=lambda b: True) == "osmesa"
    assert env == {"MUJOCO_GL": "osmesa"}


def test_display_keeps_mujoco_default():
    env = {"DISPLAY": ":0"}
    assert select_gl_backend(env, loads=lambda b: True) is None
    assert "MUJOCO_GL" not in env


def test_first_loadable_offscreen_backend_is_chosen():
    env: dict[str, str] = {}
    assert select_gl_backend(env, loads=lambda b: b == "osmesa") == "osmesa"
    assert env == {"MUJOCO_GL": "osmesa", "PYOPENGL_PLATFORM": "osmesa"}
    env = {}
    assert select_gl_backend(env, loads=lambda b: True) == "egl"
    assert env["MUJOCO_GL"] == "egl"


def test_nothing_loadable_says_so_in_one_line(capsys):
    env: dict[str, str] = {}
    assert select_gl_backend(env, loads=lambda b: False) is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "libegl1" in err and "MUJOCO_GL" in err
    assert env == {}


def test_unknown_backend_name():
    with pytest.raises(ValueError, match="MUJOCO_GL: expected one of"):
        library_loads("vulkan")


@pytest.mark.slow
def test_record_images_without_mujoco_gl(tmp_path):
    """`policylink record` with image observations in a shell with neither MUJOCO_GL nor a display."""
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM", "DISPLAY")}
    out = tmp_path / "demos.zarr"
    cmd = [
        sys.executable,
        "-m",
        "policylink.cli.app",
        "record",
        "--env",
        "push",
        "--episodes",
        "1",
        "--obs_mode",
        "state+image",
        "--image_size",
        "32",
        "--out",
        str(out),
    ]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    from policylink.data.buffer import EpisodeStore

    frames = EpisodeStore(str(out), "r").array("observation.images.top")[:]
    assert frames.shape[1:] == (32, 32, 3) and frames.dtype == np.uint8
    assert frames.std() > 5.0  # a rendered scene, not a blank buffer
