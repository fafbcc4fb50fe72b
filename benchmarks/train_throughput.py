"""Training throughput: samples/s of our Diffusion Policy against LeRobot's ``DiffusionPolicy`` (lerobot 0.4.4) at
the same architecture size (parameters counted and reported), batch, data and one DDPM timestep per sample, timed
pair by pair in one process, state-only and with 96x96 images.

Each library is timed two ways:

- ``model``: the optimizer step alone, on one batch prepared beforehand (forward + backward + clipping + optimizer
  + LR schedule). Ours is ``policylink.train.trainer.fit`` stepping the ``Optimization`` that ``policylink train``
  builds (AdamW, clip 10, cosine LR, EMA copy); LeRobot's is ``lerobot.scripts.lerobot_train.update_policy``
  (Adam, clip 10, cosine LR, no EMA: ours does the EMA update on top).
- ``data``: the same step fed by each library's own data path. Ours: ``training_batch`` over ``SequenceDataset``
  (in memory), synchronous in the training process, as ``policylink.runtime.train`` runs it. LeRobot's, as
  ``lerobot-train`` runs it: ``LeRobotDataset`` (``delta_timestamps``, PNG image features of the exported store)
  -> ``DataLoader`` (``EpisodeAwareSampler``, ``--workers`` processes, prefetch 2, pinned memory on CUDA) ->
  ``accelerate`` -> the policy's preprocessor. Each of its data blocks opens a new DataLoader iterator and takes
  its first batch untimed (worker start-up), then times its steps with the workers' prefetch in flight; the
  iterator is dropped after the block, so no worker runs during the other library's blocks.

Blocks alternate ours/LeRobot (order swapped every repeat); the tables give the median over repeats. Synthetic
episodes (smooth trajectories; images a moving square on a gradient, PNG-friendly like a render) are written to a
temporary episode store and exported to a LeRobot v3 folder with ``policylink.data.lerobot.export_lerobot``.

    .venv/bin/python benchmarks/train_throughput.py            # CPU sizes when no GPU; writes results/
    .venv/bin/python benchmarks/train_throughput.py --device cuda --amp
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
RESULTS = Path(__file__).resolve().parent / "results" / "train_throughput.md"
STATE, ENV_STATE, IMAGE = "observation.state", "observation.environment_state", "observation.images.top"
STATE_DIM, ENV_DIM, ACTION_DIM, IMAGE_SIDE, CROP_SIDE = 8, 8, 7, 96, 84
N_OBS, HORIZON, DROP_LAST, FPS = 2, 16, 7, 10.0
MODES = ("state", "image")
# per-device defaults: (down_dims, batch per mode, steps per block per mode, torch threads; 0 = torch's default).
# One thread on CPU: on a shared machine two OpenMP threads stall whenever another job holds a core (the same
# block then varies 10x); both libraries run with the same setting.
PRESETS = {
    "cpu": ("64,128,256", {"state": 64, "image": 16}, {"state": 5, "image": 2}, 1),
    "cuda": ("512,1024,2048", {"state": 64, "image": 64}, {"state": 20, "image": 10}, 0),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and complete the arguments (see :func:`resolve_args`). Exits with status 2 on a bad value."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    ap.add_argument("--modes", default="state,image", help="comma list of: state (state + env state), image")
    ap.add_argument("--down-dims", default=None, help="U-Net channels per level, both libraries (CPU 64,128,256)")
    ap.add_argument("--batch", type=int, default=None, help="batch size (default per mode and device)")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps per timed block (default per mode)")
    ap.add_argument("--repeats", type=int, default=5, help="timed blocks per library and pipeline")
    ap.add_argument("--episode-length", type=int, default=60, help="steps per synthetic episode")
    ap.add_argument("--workers", type=int, default=None, help="LeRobot DataLoader workers (min(4, CPUs))")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU 1; 0: torch's default)")
    ap.add_argument("--amp", action="store_true", help="bf16 autocast on CUDA, both libraries")
    ap.add_argument("--no-ema", action="store_true", help="train ours without its EMA copy (LeRobot keeps none)")
    ap.add_argument("--profile", action="store_true", help="also print the top ops of one model step of each")
    ap.add_argument("--out", default=str(RESULTS), help="markdown results ('' = none); JSON next to it")
    args = ap.parse_args(argv)
    try:
        return resolve_args(args)
    except ValueError as e:
        ap.error(str(e))


def resolve_args(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the per-device defaults and check every value.

    Sets ``args.device`` (``"cpu"``/``"cuda"``), ``args.modes`` (list), ``args.down_dims`` (list of int),
    ``args.batches`` / ``args.block_steps`` (mode -> int) and ``args.workers``.

    Raises:
        ValueError: names the option, the expected and the received value (unknown device or mode, CUDA asked for
            but absent, U-Net levels not multiples of 8 or too many for the 16-step chunk, non-positive counts).
    """
    import torch

    if args.device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"--device: expected auto, cpu or cuda, received {args.device!r}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device: cuda requested, but torch.cuda.is_available() is False")
    args.device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    dims, batches, steps, threads = PRESETS[args.device]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in args.modes if m not in MODES]
    if bad or not args.modes:
        raise ValueError(f"--modes: expected a comma list of {MODES}, received {bad or args.modes}")
    try:
        args.down_dims = [int(d) for d in (args.down_dims or dims).split(",")]
    except ValueError:
        raise ValueError(f"--down-dims: expected a comma list of ints, received {args.down_dims!r}") from None
    if any(d < 8 or d % 8 for d in args.down_dims) or HORIZON % 2 ** len(args.down_dims):
        raise ValueError(
            f"--down-dims: expected 1-4 levels, each a multiple of 8 (GroupNorm groups) with {HORIZON} divisible by "
            f"2 ** levels (LeRobot's rule), received {args.down_dims}"
        )
    args.batches = {m: args.batch or batches[m] for m in args.modes}
    args.block_steps = {m: args.steps or steps[m] for m in args.modes}
    args.workers = min(4, os.cpu_count() or 1) if args.workers is None else args.workers
    args.threads = threads if args.threads is None else args.threads
    for name, value in (
        ("--batch", args.batch), ("--steps", args.steps), ("--repeats", args.repeats),
        ("--episode-length", args.episode_length),
    ):  # fmt: skip
        if value is not None and value < 1:
            raise ValueError(f"{name}: expected an int >= 1, received {value}")
    if args.episode_length <= DROP_LAST:
        raise ValueError(f"--episode-length: expected > {DROP_LAST} (LeRobot drops the last {DROP_LAST}), received "
                         f"{args.episode_length}")  # fmt: skip
    if args.workers < 0 or args.threads < 0:
        raise ValueError(f"--workers/--threads: expected >= 0, received {args.workers}/{args.threads}")
    return args


