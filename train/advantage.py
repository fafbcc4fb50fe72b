"""``policylink finetune advantage``: offline advantage-conditioned fine-tuning (RECAP in pi*0.6; ALTER in N0-VTLA)
and its advantage-weighted regression baseline, on the one trainer.

Two steps::

    # 1. label every step of a store (written next to it, under labels/advantage/)
    policylink finetune advantage label --dataset outputs/data/push_mixed.zarr --source value \\
        --checkpoint outputs/train/push_bc/checkpoints/last          # value model on the BC policy's latents
    policylink finetune advantage label --dataset outputs/data/push_mixed.zarr --source progress --env push
    # 2. train a policy conditioned on the labels (label dropout p, CFG weight recorded in the checkpoint)
    policylink finetune advantage train --config configs/train/push_flow.yaml \\
        --dataset.path outputs/data/push_mixed.zarr --objective.label_dropout 0.3 --policy.cfg_scale 1.0
    policylink finetune advantage train ... --objective.type awr --objective.beta 1.0   # AWR baseline

The objectives ``advantage`` and ``awr`` (:mod:`policylink.train.objectives`) are also available to
``policylink train --objective.type``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from policylink.data.labels import (
    DEFAULT_LABEL_SET,
    LabelConfig,
    binary_labels,
    config_dict,
    discounted_returns,
    episode_starts,
    nstep_advantage,
    progress_advantage,
    progress_from_distance,
    read_labels,
    recap_rewards,
    write_labels,
)
from policylink.policies.common.conditioning import NULL_LABEL, drop_labels
from policylink.policies.finetune.advantage import ValueConfig, awr_weights
from policylink.train.config import TrainConfig
from policylink.train.losses import BatchFields
from policylink.train.objectives import AdvantageConfig, ObjectiveConfig, resolve_objective

ADVANTAGE_LABELS = 2  # 0 negative, 1 positive
POSITIVE_LABEL = 1


@dataclass
class AdvantageTrainConfig(TrainConfig):
    """``policylink finetune advantage train``: :class:`~policylink.train.config.TrainConfig` with
    ``objective: {type: advantage}`` by default (:class:`~policylink.train.objectives.AdvantageConfig`;
    ``--objective.type awr`` for the AWR baseline)."""

    objective: ObjectiveConfig = field(default_factory=AdvantageConfig)

    renamed_flags: ClassVar[dict[str, str]] = {
        **TrainConfig.renamed_flags,
        "advantage.awr_beta": "objective.beta",
        "advantage.awr_max_weight": "objective.max_weight",
        "advantage.": "objective.",
    }


class _StoreLabels:
    """The store's label set as tensors, indexed by a batch's ``episode_index`` and anchor ``step``."""

    def __init__(self, cfg: TrainConfig, name: str):
        from policylink.data.buffer import EpisodeStore

        labels = read_labels(cfg.dataset.path, name)  # LabelsError names what is missing
        self.label = torch.as_tensor(labels.label.astype(np.int64))
        adv = labels.advantage.astype(np.float64)
        self.advantage = torch.as_tensor((adv / max(float(adv.std()), 1e-8)).astype(np.float32))
        self.starts = torch.as_tensor(episode_starts(EpisodeStore(cfg.dataset.path, "r").episode_ends))

    def rows(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """int64 ``(B,)`` store rows of the batch's anchor steps."""
        return self.starts[batch["episode_index"].cpu()] + batch["step"].cpu()


