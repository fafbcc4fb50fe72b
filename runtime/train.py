"""``policylink train``: imitation training of the chunk policies (Diffusion Policy, flow matching) from an
episode store, with AdamW, cosine LR with warm-up, EMA, validation loss, evaluation rollouts, resumable
checkpoints, a metrics CSV (+ TensorBoard when installed) and PyTorch DDP (``torchrun``; gloo on CPU).

Every random draw of a step is a function of ``(seed, step)``: the global batch's window indices and the
generative noise are drawn for the whole global batch and each DDP rank takes its slice, so N processes at
global batch B follow the same loss curve as one process at batch B, and a resumed run continues exactly.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from policylink.adapters.obs_modes import OBS_MODES, obs_mode_env_kwargs
from policylink.adapters.registry import available_envs, make_env
from policylink.adapters.schema import ACTION_KEY, PolicySpec
from policylink.data.buffer import EpisodeStore, StoreError
from policylink.data.normalize import Normalizer
from policylink.data.sampler import ACTION_PAD_KEY, SequenceDataset, split_episodes
from policylink.data.stats import compute_stats
from policylink.policies.checkpoint import load_training_state, resolve_device, save_checkpoint
from policylink.policies.config import PolicyConfig
from policylink.policies.ema import EMA
from policylink.policies.model import ChunkModel, build_model
from policylink.policies.policy import ChunkPolicy
from policylink.policies.processing import chunk_from_window, normalizer_modes, window_horizon

METRICS_FILE = "metrics.csv"
METRIC_FIELDS = ("step", "loss", "lr", "grad_norm", "samples_per_s", "val_loss", "success_rate")


@dataclass
class DatasetConfig:
    """Where the demonstrations come from.

    Attributes:
        path: episode store (zarr folder) written by ``policylink record``.
        env: registry name of the environment the demos come from; its EnvSpec gives the policy's features,
            ActionSpec and control frequency, and evaluation rollouts run on it.
        obs_mode: env observation mode (``"state"``, ``"image"``, ``"state+image"``, ``"image+proprio"``).
        image_size: camera image side, px (image modes).
        val_fraction: fraction of episodes held out for the validation loss (episode split).
        split_seed: seed of the episode split.
    """

    path: str = ""
    env: str = ""
    obs_mode: str = "state"
    image_size: int = 96
    val_fraction: float = 0.1
    split_seed: int = 0


@dataclass
class EvalConfig:
    """Periodic evaluation rollouts (rank 0, EMA weights).

    Attributes:
        every: steps between evaluations (0 = off; a final evaluation runs when ``episodes > 0`` and ``every > 0``).
        episodes: rollouts per evaluation, run as one batch of parallel envs.
        seed: reset seed of the first rollout (episode ``i`` uses ``seed + i``; keep it apart from the demo seeds).
    """

    every: int = 0
    episodes: int = 10
    seed: int = 100_000


@dataclass
class TrainConfig:
    """``policylink train`` configuration (YAML via ``--config``, dotted overrides such as ``--steps 500``).

    Attributes:
        policy: the :class:`PolicyConfig` (type, observation keys, horizons, encoder, U-Net, sampler).
        dataset: :class:`DatasetConfig`.
        eval: :class:`EvalConfig`.
        output_dir: run folder: ``metrics.csv``, ``checkpoints/last`` (+ ``checkpoints/step_NNNNNN`` every
            ``save_every`` steps) and ``tb/`` when TensorBoard is installed.
        steps: optimizer steps.
        batch_size: global batch (split evenly over DDP ranks).
        lr, weight_decay, betas: AdamW settings.
        warmup_steps: linear warm-up, then cosine decay to 0 at ``steps``.
        grad_clip: max global gradient norm (0 = no clipping).
        log_every, val_every, save_every: periods in steps (0 = off; a checkpoint is always written at the end).
        val_windows: validation windows per validation (evenly spaced over the val split).
        seed: seed of every random draw (init, batches, noise, augmentation).
        device: ``"auto"`` (CUDA when present), ``"cpu"``, ``"cuda"``.
        resume: continue from ``output_dir/checkpoints/last`` when it exists.
        progress: show a tqdm bar (rank 0).
        torch_threads: intra-op CPU threads (0 = torch's default).
    """

    policy: PolicyConfig = field(default_factory=PolicyConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output_dir: str = "outputs/train/run"
    steps: int = 1000
    batch_size: int = 64
    lr: float = 1e-4
    weight_decay: float = 1e-6
    betas: list[float] = field(default_factory=lambda: [0.95, 0.999])
    warmup_steps: int = 100
    grad_clip: float = 10.0
    log_every: int = 50
    val_every: int = 0
    save_every: int = 0
    val_windows: int = 256
    seed: int = 0
    device: str = "auto"
    resume: bool = False
    progress: bool = True
    torch_threads: int = 0


def main(argv: list[str]) -> int:
    """``policylink train --config configs/train/<name>.yaml [--steps N] [--resume true] ...``."""
    from policylink.runtime.cli import parse_config

    cfg = parse_config(TrainConfig, argv, prog="policylink train")
    path = train(cfg)
    if _rank() == 0:
        print(f"checkpoint: {path}")
    return 0


def train(cfg: TrainConfig) -> Path:
    """Train a policy; returns the final checkpoint folder (``output_dir/checkpoints/last``).

    Under ``torchrun`` (``WORLD_SIZE > 1``) this joins the process group (gloo on CPU, NCCL on CUDA); the
    global ``batch_size`` must divide evenly by the world size.

    Raises:
        ValueError: a bad field (:func:`validate_config`), a batch not divisible by the world size, a store
            recorded on another env or with other feature shapes than ``dataset.env`` / ``dataset.obs_mode``
            give, or a bad policy config.
        FileNotFoundError: ``dataset.path`` does not exist.
    """
    validate_config(cfg)
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), _rank()
    device = resolve_device(cfg.device)
    if world > 1:
        import torch.distributed as dist

        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if cfg.batch_size % world:
        raise ValueError(f"batch_size: expected a multiple of the world size {world}, received {cfg.batch_size}")
    if cfg.torch_threads > 0:
        torch.set_num_threads(cfg.torch_threads)
    torch.manual_seed(cfg.seed)
    out_dir = Path(cfg.output_dir)
    ckpt_dir = out_dir / "checkpoints" / "last"

    spec = policy_spec_for(cfg)
    try:
        store = EpisodeStore(cfg.dataset.path, "r")
    except StoreError as e:
        raise ValueError(f"dataset.path: {e}") from None
    if rank == 0 and not cfg.resume and ckpt_dir.exists():
        print(
            f"WARNING: {out_dir} already holds a run; starting over and replacing it (pass --resume true to "
            "continue it, or another --output_dir to keep it)",
            file=sys.stderr,
        )
    check_store_matches(store, cfg, spec)
    train_eps, val_eps = split_episodes(store.n_episodes, cfg.dataset.val_fraction, cfg.dataset.split_seed)
    keys = list(cfg.policy.observation_keys)
    stats = compute_stats(store, keys=[*keys, ACTION_KEY], episodes=train_eps)
    p = cfg.policy
    normalizer = Normalizer(
        stats, normalizer_modes(spec.observation_features, p.state_norm_mode, p.action_norm_mode, p.image_norm_mode)
    )
    # Default padding: every step of every episode anchors a window (episodes can be shorter than H).
    horizon = window_horizon(p.n_obs_steps, p.chunk_size)
    window = dict(n_obs_steps=p.n_obs_steps, horizon=horizon, obs_keys=keys, normalizer=normalizer)
    train_ds = SequenceDataset(store, episodes=train_eps, **window)
    if len(train_ds) == 0:
        raise ValueError(
            f"dataset {cfg.dataset.path!r}: expected training windows, received none "
            f"({len(train_eps)} training episodes)"
        )
    val_ds = SequenceDataset(store, episodes=val_eps, **window) if len(val_eps) else None
    if val_ds is None and cfg.val_every > 0 and rank == 0:
        print(
            f"WARNING: val_every={cfg.val_every} but no episode is held out (dataset.val_fraction="
            f"{cfg.dataset.val_fraction}, {store.n_episodes} episodes): no validation loss will be logged",
            file=sys.stderr,
        )

    model = build_model(p, spec.observation_features, spec.action.dim).to(device)
    ema = EMA(model, p.ema_max_decay, p.ema_power)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine_with_warmup(cfg.warmup_steps, cfg.steps))
    step = 0
    if cfg.resume and ckpt_dir.exists():
        state = load_training_state(ckpt_dir, device)
        model.load_state_dict(state["model"])
        ema.load_state_dict(state["ema"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"]["torch"])
        step = int(state["step"])
    train_model: torch.nn.Module = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        train_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)

    logger = _MetricsLogger(out_dir, enabled=rank == 0, resume=step > 0)
    local_b = cfg.batch_size // world
    bar = _progress(cfg, step)
    t_last, samples = time.perf_counter(), 0
    loss_sum, loss_n = 0.0, 0
    while step < cfg.steps:
        model.train()
        idx, noise = _step_draws(cfg, model, len(train_ds), step)
        sl = slice(rank * local_b, (rank + 1) * local_b)
        batch = collate([train_ds[int(i)] for i in idx[sl]], keys, p.n_obs_steps, device)
        torch.manual_seed(_mix(cfg.seed, step, rank))  # augmentation (random crops) of this rank's slice
        valid = batch["valid"] if p.mask_padded_actions else None
        loss = train_model(batch["obs"], batch["action"], {k: v[sl].to(device) for k, v in noise.items()}, valid)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = _clip(model, cfg.grad_clip)
        optimizer.step()
        scheduler.step()
        ema.update(model)
        step += 1
        samples += cfg.batch_size
        loss_sum += _mean_over_ranks(loss.detach(), world)
        loss_n += 1
        row: dict[str, Any] = {}
        if cfg.log_every and step % cfg.log_every == 0 or step == cfg.steps:
            now = time.perf_counter()
            row.update(
                loss=loss_sum / loss_n,
                lr=scheduler.get_last_lr()[0],
                grad_norm=grad_norm,
                samples_per_s=samples / max(now - t_last, 1e-9),
            )
            t_last, samples, loss_sum, loss_n = now, 0, 0.0, 0
        if val_ds is not None and cfg.val_every and (step % cfg.val_every == 0 or step == cfg.steps):
            row["val_loss"] = validation_loss(ema.model, val_ds, keys, cfg, device)
        if rank == 0 and cfg.eval.every and cfg.eval.episodes and (step % cfg.eval.every == 0 or step == cfg.steps):
            policy = ChunkPolicy(ema.model, normalizer, spec, device=device, seed=cfg.eval.seed)
            row["success_rate"] = evaluate_success(policy, cfg.dataset, cfg.eval.episodes, cfg.eval.seed)
        if row:
            logger.log(step, row)
            if bar is not None:
                bar.set_postfix({k: f"{v:.4g}" for k, v in row.items() if k != "lr"}, refresh=False)
        if bar is not None:
            bar.update(1)
        if rank == 0 and (cfg.save_every and step % cfg.save_every == 0 or step == cfg.steps):
            state = {
                "model": model.state_dict(),
                "ema": ema.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "step": step,
                "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state()},
            }
            save_checkpoint(
                ckpt_dir,
                model=ema.model,
                normalizer=normalizer,
                spec=spec,
                training_state=state,
                train_config=_plain(cfg),
            )
            if cfg.save_every and step % cfg.save_every == 0:
                numbered = ckpt_dir.with_name(f"step_{step:06d}")
                shutil.rmtree(numbered, ignore_errors=True)
                shutil.copytree(ckpt_dir, numbered)
    if bar is not None:
        bar.close()
    logger.close()
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
    return ckpt_dir


def validate_config(cfg: TrainConfig) -> None:
    """Check the fields of ``cfg`` before anything is built.

    Raises:
        ValueError: the first bad field, named with the expected and the received value (empty dataset
            path/env, unknown ``obs_mode``/``device``, ``steps``/``batch_size``/``val_windows`` < 1, ``lr`` <= 0,
            negative periods, ``val_fraction`` outside [0, 1), CUDA requested without CUDA, ...), or a bad policy
            config.
        FileNotFoundError: ``dataset.path`` does not exist.
    """
    cfg.policy.validate()
    d = cfg.dataset
    if not d.path or not d.env:
        raise ValueError(
            f"dataset.path and dataset.env: expected a store path and an env name, received {d.path!r} and {d.env!r}"
        )
    if not Path(d.path).exists():
        raise FileNotFoundError(
            f"dataset.path: expected an episode store (policylink record --out), {d.path!r} not found"
        )
    if d.env not in available_envs():
        raise ValueError(f"dataset.env: expected a registered env ({', '.join(available_envs())}), received {d.env!r}")
    if d.obs_mode not in OBS_MODES:
        raise ValueError(f"dataset.obs_mode: expected one of {OBS_MODES}, received {d.obs_mode!r}")
    if not 0.0 <= d.val_fraction < 1.0:
        raise ValueError(f"dataset.val_fraction: expected a value in [0, 1), received {d.val_fraction}")
    resolve_device(cfg.device)  # raises ValueError naming ``device`` (unknown, or CUDA missing)
    positive = {
        "steps": cfg.steps,
        "batch_size": cfg.batch_size,
        "val_windows": cfg.val_windows,
        "dataset.image_size": d.image_size,
    }
    non_negative = {
        "warmup_steps": cfg.warmup_steps,
        "grad_clip": cfg.grad_clip,
        "log_every": cfg.log_every,
        "val_every": cfg.val_every,
        "save_every": cfg.save_every,
        "torch_threads": cfg.torch_threads,
        "weight_decay": cfg.weight_decay,
        "eval.every": cfg.eval.every,
        "eval.episodes": cfg.eval.episodes,
    }
    for name, value in positive.items():
        if value < 1:
            raise ValueError(f"{name}: expected an int >= 1, received {value}")
    for name, value in non_negative.items():
        if value < 0:
            raise ValueError(f"{name}: expected a value >= 0, received {value}")
    if not cfg.lr > 0:
        raise ValueError(f"lr: expected a learning rate > 0, received {cfg.lr}")
    if len(cfg.betas) != 2 or not all(0.0 <= b < 1.0 for b in cfg.betas):
        raise ValueError(f"betas: expected two values in [0, 1), received {cfg.betas}")


def check_store_matches(store: EpisodeStore, cfg: TrainConfig, spec: PolicySpec) -> None:
    """Check that the demos in ``store`` were recorded on ``cfg.dataset.env`` with the policy's observation
    shapes and the env's action size (from the store's ``info``; a foreign store without it is not checked).

    Raises:
        ValueError: names the field (``dataset.env``, an observation key, ``action``), expected and received.
    """
    info = store.info
    recorded_env = info.get("env")
    if recorded_env is not None and recorded_env != cfg.dataset.env:
        raise ValueError(
            f"dataset.env: the store {cfg.dataset.path!r} was recorded on env {recorded_env!r}, received "
            f"dataset.env={cfg.dataset.env!r}"
        )
    features = info.get("features", {})
    for key, feature in spec.observation_features.items():
        if key not in store.keys:
            raise ValueError(
                f"{key}: expected in the store {cfg.dataset.path!r} (policy.observation_keys), it holds "
                f"{sorted(k for k in store.keys if k.startswith('observation.'))}"
            )
        recorded = features.get(key, {}).get("shape")
        if recorded is not None and tuple(recorded) != tuple(feature.shape):
            raise ValueError(
                f"{key}: env {cfg.dataset.env!r} with obs_mode={cfg.dataset.obs_mode!r} gives shape "
                f"{tuple(feature.shape)}, the store {cfg.dataset.path!r} holds {tuple(recorded)} (record it with "
                f"the same obs_mode / image_size, or set dataset.obs_mode / dataset.image_size to match)"
            )
    recorded_action = info.get("action", {}).get("names")
    if recorded_action is not None and len(recorded_action) != spec.action.dim:
        raise ValueError(
            f"action: env {cfg.dataset.env!r} has {spec.action.dim} action dimensions, the store holds "
            f"{len(recorded_action)} ({recorded_action})"
        )


def policy_spec_for(cfg: TrainConfig) -> PolicySpec:
    """The PolicySpec of a run: the env's features for ``policy.observation_keys``, its ActionSpec and rate.

    Raises:
        ValueError: an observation key the env does not provide (named, with what it provides).
    """
    env = make_env(cfg.dataset.env, **_env_kwargs(cfg.dataset))
    try:
        env_spec = env.env_spec
    finally:
        env.close()
    missing = [k for k in cfg.policy.observation_keys if k not in env_spec.observation_features]
    if missing:
        raise ValueError(
            f"policy.observation_keys: {missing} not provided by env {cfg.dataset.env!r} with "
            f"obs_mode={cfg.dataset.obs_mode!r}; it provides {sorted(env_spec.observation_features)}"
        )
    p = cfg.policy
    return PolicySpec(
        {k: env_spec.observation_features[k] for k in p.observation_keys},
        env_spec.action,
        n_obs_steps=p.n_obs_steps,
        chunk_size=p.chunk_size,
        n_action_steps=p.n_action_steps,
        control_frequency=env_spec.control_frequency,
    )


def cosine_with_warmup(warmup_steps: int, total_steps: int):
    """LR multiplier ``f(step)``: linear ``0 -> 1`` over ``warmup_steps``, then cosine ``1 -> 0`` at ``total_steps``."""

    def f(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / max(1, warmup_steps)
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return f


def collate(items: list[dict[str, Any]], keys: list[str], n_obs_steps: int, device: torch.device) -> dict[str, Any]:
    """Stack dataset items into ``{"obs": {key: (B, T, ...)}, "action": (B, H, A), "valid": bool (B, H)}`` on
    ``device``; the action chunk starts at the newest observation's step (see
    :func:`~policylink.policies.processing.window_horizon`) and ``valid`` is False past the episode's end."""
    actions = chunk_from_window(torch.stack([it[ACTION_KEY] for it in items]), n_obs_steps)
    pad = torch.stack([it[ACTION_PAD_KEY] for it in items])[:, n_obs_steps - 1 :]
    return {
        "obs": {k: torch.stack([it[k] for it in items]).to(device) for k in keys},
        "action": actions.to(device),
        "valid": (~pad).to(device),
    }


