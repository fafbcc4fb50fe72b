"""Headless MuJoCo rendering for the sim tests (EGL unless the caller chose another backend)."""

import os

os.environ.setdefault("MUJOCO_GL", "egl")
