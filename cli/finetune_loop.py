"""``policylink finetune loop``: parse, then :func:`policylink.train.loop.run_loop`."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from policylink.train.loop import LoopConfig, run_loop


def main(argv: Sequence[str]) -> int:
    """``policylink finetune loop --policy CKPT --env ENV --rounds R --episodes N [...]``."""
    from policylink.cli.app import parse_config

    cfg = parse_config(LoopConfig, list(argv[1:]), prog="policylink finetune loop")
    rows = run_loop(cfg)
    print(Path(cfg.out, "rounds.md").read_text() if rows else "no rounds")
    return 0


if __name__ == "__main__":
    from policylink.cli.app import run_main

    raise SystemExit(run_main("finetune loop", main, sys.argv[1:]))
