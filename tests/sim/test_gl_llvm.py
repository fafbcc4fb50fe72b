"""A policy (torchvision) can be loaded after an env rendered its first frame: no LLVM clash with Mesa."""

import subprocess
import sys

CODE = """
from policylink.adapters.registry import make_env
env = make_env("push", obs_mode="state+image")
obs, _ = env.reset(seed=0)
assert obs["observation.images.top"].shape == (96, 96, 3)
import torchvision  # loads torch._dynamo -> triton after the GL context exists
print("ok", torchvision.__version__)
"""


def test_torchvision_after_first_frame_does_not_crash():
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("ok ")