@torch.no_grad()
def validation_loss(
    model: ChunkModel,
    ds: SequenceDataset,
    keys: list[str],
    cfg: TrainConfig,
    device: torch.device,
    batch_size: int = 64,
) -> float:
    """Mean loss of ``model`` (eval mode) over ``cfg.val_windows`` evenly spaced windows with fixed noise."""
    model.eval()
    idx = np.unique(np.linspace(0, len(ds) - 1, min(cfg.val_windows, len(ds))).astype(np.int64))
    g = torch.Generator().manual_seed(cfg.seed + 7)
    total, n = 0.0, 0
    for start in range(0, len(idx), batch_size):
        chunk = idx[start : start + batch_size]
        batch = collate([ds[int(i)] for i in chunk], keys, cfg.policy.n_obs_steps, device)
        noise = model.draw_noise(len(chunk), g, device)
        valid = batch["valid"] if cfg.policy.mask_padded_actions else None
        total += float(model(batch["obs"], batch["action"], noise, valid)) * len(chunk)
        n += len(chunk)
    return total / max(n, 1)


def evaluate_success(
    policy: ChunkPolicy, dataset: DatasetConfig, episodes: int, seed: int, n_action_steps: int | None = None
) -> float:
    """Success rate of ``policy`` over ``episodes`` rollouts (reset seeds ``seed .. seed + episodes - 1``),
    in [0, 1].

    The rollout loop (:func:`policylink.runtime.rollout.rollout`) with a receding-horizon executor: all episodes
    run as one batch (one env each, batched inference) and a new chunk is predicted every ``n_action_steps``
    (default: the spec's); an episode counts as a success when ``info["is_success"]`` is True at any step.
    """
    from policylink.runtime.executors import ExecutorConfig, make_executor
    from policylink.runtime.rollout import RegistryEnvFn, make_vector_env, plan_episodes, rollout

    env_fn = RegistryEnvFn(dataset.env, **_env_kwargs(dataset))
    vec = make_vector_env(env_fn, plan_episodes(episodes, seed, episodes))
    executor = make_executor(policy, ExecutorConfig(n_action_steps=n_action_steps))
    try:
        results = rollout(vec, executor, episodes)
    finally:
        executor.close()
        vec.close()
    return float(np.mean([r.success for r in results]))


