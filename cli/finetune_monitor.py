"""``policylink finetune monitor``: parse, then :func:`policylink.train.corrector.train_and_calibrate`."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from policylink.train.corrector import MonitorCmdConfig, train_and_calibrate


def main(argv: Sequence[str]) -> int:
    """``policylink finetune monitor [--option value ...]`` (argv starts with the subcommand name)."""
    from policylink.cli.app import parse_config

    cfg = parse_config(MonitorCmdConfig, list(argv[1:]), prog="policylink finetune monitor")
    print(json.dumps(train_and_calibrate(cfg), indent=2))
    return 0


if __name__ == "__main__":
    from policylink.cli.app import run_main

    raise SystemExit(run_main("finetune monitor", main, sys.argv[1:]))
