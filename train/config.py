"""Configuration of ``policylink train`` (:class:`TrainConfig`, YAML via ``--config`` plus dotted overrides), its
validation before any work starts, and the command's entry point (:func:`main`). Nothing here imports torch, so
``policylink train --help`` prints at once; the trainer (:mod:`policylink.train.imitation`) is imported to run."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from policylink.adapters.config_checks import require_counts, require_non_negative, require_positive, require_within
from policylink.adapters.obs_modes import check_obs_mode
from policylink.adapters.registry import check_env_name
from policylink.adapters.schema import ControlMode
from policylink.policies.config import PolicyConfig
from policylink.policies.registry import default_config
from policylink.train.objectives import ImitationConfig, ObjectiveConfig, resolve_objective


@dataclass
class DatasetConfig:
    """Where the demonstrations come from.

    Attributes:
        path: episode store (zarr folder) written by ``policylink record`` or ``policylink dataset import``;
            its ``info`` gives the policy's features, ActionSpec and control frequency.
        env: registry name of the environment the demos come from (optional): evaluation rollouts run on it, a
            store recorded on another env is rejected, and its EnvSpec fills in what the store does not record.
        control_mode: control mode of the stored actions (a :class:`~policylink.adapters.schema.ControlMode`
            value), used only when the store records no ActionSpec (a LeRobot import) and ``env`` is empty: the
            ActionSpec is then built from the stored action names and range, with unknown units.
        obs_mode: env observation mode (``"state"``, ``"image"``, ``"state+image"``, ``"image+proprio"``,
            ``"pointmap+proprio"``, ``"image+pointmap+proprio"``).
        image_size: camera image side, px (image modes).
        val_fraction: fraction of episodes held out for the validation loss (episode split).
        split_seed: seed of the episode split.
    """

    path: str = ""
    env: str = ""
    control_mode: str = ""
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
        objective: the objective's section (:mod:`policylink.train.objectives`: ``type`` = ``imitation``,
            ``advantage``, ``awr``, ``prefix_conditioned`` or a registered one, plus its options).
        loss: deprecated alias of ``objective.type`` (one release; empty = ``objective.type``).
        dataset: :class:`DatasetConfig`.
        eval: :class:`EvalConfig`.
        output_dir: run folder: ``metrics.csv``, ``checkpoints/last`` (+ ``checkpoints/step_NNNNNN`` every
            ``save_every`` steps) and ``tb/`` when TensorBoard is installed.
        steps: optimizer steps.
        batch_size: global batch (split evenly over DDP ranks).
        lr: AdamW learning rate after warm-up (the peak of the schedule).
        weight_decay: AdamW weight decay.
        betas: AdamW (beta1, beta2).
        warmup_steps: linear warm-up, then cosine decay to 0 at ``steps``.
        grad_clip: max global gradient norm (0 = no clipping).
        log_every: steps between metric rows (metrics.csv, the progress bar; 0 = off).
        val_every: steps between validation losses (0 = off).
        save_every: steps between kept checkpoints ``checkpoints/step_NNNNNN`` (0 = off; ``checkpoints/last`` is
            always written at the end).
        val_windows: validation windows per validation (evenly spaced over the val split).
        seed: seed of every random draw (init, batches, noise, augmentation).
        device: torch device: ``"auto"`` (CUDA when present), ``"cpu"`` or ``"cuda[:N]"``.
        resume: continue from ``output_dir/checkpoints/last`` when it exists.
        progress: show a tqdm bar (rank 0).
        torch_threads: intra-op CPU threads (0 = torch's default).
        amp: mixed precision on CUDA (bfloat16 autocast, float16 with a gradient scaler where bf16 is unsupported;
            ignored on CPU).
        wandb_project: also log the metrics to this Weights & Biases project (wandb installed and logged in;
            empty = off). TensorBoard logs go to ``output_dir/tb/`` whenever tensorboard is installed.
    """

    policy: PolicyConfig = field(default_factory=default_config)
    objective: ObjectiveConfig = field(default_factory=ImitationConfig)
    loss: str = ""
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
    amp: bool = False
    wandb_project: str = ""

    renamed_flags: ClassVar[dict[str, str]] = {"loss": "objective.type"}
    hidden_options: ClassVar[tuple[str, ...]] = ("loss",)


def validate_config(cfg: TrainConfig) -> None:
    """Check the fields of ``cfg`` before anything is built.

    Raises:
        ValueError: the first bad field, named with the expected and the received value (empty dataset
            path, unregistered env, evaluation rollouts without an env, unknown objective/``obs_mode``/``device``/
            ``control_mode``, ``steps``/``batch_size``/``val_windows`` < 1, ``lr`` <= 0, negative periods,
            ``val_fraction`` outside [0, 1), CUDA requested without CUDA, ...), a bad policy config or objective
            option.
        FileNotFoundError: ``dataset.path`` does not exist.
    """
    d = cfg.dataset  # paths and names first, before torch is imported (a typo costs no waiting)
    if not d.path:
        raise ValueError(f"dataset.path: expected an episode store path, received {d.path!r}")
    if not Path(d.path).exists():
        raise FileNotFoundError(
            f"dataset.path: expected an episode store (policylink record --out), {d.path!r} not found"
        )
    if d.env:
        check_env_name(d.env, "dataset.env")
    cfg.policy.validate()
    if not d.env and cfg.eval.every and cfg.eval.episodes:
        raise ValueError(
            f"dataset.env: evaluation rollouts (eval.every={cfg.eval.every}) need a registered env, received '' "
            "(set dataset.env, or eval.every=0)"
        )
    if d.control_mode and d.control_mode not in {m.value for m in ControlMode}:
        raise ValueError(
            f"dataset.control_mode: expected one of {[m.value for m in ControlMode]}, received {d.control_mode!r}"
        )
    if cfg.wandb_project and importlib.util.find_spec("wandb") is None:
        raise ValueError(
            f"wandb_project: {cfg.wandb_project!r} needs wandb (pip install wandb; wandb login), which is not "
            "installed; leave it empty for metrics.csv and TensorBoard only"
        )
    check_obs_mode(d.obs_mode, field="dataset.obs_mode")
    require_within(d, "dataset.", val_fraction="[0, 1)")
    require_counts(cfg, steps=1, batch_size=1, val_windows=1, warmup_steps=0, log_every=0, val_every=0, save_every=0,
                   torch_threads=0)  # fmt: skip
    require_counts(d, "dataset.", image_size=1)
    require_counts(cfg.eval, "eval.", every=0, episodes=0)
    require_non_negative(cfg, "grad_clip", "weight_decay")
    require_positive(cfg, "lr")
    if len(cfg.betas) != 2 or not all(0.0 <= b < 1.0 for b in cfg.betas):
        raise ValueError(f"betas: expected two values in [0, 1), received {cfg.betas}")
    resolve_objective(cfg).validate()
    from policylink.policies.checkpoint import resolve_device  # torch: imported when a run starts, not for --help

    resolve_device(cfg.device)  # raises ValueError naming ``device`` (unknown, or CUDA missing)


__all__ = ["DatasetConfig", "EvalConfig", "TrainConfig", "validate_config"]
