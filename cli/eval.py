"""``policylink eval``: parse, then :func:`policylink.evaluate.nxm.evaluate`."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from policylink.evaluate import report
from policylink.evaluate.nxm import EvalConfig, evaluate


def main(argv: Sequence[str] | None = None) -> int:
    """``policylink eval --policies A,B --envs X,Y --episodes 50 --seed 0 --workers 2 --out DIR``.

    Raises:
        ValueError: missing ``--policies``/``--envs``, bad counts, duplicate labels or executor settings.
        IncompatibleSpecError: every (policy, env) cell that cannot run, before anything runs.
    """
    from policylink.cli.app import parse_config

    cfg = parse_config(EvalConfig, list(sys.argv[1:] if argv is None else argv), prog="policylink eval")
    if not cfg.policies or not cfg.envs:
        raise ValueError(
            f"--policies and --envs: expected at least one of each (see policylink eval --help), received "
            f"policies={cfg.policies} envs={cfg.envs}"
        )
    summaries = evaluate(
        cfg.policies,
        cfg.envs,
        episodes=cfg.episodes,
        seed=cfg.seed,
        workers=cfg.workers,
        out=cfg.out,
        ray_address=cfg.ray_address,
        num_envs=cfg.num_envs,
        shard_episodes=cfg.shard_episodes,
        videos=cfg.videos,
        device=cfg.device,
        cfg_scale=cfg.cfg_scale,
        resume=cfg.resume,
        env_kwargs=cfg.env_kwargs,
        executor=cfg.executor,
        instructions=cfg.instructions,
    )
    print(report.markdown_table(summaries))
    print(f"wrote {Path(cfg.out) / 'report.html'}")
    return 0


if __name__ == "__main__":
    from policylink.cli.app import run_main

    raise SystemExit(run_main("eval", main, sys.argv[1:]))
