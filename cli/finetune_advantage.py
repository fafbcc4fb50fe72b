"""``policylink finetune advantage label|train``: parse, then :mod:`policylink.train.advantage`."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from policylink.train.advantage import AdvantageTrainConfig, LabelCommand, label_store, train_advantage


def main(argv: Sequence[str]) -> int:
    """``policylink finetune advantage label|train [--option value ...]`` (argv starts with ``advantage``)."""
    from policylink.cli.app import parse_config

    rest = list(argv[1:])
    if not rest or rest[0] not in ("label", "train"):
        asked = bool(rest) and rest[0] in ("-h", "--help")
        if rest and not asked:
            print(f"policylink finetune advantage: unknown subcommand {rest[0]!r} (expected label or train)",
                  file=sys.stderr)  # fmt: skip
        print("usage: policylink finetune advantage label|train [--option value ...]\n"
              "  label  compute binary advantage labels of an episode store (RECAP value model or ALTER progress)\n"
              "  train  train a policy conditioned on those labels (or --objective.type awr: the AWR baseline)\n"
              "each takes --help for its options", file=sys.stderr if not asked else sys.stdout)  # fmt: skip
        return 0 if asked else 2
    if rest[0] == "label":
        cmd = parse_config(LabelCommand, rest[1:], prog="policylink finetune advantage label")
        print(json.dumps(label_store(cmd), indent=1, default=str))
        return 0
    cfg = parse_config(AdvantageTrainConfig, rest[1:], prog="policylink finetune advantage train")
    print(f"checkpoint: {train_advantage(cfg)}")
    return 0


if __name__ == "__main__":
    from policylink.cli.app import run_main

    raise SystemExit(run_main("finetune advantage", main, sys.argv[1:]))
