"""``policylink train``: parse, then :func:`policylink.train.imitation.train`."""

from __future__ import annotations

import os
import sys

from policylink.train.config import TrainConfig, validate_config


def main(argv: list[str]) -> int:
    """``policylink train --config configs/train/<name>.yaml [--steps N] [--resume true] ...``: parse the config
    (``--help`` exits here, before torch is imported), then :func:`policylink.train.imitation.train`."""
    from policylink.cli.app import parse_config

    cfg = parse_config(TrainConfig, argv, prog="policylink train")
    validate_config(cfg)  # its paths and names before the trainer's imports (train() checks again, cheaply)
    from policylink.train.imitation import train

    path = train(cfg)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"checkpoint: {path}")
    return 0


if __name__ == "__main__":  # torchrun --nproc_per_node=N -m policylink.cli.train --config ...
    from policylink.cli.app import run_main

    raise SystemExit(run_main("train", main, sys.argv[1:]))
