"""Training losses of the one trainer (``policylink train``): the :class:`Loss` protocol, the batch a loss
receives, a name registry (``loss: imitation`` in the train config), and the imitation loss.

A loss declares the dataset fields it needs (:class:`BatchFields`: stored per-step arrays such as ``reward`` /
``done`` / labels, per-episode tags such as ``source`` / ``quality`` / ``success``, chunk transitions for
critics), draws all randomness of a global batch in :meth:`Loss.draw` (so N DDP ranks equal one process), and
maps ``(model, batch, step)`` to a scalar loss and metrics. Critic, Q-VGM and advantage losses (issues 14, 15)
plug in with :func:`register_loss`; the trainer never branches on a loss name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import torch

from policylink.adapters.schema import ACTION_KEY, TASK_KEY
from policylink.data.sampler import ACTION_PAD_KEY, NEXT_PREFIX, OBS_PAD_KEY, SequenceDataset

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


LossFactory = Callable[["TrainConfig"], Loss]
_BUILTIN: dict[str, str] = {
    "imitation": "policylink.train.losses:ImitationLoss",
    "advantage": "policylink.train.advantage:AdvantageLoss",
    "awr": "policylink.train.advantage:AWRLoss",
    "prefix_conditioned": "policylink.train.prefix:PrefixConditionedLoss",
}
"""Built-in losses as lazy ``module:attribute`` factories (imported only when chosen)."""
_REGISTERED: dict[str, LossFactory] = {}


def register_loss(name: str, factory: LossFactory, overwrite: bool = False) -> None:
    """Register ``factory(train_config) -> Loss`` under ``name`` (chosen with ``loss: <name>``).

    Raises:
        ValueError: ``name`` is taken and ``overwrite`` is False.
    """
    if not overwrite and name in available_losses():
        raise ValueError(f"loss {name!r}: already registered (pass overwrite=True to replace it)")
    _REGISTERED[name] = factory


def available_losses() -> list[str]:
    """Sorted names of every built-in and registered loss."""
    return sorted({*_BUILTIN, *_REGISTERED})


def make_loss(cfg: TrainConfig) -> Loss:
    """The loss named by ``cfg.loss``, built from the run's config.

    Raises:
        ValueError: ``cfg.loss`` is not a registered loss (names the known ones).
    """
    if cfg.loss in _REGISTERED:
        factory = _REGISTERED[cfg.loss]
    elif cfg.loss in _BUILTIN:
        module, attr = _BUILTIN[cfg.loss].split(":")
        factory = getattr(importlib.import_module(module), attr)
    else:
        raise ValueError(f"loss: expected one of {available_losses()}, received {cfg.loss!r}")
    return factory(cfg)


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