class AdvantageLoss:
    """Advantage-conditioned behaviour cloning: the imitation loss with the step's binary label in the model's
    conditioning slot (``model(obs, action, noise, valid, labels=)``), dropped to the null label with probability
    ``label_dropout`` (:func:`~policylink.policies.common.conditioning.drop_labels`, drawn in :meth:`draw` for the
    global batch). Registered as objective ``advantage`` (:class:`~policylink.train.objectives.AdvantageConfig`).

    Args:
        cfg: the run's :class:`~policylink.train.config.TrainConfig` (policy, dataset).
        labels: label set of the store (``labels/<name>``). label_dropout: null-label probability in [0, 1].

    Raises:
        ValueError: the policy has no 2-label slot (``policy.conditioning.num_labels``).
        LabelsError: the store has no (or stale) labels.
    """

    fields: ClassVar[BatchFields] = BatchFields()
    metrics: ClassVar[tuple[str, ...]] = ("positive_fraction", "dropped_fraction")

    def __init__(self, cfg: TrainConfig, labels: str = DEFAULT_LABEL_SET, label_dropout: float = 0.3):
        n = cfg.policy.conditioning.num_labels
        if n != ADVANTAGE_LABELS:
            raise ValueError(f"policy.conditioning.num_labels: the advantage loss needs {ADVANTAGE_LABELS} labels "
                             f"(0 negative, 1 positive), received {n}")  # fmt: skip
        self.label_dropout = label_dropout
        self.mask_padded_actions = bool(cfg.policy.mask_padded_actions)
        self.store = _StoreLabels(cfg, labels)

    def draw(self, model, batch_size: int, generator: torch.Generator, device="cpu") -> dict[str, torch.Tensor]:
        """``model.draw_noise`` plus ``drop`` bool ``(B,)``: True where the label is dropped."""
        noise = model.draw_noise(batch_size, generator, device)
        noise["drop"] = drop_labels(torch.zeros(batch_size, dtype=torch.long), self.label_dropout, generator) < 0
        return noise

    def __call__(self, model, batch: Mapping[str, Any], step: int) -> tuple[torch.Tensor, dict[str, float]]:
        """Scalar conditioned denoising / flow-matching MSE and the batch's positive and dropped fractions."""
        labels = self.store.label[self.store.rows(batch)].to(batch["action"].device)
        drop = batch["noise"]["drop"].to(labels.device)
        labels = torch.where(drop, torch.full_like(labels, NULL_LABEL), labels)
        noise = {k: v for k, v in batch["noise"].items() if k != "drop"}
        valid = batch["valid"] if self.mask_padded_actions else None
        loss = model(batch["obs"], batch["action"], noise, valid, labels=labels)
        pos = float((labels == POSITIVE_LABEL).float().mean())
        return loss, {"positive_fraction": pos, "dropped_fraction": float(drop.float().mean())}


class AWRLoss:
    """Advantage-weighted regression baseline: the imitation loss per sample weighted by
    ``min(exp(A / beta), w_max)`` (:func:`~policylink.policies.finetune.advantage.awr_weights`), ``A`` the stored
    advantage of the anchor step divided by the store's advantage standard deviation. The policy needs no
    conditioning slot. Single-process (the per-sample loss bypasses DDP's ``forward``). Registered as objective
    ``awr`` (:class:`~policylink.train.objectives.AWRConfig`).

    Args:
        cfg: the run's :class:`~policylink.train.config.TrainConfig`. labels: label set whose advantages weight.
        beta: temperature (> 0). max_weight: weight cap ``w_max`` (> 0).
    """

    fields: ClassVar[BatchFields] = BatchFields()
    metrics: ClassVar[tuple[str, ...]] = ("mean_weight",)

    def __init__(self, cfg: TrainConfig, labels: str = DEFAULT_LABEL_SET, beta: float = 1.0, max_weight: float = 20.0):
        awr_weights(torch.zeros(1), beta, max_weight)  # validates beta / w_max early
        self.beta, self.max_weight = beta, max_weight
        self.mask_padded_actions = bool(cfg.policy.mask_padded_actions)
        self.store = _StoreLabels(cfg, labels)

    def draw(self, model, batch_size: int, generator: torch.Generator, device="cpu") -> dict[str, torch.Tensor]:
        """The head's training noise (``model.draw_noise``)."""
        return model.draw_noise(batch_size, generator, device)

    def __call__(self, model, batch: Mapping[str, Any], step: int) -> tuple[torch.Tensor, dict[str, float]]:
        """``mean_i w_i * mean_{h,a} err_{i,h,a}`` (padded steps zeroed; denominator ``B * H * A``)."""
        m = getattr(model, "module", model)  # DDP wrapper -> the model
        cond = m.condition(m.embed(batch["obs"]))
        valid = batch["valid"] if self.mask_padded_actions else None
        per = m.per_sample_loss(cond, batch["action"], batch["noise"], valid)
        adv = self.store.advantage[self.store.rows(batch)].to(per.device)
        w = awr_weights(adv, self.beta, self.max_weight)
        return (w * per).mean(), {"mean_weight": float(w.mean())}


# ----------------------------------------------------------------------------------------------- CLI