def episodes_needed(batches: int, batch: int, length: int) -> int:
    """Episodes of ``length`` steps (at least 20) so that LeRobot's sampler (``length - 7`` anchors an episode)
    yields ``batches`` batches of ``batch`` within one epoch, +25 % (an epoch's end restarts the DataLoader)."""
    return max(20, math.ceil(1.25 * batches * batch / (length - DROP_LAST)))


def synthetic_episode(rng: np.random.Generator, length: int, image: bool) -> dict[str, np.ndarray]:
    """One episode: smooth state ``(T, 8)`` and action ``(T, 7)`` float32; ``image`` adds a 96x96 RGB frame
    ``(T, 96, 96, 3)`` uint8 (a square moving on a gradient), else an env state ``(T, 8)``."""
    t = np.arange(length, dtype=np.float32)[:, None] / length
    f = rng.uniform(0.5, 2.0, (1, STATE_DIM + ENV_DIM)).astype(np.float32)
    phase = rng.uniform(0, 2 * np.pi, (1, STATE_DIM + ENV_DIM)).astype(np.float32)
    wave = np.sin(2 * np.pi * f * t + phase)
    ep = {STATE: wave[:, :STATE_DIM], "action": np.diff(wave[:, : ACTION_DIM + 1], axis=0, prepend=0)[:, :ACTION_DIM]}
    ep["action"] = (ep["action"] * 10).astype(np.float32)
    if not image:
        ep[ENV_STATE] = wave[:, STATE_DIM:].copy()
        return ep
    side = IMAGE_SIDE
    grad = np.linspace(40, 200, side, dtype=np.float32)
    base = np.stack([grad[None, :].repeat(side, 0), grad[:, None].repeat(side, 1), np.full((side, side), 90.0)], -1)
    frames = np.repeat(base[None], length, 0).astype(np.uint8)
    xy = ((wave[:, :2] + 1) / 2 * (side - 16)).astype(int)
    for i, (x, y) in enumerate(xy):
        frames[i, y : y + 16, x : x + 16] = (230, 60, 30)
    ep[IMAGE] = frames
    return ep


