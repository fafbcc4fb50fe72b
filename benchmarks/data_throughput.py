"""Data throughput: recording frames/s (vs the same rollouts unrecorded), zarr chunk size vs write/read speed,
SequenceDataset samples/s vs one training step, and the same windows read through LeRobot's LeRobotDataset on
the exported copy. Every speed is also given as a ratio against a baseline measured in the same run.

    MUJOCO_GL=egl .venv/bin/python benchmarks/data_throughput.py --episodes 20 \\
        --out benchmarks/results/data_throughput.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MUJOCO_GL", "egl")


def rollouts(env, expert, episodes: int, seed: int, recorder=None) -> int:
    """Run ``episodes`` expert episodes; record them when ``recorder`` is given. Returns frames."""
    from policylink.data.episode_meta import EpisodeMeta
    from policylink.runtime.record import record_episode

    frames = 0
    for i in range(episodes):
        expert.reset(seed + i)
        if recorder is not None:
            frames += record_episode(
                env,
                lambda o: expert.act(o, env),
                recorder,
                seed=seed + i,
                meta=EpisodeMeta(source="expert", quality="expert"),
            )[2]
            continue
        obs, _ = env.reset(seed=seed + i)
        for _ in range(env.env_spec.max_episode_steps):
            obs, _, term, trunc, _ = env.step(expert.act(obs, env))
            frames += 1
            if term or trunc:
                break
    return frames


def bench_recording(args, tmp: Path) -> tuple[Path, list[str]]:
    from policylink.adapters.registry import make_env
    from policylink.data.recorder import EpisodeRecorder
    from policylink.sim.experts import make_expert

    env = make_env(args.env, obs_mode=args.obs_mode, image_size=args.image_size)
    expert = make_expert(env, quality="expert", seed=0)
    rollouts(env, expert, 1, 10_000)  # warm-up (renderer, caches)
    t = time.perf_counter()
    n0 = rollouts(env, expert, args.episodes, 0)
    base = n0 / (time.perf_counter() - t)
    path = tmp / "rec.zarr"
    t = time.perf_counter()
    with EpisodeRecorder(path, env_spec=env.env_spec) as rec:
        n1 = rollouts(env, expert, args.episodes, 0, rec)
    rec_fps = n1 / (time.perf_counter() - t)
    lines = [
        "## Recording",
        "",
        "| run | frames | frames/s | ratio |",
        "|---|---:|---:|---:|",
        f"| env + expert, not recorded (baseline) | {n0} | {base:.0f} | 1.00 |",
        f"| env + expert + EpisodeRecorder -> zarr | {n1} | {rec_fps:.0f} | {rec_fps / base:.2f} |",
        "",
    ]
    return path, lines


def bench_chunks(src_path: Path, tmp: Path, windows: int) -> list[str]:
    from policylink.data.buffer import EpisodeStore
    from policylink.data.sampler import SequenceSampler

    src = EpisodeStore(src_path)
    eps = [src.get_episode(i) for i in range(src.n_episodes)]
    metas = src.all_meta()
    obs_keys = [k for k in src.keys if k.startswith("observation.")]
    rng = np.random.default_rng(0)
    lines = [
        "## Chunking (time steps per chunk from a byte target; images 96x96x3 = 27 KiB/step)",
        "",
        "| chunk target | image steps/chunk | write frames/s | size on disk (MiB) | random windows/s "
        "from disk | ratio vs in-memory |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kib in (32, 256, 1024, 8192):
        path = tmp / f"chunk{kib}.zarr"
        t = time.perf_counter()
        with EpisodeStore(path, "w", chunk_bytes=kib * 1024) as dst:
            for ep, meta in zip(eps, metas):
                dst.add_episode(ep, meta)
        write = src.n_steps / (time.perf_counter() - t)
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20
        store = EpisodeStore(path)
        disk = SequenceSampler(
            {k: store.array(k) for k in [*obs_keys, "action"]},
            store.episode_ends,
            n_obs_steps=2,
            horizon=16,
            obs_keys=obs_keys,
        )
        mem = SequenceSampler(
            store.load([*obs_keys, "action"]), store.episode_ends, n_obs_steps=2, horizon=16, obs_keys=obs_keys
        )
        idx = rng.integers(0, len(disk), windows)
        rate = {}
        for name, s in (("disk", disk), ("mem", mem)):
            t = time.perf_counter()
            for i in idx:
                s.sample(int(i))
            rate[name] = windows / (time.perf_counter() - t)
        cam = next((k for k in obs_keys if k.startswith("observation.images.")), None)
        steps = store.array(cam).chunks[0] if cam else "-"
        lines.append(
            f"| {kib} KiB | {steps} | {write:.0f} | {size:.1f} | {rate['disk']:.0f} | "
            f"{rate['disk'] / rate['mem']:.3f} |"
        )
    return [*lines, ""]


def bench_training(store_path: Path, args) -> list[str]:
    import torch

    from policylink.adapters.registry import make_env
    from policylink.data.buffer import EpisodeStore
    from policylink.data.normalize import Normalizer
    from policylink.data.processors import Processors
    from policylink.data.sampler import SequenceDataset
    from policylink.data.stats import compute_stats
    from policylink.policies.processing import normalizer_modes, window_horizon
    from policylink.policies.registry import build_model, default_config
    from policylink.train.losses import BatchFields, training_batch

    torch.set_num_threads(2)
    env = make_env(args.env, obs_mode=args.obs_mode, image_size=args.image_size)
    store = EpisodeStore(store_path)
    keys = [k for k in store.keys if k.startswith("observation.")]
    feats = {k: env.env_spec.observation_features[k] for k in keys}
    cfg = default_config()
    cfg.observation_keys = keys
    stats = compute_stats(store, keys=[*keys, "action"])
    norm = Normalizer(stats, normalizer_modes(feats, cfg.state_norm_mode, cfg.action_norm_mode, cfg.image_norm_mode))
    horizon = window_horizon(cfg.n_obs_steps, cfg.chunk_size)  # as train/imitation.py: the chunk starts at t
    chain = Processors.for_keys(keys, norm, n_obs_steps=cfg.n_obs_steps)
    ds = SequenceDataset(store, n_obs_steps=cfg.n_obs_steps, horizon=horizon, obs_keys=keys, processors=chain)
    b = args.batch
    rng = np.random.default_rng(0)

    def per_item():  # items, then torch.stack (train/imitation.py's former collate)
        items = [ds[int(i)] for i in rng.integers(0, len(ds), b)]
        return ({k: torch.stack([it[k] for it in items]) for k in keys}, torch.stack([it["action"] for it in items]))

    def batched():  # numpy stacking inside SequenceDataset.get_batch: the batch train/imitation.py trains on
        out = training_batch(ds, rng.integers(0, len(ds), b), BatchFields(), "cpu")
        return out["obs"], out["action"]

    t_data = {}
    for name, fn in (("per_item", per_item), ("get_batch", batched)):
        fn()
        t = time.perf_counter()
        for _ in range(args.steps):
            obs, act = fn()
        t_data[name] = (time.perf_counter() - t) / args.steps
    model = build_model(cfg, feats, env.env_spec.action.dim)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)

    def step():
        loss = model(obs, act, model.draw_noise(b, g))
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()
    t = time.perf_counter()
    for _ in range(args.steps):
        step()
    t_step = (time.perf_counter() - t) / args.steps
    return [
        "## Sampler vs training step",
        "",
        f"Diffusion Policy (default config, obs {keys}), batch {b}, n_obs_steps 2, chunk 16 (window {horizon}), CPU "
        f"2 threads, mean of {args.steps} batches.",
        "",
        "| work per batch | seconds | samples/s | ratio (data / step) |",
        "|---|---:|---:|---:|",
        f"| SequenceDataset `ds[i]` x {b} + `torch.stack` | {t_data['per_item']:.4f} | "
        f"{b / t_data['per_item']:.0f} | {t_data['per_item'] / t_step:.4f} |",
        f"| `training_batch` via SequenceDataset `get_batch` ({b} windows, numpy stacking) | "
        f"{t_data['get_batch']:.4f} | "
        f"{b / t_data['get_batch']:.0f} | {t_data['get_batch'] / t_step:.4f} |",
        f"| training step (forward + backward + AdamW) | {t_step:.3f} | {b / t_step:.0f} | 1.000 |",
        "",
    ]


def bench_lerobot(store_path: Path, tmp: Path, n: int) -> list[str]:
    from policylink.data.buffer import EpisodeStore
    from policylink.data.lerobot import export_lerobot
    from policylink.data.sampler import SequenceDataset

    store = EpisodeStore(store_path)
    t = time.perf_counter()
    root = export_lerobot(store, tmp / "lerobot")
    t_export = time.perf_counter() - t
    keys = [k for k in store.keys if k.startswith("observation.")]
    t = time.perf_counter()
    ours = SequenceDataset(store, n_obs_steps=2, horizon=16, obs_keys=keys)
    t_ours_open = time.perf_counter() - t
    lines = [
        "## Same windows through LeRobotDataset (exported copy, image features in parquet)",
        "",
        f"Export of {store.n_episodes} episodes / {store.n_steps} frames: {t_export:.1f} s.",
        "",
        "| reader | open (s) | windows/s | ratio vs ours |",
        "|---|---:|---:|---:|",
    ]
    idx = np.random.default_rng(1).integers(0, len(ours), n)
    t = time.perf_counter()
    for i in idx:
        ours[int(i)]
    ours_rate = n / (time.perf_counter() - t)
    lines.append(f"| policylink SequenceDataset (in memory) | {t_ours_open:.2f} | {ours_rate:.0f} | 1.00 |")
    try:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset
    except ImportError as e:
        return [*lines, f"| LeRobotDataset | - | not installed ({e}) | - |", ""]
    fps = float(store.info["fps"])
    delta = {k: [-1 / fps, 0.0] for k in keys}
    delta["action"] = [(j - 1) / fps for j in range(16)]
    t = time.perf_counter()
    ds = LeRobotDataset(repo_id="policylink/bench", root=root, delta_timestamps=delta)
    t_open = time.perf_counter() - t
    lr_idx = np.random.default_rng(1).integers(0, len(ds), n)
    ds[0]
    t = time.perf_counter()
    for i in lr_idx:
        ds[int(i)]
    lr_rate = n / (time.perf_counter() - t)
    lines.append(
        f"| lerobot 0.4.4 LeRobotDataset (delta_timestamps) | {t_open:.2f} | {lr_rate:.0f} | "
        f"{lr_rate / ours_rate:.3f} |"
    )
    return [*lines, ""]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="push")
    p.add_argument("--obs-mode", default="state+image")
    p.add_argument("--image-size", type=int, default=96)
    p.add_argument("--episodes", type=int, default=20)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=3, help="training steps / batches timed")
    p.add_argument("--windows", type=int, default=300, help="random windows read per chunking / LeRobot run")
    p.add_argument("--out", default=None, help="markdown file for the results")
    args = p.parse_args()
    # torchvision (triton) segfaults when first imported after MuJoCo's EGL context exists: import it first
    import torchvision  # noqa: F401

    tmp = Path(tempfile.mkdtemp(prefix="data_throughput_"))
    try:
        path, lines = bench_recording(args, tmp)
        print("\n".join(lines), flush=True)
        for run in (
            lambda: bench_chunks(path, tmp, args.windows),
            lambda: bench_training(path, args),
            lambda: bench_lerobot(path, tmp, args.windows),
        ):
            part = run()
            print("\n".join(part), flush=True)
            lines += part
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.out:
        cmd = (
            f"MUJOCO_GL=egl .venv/bin/python benchmarks/data_throughput.py --env {args.env} --obs-mode "
            f"{args.obs_mode} --episodes {args.episodes} --batch {args.batch} --steps {args.steps} "
            f"--windows {args.windows} --out {args.out}"
        )
        head = [
            "# Data throughput",
            "",
            f"Command: `{cmd}`",
            "",
            f"Machine: 2-core CPU, no GPU (shared with other jobs). Date: {datetime.date.today()}.",
            "",
        ]
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("\n".join(head + lines))


if __name__ == "__main__":
    main()
