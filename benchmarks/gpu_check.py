"""GPU readiness check: a few hundred mixed-precision (bf16 autocast) training steps of our Diffusion Policy on
synthetic state + 96x96 image episodes, a checkpoint saved and loaded back, then chunk-inference latency and the
corrector monitor's per-step latency, within a time budget (5 minutes). Without CUDA the same path runs on the CPU
with fewer steps and a smaller U-Net (AMP is then off: the trainer honours it on CUDA only). Installs and downloads
nothing (random init, synthetic data, ``HF_HUB_OFFLINE=1``). Exit status 1 when a check fails.

    benchmarks/gpu_check.sh                     # (or .venv/bin/python benchmarks/gpu_check.py [--device cpu])

The training loop is ``policylink.train.trainer.fit`` stepping the ``Optimization`` of ``policylink train``
(``policylink.train.imitation.optim_config``) with ``amp=True`` added: ``TrainConfig`` has no AMP field yet, so
the imitation job itself (``policylink.train.imitation.train``) cannot run with mixed precision.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _train_setups import IMAGE, STATE, build_store  # noqa: E402  (benchmarks/ is not a package)

PRESETS = {  # device -> defaults
    "cuda": {
        "steps": 300,
        "batch": 64,
        "down_dims": [256, 512, 1024],
        "calls": 50,
        "monitor_steps": 300,
        "episodes": 32,
    },
    "cpu": {"steps": 12, "batch": 8, "down_dims": [64, 128, 256], "calls": 5, "monitor_steps": 50, "episodes": 8},
}
WARMUP_STEPS = 5  # excluded from the training rate (allocator, cuDNN algorithm choice)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Options with per-device defaults (:data:`PRESETS`). Exits with status 2 on a bad value."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--steps", type=int, default=None, help="training steps (CUDA 300, CPU 12)")
    ap.add_argument("--batch", type=int, default=None, help="batch size (CUDA 64, CPU 8)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (CPU run 1: steady on a shared box)")
    ap.add_argument("--budget-s", type=float, default=300.0, help="the whole check must finish within this")
    ap.add_argument("--out", default="", help="also write the results as JSON here")
    args = ap.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device: cuda requested, but torch.cuda.is_available() is False")
    args.device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    preset = PRESETS[args.device]
    args.steps = preset["steps"] if args.steps is None else args.steps
    args.batch = preset["batch"] if args.batch is None else args.batch
    if args.steps <= WARMUP_STEPS or args.batch < 1:
        ap.error(f"--steps/--batch: expected steps > {WARMUP_STEPS} and batch >= 1, received {args.steps}/{args.batch}")
    for name in ("down_dims", "calls", "monitor_steps", "episodes"):
        setattr(args, name, preset[name])
    args.threads = (1 if args.device == "cpu" else 0) if args.threads is None else args.threads
    if args.threads:
        torch.set_num_threads(args.threads)
    return args


def device_info(device: str) -> dict[str, Any]:
    """torch version, the device's name, compute capability, memory (GiB) and bf16 support."""
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "device": device, "cuda_build": torch.version.cuda}
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        info.update(name=p.name, capability=f"{p.major}.{p.minor}", memory_gib=round(p.total_memory / 2**30, 1),
                    bf16=torch.cuda.is_bf16_supported())  # fmt: skip
    else:
        info.update(name=f"CPU ({os.cpu_count()} cores)", threads=torch.get_num_threads())
    return info