def build_store(path: Path, mode: str, episodes: int, length: int, seed: int = 0):
    """Write ``episodes`` synthetic episodes of ``mode`` to an episode store at ``path`` (fps 10); returns it
    opened read-only."""
    from policylink.data.buffer import EpisodeStore
    from policylink.data.episode_meta import EpisodeMeta

    rng = np.random.default_rng(seed)
    with EpisodeStore(path, "w") as store:
        store.update_info(fps=FPS)
        for i in range(episodes):
            store.add_episode(synthetic_episode(rng, length, mode == "image"), EpisodeMeta(task="", seed=i))
    return EpisodeStore(path, "r")


def obs_keys(mode: str) -> list[str]:
    """Observation keys of ``mode``: LeRobot's Diffusion Policy needs the robot state plus an image or an env
    state, so the state-only mode reads state + env state in both libraries."""
    return [STATE, IMAGE] if mode == "image" else [STATE, ENV_STATE]


# ------------------------------------------------------------------------------------------------------- ours
class Ours:
    """Our Diffusion Policy trained as ``policylink.runtime.train.train`` trains it (see the module docstring)."""

    name = "policylink"

    def __init__(self, store_path: Path, mode: str, args: argparse.Namespace):
        import dataclasses

        import torch

        from policylink.policies.diffusion import DiffusionPolicyConfig
        from policylink.policies.registry import build_model
        from policylink.runtime.losses import make_loss
        from policylink.runtime.train import optim_config
        from policylink.runtime.train_config import DatasetConfig, TrainConfig
        from policylink.runtime.train_data import training_data
        from policylink.train.trainer import Optimization

        policy = DiffusionPolicyConfig(observation_keys=obs_keys(mode), n_obs_steps=N_OBS, chunk_size=HORIZON)
        policy.unet.down_dims = list(args.down_dims)
        policy.encoder.crop_ratio = CROP_SIDE / IMAGE_SIDE  # 84 px random crops, as LeRobot's crop_shape
        self.batch_size, self.device = args.batches[mode], torch.device(args.device)
        data = DatasetConfig(path=str(store_path), control_mode="joint_position", val_fraction=0.0)
        cfg = TrainConfig(policy=policy, dataset=data, batch_size=self.batch_size, device=args.device, steps=10**6)
        self.loss_fn = make_loss(cfg)
        spec, _, self.ds, _ = training_data(cfg, self.loss_fn.fields, warn=False)
        torch.manual_seed(0)
        self.model = build_model(policy, spec.observation_features, spec.action.dim).to(self.device)
        optim = optim_config(cfg)  # AdamW, clip, cosine LR and EMA, as policylink train
        optim = dataclasses.replace(optim, amp=args.amp, ema_max_decay=None if args.no_ema else optim.ema_max_decay)
        self.run = Optimization(self.model, optim, device=self.device)
        self.rng, self.gen, self.step = np.random.default_rng(0), torch.Generator().manual_seed(0), 0
        self.fixed = self.batch()

    def batch(self) -> dict[str, Any]:
        """One training batch (``training_batch`` of random windows) on the device."""
        from policylink.runtime.losses import training_batch

        return training_batch(self.ds, self.rng.integers(0, len(self.ds), self.batch_size), self.loss_fn.fields,
                              self.device)  # fmt: skip

    def train(self, steps: int, with_data: bool) -> None:
        """``steps`` optimizer steps through :func:`fit`, on fresh batches (``with_data``) or the fixed one."""
        from policylink.train.trainer import fit

        def step_loss(step: int):
            self.model.train()
            batch = dict(self.batch() if with_data else self.fixed)
            noise = self.loss_fn.draw(self.model, self.batch_size, self.gen)
            batch["noise"] = {k: v.to(self.device) for k, v in noise.items()}
            return self.loss_fn(self.model, batch, step)

        for done in fit(step_loss, self.run, self.step + steps, start=self.step):
            float(done.loss)  # the trainer logs the loss every step (a device sync), as LeRobot's loss.item()
        self.step += steps

    def start(self, with_data: bool) -> None:
        """Nothing to set up: batches are built in the training process."""

    def stop(self) -> None:
        """Nothing runs between blocks."""

    def data_only(self, n: int) -> None:
        for _ in range(n):
            self.batch()

    def parameters(self) -> dict[str, int]:
        return param_counts(self.model, self.model.encoder, self.model.net)


