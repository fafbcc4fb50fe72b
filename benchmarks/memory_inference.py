"""Inference time of chunk policies relative to a baseline, measured interleaved in one process (issue 18: SEGA
at <= 1.5x the obs-horizon-2 policy's time).

Each policy runs one ``memory`` episode's worth of calls: ``update_observation`` then ``predict_action_chunk``
every ``n_action_steps`` steps (the receding executor's pattern; SEGA advances its state there), on the
same recorded observation stream; rounds alternate the policies' order. Reported: the median over rounds of the
per-call time, and the ratio of medians to the first policy.

    python benchmarks/memory_inference.py label=CHECKPOINT ... [--rounds 30] [--batch 1]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from policylink.data.buffer import EpisodeStore
from policylink.policies.checkpoint import load_components
from policylink.policies.policy import policy_for_model


def episode_stream(store_path: str, key: str = "observation.state") -> np.ndarray:
    """The first episode's observations ``(T, D)`` of a store."""
    with EpisodeStore(store_path) as store:
        return np.asarray(store.get_episode(0)[key])


def time_policy(policy, stream: np.ndarray, batch: int) -> float:
    """Mean seconds per ``predict_action_chunk`` over one episode (observation updates excluded)."""
    policy.reset()
    every, spent, calls = policy.spec.n_action_steps, 0.0, 0
    for t, row in enumerate(stream):
        policy.update_observation({"observation.state": np.repeat(row[None], batch, 0)})
        if t % every == 0:
            start = time.perf_counter()
            policy.predict_action_chunk()
            spent += time.perf_counter() - start
            calls += 1
    return spent / calls


def main() -> None:
    """Parse ``label=checkpoint`` pairs, time them interleaved, print a Markdown table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("policies", nargs="+", help="label=checkpoint folder; the first is the baseline")
    ap.add_argument("--store", default="outputs/memory/data/memory_state.zarr")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    policies = {}
    for item in args.policies:
        label, path = item.split("=", 1)
        _, spec, model, processors = load_components(path)
        policies[label] = policy_for_model(model, processors, spec, device="cpu")
    stream = episode_stream(args.store)
    times: dict[str, list[float]] = {k: [] for k in policies}
    labels = list(policies)
    for r in range(args.rounds):
        for label in labels if r % 2 == 0 else labels[::-1]:
            times[label].append(time_policy(policies[label], stream, args.batch))
    base = float(np.median(times[labels[0]]))
    print(f"| policy | median ms / chunk (batch {args.batch}) | ratio to {labels[0]} |\n|---|---|---|")
    for label in labels:
        med = float(np.median(times[label]))
        print(f"| {label} | {1e3 * med:.2f} | {med / base:.2f} |")


if __name__ == "__main__":
    main()
