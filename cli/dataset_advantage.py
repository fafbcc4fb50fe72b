"""``policylink dataset advantage-report``: parse, then
:func:`policylink.evaluate.advantage_report.advantage_report`."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from policylink.evaluate.advantage_report import AdvantageReportConfig, advantage_report


def main(argv: Sequence[str]) -> int:
    """Entry point (``argv`` without the subcommand name; ``--path`` already set from a positional PATH)."""
    from policylink.cli.app import parse_config

    cfg = parse_config(AdvantageReportConfig, list(argv), prog="policylink dataset advantage-report")
    advantage_report(cfg)
    return 0


if __name__ == "__main__":
    from policylink.cli.app import run_main

    raise SystemExit(run_main("dataset advantage-report", main, sys.argv[1:]))