# ---------------------------------------------------------------------------------------------------- LeRobot
class LeRobot:
    """LeRobot's DiffusionPolicy trained as ``lerobot-train`` trains it (see the module docstring)."""

    name = "lerobot"

    def __init__(self, root: Path, mode: str, args: argparse.Namespace):
        import torch
        from accelerate import Accelerator

        from policylink.policies.lerobot.loading import import_lerobot_policies

        import_lerobot_policies()  # lerobot 0.4.4 next to transformers 5 (see that function)
        from lerobot.configs.types import FeatureType
        from lerobot.datasets.factory import resolve_delta_timestamps
        from lerobot.datasets.lerobot_dataset import LeRobotDataset, LeRobotDatasetMetadata
        from lerobot.datasets.sampler import EpisodeAwareSampler
        from lerobot.datasets.utils import dataset_to_policy_features
        from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
        from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy
        from lerobot.policies.factory import make_pre_post_processors

        meta = LeRobotDatasetMetadata("policylink/bench", root=root)
        feats = dataset_to_policy_features(meta.features)
        outputs = {k: f for k, f in feats.items() if f.type is FeatureType.ACTION}
        self.cfg = DiffusionConfig(
            input_features={k: f for k, f in feats.items() if k not in outputs}, output_features=outputs,
            n_obs_steps=N_OBS, horizon=HORIZON, down_dims=tuple(args.down_dims), drop_n_last_frames=DROP_LAST,
            crop_shape=(CROP_SIDE, CROP_SIDE) if mode == "image" else None, device=args.device,
        )  # fmt: skip
        delta = resolve_delta_timestamps(self.cfg, meta)
        dataset = LeRobotDataset("policylink/bench", root=root, delta_timestamps=delta)
        torch.manual_seed(0)
        self.policy = DiffusionPolicy(self.cfg).to(args.device)
        self.pre, _ = make_pre_post_processors(self.cfg, dataset_stats=dataset.meta.stats)
        self.optimizer = self.cfg.get_optimizer_preset().build(self.policy.parameters())
        self.scheduler = self.cfg.get_scheduler_preset().build(self.optimizer, num_training_steps=10**6)
        precision = "bf16" if args.amp and args.device == "cuda" else "no"
        self.accelerator = Accelerator(step_scheduler_with_optimizer=False, cpu=args.device == "cpu",
                                       mixed_precision=precision)  # fmt: skip
        ep = meta.episodes
        sampler = EpisodeAwareSampler(ep["dataset_from_index"], ep["dataset_to_index"], drop_n_last_frames=DROP_LAST,
                                      shuffle=True)  # fmt: skip
        self.workers, self.batch_size = args.workers, args.batches[mode]
        loader = torch.utils.data.DataLoader(
            dataset, num_workers=args.workers, batch_size=self.batch_size, sampler=sampler,
            pin_memory=args.device == "cuda", drop_last=False, prefetch_factor=2 if args.workers else None,
        )  # fmt: skip
        self.policy, self.optimizer, self.loader, self.scheduler = self.accelerator.prepare(
            self.policy, self.optimizer, loader, self.scheduler
        )
        self.tracker = _tracker(self.batch_size, dataset, self.accelerator)
        self.start(with_data=True)
        self.fixed = self.pre(next(self.batches))
        self.stop()

    def start(self, with_data: bool) -> None:
        """Before a block that reads data: a new DataLoader iterator whose first batch is taken untimed (worker
        start-up); the block then begins with the workers' prefetch in flight, as in steady state."""
        if with_data:
            self.batches = iter(self.loader)
            next(self.batches)

    def stop(self) -> None:
        """After a block: drop the iterator, which stops its workers (no background load on the next block)."""
        self.batches = None

    def train(self, steps: int, with_data: bool) -> None:
        """``steps`` calls of LeRobot's ``update_policy``, on fresh preprocessed batches (``with_data``) or on the
        fixed one."""
        from lerobot.scripts.lerobot_train import update_policy

        for _ in range(steps):
            batch = self.pre(next(self.batches)) if with_data else self.fixed
            update_policy(self.tracker, self.policy, batch, self.optimizer, 10.0, accelerator=self.accelerator,
                          lr_scheduler=self.scheduler)  # fmt: skip

    def data_only(self, n: int) -> None:
        for _ in range(n):
            self.pre(next(self.batches))

    def parameters(self) -> dict[str, int]:
        model = self.accelerator.unwrap_model(self.policy).diffusion
        encoder = getattr(model, "rgb_encoder", None)
        return param_counts(model, encoder, model.unet)


