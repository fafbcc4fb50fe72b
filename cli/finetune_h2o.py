"""``policylink finetune h2o``: parse, then :func:`policylink.train.h2o.run_h2o` (H2O dynamics discriminators, a
dynamics-weighted critic over simulated + robot episodes, advantage labels on their union)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from policylink.train.h2o import H2OCommand, run_h2o


def main(argv: Sequence[str]) -> int:
    """``policylink finetune h2o --sim SIM.zarr --real ROBOT.zarr --out DIR`` (argv starts with ``h2o``)."""
    from policylink.cli.app import parse_config

    cmd = parse_config(H2OCommand, list(argv[1:]), prog="policylink finetune h2o")
    summary = run_h2o(cmd)
    summary.pop("command", None)
    print(json.dumps(summary, indent=1, default=str))
    print(f"labelled store: {cmd.out}/train.zarr (policylink finetune advantage train --dataset.path ...)")
    return 0


if __name__ == "__main__":
    from policylink.cli.app import run_main

    raise SystemExit(run_main("finetune h2o", main, sys.argv[1:]))
