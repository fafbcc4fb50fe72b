"""Where a pick_place policy fails under a reality gap (issue 34 item 2): each of N held-out episodes (reset seeds
``seed .. seed + N - 1``, one vector env of ``num_envs`` slots, the policy reseeded as ``policylink eval``'s shard
is) is classed by the phase it reached, from its observed states and the simulator's joint speeds:

- ``success``;
- ``diverged``: the env faulted on diverged physics (``info["fault"]``), or the cube was flung beyond 1 m;
- ``stalled at the cube``: never lifted it (cube centre never above 4 cm);
- ``carry``: lifted, never within 3 cm (planar) of the target;
- ``place``: lifted and brought within 3 cm of the target, not placed by the step limit.

Usage::

    MUJOCO_GL=egl OMP_NUM_THREADS=1 .venv/bin/python benchmarks/gap_failures.py \\
        --policy outputs/s2r/train/rand_worn2/checkpoints/last --gap worn_gantry --out outputs/gap/diag.json

Prints the counts and writes ``{"counts": ..., "episodes": [...]}`` (per episode: index, seed, class, steps, the
step of the fault or first speed above 10, the largest joint speed and cube coordinate) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import Any

import numpy as np

from policylink.adapters.schema import FAULT_INFO, STATE_KEY
from policylink.policies.loading import load_policy
from policylink.runtime.executors import ExecutorConfig, make_executor
from policylink.runtime.rollout import EpisodeSubscriber, rollout
from policylink.runtime.vector_env import RegistryEnvFn, make_vector_env, plan_episodes

LIFTED_M, OVER_TARGET_M, FLUNG_M = 0.04, 0.03, 1.0


class PhaseTracker(EpisodeSubscriber):
    """Per-episode phase flags of pick_place (state: ee xyz, gripper, cube xyz, target xyz) and joint speeds."""

    def __init__(self, vec: Any):
        self.vec, self.cur, self.episodes = vec, {}, {}

    def on_reset(self, slot, index, seed, info):
        self.cur[slot] = {
            "index": index,
            "seed": seed,
            "steps": 0,
            "fault_step": None,
            "max_speed": 0.0,
            "max_cube": 0.0,
            "lifted": False,
            "over_target": False,
            "fault": "",
        }

    def on_step(self, slot, obs, action, reward, done, info):
        e, s = self.cur[slot], np.asarray(obs[STATE_KEY], np.float64)
        cube, target = s[4:7], s[7:10]
        e["steps"] += 1
        if not done:  # after a SAME_STEP reset the slot already holds the next episode
            speed = float(np.abs(self.vec.envs[slot].unwrapped.data.qvel).max())
            e["max_speed"] = max(e["max_speed"], speed)
            if speed > 10 and e["fault_step"] is None:
                e["fault_step"] = e["steps"]
        if info.get(FAULT_INFO):
            e["fault"], e["fault_step"] = str(info[FAULT_INFO]), e["fault_step"] or e["steps"]
        e["max_cube"] = max(e["max_cube"], float(np.abs(cube).max()))
        if LIFTED_M < cube[2] < FLUNG_M:
            e["lifted"] = True
        if e["lifted"] and np.linalg.norm(cube[:2] - target[:2]) < OVER_TARGET_M:
            e["over_target"] = True

    def on_episode_end(self, slot, result):
        e = self.cur.pop(slot)
        e["success"], e["n_steps"] = bool(result.success), result.n_steps
        e["class"] = phase_class(e)
        self.episodes[e["index"]] = e


def phase_class(e: dict[str, Any]) -> str:
    """The failure class of one tracked episode (see the module docstring)."""
    if e["success"]:
        return "success"
    if e["fault"] or e["max_cube"] > FLUNG_M:
        return "diverged"
    if not e["lifted"]:
        return "stalled at the cube"
    return "place" if e["over_target"] else "carry"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", required=True)
    p.add_argument("--gap", default="worn_gantry", help="a preset name or YAML file; 'none' for the nominal sim")
    p.add_argument("--episodes", type=int, default=100)
    p.add_argument("--seed", type=int, default=100000)
    p.add_argument("--num_envs", type=int, default=25)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    env_fn = RegistryEnvFn("pick_place", **({} if a.gap == "none" else {"gap": a.gap}))
    probe = env_fn()
    policy = load_policy(a.policy, "cpu", a.seed, None, env_spec=probe.env_spec)
    probe.close()
    np.random.seed(a.seed % 2**32)
    torch.manual_seed(a.seed)
    if callable(getattr(type(policy), "reseed", None)):
        policy.reseed(a.seed)
    vec = make_vector_env(env_fn, plan_episodes(a.episodes, a.seed, a.num_envs, 0))
    tracker = PhaseTracker(vec)
    try:
        rollout(vec, make_executor(policy, ExecutorConfig()), a.episodes, subscribers=[tracker])
    finally:
        vec.close()
    eps = [tracker.episodes[i] for i in sorted(tracker.episodes)]
    counts = dict(Counter(e["class"] for e in eps))
    print(json.dumps({"policy": a.policy, "gap": a.gap, "counts": counts}))
    with open(a.out, "w") as f:
        json.dump({"counts": counts, "episodes": eps}, f, indent=0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
