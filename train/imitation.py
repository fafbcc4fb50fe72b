"""``policylink train``: one trainer for the chunk policies (Diffusion Policy, flow matching) from an episode
store, with a pluggable objective (``objective: {type: imitation}`` by default; :mod:`policylink.train.objectives`),
AdamW, cosine LR with warm-up (diffusers' schedule), EMA, validation loss, evaluation rollouts, resumable
checkpoints, a metrics CSV (+ TensorBoard when installed) and PyTorch DDP (``torchrun``; gloo on CPU). The
PolicySpec comes from the store (:mod:`policylink.train.data`), so a store with no registered env trains too.

Every random draw of a step is a function of ``(seed, step)``: the global batch's window indices and the
generative noise are drawn for the whole global batch and each DDP rank takes its slice, so N processes at
global batch B follow the same loss curve as one process at batch B, and a resumed run continues exactly.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from policylink.adapters.obs_modes import obs_mode_env_kwargs
from policylink.data.sampler import SequenceDataset
from policylink.policies.checkpoint import load_training_state, resolve_device, save_checkpoint
from policylink.policies.common.pointmap_encoder import bind_workspaces
from policylink.policies.model import ChunkModel
from policylink.policies.policy import ChunkPolicy, policy_for_model
from policylink.policies.registry import build_model
from policylink.train.config import DatasetConfig, EvalConfig, TrainConfig, validate_config  # noqa: F401
from policylink.train.data import training_data
from policylink.train.losses import Loss, training_batch
from policylink.train.metrics_log import MetricsLogger
from policylink.train.objectives import make_objective, resolve_objective
from policylink.train.trainer import OptimConfig, Optimization, cosine_with_warmup, fit  # noqa: F401

METRIC_FIELDS = ("step", "loss", "lr", "grad_norm", "samples_per_s", "val_loss", "success_rate")


def _distributed(model: torch.nn.Module, world: int, device: torch.device) -> torch.nn.Module:
    """``model`` wrapped in ``DistributedDataParallel`` under ``torchrun`` (``world > 1``), else ``model``."""
    if world <= 1:
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def _save(cfg: TrainConfig, ckpt_dir: Path, run: Any, model: Any, step: int, spec: Any, processors: Any) -> None:
    """Write ``checkpoints/last`` (the EMA weights, spec, processor chain with its normaliser, training state to resume
    from) and, every ``save_every`` steps, a numbered copy of it."""
    state = _training_state(run, model, step)
    save_checkpoint(ckpt_dir, model=run.ema.model, spec=spec, training_state=state,
                    train_config=_plain(cfg), processors=processors)  # fmt: skip
    if cfg.save_every and step % cfg.save_every == 0:
        _copy_numbered(ckpt_dir, step)


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
    cfg = dataclasses.replace(cfg, objective=resolve_objective(cfg), loss="")  # the deprecated ``loss`` resolved
    world, rank, device = _init_distributed(cfg)
    torch.manual_seed(cfg.seed)
    out_dir = Path(cfg.output_dir)
    ckpt_dir = out_dir / "checkpoints" / "last"
    if rank == 0 and not cfg.resume and ckpt_dir.exists():
        _warn_replacing(out_dir)
    loss_fn = make_objective(cfg)
    fields = loss_fn.fields
    spec, train_ds, val_ds = training_data(cfg, fields, warn=rank == 0)
    model = build_model(cfg.policy, spec.observation_features, spec.action.dim).to(device)
    bind_workspaces(model, train_ds.processors.normalizer)  # a PointNet's workspace box in normalised units
    run = Optimization(model, optim_config(cfg), device=device)
    # the saved state loads on the CPU: torch.set_rng_state takes a CPU tensor, load_state_dict moves the rest
    step = _load_state(run, load_training_state(ckpt_dir)) if cfg.resume and ckpt_dir.exists() else 0
    train_model = _distributed(model, world, device)
    logger = MetricsLogger(
        out_dir,
        (*METRIC_FIELDS, *loss_fn.metrics),
        enabled=rank == 0,
        resume=step > 0,
        wandb_project=cfg.wandb_project,
        config=_plain(cfg),
    )
    local_b = cfg.batch_size // world
    period = _Period(loss_fn.metrics, world, device)

    def step_loss(step: int) -> tuple[torch.Tensor, dict[str, float]]:
        model.train()
        idx, noise = _step_draws(cfg, loss_fn, model, len(train_ds), step)
        sl = slice(rank * local_b, (rank + 1) * local_b)
        batch = training_batch(train_ds, idx[sl], fields, device)
        batch["noise"] = {k: v[sl].to(device) for k, v in noise.items()}
        torch.manual_seed(_mix(cfg.seed, step, rank))  # augmentation (random crops) of this rank's slice
        return loss_fn(train_model, batch, step)

    ema = run.ema.model
    for done in fit(step_loss, run, cfg.steps, start=step, progress="train" if cfg.progress and rank == 0 else None):
        step = done.step
        period.add(done.loss, done.metrics, cfg.batch_size)
        row: dict[str, Any] = {}
        if _due(cfg.log_every, step, cfg.steps) or step == cfg.steps:
            row.update(period.flush(), lr=run.scheduler.get_last_lr()[0], grad_norm=done.grad_norm)
        if val_ds is not None and _due(cfg.val_every, step, cfg.steps):
            row["val_loss"] = validation_loss(ema, val_ds, loss_fn, cfg, device)
        if rank == 0 and cfg.eval.episodes and _due(cfg.eval.every, step, cfg.steps):
            row["success_rate"] = _success_rate(cfg, policy_for_model(ema, train_ds.processors, spec, device=device))
        if row:
            logger.log(step, row)
            if done.bar is not None:
                done.bar.set_postfix({k: f"{v:.4g}" for k, v in row.items() if k != "lr"}, refresh=False)
        if rank == 0 and (cfg.save_every and step % cfg.save_every == 0 or step == cfg.steps):
            _save(cfg, ckpt_dir, run, model, step, spec, train_ds.processors)
    logger.close()
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
    return ckpt_dir


def _warn_replacing(out_dir: Path) -> None:
    print(
        f"WARNING: {out_dir} already holds a run; starting over and replacing it (pass --resume true to "
        "continue it, or another --output_dir to keep it)",
        file=sys.stderr,
    )


def _due(every: int, step: int, total: int) -> bool:
    """A periodic action is due after ``step``: every ``every`` steps and at the last one (``every = 0``: off)."""
    return bool(every) and (step % every == 0 or step == total)


def _success_rate(cfg: TrainConfig, policy: ChunkPolicy) -> float:
    """Training-time evaluation: :func:`evaluate_success` over ``cfg.eval`` (policy reseeded with its seed)."""
    policy.reseed(cfg.eval.seed)
    return evaluate_success(policy, cfg.dataset, cfg.eval.episodes, cfg.eval.seed)


def optim_config(cfg: TrainConfig) -> OptimConfig:
    """The run's optimizer step: AdamW, cosine LR with warm-up over ``cfg.steps``, gradient clipping (the norm is
    always measured and logged), EMA of the policy with its ``ema_max_decay`` / ``ema_power``, mixed precision on
    CUDA with ``cfg.amp``."""
    p = cfg.policy
    return OptimConfig(
        optimizer="adamw",
        lr=cfg.lr,
        betas=tuple(cfg.betas),
        weight_decay=cfg.weight_decay,
        grad_clip=max(cfg.grad_clip, 0.0),
        schedule="cosine",
        warmup_steps=cfg.warmup_steps,
        total_steps=cfg.steps,
        ema_max_decay=p.ema_max_decay,
        ema_power=p.ema_power,
        amp=cfg.amp,
        measure_grad_norm=True,
    )


def _training_state(run: Optimization, model: torch.nn.Module, step: int) -> dict[str, Any]:
    """Everything a resumed run needs: the model, the optimization's state, the step and the RNG state."""
    rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state()}
    return {"model": model.state_dict(), **run.state(), "step": step, "rng": rng}


