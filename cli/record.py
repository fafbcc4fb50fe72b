"""``policylink record``: parse, then :func:`policylink.runtime.record.record`."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from policylink.runtime.record import INTERRUPTED_EXIT_CODE, RecordConfig, RecordInterrupted, record


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``policylink record``; prints the summary. Returns 0 on success."""
    from policylink.cli.app import parse_config

    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = parse_config(RecordConfig, argv, prog="policylink record")
    try:
        summary = record(cfg)
    except RecordInterrupted as e:
        print(f"\n{e}", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    print(f"{summary} -> {cfg.out}")
    return 0


if __name__ == "__main__":
    from policylink.cli.app import run_main

    raise SystemExit(run_main("record", main, sys.argv[1:]))
