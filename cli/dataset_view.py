"""``policylink dataset view``: parse, then :func:`policylink.evaluate.episode_view.view`."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from policylink.evaluate.episode_view import ViewConfig, view


def main(argv: Sequence[str]) -> int:
    """``policylink dataset view --path STORE [--episode N] [--out DIR]`` (the dispatcher turns a leading STORE
    into ``--path``). Prints the page's path."""
    from policylink.cli.app import parse_config

    cfg = parse_config(ViewConfig, argv, prog="policylink dataset view")
    print(f"wrote {view(cfg)}")
    return 0


if __name__ == "__main__":
    from policylink.cli.app import run_main

    raise SystemExit(run_main("dataset view", main, sys.argv[1:]))
