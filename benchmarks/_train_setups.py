"""The two trainers compared by ``train_throughput.py`` (and used by ``gpu_check.py``): synthetic episodes written
to an episode store, our Diffusion Policy trained as ``policylink train`` trains it, and LeRobot's DiffusionPolicy
trained as ``lerobot-train`` trains it, each behind the same small interface (``start`` / ``train`` /
``data_only`` / ``stop`` / ``parameters``). A helper module (leading underscore: ``policylink bench`` does not list
it)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

STATE, ENV_STATE, IMAGE = "observation.state", "observation.environment_state", "observation.images.top"
STATE_DIM, ENV_DIM, ACTION_DIM, IMAGE_SIDE, CROP_SIDE = 8, 8, 7, 96, 84
N_OBS, HORIZON, DROP_LAST, FPS = 2, 16, 7, 10.0


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
    """Our Diffusion Policy trained as ``policylink.train.imitation.train`` trains it (see the module docstring)."""

    name = "policylink"

    def __init__(self, store_path: Path, mode: str, args: argparse.Namespace):
        import dataclasses

        import torch

        from policylink.policies.diffusion import DiffusionPolicyConfig
        from policylink.policies.registry import build_model
        from policylink.train.config import DatasetConfig, TrainConfig
        from policylink.train.data import training_data
        from policylink.train.imitation import optim_config
        from policylink.train.losses import make_loss
        from policylink.train.trainer import Optimization

        policy = DiffusionPolicyConfig(observation_keys=obs_keys(mode), n_obs_steps=N_OBS, chunk_size=HORIZON)
        policy.unet.down_dims = list(args.down_dims)
        policy.encoder.crop_ratio = CROP_SIDE / IMAGE_SIDE  # 84 px random crops, as LeRobot's crop_shape
        self.batch_size, self.device = args.batches[mode], torch.device(args.device)
        data = DatasetConfig(path=str(store_path), control_mode="joint_position", val_fraction=0.0)
        cfg = TrainConfig(policy=policy, dataset=data, batch_size=self.batch_size, device=args.device, steps=10**6)
        self.loss_fn = make_loss(cfg)
        spec, self.ds, _ = training_data(cfg, self.loss_fn.fields, warn=False)
        torch.manual_seed(0)
        self.model = build_model(policy, spec.observation_features, spec.action.dim).to(self.device)
        optim = optim_config(cfg)  # AdamW, clip, cosine LR and EMA, as policylink train
        optim = dataclasses.replace(optim, amp=args.amp, ema_max_decay=None if args.no_ema else optim.ema_max_decay)
        self.run = Optimization(self.model, optim, device=self.device)
        self.rng, self.gen, self.step = np.random.default_rng(0), torch.Generator().manual_seed(0), 0
        self.fixed = self.batch()

    def batch(self) -> dict[str, Any]:
        """One training batch (``training_batch`` of random windows) on the device."""
        from policylink.train.losses import training_batch

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