@dataclass
class LabelCommand:
    """``policylink finetune advantage label``: compute and store advantage labels.

    Attributes:
        dataset: the episode store to label (labels are written under ``labels/<name>``).
        source: ``value`` (n-step advantage from a value model on a policy's frozen latents, RECAP) or
            ``progress`` (progress gained over a chunk, ALTER; needs ``env`` with a ``goal_distance``).
        checkpoint: the frozen policy whose ``embed`` latents feed the value model (``source=value``).
        env: registry env whose ``goal_distance`` gives the progress (``source=progress``; default: the store's).
        name: label-set name (the store's ``labels/<name>`` group; ``finetune advantage train --objective.labels``).
        n_step: RECAP's ``N``: the advantage is ``sum_{k<N} r_k + V(o_{t+N}) - V(o_t)`` (steps).
        horizon: ALTER's chunk: the advantage is the progress gained over this many steps.
        max_episode_steps: for RECAP's reward normalisation (default: the longest episode).
        positive_fraction: top fraction of steps per task labelled positive (RECAP: 0.3).
        failure_window: the last this-many steps of a failed episode are forced negative.
        positive_sources: episode sources forced positive (e.g. ``human``).
        positive_qualities: episode qualities forced positive (e.g. ``expert``).
        value: the value model (:class:`ValueConfig`: ``mse`` or distributional ``bins``, steps, folds...).
        seed: value-model seed.
        device: torch device for the latents.
        torch_threads: intra-op CPU threads (0 = torch's default; 1 on a shared machine).
    """

    dataset: str = ""
    source: str = "value"
    checkpoint: str = ""
    env: str = ""
    name: str = DEFAULT_LABEL_SET
    n_step: int = 10
    horizon: int = 16
    max_episode_steps: int = 0
    positive_fraction: float = 0.3
    failure_window: int = 10
    positive_sources: list[str] = field(default_factory=list)
    positive_qualities: list[str] = field(default_factory=list)
    value: ValueConfig = field(default_factory=ValueConfig)
    seed: int = 0
    device: str = "cpu"
    torch_threads: int = 1


def label_store(cmd: LabelCommand) -> dict[str, Any]:
    """Label ``cmd.dataset``; returns the attributes written (threshold per task, positive fraction...).

    Raises:
        ValueError: bad ``source``, a missing ``checkpoint`` / ``env``, or an env without progress.
    """
    from policylink.data.buffer import EpisodeStore

    if not cmd.dataset or not Path(cmd.dataset).exists():
        raise ValueError(f"dataset: expected an episode store path (--dataset STORE.zarr), received {cmd.dataset!r}"
                         + (" (no such path)" if cmd.dataset else ""))  # fmt: skip
    if cmd.torch_threads:
        torch.set_num_threads(cmd.torch_threads)
    store = EpisodeStore(cmd.dataset, "r")
    metas = store.all_meta()
    _check_label_command(cmd, store, metas)
    ends = store.episode_ends
    success = np.array([-1 if m.success is None else int(m.success) for m in metas])
    attrs: dict[str, Any] = {"source": cmd.source}
    if cmd.source == "value":
        adv, extra = _value_advantage(cmd, store, success)
    elif cmd.source == "progress":
        progress = progress_from_distance(_goal_distance(cmd, store), ends)
        adv, extra = progress_advantage(progress, ends, cmd.horizon), {"horizon": cmd.horizon}
    else:
        raise ValueError(f"source: expected 'value' or 'progress', received {cmd.source!r}")
    lcfg = LabelConfig(cmd.positive_fraction, cmd.failure_window, tuple(cmd.positive_sources),
                       tuple(cmd.positive_qualities))  # fmt: skip
    labels, thresholds = binary_labels(
        adv, ends, tasks=[m.task for m in metas], success=success, sources=[m.source for m in metas],
        qualities=[m.quality for m in metas], config=lcfg,
    )  # fmt: skip
    attrs.update(extra, config=config_dict(lcfg), thresholds=thresholds, positive=float(labels.mean()))
    write_labels(cmd.dataset, labels, adv, attrs, cmd.name)
    return attrs


def _check_label_command(cmd: LabelCommand, store, metas) -> None:
    """Refuse settings that would be ignored or would silently label the wrong thing (each error names its field).

    Raises:
        ValueError: ``n_step``/``horizon`` < 1, ``checkpoint`` with ``source=progress``, an ``env`` other than the
            one the store was recorded on, a ``positive_sources``/``positive_qualities`` entry no episode has.
    """
    for name in ("n_step", "horizon"):
        if getattr(cmd, name) < 1:
            raise ValueError(f"{name}: expected >= 1 steps, received {getattr(cmd, name)}")
    if cmd.source == "progress" and cmd.checkpoint:
        raise ValueError(f"checkpoint: used by source=value only (the value model's latents), received "
                         f"{cmd.checkpoint!r} with source=progress")  # fmt: skip
    recorded = store.info.get("env")
    if cmd.env and recorded and cmd.env != recorded:
        raise ValueError(f"env: the store {cmd.dataset!r} was recorded on {recorded!r}, received env={cmd.env!r}")
    for name, have in (
        ("positive_sources", {m.source for m in metas}),
        ("positive_qualities", {m.quality for m in metas}),
    ):
        unknown = sorted(set(getattr(cmd, name)) - have)
        if unknown:
            raise ValueError(f"{name}: no episode of the store has {unknown} (the store's: {sorted(map(str, have))})")


