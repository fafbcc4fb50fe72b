"""The base classes of the chunk models. :class:`ChunkModel`: observation encoder -> latent (+ the optional
label/vector conditioning offset) and a training loss over action chunks (every policy type: ACT decodes its chunk
directly). :class:`GenerativeChunkModel` adds a denoising network sampled by a
:class:`~policylink.adapters.capabilities.DenoisingSampler` (Diffusion Policy, flow matching, the VLA): only these
can ``generate`` with guidance and trajectories. A registered policy type supplies a subclass with its network (and
sampler) and its training loss. Works in normalised units throughout.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from policylink.adapters.capabilities import ConditioningSpec, DenoisingSampler, Guidance, GuidanceFn
from policylink.adapters.schema import FeatureSpec
from policylink.policies.common.conditioning import ConditioningEmbedding
from policylink.policies.config import PolicyConfig
from policylink.policies.temporal import observation_encoder


def policy_features(cfg: PolicyConfig, features: Mapping[str, FeatureSpec]) -> dict[str, FeatureSpec]:
    """The features a policy reads: ``cfg.observation_keys`` of ``features``, in that order.

    Raises:
        ValueError: an observation key is not in ``features`` (names the keys and the available ones).
    """
    missing = [k for k in cfg.observation_keys if k not in features]
    if missing:
        raise ValueError(f"policy.observation_keys: {missing} not among the available features {sorted(features)}")
    return {k: features[k] for k in cfg.observation_keys}


class ChunkModel(nn.Module, ABC):
    """Encoder + conditioning slot + a training loss over action chunks; subclasses add the network and the loss.

    Args:
        cfg: the policy's config (validated here).
        features: observation features by key; only ``cfg.observation_keys`` are used.
        action_dim: ``A``.
        encoder: the observation encoder (a module with ``out_dim`` and ``forward(obs[, memory]) -> (B, D)``);
            default: the shared window encoder (+ SEGA memory when configured) of
            :func:`~policylink.policies.temporal.observation_encoder`.

    Subclasses implement :meth:`draw_noise` and :meth:`loss_terms`.

    Raises:
        ValueError: the config is inconsistent, or an observation key is not in ``features``.
    """

    def __init__(
        self,
        cfg: PolicyConfig,
        features: Mapping[str, FeatureSpec],
        action_dim: int,
        encoder: nn.Module | None = None,
    ):
        super().__init__()
        self.cfg = cfg.validate()
        self.features = policy_features(cfg, features)
        self.action_dim = int(action_dim)
        self.horizon = cfg.chunk_size
        self.encoder = encoder if encoder is not None else observation_encoder(self.features, cfg.n_obs_steps, cfg)
        self.extra_conditioning = ConditioningEmbedding(cfg.conditioning, self.encoder.out_dim)

    @property
    def latent_dim(self) -> int:
        """``D``: width of the observation latent and of the conditioning vector the network sees."""
        return self.encoder.out_dim

    @property
    def conditioning(self) -> ConditioningSpec:
        """The extra conditioning slot (labels / vectors; see ``cfg.conditioning``)."""
        return self.cfg.conditioning

    def embed(self, obs: Mapping[str, torch.Tensor], memory: Any = None) -> torch.Tensor:
        """Observation latent float32 ``(B, D)`` from prepared windows ``(B, T, ...)``; ``memory`` (SEGA only:
        ``(MemoryRows, row ids, B)``, see :class:`~policylink.policies.temporal.SegaEncoder`) reads and updates
        those rows' latent state."""
        return self.encoder(obs) if memory is None else self.encoder(obs, memory)

    def conditioning_embedding(
        self, batch_size: int, labels: torch.Tensor | None = None, tokens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The offset ``(B, D)`` the slot adds to the latent: label embedding (``-1`` = learned null) plus the
        projected vector (NaN rows / None = learned null); zeros when the slot is off.

        Raises:
            ValueError: a slot the config does not have, a label out of range, a wrong shape.
        """
        return self.extra_conditioning(batch_size, labels, tokens)

    def condition(
        self, latent: torch.Tensor, labels: torch.Tensor | None = None, tokens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The network's global conditioning ``(B, D)``: ``latent`` plus :meth:`conditioning_embedding` (the
        latent itself when the slot is off)."""
        if not self.extra_conditioning.enabled and labels is None and tokens is None:
            return latent
        return latent + self.conditioning_embedding(latent.shape[0], labels, tokens).to(latent.dtype)

    def forward(
        self,
        obs: Mapping[str, torch.Tensor],
        actions: torch.Tensor,
        noise: Mapping[str, torch.Tensor],
        valid: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        tokens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Training loss (scalar) for normalised ``actions`` ``(B, H, A)``; see :meth:`loss`.

        ``noise`` comes from :meth:`draw_noise` so that the caller controls every random draw (DDP ranks take
        slices of one global draw, which makes 1-process and N-process training identical). ``labels`` int
        ``(B,)`` (``-1`` = null; apply label dropout with
        :func:`~policylink.policies.common.conditioning.drop_labels`) and ``tokens`` ``(B, token_dim)`` feed the
        conditioning slot.
        """
        return self.loss(self.condition(self.embed(obs), labels, tokens), actions, noise, valid)

    def loss(
        self,
        cond: torch.Tensor,
        actions: torch.Tensor,
        noise: Mapping[str, torch.Tensor],
        valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Mean squared error of the head's prediction over all ``B * H * A`` entries.

        ``valid`` (bool ``(B, H)``, optional) zeroes the error of padded steps past an episode's end (their
        actions repeat the last one, which is wrong for delta actions). The denominator stays ``B * H * A`` so
        that the mean over DDP ranks equals the single-process loss.
        """
        return self.per_sample_loss(cond, actions, noise, valid).mean()

    def per_sample_loss(
        self,
        cond: torch.Tensor,
        actions: torch.Tensor,
        noise: Mapping[str, torch.Tensor],
        valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Squared error of the head's prediction per sample ``(B,)``: the mean over its ``H * A`` entries, with
        padded steps (``valid`` False) zeroed but still counted, so ``per_sample_loss(...).mean()`` is
        :meth:`loss`. Weighted objectives (AWR) weight these per-sample terms."""
        pred, target = self.loss_terms(cond, actions, noise)
        err = (pred - target).square()
        if valid is not None:
            err = err * valid[..., None].to(err.dtype)
        return err.mean(dim=tuple(range(1, err.dim())))

    @abstractmethod
    def draw_noise(
        self, batch_size: int, generator: torch.Generator | None = None, device: torch.device | str = "cpu"
    ) -> dict[str, torch.Tensor]:
        """All training-time randomness of one batch: ``{"noise": (B, H, A), "t": (B,)}``."""

    @abstractmethod
    def loss_terms(
        self, cond: torch.Tensor, actions: torch.Tensor, noise: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(prediction, target)``, both ``(B, H, A)``, from conditioning ``(B, D)``, normalised actions and noise."""


class GenerativeChunkModel(ChunkModel):
    """A :class:`ChunkModel` whose chunks come from a denoising network: subclasses set :attr:`sampler` (a
    :class:`~policylink.adapters.capabilities.DenoisingSampler` over ``self.net``) in ``__init__``. This is the
    capability guidance, trajectories, Q-VGM and RTC need; callers check ``isinstance(model,
    GenerativeChunkModel)``."""

    sampler: DenoisingSampler

    def generate(
        self,
        cond: torch.Tensor,
        noise: torch.Tensor,
        num_steps: int | None = None,
        guidance: Guidance | GuidanceFn | None = None,
        return_trajectory: bool = False,
    ):
        """Sample normalised chunks ``(B, H, A)`` from ``noise`` ``(B, H, A)`` given ``cond`` ``(B, D)`` with
        :attr:`sampler` (see :meth:`~policylink.policies.common.samplers.Sampler.sample`). Deterministic given
        ``noise``; ``num_steps`` defaults to the sampler's."""
        return self.sampler.sample(cond, noise, num_steps, guidance, return_trajectory)


__all__ = ["ChunkModel", "GenerativeChunkModel", "policy_features"]