def _load_state(run: Optimization, state: dict[str, Any]) -> int:
    """Restore :func:`_training_state` into the trained model and ``run``; returns the step to continue from."""
    run.ema_source.load_state_dict(state["model"])
    run.load(state)
    torch.set_rng_state(state["rng"]["torch"])
    return int(state["step"])


@torch.no_grad()
def validation_loss(
    model: ChunkModel,
    ds: SequenceDataset,
    loss_fn: Loss,
    cfg: TrainConfig,
    device: torch.device,
    batch_size: int = 64,
) -> float:
    """Mean ``loss_fn`` of ``model`` (eval mode) over ``cfg.val_windows`` evenly spaced windows of ``ds`` with
    fixed draws (generator seeded ``cfg.seed + 7``)."""
    model.eval()
    idx = np.unique(np.linspace(0, len(ds) - 1, min(cfg.val_windows, len(ds))).astype(np.int64))
    g = torch.Generator().manual_seed(cfg.seed + 7)
    total, n = 0.0, 0
    for start in range(0, len(idx), batch_size):
        chunk = idx[start : start + batch_size]
        batch = training_batch(ds, chunk, loss_fn.fields, device)
        batch["noise"] = loss_fn.draw(model, len(chunk), g, device)
        total += float(loss_fn(model, batch, cfg.steps)[0]) * len(chunk)
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
    cfg: TrainConfig, loss_fn: Loss, model: torch.nn.Module, n_windows: int, step: int
) -> tuple[np.ndarray, dict[str, torch.Tensor]]:
    """Global-batch window indices ``(batch_size,)`` and the loss's draws for ``step`` (a function of seed and
    step)."""
    idx = np.random.default_rng([cfg.seed, step]).integers(0, n_windows, cfg.batch_size)
    g = torch.Generator().manual_seed(_mix(cfg.seed, step, 0xD1FF))
    return idx, loss_fn.draw(model, cfg.batch_size, g)


