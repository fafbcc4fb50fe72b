"""``policylink finetune critic`` and ``policylink finetune qvgm``: parse, then :mod:`policylink.train.qvgm`."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from policylink.train.qvgm import CriticCmdConfig, QVGMCmdConfig, finetune_policy, train_critic


def main(argv: Sequence[str]) -> int:
    """``policylink finetune critic|qvgm [--option value ...]`` (argv starts with the subcommand name)."""
    from policylink.cli.app import parse_config

    name, rest = argv[0], list(argv[1:])
    if name == "critic":
        cfg = parse_config(CriticCmdConfig, rest, prog="policylink finetune critic")
        print(f"critic: {train_critic(cfg)}")
    else:
        cfg = parse_config(QVGMCmdConfig, rest, prog="policylink finetune qvgm")
        print(f"checkpoint: {finetune_policy(cfg)}")
    return 0


if __name__ == "__main__":
    from policylink.cli.app import run_main

    raise SystemExit(run_main("finetune", main, sys.argv[1:]))
