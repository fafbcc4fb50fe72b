"""Success rate of the scripted experts (expert / noisy / poor) on the MuJoCo tasks over N seeds.

Usage::

    MUJOCO_GL=egl .venv/bin/python benchmarks/expert_success.py --envs reach,push --seeds 100 \
        --out benchmarks/results/expert_success.md

Episodes use seeds ``0 .. N-1`` for both the env and the expert's noise; a run ends at success or at the env's
``max_episode_steps``. Writes a markdown table (rate, 95 % Wilson interval, mean episode length).
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import time

import numpy as np
from tqdm import tqdm

from policylink.adapters.registry import make_env
from policylink.evaluate.report import wilson_interval
from policylink.sim.experts import QUALITIES, make_expert

DEFAULT_ENVS = ("reach", "push", "pick_place", "insert", "multitask")


def run_episode(env, expert, seed: int) -> tuple[bool, int]:
    """Roll ``expert`` on ``env`` from ``reset(seed=seed)``; return (success, steps)."""
    obs, info = env.reset(seed=seed)
    expert.reset(seed)
    for t in range(env.unwrapped.env_spec.max_episode_steps):
        obs, _, terminated, truncated, info = env.step(expert.act(obs, env))
        if terminated or truncated:
            return bool(info["is_success"]), t + 1
    return bool(info["is_success"]), env.unwrapped.env_spec.max_episode_steps


def main(argv: list[str] | None = None) -> int:
    """Measure and print (and optionally write) the success table. Returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", default=",".join(DEFAULT_ENVS), help="comma-separated env names")
    parser.add_argument("--qualities", default=",".join(QUALITIES), help="comma-separated expert qualities")
    parser.add_argument("--seeds", type=int, default=100, help="episodes per (env, quality), seeds 0..N-1")
    parser.add_argument("--out", default=None, help="markdown file to write")
    parser.add_argument(
        "--perturbation", default=None, help="JSON fields of PerturbationConfig, e.g. '{\"displacement\": 0.03}'"
    )
    args = parser.parse_args(argv)
    env_kwargs = {"perturbation": json.loads(args.perturbation)} if args.perturbation else {}
    rows = []
    for name in args.envs.split(","):
        env = make_env(name, **env_kwargs)
        for quality in args.qualities.split(","):
            expert = make_expert(env, quality=quality)
            t0 = time.perf_counter()
            results = [
                run_episode(env, expert, s) for s in tqdm(range(args.seeds), desc=f"{name}/{quality}", leave=False)
            ]
            k = sum(r[0] for r in results)
            lo, hi = wilson_interval(k, args.seeds)
            rows.append(
                (
                    name,
                    quality,
                    k / args.seeds,
                    lo,
                    hi,
                    float(np.mean([r[1] for r in results])),
                    time.perf_counter() - t0,
                )
            )
        env.close()
    lines = ["| env | quality | success | 95% CI | mean steps | wall s |", "|---|---|---|---|---|---|"]
    lines += [
        f"| {n} | {q} | {r:.2f} | [{lo:.2f}, {hi:.2f}] | {steps:.1f} | {w:.1f} |" for n, q, r, lo, hi, steps, w in rows
    ]
    table = "\n".join(lines)
    print(table)
    if args.out:
        cmd = "MUJOCO_GL=egl .venv/bin/python benchmarks/expert_success.py " + shlex.join(sys.argv[1:])
        with open(args.out, "w") as f:
            f.write(
                f"# Scripted expert success{' under perturbation' if env_kwargs else ''}\n\nCommand: `{cmd}`\n\n"
                "Machine: 2-core CPU, no GPU (shared). "
                f"Date: {datetime.date.today().isoformat()}. Episodes: seeds 0..{args.seeds - 1} per row; "
                "an episode ends at success or at `max_episode_steps`.\n\n" + table + "\n"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