def _init_distributed(cfg: TrainConfig) -> tuple[int, int, torch.device]:
    """``(world size, rank, device)``; joins the process group under ``torchrun`` and sets torch's threads.

    Raises:
        ValueError: ``batch_size`` is not a multiple of the world size.
    """
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
    return world, rank, device


def _copy_numbered(ckpt_dir: Path, step: int) -> None:
    """Copy ``checkpoints/last`` to ``checkpoints/step_NNNNNN`` (replacing an older copy)."""
    numbered = ckpt_dir.with_name(f"step_{step:06d}")
    shutil.rmtree(numbered, ignore_errors=True)
    shutil.copytree(ckpt_dir, numbered)


def _mix(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1, np.uint64)[0] >> 1)


class _Period:
    """Accumulates one logging period: the loss (mean over DDP ranks, every step, as before), the loss's metrics
    (per-rank sums, averaged over ranks at :meth:`flush` with one all-reduce) and the samples seen."""

    def __init__(self, metrics: tuple[str, ...], world: int, device: torch.device):
        self.names, self.world, self.device = metrics, world, device
        self._start()

    def _start(self) -> None:
        self.t0, self.samples, self.loss, self.n = time.perf_counter(), 0, 0.0, 0
        self.sums = dict.fromkeys(self.names, 0.0)

    def add(self, loss: torch.Tensor, metrics: dict[str, float], samples: int) -> None:
        self.loss += _mean_over_ranks(loss, self.world)
        self.n += 1
        self.samples += samples
        for k in self.names:
            self.sums[k] += float(metrics[k])

    def flush(self) -> dict[str, float]:
        """``loss``, ``samples_per_s`` and each metric's per-step mean since the last flush; starts a new period."""
        now = time.perf_counter()
        row = {"loss": self.loss / self.n, "samples_per_s": self.samples / max(now - self.t0, 1e-9)}
        if self.names:
            means = torch.tensor([v / self.n for v in self.sums.values()], dtype=torch.float64, device=self.device)
            if self.world > 1:
                import torch.distributed as dist

                dist.all_reduce(means)
                means /= self.world
            row.update(zip(self.names, means.tolist()))
        self._start()
        return row


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
    """The run's config as a plain dict, the objective's ``type`` included (what the checkpoint records)."""
    return {**dataclasses.asdict(cfg), "objective": cfg.objective.to_dict()}