def _env_kwargs(d: DatasetConfig) -> dict[str, Any]:
    """Env-factory kwargs of the dataset's observation mode (see :func:`obs_mode_env_kwargs`)."""
    return obs_mode_env_kwargs(d.obs_mode, d.image_size)


def _step_draws(
    cfg: TrainConfig, model: ChunkModel, n_windows: int, step: int
) -> tuple[np.ndarray, dict[str, torch.Tensor]]:
    """Global-batch window indices ``(batch_size,)`` and noise for ``step`` (a function of seed and step)."""
    idx = np.random.default_rng([cfg.seed, step]).integers(0, n_windows, cfg.batch_size)
    g = torch.Generator().manual_seed(_mix(cfg.seed, step, 0xD1FF))
    return idx, model.draw_noise(cfg.batch_size, g)


def _mix(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1, np.uint64)[0] >> 1)


def _clip(model: torch.nn.Module, max_norm: float) -> float:
    if max_norm > 0:
        return float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
    grads = [p.grad.norm() for p in model.parameters() if p.grad is not None]
    return float(torch.stack(grads).norm()) if grads else 0.0


def _mean_over_ranks(x: torch.Tensor, world: int) -> float:
    if world > 1:
        import torch.distributed as dist

        x = x.clone()
        dist.all_reduce(x)
        x /= world
    return float(x)


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _plain(cfg: TrainConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def _progress(cfg: TrainConfig, step: int):
    if not cfg.progress or _rank() != 0:
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.steps, initial=step, desc="train", unit="step", dynamic_ncols=True)


class _MetricsLogger:
    """Rank 0 writes ``metrics.csv`` (appending on resume) and, when tensorboard is installed, ``tb/``."""

    def __init__(self, out_dir: Path, enabled: bool, resume: bool):
        self.enabled = enabled
        self.file = self.writer = self.tb = None
        if not enabled:
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / METRICS_FILE
        fresh = not (resume and path.exists())
        self.file = path.open("w" if fresh else "a", newline="")
        self.writer = csv.DictWriter(self.file, fieldnames=METRIC_FIELDS)
        if fresh:
            self.writer.writeheader()
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(out_dir / "tb"))
        except ImportError:
            self.tb = None

    def log(self, step: int, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.writer.writerow({"step": step, **row})
        self.file.flush()
        if self.tb is not None:
            for k, v in row.items():
                self.tb.add_scalar(k, v, step)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        if self.tb is not None:
            self.tb.close()


if __name__ == "__main__":  # torchrun --nproc_per_node=N -m policylink.runtime.train --config ...
    import sys

    raise SystemExit(main(sys.argv[1:]))
