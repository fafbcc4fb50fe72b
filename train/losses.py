"""Training losses of the one trainer (``policylink train``): the :class:`Loss` protocol, the batch a loss
receives, and the imitation loss. Losses are chosen by name through :mod:`policylink.train.objectives`
(``objective: {type: imitation}`` in the train config).

A loss declares the dataset fields it needs (:class:`BatchFields`: stored per-step arrays such as ``reward`` /
``done`` / labels, per-episode tags such as ``source`` / ``quality`` / ``success``, chunk transitions for
critics), draws all randomness of a global batch in :meth:`Loss.draw` (so N DDP ranks equal one process), and
maps ``(model, batch, step)`` to a scalar loss and metrics. A loss class plugs in with
:func:`~policylink.train.objectives.register_objective` (its options as a config section); the trainer never
branches on a name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import torch

from policylink.adapters.schema import ACTION_KEY, TASK_KEY
from policylink.data.sampler import ACTION_PAD_KEY, NEXT_PREFIX, OBS_PAD_KEY, SequenceDataset
from policylink.train.objectives import ObjectiveConfig, available_objectives, make_objective, register_objective

if TYPE_CHECKING:
    from policylink.train.config import TrainConfig

TRANSITION_KEYS = ("return", "terminal", "discount", "next_is_pad")
"""Per-sample transition tensors ``(B,)`` a batch carries when :attr:`BatchFields.transition_gamma` is set."""


@dataclass(frozen=True)
class BatchFields:
    """What a loss needs from the dataset beyond observations and actions.

    Attributes:
        step: stored per-step arrays (``reward``, ``done``, labels...), given over the chunk ``(B, H, ...)``
            aligned with ``batch["action"]`` (step ``t + k`` at index ``k``; mask with ``batch["valid"]``).
        episode: per-episode tags, a subset of :data:`policylink.data.sampler.EPISODE_FIELDS`.
        transition_gamma: when set, chunk transitions with this discount (see
            :meth:`~policylink.data.sampler.SequenceDataset.get_transitions`): the batch gains
            :data:`TRANSITION_KEYS` and ``next_obs``; ``reward`` and ``done`` are read automatically.
    """

    step: tuple[str, ...] = ()
    episode: tuple[str, ...] = ()
    transition_gamma: float | None = None

    def step_keys(self) -> list[str]:
        """Per-step arrays to load: :attr:`step`, plus ``reward`` and ``done`` for transitions (no duplicates)."""
        extra = ("reward", "done") if self.transition_gamma is not None else ()
        return list(dict.fromkeys([*self.step, *extra]))


@runtime_checkable
class Loss(Protocol):
    """A training objective plugged into the trainer.

    Attributes:
        fields: the dataset fields the loss reads (:class:`BatchFields`).
        metrics: names of the extra metrics :meth:`__call__` returns (columns of ``metrics.csv``).
    """

    fields: BatchFields
    metrics: tuple[str, ...]

    def draw(
        self, model: torch.nn.Module, batch_size: int, generator: torch.Generator, device: torch.device | str = "cpu"
    ) -> dict[str, torch.Tensor]:
        """Every random draw of one global batch, each tensor with leading dim ``batch_size`` (DDP ranks take
        slices); the trainer passes them to :meth:`__call__` as ``batch["noise"]``. ``model`` is unwrapped."""
        ...

    def __call__(
        self, model: torch.nn.Module, batch: Mapping[str, Any], step: int
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Scalar loss (mean over ``B * H * A`` entries, so a DDP mean equals one process) and metrics.

        ``model`` may be DDP-wrapped: call it (``forward``) for anything that needs gradient sync. ``batch``
        is :func:`training_batch`'s dict plus ``noise``; ``step`` the optimizer step about to be taken (0-based).
        """
        ...


