"""Every committed training config parses (unknown or misspelt fields fail) and its policy config validates."""

from pathlib import Path

import pytest

from policylink.cli.app import parse_config
from policylink.train.config import TrainConfig

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs" / "train").glob("*.yaml"))


def test_the_configs_folder_is_found():
    assert len(CONFIGS) >= 20


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_committed_config_parses_and_its_policy_validates(path):
    cfg = parse_config(TrainConfig, ["--config", str(path)], prog="policylink train")
    cfg.policy.validate()
    assert cfg.steps >= 1 and cfg.batch_size >= 1 and cfg.dataset.path
    assert type(cfg.policy).__name__.lower().startswith(path.stem.split("_")[0])
