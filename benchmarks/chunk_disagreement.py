"""Issue 16, round 4: a plan-time risk signal for the action horizon. At every plan the policy samples two chunks
(two noise draws, same observation); if their mean distance over the first ``--look`` actions is at least ``tau``
(metres, push's ``ee_delta`` actions) the row executes ``short`` actions of the first chunk, else ``long``.
Each plan counts as one policy call (its two samples are reported too).

    MUJOCO_GL=egl python benchmarks/chunk_disagreement.py --policy outputs/deploy2/flow_push_euler3 \
        --cells 4:inf/4,8:inf/8,8:0.01/2 --episodes 100 --seed 100000 [--perturbed]

A cell is ``long:tau/short``; ``tau = inf`` is plain open-loop execution of ``long`` actions (one sample per plan).
Prints one JSON row per cell: success, Wilson 95% interval, calls / samples / steps per episode, the fraction of
plans judged risky and percentiles of the disagreement. Results: benchmarks/results/corrector.md (round 4).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from corrector import PERTURBED  # noqa: E402

from policylink.evaluate.report import wilson_interval  # noqa: E402
from policylink.policies import load_policy  # noqa: E402
from policylink.runtime.executors import ExecutorConfig  # noqa: E402
from policylink.runtime.executors.receding import RecedingHorizonExecutor  # noqa: E402
from policylink.runtime.rollout import RegistryEnvFn, make_vector_env, plan_episodes, rollout  # noqa: E402


class DisagreementHorizon(RecedingHorizonExecutor):
    """Receding horizon whose per-chunk horizon is ``short`` when two sampled chunks disagree by >= ``tau``."""

    def __init__(self, policy, long: int, short: int, tau: float, look: int):
        super().__init__(policy, ExecutorConfig(n_action_steps=long))
        self.long, self.short, self.tau, self.look = long, short, tau, look
        self.disagreement: list[float] = []

    def _plan_rows(self, ids, guidance=None, offset=0):
        chunk, _ = self._infer(ids)
        d = np.zeros(len(ids))
        if np.isfinite(self.tau):
            second, _ = self._infer(ids)
            d = np.linalg.norm(chunk[:, : self.look] - second[:, : self.look], axis=-1).mean(1)
            self.disagreement.extend(d.tolist())
        risky = d >= self.tau
        for rows, limit in ((risky, self.short), (~risky, self.long)):
            if rows.any():
                self.queue.install(ids[rows], chunk[rows], offset=offset, limit=limit)
        self.inferences[ids] += 1
        return False


def run_cell(policy, cell: str, args) -> dict:
    """One ``long:tau/short`` cell over ``args.episodes`` seeds from ``args.seed``."""
    long, rest = cell.split(":")
    tau, short = (rest.split("/") + [long])[:2]
    t0 = time.perf_counter()
    policy.reseed(args.seed)
    env = RegistryEnvFn("push", perturbation=PERTURBED) if args.perturbed else RegistryEnvFn("push")
    vec = make_vector_env(env, plan_episodes(args.episodes, args.seed, args.num_envs))
    ex = DisagreementHorizon(policy, int(long), int(short), float(tau), args.look)
    try:
        results = rollout(vec, ex, args.episodes)
    finally:
        vec.close()
    k = sum(r.success for r in results)
    d = np.asarray(ex.disagreement)
    calls = float(np.mean([r.inferences for r in results]))
    return {
        "cell": cell, "perturbed": args.perturbed, "look": args.look, "success": k / len(results),
        "ci95": list(wilson_interval(k, len(results))), "n": len(results),
        "calls_per_episode": calls, "samples_per_episode": calls * (2 if np.isfinite(float(tau)) else 1),
        "steps_per_episode": float(np.mean([r.n_steps for r in results])),
        "risky_fraction": float((d >= float(tau)).mean()) if d.size else 0.0,
        "disagreement_m": {q: float(np.percentile(d, q)) for q in (25, 50, 75, 90)} if d.size else None,
        "wall_s": time.perf_counter() - t0,
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", required=True, help="flow (or diffusion) checkpoint on push")
    p.add_argument("--cells", required=True, help="comma-separated long:tau/short cells, e.g. 8:0.01/2,8:inf/8")
    p.add_argument("--episodes", type=int, default=100)
    p.add_argument("--seed", type=int, default=100000, help="first seed (100000+: held out; tuning used 2000+)")
    p.add_argument("--num_envs", type=int, default=10)
    p.add_argument("--look", type=int, default=16, help="actions compared between the two samples")
    p.add_argument("--perturbed", action="store_true", help="displacement + force pulses (as benchmarks/corrector.py)")
    args = p.parse_args()
    torch.set_num_threads(1)
    policy = load_policy(args.policy, device="cpu")
    for cell in args.cells.split(","):
        print(json.dumps(run_cell(policy, cell, args)), flush=True)


if __name__ == "__main__":
    main()
