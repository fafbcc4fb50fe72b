"""``policylink run``: parse, then :func:`policylink.evaluate.run.run_policy` (one policy on one environment, or on
a robot with ``--robot``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from policylink.cli.app import parse_config
from policylink.evaluate.run import RunConfig, run_policy


def main(argv: Sequence[str] | None = None) -> int:
    """``policylink run --policy X --env Y --episodes N``: print each episode's result and the success rate."""
    cfg = parse_config(RunConfig, list(sys.argv[1:] if argv is None else argv), prog="policylink run")
    if cfg.policy and cfg.robot:
        from policylink.evaluate.refs import require_policy_refs
        from policylink.real.deploy import run_on_robot
        from policylink.runtime.checks import limit_threads

        require_policy_refs([(cfg.policy, cfg.policy)], [], field="policy")  # before any heavy import
        limit_threads(cfg.threads)
        return run_on_robot(cfg)
    return run_policy(cfg)


if __name__ == "__main__":
    from policylink.cli.app import run_main

    raise SystemExit(run_main("run", main, sys.argv[1:]))
