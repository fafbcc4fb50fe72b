"""Failure breakdown of chunk policies on the ``memory`` task: per episode, whether the waypoint was visited, the
wrong goal touched, or the right one reached (issue 18). All episodes run as one batch (one env per row, the
receding-horizon pattern: a new chunk every ``n_action_steps``).

    python benchmarks/memory_breakdown.py label=CHECKPOINT ... [--episodes 50] [--seed 100000]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from policylink.adapters.registry import make_env
from policylink.policies.checkpoint import load_components
from policylink.policies.policy import policy_for_model


def breakdown(policy, episodes: int, seed: int) -> dict[str, float]:
    """Fractions of ``episodes`` (seeds ``seed ..``): ``success``, ``wrong_goal``, ``no_waypoint`` (never
    visited), ``other`` (visited, no goal touched before the time limit)."""
    envs = [make_env("memory").unwrapped for _ in range(episodes)]
    obs = [env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]
    policy.reset()
    done, info = np.zeros(episodes, bool), [{} for _ in envs]
    chunk, every = None, policy.spec.n_action_steps
    for t in range(envs[0].max_episode_steps):
        policy.update_observation({"observation.state": np.stack([o["observation.state"] for o in obs])})
        if t % every == 0:
            chunk = policy.predict_action_chunk()
        for i, env in enumerate(envs):
            if not done[i]:
                obs[i], _, term, trunc, info[i] = env.step(chunk[i, t % every])
                done[i] = term or trunc
    success = np.array([d["is_success"] for d in info])
    wrong = np.array([d["wrong_goal"] for d in info])
    visited = np.array([env.visited for env in envs])
    return {
        "success": success.mean(),
        "wrong_goal": wrong.mean(),
        "no_waypoint": (~visited).mean(),
        "other": (visited & ~success & ~wrong).mean(),
    }


def main() -> None:
    """Print a Markdown table of :func:`breakdown` per ``label=checkpoint``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("policies", nargs="+", help="label=checkpoint folder")
    ap.add_argument("--episodes", type=int, default=50)
    ap.add_argument("--seed", type=int, default=100_000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print("| policy | success | wrong goal | waypoint never visited | visited, no goal by the limit |")
    print("|---|---|---|---|---|")
    for item in args.policies:
        label, path = item.split("=", 1)
        _, spec, model, processors = load_components(path)
        r = breakdown(policy_for_model(model, processors, spec, device="cpu"), args.episodes, args.seed)
        print(f"| {label} | {r['success']:.0%} | {r['wrong_goal']:.0%} | {r['no_waypoint']:.0%} | {r['other']:.0%} |")


if __name__ == "__main__":
    main()