def train(store_path: Path, args: argparse.Namespace) -> tuple[Any, Any, Any, dict[str, Any]]:
    """``args.steps`` AMP training steps as ``policylink train`` takes them (its data, model, optimizer, EMA).
    Returns ``(EMA model, processor chain, spec, results)``; results: samples/s after the warm-up, data seconds per
    step (batch building in the training process), loss at the start / end, autocast dtype, peak memory."""
    import torch

    from policylink.policies.diffusion import DiffusionPolicyConfig
    from policylink.policies.registry import build_model
    from policylink.train.config import DatasetConfig, TrainConfig
    from policylink.train.data import training_data
    from policylink.train.imitation import optim_config
    from policylink.train.losses import make_loss, training_batch
    from policylink.train.trainer import Optimization, fit

    policy = DiffusionPolicyConfig(observation_keys=[STATE, IMAGE])
    policy.unet.down_dims = list(args.down_dims)
    data = DatasetConfig(path=str(store_path), control_mode="joint_position", val_fraction=0.0)
    cfg = TrainConfig(policy=policy, dataset=data, batch_size=args.batch, steps=args.steps, device=args.device)
    loss_fn, device = make_loss(cfg), torch.device(args.device)
    spec, ds, _ = training_data(cfg, loss_fn.fields, warn=False)
    torch.manual_seed(0)
    model = build_model(policy, spec.observation_features, spec.action.dim).to(device)
    run = Optimization(model, dataclasses.replace(optim_config(cfg), amp=True), device=device)
    rng, gen = np.random.default_rng(0), torch.Generator().manual_seed(0)
    seen: dict[str, Any] = {"data_s": 0.0}

    def step_loss(step: int):
        model.train()
        t0 = time.perf_counter()
        batch = training_batch(ds, rng.integers(0, len(ds), cfg.batch_size), loss_fn.fields, device)
        batch["noise"] = {k: v.to(device) for k, v in loss_fn.draw(model, cfg.batch_size, gen).items()}
        seen["data_s"] += time.perf_counter() - t0
        seen["autocast"] = (
            str(torch.get_autocast_dtype(device.type)) if torch.is_autocast_enabled(device.type) else None
        )
        return loss_fn(model, batch, step)

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    losses, t_start = [], 0.0
    for done in fit(step_loss, run, cfg.steps):
        losses.append(float(done.loss))  # a sync per step, as the trainer's logging
        if done.step == WARMUP_STEPS:
            sync()
            t_start, seen["data_s"] = time.perf_counter(), 0.0
    sync()
    timed = cfg.steps - WARMUP_STEPS
    elapsed = time.perf_counter() - t_start
    k = max(1, min(10, len(losses) // 4))
    results = {
        "steps": cfg.steps, "batch": cfg.batch_size, "down_dims": list(args.down_dims),
        "params": sum(p.numel() for p in model.parameters()), "samples_per_s": timed * cfg.batch_size / elapsed,
        "step_ms": 1e3 * elapsed / timed, "data_ms_per_step": 1e3 * seen["data_s"] / timed,
        "loss_first": float(np.mean(losses[:k])), "loss_last": float(np.mean(losses[-k:])),
        "autocast": seen.get("autocast"), "all_finite": bool(np.isfinite(losses).all()),
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
    }  # fmt: skip
    return run.ema.model, ds.processors, spec, results


def observation_batches(store: Any, keys: list[str], b: int, steps: int = 40) -> list[dict[str, np.ndarray]]:
    """Steps ``0 .. steps-1`` of episodes ``0 .. b-1`` as observation batches (key -> ``(b, ...)``), read into
    memory beforehand so that no store read is timed."""
    data = store.load(keys)
    starts = np.array([store.episode_slice(i).start for i in range(b)])
    return [{k: data[k][starts + t] for k in keys} for t in range(steps)]


def latency_ms(fn, calls: int, device: str) -> dict[str, float]:
    """Median and 90th percentile milliseconds of ``fn()`` over ``calls`` calls (after one untimed call)."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    fn()
    times = []
    for _ in range(calls):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(1e3 * (time.perf_counter() - t0))
    return {"median_ms": statistics.median(times), "p90_ms": float(np.percentile(times, 90))}


def inference(policy: Any, store: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Chunk latency (one new observation + ``predict_action_chunk``: encoder, DDIM sampling, unnormalisation) at
    batch 1 and 8, from the checkpoint loaded back."""
    keys, out = list(policy.spec.observation_features), {}
    for b in (1, 8):
        policy.reset()
        obs, step = observation_batches(store, keys, b), iter(range(10**9))

        def call(obs=obs, step=step):
            policy.update_observation(obs[next(step) % len(obs)])
            return policy.predict_action_chunk()

        out[f"batch_{b}"] = latency_ms(call, args.calls, args.device)
    return out


def monitor(policy: Any, store: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Train the corrector's latent monitor on the policy's latents of 8 stored episodes, then time one control
    step of monitoring at batch 1 and 8: new observation, ``embed`` (encoder), monitor MLP, deviation score."""
    import torch

    from policylink.policies.corrector.monitor import (
        MonitorConfig,
        episode_latents,
        monitor_deviation,
        monitor_pairs,
    )
    from policylink.train.monitor import train_monitor

    keys, episodes = list(policy.spec.observation_features), [store.get_episode(i) for i in range(8)]
    t0 = time.perf_counter()
    latents = [episode_latents(policy, ep) for ep in episodes]
    config = MonitorConfig()
    pairs = monitor_pairs(latents, [ep["action"] for ep in episodes], config.horizon)
    mon, losses = train_monitor(*pairs, config, steps=args.monitor_steps)
    mon = mon.to(args.device)
    out: dict[str, Any] = {"fit_s": time.perf_counter() - t0, "pairs": len(pairs[0]), "loss_last": losses[-1]}
    for b in (1, 8):
        policy.reset()
        z_prev = torch.as_tensor(np.stack([lat[0] for lat in latents[:b]]), device=args.device)
        acts = torch.as_tensor(np.stack([ep["action"][: config.horizon] for ep in episodes[:b]]), device=args.device)
        obs, step = observation_batches(store, keys, b), iter(range(10**9))

        def call(obs=obs, step=step, z_prev=z_prev, acts=acts):
            policy.update_observation(obs[next(step) % len(obs)])
            z = policy.embed()
            with torch.no_grad():
                pred = mon(z_prev, acts).cpu().numpy()
            return monitor_deviation(mon, pred, z - z_prev.cpu().numpy())

        out[f"batch_{b}"] = latency_ms(call, args.calls, args.device)
    return out


def checks(res: dict[str, Any], args: argparse.Namespace, elapsed: float) -> list[tuple[str, bool]]:
    """The pass/fail list: finite losses, loss going down (>= 100 steps), bf16 autocast active (CUDA), latencies
    measured, the whole run within ``--budget-s``."""
    tr = res["train"]
    out = [("training losses finite", tr["all_finite"])]
    if tr["steps"] >= 100:
        out.append((f"loss decreased ({tr['loss_first']:.3f} -> {tr['loss_last']:.3f})",
                    tr["loss_last"] < tr["loss_first"]))  # fmt: skip
    if args.device == "cuda":
        out.append((f"bf16/fp16 autocast active in the training step ({tr['autocast']})", tr["autocast"] is not None))
    medians = [res[part][f"batch_{b}"]["median_ms"] for part in ("inference", "monitor") for b in (1, 8)]
    out.append(("chunk and monitor latency measured", bool(np.isfinite(medians).all())))
    out.append((f"finished within {args.budget_s:.0f} s ({elapsed:.0f} s)", elapsed <= args.budget_s))
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the check, print the results and the pass/fail list; returns 0 when every check passes, else 1."""
    t_all = time.perf_counter()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from policylink.policies import load_policy
    from policylink.policies.checkpoint import save_checkpoint

    res: dict[str, Any] = {"info": device_info(args.device)}
    print(json.dumps(res["info"]), flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        store = build_store(Path(tmp) / "demo.zarr", "image", args.episodes, 60)
        ema, processors, spec, res["train"] = train(Path(tmp) / "demo.zarr", args)
        print(f"train: {json.dumps(res['train'])}", flush=True)
        ckpt = save_checkpoint(Path(tmp) / "ckpt", model=ema, processors=processors, spec=spec)
        policy = load_policy(str(ckpt), device=args.device)
        res["inference"] = inference(policy, store, args)
        print(f"chunk inference (ms): {json.dumps(res['inference'])}", flush=True)
        res["monitor"] = monitor(policy, store, args)
        print(f"monitor step (ms): {json.dumps(res['monitor'])}", flush=True)
    elapsed = time.perf_counter() - t_all
    res["elapsed_s"], res["checks"] = elapsed, checks(res, args, elapsed)
    for name, ok in res["checks"]:
        print(f"[{'PASS' if ok else 'FAIL'}] {name}")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1, default=str))
    return 0 if all(ok for _, ok in res["checks"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