def _check_checkpoint_fits(cmd: LabelCommand, model, store) -> None:
    """The value model's policy must read this store's observations (same keys and shapes).

    Raises:
        ValueError: names ``checkpoint``, the key, the policy's shape and the store's.
    """
    features = store.info.get("features") or {}
    for key, spec in model.features.items():
        if key not in store.keys:
            raise ValueError(f"checkpoint: its policy reads {key!r}, which the store {cmd.dataset!r} does not hold "
                             f"(it holds {sorted(store.keys)})")  # fmt: skip
        shape = (features.get(key) or {}).get("shape")
        if shape is not None and tuple(shape) != tuple(spec.shape):
            raise ValueError(f"checkpoint: its policy reads {key!r} of shape {tuple(spec.shape)}, the store "
                             f"{cmd.dataset!r} holds {tuple(shape)} (trained on another env?)")  # fmt: skip


def _value_advantage(cmd, store, success):
    from policylink.policies.checkpoint import load_components
    from policylink.policies.finetune.advantage import store_latents
    from policylink.train.value import cross_fitted_values

    if not cmd.checkpoint:
        raise ValueError("checkpoint: source=value needs the frozen policy whose latents feed the value model")
    _, _, model, processors = load_components(cmd.checkpoint)
    _check_checkpoint_fits(cmd, model, store)
    ends = store.episode_ends
    t_max = cmd.max_episode_steps or int(store.episode_lengths.max())
    rewards = recap_rewards(ends, success, t_max)
    returns = discounted_returns(rewards, ends)
    latents = store_latents(model.to(cmd.device), processors, store)
    vcfg = cmd.value
    episode = np.repeat(np.arange(len(ends)), store.episode_lengths)
    values = cross_fitted_values(latents, returns, episode, vcfg, cmd.seed)
    adv = nstep_advantage(rewards, values, ends, cmd.n_step)
    corr = float(np.corrcoef(values, returns)[0, 1]) if len(values) > 1 else float("nan")
    return adv, {"n_step": cmd.n_step, "max_episode_steps": t_max, "value": dataclasses.asdict(vcfg),
                 "value_return_corr": corr, "checkpoint": str(cmd.checkpoint)}  # fmt: skip


def _goal_distance(cmd: LabelCommand, store) -> np.ndarray:
    from policylink.adapters.registry import make_env

    env_name = cmd.env or store.info.get("env", "")
    if not env_name:
        raise ValueError("env: source=progress needs the env whose goal_distance defines progress; received ''")
    if "observation.state" not in store.keys:
        raise ValueError(f"dataset: progress is computed from observation.state; the store holds {store.keys}")
    env = make_env(env_name)
    try:
        goal_distance = getattr(env.unwrapped, "goal_distance", None)
        d = None if goal_distance is None else goal_distance(store.load(["observation.state"])["observation.state"])
    finally:
        env.close()
    if d is None:
        raise ValueError(
            f"env {env_name!r}: the task defines no goal_distance (no progress signal); use --source value"
        )
    return d


def train_advantage(cfg: TrainConfig):
    """Run the trainer with the run's objective (``advantage`` or ``awr``); for ``advantage`` a policy without a label
    slot gets ``policy.conditioning.num_labels = 2`` and ``policy.default_label = 1`` (sample with "positive").
    Returns the final checkpoint folder."""
    from policylink.train.imitation import train

    p = cfg.policy
    if isinstance(resolve_objective(cfg), AdvantageConfig) and p.conditioning.num_labels == 0:
        p.conditioning = dataclasses.replace(p.conditioning, num_labels=ADVANTAGE_LABELS)
        if p.default_label == NULL_LABEL:
            p.default_label = POSITIVE_LABEL
    return train(cfg)


__all__ = [
    "AWRLoss",
    "AdvantageLoss",
    "AdvantageTrainConfig",
    "LabelCommand",
    "label_store",
    "train_advantage",
]
