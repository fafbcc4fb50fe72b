"""The shared torch model of the chunk policies: observation encoder + conditional 1-D U-Net, with the
generative head (diffusion or flow matching) supplied by a subclass. Works in normalised units throughout.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping

import torch
from torch import nn

from policylink.adapters.schema import FeatureSpec
from policylink.policies.config import PolicyConfig
from policylink.policies.encoders import ObservationEncoder
from policylink.policies.unet1d import ConditionalUnet1D

Guidance = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``guidance(x_t, t, out) -> out'``: ``x_t`` the current noisy chunk ``(B, H, A)`` (normalised units), ``t``
float ``(B,)`` in ``[0, 1]`` with ``t = 0`` pure noise and ``t = 1`` clean actions, ``out`` the network's
prediction ``(B, H, A)`` (velocity for flow, noise epsilon for diffusion); returns the corrected prediction."""


class ChunkModel(nn.Module, ABC):
    """Encoder + U-Net; subclasses define the training loss and the sampler.

    Args:
        cfg: the :class:`PolicyConfig` (validated here).
        features: observation features by key; only ``cfg.observation_keys`` are used.
        action_dim: ``A``.

    Raises:
        ValueError: the config is inconsistent, or an observation key is not in ``features``.
    """

    def __init__(self, cfg: PolicyConfig, features: Mapping[str, FeatureSpec], action_dim: int):
        super().__init__()
        self.cfg = cfg.validate()
        missing = [k for k in cfg.observation_keys if k not in features]
        if missing:
            raise ValueError(f"policy.observation_keys: {missing} not among the available features {sorted(features)}")
        self.features = {k: features[k] for k in cfg.observation_keys}
        self.action_dim = int(action_dim)
        self.horizon = cfg.chunk_size
        self.encoder = ObservationEncoder(self.features, cfg.n_obs_steps, cfg.encoder)
        u = cfg.unet
        self.net = ConditionalUnet1D(
            self.action_dim, self.encoder.out_dim, tuple(u.down_dims), u.kernel_size, u.n_groups, u.time_embed_dim
        )

    def embed(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Observation latent float32 ``(B, D)`` (``D = encoder.out_dim``) from prepared windows ``(B, T, ...)``."""
        return self.encoder(obs)

    def forward(
        self,
        obs: Mapping[str, torch.Tensor],
        actions: torch.Tensor,
        noise: Mapping[str, torch.Tensor],
        valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Training loss (scalar) for normalised ``actions`` ``(B, H, A)``; see :meth:`loss`.

        ``noise`` comes from :meth:`draw_noise` so that the caller controls every random draw (DDP ranks take
        slices of one global draw, which makes 1-process and N-process training identical).
        """
        return self.loss(self.embed(obs), actions, noise, valid)

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
        pred, target = self.loss_terms(cond, actions, noise)
        err = (pred - target).square()
        if valid is not None:
            err = err * valid[..., None].to(err.dtype)
        return err.mean()

    @torch.no_grad()
    def generate(
        self, cond: torch.Tensor, noise: torch.Tensor, num_steps: int | None = None, guidance: Guidance | None = None
    ) -> torch.Tensor:
        """Sample normalised chunks ``(B, H, A)`` from ``noise`` ``(B, H, A)`` given ``cond`` ``(B, D)``.

        Deterministic given ``noise``: the sampler itself draws nothing. ``num_steps`` defaults to the
        config's (DDIM steps or Euler steps).
        """
        return self._generate(cond, noise, num_steps, guidance)

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

    @abstractmethod
    def _generate(
        self, cond: torch.Tensor, noise: torch.Tensor, num_steps: int | None, guidance: Guidance | None
    ) -> torch.Tensor:
        """Sampler body of :meth:`generate`."""


def build_model(cfg: PolicyConfig, features: Mapping[str, FeatureSpec], action_dim: int) -> ChunkModel:
    """The :class:`ChunkModel` subclass for ``cfg.type`` (``"diffusion"`` or ``"flow"``).

    Raises:
        ValueError: unknown ``cfg.type``.
    """
    cfg.validate()
    if cfg.type == "diffusion":
        from policylink.policies.diffusion.model import DiffusionModel

        return DiffusionModel(cfg, features, action_dim)
    from policylink.policies.flow.model import FlowModel

    return FlowModel(cfg, features, action_dim)
