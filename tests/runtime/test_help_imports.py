"""``--help`` must not import torch (it took 5-15 s on a loaded 2-core machine): config dataclasses live in
torch-free modules, and the ``policylink train`` entry point parses its config before importing the trainer."""

from __future__ import annotations

import subprocess
import sys

import pytest

_PROBE = """
import sys
{body}
print(sorted(m for m in ("torch", "torchvision", "mujoco") if m in sys.modules))
"""


def _imported(body: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(body=body)], capture_output=True, text=True, timeout=120, check=True
    )
    return out.stdout.strip().splitlines()[-1]


def test_train_config_and_policy_configs_import_no_torch():
    body = (
        "import policylink.train.config, policylink.policies.config\n"
        "import policylink.policies.common.encoder_config, policylink.policies.common.unet_config\n"
        "from policylink.train.config import TrainConfig\n"
        "cfg = TrainConfig()\n"
        "assert cfg.policy.type == 'diffusion' and cfg.policy.unet.down_dims == [256, 512, 1024]"
    )
    assert _imported(body) == "[]"


@pytest.mark.parametrize("command", ["train", "eval", "run", "record", "serve", "demo", "dataset merge"])
def test_help_imports_no_torch(command):
    body = (
        "from policylink.cli.app import main\n"
        f"try:\n    main({command.split()!r} + ['--help'])\n"
        "except SystemExit as e:\n    assert e.code in (0, None), e.code"
    )
    assert _imported(body) == "[]"


def test_old_import_paths_still_name_the_same_classes():
    from policylink.policies.common import encoder_config, encoders, unet1d, unet_config

    assert encoders.EncoderConfig is encoder_config.EncoderConfig
    assert unet1d.UNetConfig is unet_config.UNetConfig
    assert unet1d.UNetPolicyConfig is unet_config.UNetPolicyConfig


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--policy", "no/such/checkpoints/last", "--env", "reach"],
        ["eval", "--policies", "no/such/{env}/checkpoints/last", "--envs", "reach,push"],
        ["serve", "--checkpoint", "no/such/checkpoints/last"],
        ["train", "--dataset.path", "no/such.zarr", "--policy.type", "flow"],
    ],
)
def test_a_missing_path_is_reported_before_torch_or_mujoco_is_imported(argv):
    """A missing checkpoint or dataset is one error in a fraction of a second, not after seconds of imports."""
    body = (
        "import io, contextlib\n"
        "from policylink.cli.app import main\n"
        "err = io.StringIO()\n"
        f"with contextlib.redirect_stderr(err):\n    code = main({argv!r})\n"
        "assert code == 2, code\n"
        "assert 'not found' in err.getvalue() and 'no/such' in err.getvalue(), err.getvalue()"
    )
    assert _imported(body) == "[]"