class ImitationLoss:
    """Behaviour cloning of the generative chunk head: ``model(obs, action, noise, valid)`` (the denoising or
    flow-matching MSE of Diffusion Policy, Chi et al. arXiv 2303.04137, or flow matching), with padded steps
    past an episode's end masked when ``policy.mask_padded_actions`` is set.

    Args:
        cfg: the run's :class:`~policylink.train.config.TrainConfig`.
    """

    fields: ClassVar[BatchFields] = BatchFields()
    metrics: ClassVar[tuple[str, ...]] = ()

    def __init__(self, cfg: TrainConfig):
        self.mask_padded_actions = bool(cfg.policy.mask_padded_actions)

    def draw(
        self, model: torch.nn.Module, batch_size: int, generator: torch.Generator, device: torch.device | str = "cpu"
    ) -> dict[str, torch.Tensor]:
        """The head's training noise ``{"noise": (B, H, A), "t": (B,)}`` (``model.draw_noise``)."""
        return model.draw_noise(batch_size, generator, device)

    def __call__(
        self, model: torch.nn.Module, batch: Mapping[str, Any], step: int
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Scalar MSE (see :meth:`~policylink.policies.model.ChunkModel.loss`); no extra metrics."""
        valid = batch["valid"] if self.mask_padded_actions else None
        return model(batch["obs"], batch["action"], batch["noise"], valid), {}


def register_loss(name: str, factory: Callable[..., Loss], overwrite: bool = False) -> None:
    """Deprecated alias (one release) of :func:`~policylink.train.objectives.register_objective` for a loss without
    options: registers ``factory(train_config) -> Loss`` as objective ``name`` with an empty config section."""
    config_cls = dataclasses.make_dataclass(f"{name.title().replace('_', '')}Config", [], bases=(ObjectiveConfig,))
    register_objective(name, config_cls, factory, overwrite=overwrite)


available_losses = available_objectives
"""Deprecated alias (one release) of :func:`~policylink.train.objectives.available_objectives`."""
make_loss = make_objective
"""Deprecated alias (one release) of :func:`~policylink.train.objectives.make_objective`."""


def training_batch(
    ds: SequenceDataset,
    indices: Sequence[int],
    fields: BatchFields,
    device: torch.device | str,
) -> dict[str, Any]:
    """The batch a loss receives for windows ``indices`` of ``ds`` (built with ``fields``' step/episode fields).

    Returns (tensors on ``device``):
        ``obs``: key -> ``(B, To, ...)`` normalized windows, plus ``task`` (list of ``B`` str, for encoders that
        read the instruction); ``action``: float32 ``(B, H, A)`` normalized chunk
        from the newest observation's step (``H = ds.chunk_length``); ``valid``: bool ``(B, H)``, False past the
        episode's end; each :attr:`BatchFields.step` key ``(B, H, ...)`` over the same steps; each
        :attr:`BatchFields.episode` tag (tensor ``(B,)`` or list of str); ``task``: list of str; ``episode_index``,
        ``step``: int64 ``(B,)``; with transitions also ``next_obs`` (key -> ``(B, To, ...)``) and
        :data:`TRANSITION_KEYS` ``(B,)``.
    """
    if fields.transition_gamma is not None:
        raw = ds.get_transitions(indices, fields.transition_gamma)
    else:
        raw = ds.get_batch(indices)
    first = ds.sampler.n_obs_steps - 1  # the chunk starts at the newest observation (window_horizon)
    out: dict[str, Any] = {
        "obs": {**{k: raw[k].to(device) for k in ds.obs_keys}, TASK_KEY: raw["task"]},  # task: language models
        "action": raw[ACTION_KEY][:, first:].to(device),
        "valid": (~raw[ACTION_PAD_KEY][:, first:]).to(device),
        "task": raw["task"],
        "episode_index": raw["episode_index"].to(device),
        "step": raw["step"].to(device),
    }
    if ds.sampler.chain_windows > 1:  # a memory chain: its encoder skips the windows before the episode start
        out["obs"][OBS_PAD_KEY] = raw[OBS_PAD_KEY].to(device)
    for key in fields.step:
        out[key] = raw[key][:, first:].to(device)
    for key in fields.episode:
        out[key] = raw[key].to(device) if isinstance(raw[key], torch.Tensor) else raw[key]
    if fields.transition_gamma is not None:
        out["next_obs"] = {**{k: raw[NEXT_PREFIX + k].to(device) for k in ds.obs_keys}, TASK_KEY: raw["task"]}
        out["next_observation_is_pad"] = raw[NEXT_PREFIX + OBS_PAD_KEY].to(device)
        out.update({k: raw[k].to(device) for k in TRANSITION_KEYS})
    return out


__all__ = [
    "TRANSITION_KEYS",
    "BatchFields",
    "ImitationLoss",
    "Loss",
    "available_losses",
    "make_loss",
    "register_loss",
    "training_batch",
]