def _tracker(batch_size: int, dataset: Any, accelerator: Any):
    from lerobot.utils.logging_utils import AverageMeter, MetricsTracker

    names = {"loss": ":.3f", "grad_norm": ":.3f", "lr": ":0.1e", "update_s": ":.3f", "dataloading_s": ":.3f"}
    meters = {k: AverageMeter(k, fmt) for k, fmt in names.items()}
    return MetricsTracker(batch_size, dataset.num_frames, dataset.num_episodes, meters, accelerator=accelerator)


def param_counts(model: Any, encoder: Any, net: Any) -> dict[str, int]:
    """Parameters of the whole trained model, of its image encoder (0 without images) and of its U-Net."""
    n = lambda m: sum(p.numel() for p in m.parameters()) if m is not None else 0  # noqa: E731
    return {"total": n(model), "image_encoder": n(encoder), "unet": n(net)}


# ------------------------------------------------------------------------------------------------ measurement
def block(lib: Any, fn, with_data: bool, device: str) -> float:
    """Seconds ``fn()`` takes (CUDA queue synchronised before and after), between ``lib.start(with_data)`` and
    ``lib.stop()``, which are not timed."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    lib.start(with_data)
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    seconds = time.perf_counter() - t0
    lib.stop()
    return seconds


def measure_mode(mode: str, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Build both libraries on one synthetic dataset of ``mode`` and time them pair by pair. Returns the raw
    samples/s per repeat, the data-only rates and the parameter counts."""
    from policylink.data.lerobot import export_lerobot

    b, k = args.batches[mode], args.block_steps[mode]
    episodes = episodes_needed(2 * k + 2, b, args.episode_length)  # a block reads within one DataLoader epoch
    t0 = time.perf_counter()
    store = build_store(tmp / f"{mode}.zarr", mode, episodes, args.episode_length)
    export_lerobot(store, tmp / f"{mode}_lerobot")
    print(f"[{mode}] {episodes} episodes x {args.episode_length} steps written + exported in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)  # fmt: skip
    libs = [Ours(tmp / f"{mode}.zarr", mode, args), LeRobot(tmp / f"{mode}_lerobot", mode, args)]
    params = {lib.name: lib.parameters() for lib in libs}
    print(f"[{mode}] parameters {params}", flush=True)
    for lib in libs:  # warm-up: allocator, conv algorithm choices, first worker start
        for with_data in (False, True):
            block(lib, lambda lib=lib, d=with_data: lib.train(1, with_data=d), with_data, args.device)
    data = {lib.name: 2 * k * b / block(lib, lambda lib=lib: lib.data_only(2 * k), True, args.device) for lib in libs}
    rates: dict[str, dict[str, list[float]]] = {p: {lib.name: [] for lib in libs} for p in ("model", "data")}
    for r in range(args.repeats):
        for pipeline in ("model", "data"):
            for lib in libs if r % 2 == 0 else libs[::-1]:
                d = pipeline == "data"
                seconds = block(lib, lambda lib=lib, d=d: lib.train(k, with_data=d), d, args.device)
                rates[pipeline][lib.name].append(k * b / seconds)
        print(f"[{mode}] repeat {r + 1}/{args.repeats}: " + ", ".join(
            f"{p} {n} {v[-1]:.1f}" for p, d in rates.items() for n, v in d.items()), flush=True)  # fmt: skip
    profile = profile_step(libs, args.device) if args.profile else None
    return {"batch": b, "steps_per_block": k, "episodes": episodes, "params": params, "data_only": data,
            "samples_per_s": rates, "profile": profile}  # fmt: skip


def profile_step(libs: list[Any], device: str, top: int = 15) -> dict[str, str]:
    """torch.profiler table (top ``top`` ops by self time) of two model-only steps of each library."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    out = {}
    for lib in libs:
        with profile(activities=acts) as prof:
            lib.train(2, with_data=False)
        out[lib.name] = prof.key_averages().table(sort_by=key, row_limit=top)
        print(f"--- profile: {lib.name}\n{out[lib.name]}", flush=True)
    return out


# ---------------------------------------------------------------------------------------------------- report
def machine_info(args: argparse.Namespace) -> dict[str, Any]:
    """CPU model (``lscpu``), core count, GPU name, torch / lerobot versions, threads, load average."""
    import torch

    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout if shutil.which("lscpu") else ""
    cpu = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), "")

    return {
        "cpu": cpu or platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        "torch": torch.__version__,
        "lerobot": version("lerobot"),
        "threads": torch.get_num_threads(),
        "load_avg_1min": os.getloadavg()[0],
    }


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Per mode and pipeline: median samples/s of each library, the ratio of the medians (ours / LeRobot) and the
    median of the per-repeat ratios (each repeat's two blocks ran back to back, so load from other jobs hits both
    alike)."""
    out = {}
    for mode, res in results.items():
        for pipeline, by_lib in res["samples_per_s"].items():
            med = {name: statistics.median(v) for name, v in by_lib.items()}
            paired = [a / b for a, b in zip(by_lib["policylink"], by_lib["lerobot"])]
            out[f"{mode}/{pipeline}"] = {**med, "ratio": med["policylink"] / med["lerobot"],
                                         "paired_ratio": statistics.median(paired)}  # fmt: skip
    return out


def markdown(args: argparse.Namespace, machine: dict, results: dict, summary: dict, argv: list[str]) -> str:
    """The results page."""
    cmd = " ".join([".venv/bin/python benchmarks/train_throughput.py", *argv])
    lines = [
        "# Training throughput: policylink Diffusion Policy vs LeRobot DiffusionPolicy", "",
        f"Command: `{cmd}`", "",
        f"Machine: {machine['cpu']} ({machine['cores']} cores), GPU: {machine['gpu'] or 'none'}; torch "
        f"{machine['torch']}, lerobot {machine['lerobot']}, {machine['threads']} torch threads, device "
        f"{args.device}, AMP {'bf16' if args.amp and args.device == 'cuda' else 'off'}. Load average (1 min) before: "
        f"{machine['load_avg_1min']:.2f}, after: {os.getloadavg()[0]:.2f}. Date: {datetime.date.today()}.", "",
        f"U-Net down_dims {args.down_dims}, kernel 5, 8 groups, time embedding 128, FiLM scale+bias; images: "
        f"ResNet-18 (GroupNorm, random init), random {CROP_SIDE}x{CROP_SIDE} crops of {IMAGE_SIDE}x{IMAGE_SIDE}, "
        f"32 spatial-softmax keypoints; n_obs_steps {N_OBS}, chunk {HORIZON} actions, 100 DDPM train timesteps "
        f"(one per sample). LeRobot DataLoader workers: {args.workers}. Ours {'without' if args.no_ema else 'with'} "
        "its EMA update (LeRobot has none).", "",
        "| mode | batch | steps/block | repeats | params ours (total / image enc / U-Net) | params LeRobot |",
        "|---|---:|---:|---:|---|---|",
    ]  # fmt: skip
    fmt = lambda p: f"{p['total']:,} / {p['image_encoder']:,} / {p['unet']:,}"  # noqa: E731
    for mode, res in results.items():
        lines.append(f"| {mode} | {res['batch']} | {res['steps_per_block']} | {args.repeats} | "
                     f"{fmt(res['params']['policylink'])} | {fmt(res['params']['lerobot'])} |")  # fmt: skip
    lines += ["", "## Samples/s (median over repeats; min-max in brackets)", "",
              "| mode | pipeline | policylink | LeRobot | ratio of medians | median per-repeat ratio |",
              "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for mode, res in results.items():
        for pipeline, by_lib in res["samples_per_s"].items():
            s = summary[f"{mode}/{pipeline}"]
            ours, theirs = (
                f"{s[n]:.1f} [{min(by_lib[n]):.1f}-{max(by_lib[n]):.1f}]" for n in ("policylink", "lerobot")
            )
            lines.append(f"| {mode} | {pipeline} | {ours} | {theirs} | {s['ratio']:.2f} | {s['paired_ratio']:.2f} |")
    lines += ["", "## Data path alone (batches built and preprocessed, no training step)", "",
              "| mode | policylink samples/s | x its model-step rate | LeRobot samples/s | x its model-step rate |",
              "|---|---:|---:|---:|---:|"]  # fmt: skip
    for mode, res in results.items():
        d, s = res["data_only"], summary[f"{mode}/model"]
        lines.append(f"| {mode} | {d['policylink']:.0f} | {d['policylink'] / s['policylink']:.1f} | "
                     f"{d['lerobot']:.0f} | {d['lerobot'] / s['lerobot']:.1f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the tables and write ``--out`` (+ ``.json``). Returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    machine = machine_info(args)
    print(machine, flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="train_throughput_"))
    try:
        results = {mode: measure_mode(mode, tmp, args) for mode in args.modes}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    summary = summarize(results)
    page = markdown(args, machine, results, summary, argv)
    print(page)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(page)
        raw = {"argv": argv, "machine": machine, "summary": summary, "results": results,
               "config": {k: v for k, v in vars(args).items() if k != "out"}}  # fmt: skip
        out.with_suffix(".json").write_text(json.dumps(raw, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
