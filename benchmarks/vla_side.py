"""Does a ``multitask`` policy follow the instruction even when the pick fails? Runs one episode per instruction
(the env's 18, or an instruction file's phrasings told in place of the env's), all in one batch, and reports where
the gripper ends: on the named pad's side (``x < 0`` = left), and whether it closed within 3 cm of the named cube
(benchmarks/results/vla.md, diagnostic). With ``--store`` it also reports which cube the first chunk heads for
from the first frame of each demo episode in the store (``choice``: fraction whose xy displacement over the first
8 actions points most nearly at the named cube; chance 1/3), which separates choosing the cube from reaching it.

    python benchmarks/vla_side.py CHECKPOINT [--instructions FILE] [--seed 200000] [--repeats 1]
        [--store outputs/vla/multitask_48.zarr --episodes 90]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from policylink.adapters.registry import make_env
from policylink.policies import load_policy
from policylink.sim.mujoco.multitask import GOALS


def run(policy, instructions: str | None, seed: int, repeats: int) -> dict[str, float]:
    """``{"side": fraction ending on the named side, "near_cube": fraction closing near the named cube, "n"}``."""
    told = {t: t for t in GOALS}  # env instruction -> what the policy is told
    if instructions:
        table = json.loads(Path(instructions).read_text())
        told = {t: table["/".join(g)][i % len(table["/".join(g)])] for i, (t, g) in enumerate(GOALS.items())}
    items = [t for t in GOALS for _ in range(repeats)]
    policy.reseed(seed)
    envs = [make_env("multitask", obs_mode="state") for _ in items]
    obs = [env.reset(seed=seed + i, options={"task": t})[0] for i, (env, t) in enumerate(zip(envs, items))]
    near = np.zeros(len(items), bool)
    steps = policy.config.n_action_steps
    for k in range(envs[0].unwrapped.max_episode_steps):
        policy.update_observation(
            {"observation.state": np.stack([o["observation.state"] for o in obs]), "task": [told[t] for t in items]}
        )
        if k % steps == 0:
            chunk = policy.predict_action_chunk()
        for j, env in enumerate(envs):
            obs[j] = env.step(chunk[j, k % steps])[0]
            s = obs[j]["observation.state"]
            cube = env.unwrapped.object_position
            near[j] |= bool(s[3] < 0.5 and np.linalg.norm(s[:2] - cube[:2]) < 0.03)
    side = [(o["observation.state"][0] < 0) == (GOALS[t][1] == "left") for o, t in zip(obs, items)]
    return {"side": float(np.mean(side)), "near_cube": float(near.mean()), "n": len(items)}


def first_chunk_choice(policy, store_path: str, episodes: int) -> dict[str, float]:
    """``{"choice": fraction of demo first frames whose first 8 predicted actions head for the named cube (max
    cosine of the xy displacement with the xy vectors from the gripper to each cube), "cos_named": mean cosine
    with the named cube, "n"}``; state layout of ``multitask`` (ee x, y, z, opening, then red, green, blue xyz)."""
    from policylink.data.buffer import EpisodeStore
    from policylink.sim.mujoco.multitask import COLOURS

    policy.reseed(0)
    store = EpisodeStore(store_path)
    meta = store.all_meta()[:episodes]
    hits, cos_named = [], []
    for i, m in enumerate(meta):
        s0 = np.asarray(store.get_episode(i, ["observation.state"])["observation.state"])[0]
        policy.reset()
        policy.update_observation({"observation.state": s0[None], "task": [m.task]})
        d = policy.predict_action_chunk()[0, :8, :2].sum(0)
        to_cubes = s0[4:].reshape(3, 3)[:, :2] - s0[:2]
        cos = to_cubes @ d / (np.linalg.norm(to_cubes, axis=1) * np.linalg.norm(d) + 1e-9)
        named = COLOURS.index(GOALS[m.task][0])
        hits.append(int(np.argmax(cos)) == named)
        cos_named.append(float(cos[named]))
    return {"choice": float(np.mean(hits)), "cos_named": float(np.mean(cos_named)), "n": len(meta)}


def main() -> None:
    """Print the two fractions for one checkpoint."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--instructions", default=None)
    ap.add_argument("--seed", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--store", default=None, help="demo store for the first-chunk cube choice")
    ap.add_argument("--episodes", type=int, default=90, help="demo episodes for the cube choice")
    args = ap.parse_args()
    torch.set_num_threads(1)
    policy = load_policy(args.checkpoint, device="cpu", seed=args.seed)  # loaded once for both measurements
    out = run(policy, args.instructions, args.seed, args.repeats)
    if args.store:
        choice = first_chunk_choice(policy, args.store, args.episodes)
        out.update(choice=choice["choice"], cos_named=choice["cos_named"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
