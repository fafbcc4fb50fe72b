"""ACT's network: a conditional VAE whose decoder is a transformer over observation tokens with one learned query
per chunk step (Zhao et al. 2023, arXiv 2304.13705, section 3.2, figure 4; layout as LeRobot's ``ACT``).

Training: the CVAE encoder reads ``[CLS, state, a_1 .. a_H]`` and outputs ``mu, log sigma^2`` of the style
variable ``z``; ``z = mu + sigma * eps`` enters the transformer encoder as one token next to the observation tokens
(one per feature per observation step: state vectors and, per camera, the shared
:class:`~policylink.policies.common.encoders.ImageEncoder`'s keypoint features); ``chunk_size`` learned queries
decode the chunk. Loss: ``L1(a_hat, a) + kl_weight * KL(N(mu, sigma^2) || N(0, I))``. Inference: ``z = 0`` (the
prior's mean), so ACT predicts one deterministic chunk per observation; there is no denoising sampler.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from policylink.adapters.schema import FeatureSpec
from policylink.policies.act.config import ACTPolicyConfig
from policylink.policies.common.unet1d import SinusoidalTimeEmbedding
from policylink.policies.model import ChunkModel


def _encoder_stack(d: int, heads: int, ff: int, dropout: float, pre_norm: bool, layers: int) -> nn.TransformerEncoder:
    layer = nn.TransformerEncoderLayer(d, heads, ff, dropout, batch_first=True, norm_first=pre_norm)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


class ACTModel(ChunkModel):
    """ACT over the shared :class:`~policylink.policies.common.encoders.ObservationEncoder` (whose flat output is
    split back into one token per feature and observation step). Works in normalised units.

    Args:
        cfg: :class:`~policylink.policies.act.config.ACTPolicyConfig`.
        features: observation features by key. action_dim: ``A``.

    Raises:
        ValueError: an inconsistent config, or an observation key not in ``features``.
    """

    cfg: ACTPolicyConfig

    def __init__(self, cfg: ACTPolicyConfig, features: Mapping[str, FeatureSpec], action_dim: int):
        super().__init__(cfg, features, action_dim)
        a, enc = cfg.act, cfg.encoder
        d = a.dim_model
        self.keys = sorted(self.features)  # the encoder's per-step concatenation order
        self.key_dims = [
            2 * enc.num_keypoints
            if self.features[k].is_image
            else (enc.state_out_dim if enc.state_hidden_dims else self.features[k].shape[0])
            for k in self.keys
        ]
        self.vector_slice = [i for i, k in enumerate(self.keys) if not self.features[k].is_image]
        self.token_proj = nn.ModuleList(nn.Linear(f, d) for f in self.key_dims)
        n_tokens = 1 + cfg.n_obs_steps * len(self.keys)  # z, then (step, feature) tokens
        self.encoder_pos = nn.Embedding(n_tokens, d)
        self.latent_proj = nn.Linear(a.latent_dim, d)
        self.encoder_stack = _encoder_stack(d, a.n_heads, a.dim_feedforward, a.dropout, a.pre_norm, a.n_encoder_layers)
        dec = nn.TransformerDecoderLayer(d, a.n_heads, a.dim_feedforward, a.dropout, batch_first=True,
                                         norm_first=a.pre_norm)  # fmt: skip
        self.decoder_stack = nn.TransformerDecoder(dec, a.n_decoder_layers)
        self.queries = nn.Embedding(self.horizon, d)
        self.action_head = nn.Linear(d, self.action_dim)
        # CVAE encoder (training only): [CLS, newest state features, a_1 .. a_H] -> (mu, log sigma^2)
        self.vae_cls = nn.Parameter(torch.zeros(1, 1, d))
        state_dim = sum(self.key_dims[i] for i in self.vector_slice)
        self.vae_state_proj = nn.Linear(state_dim, d) if state_dim else None
        self.vae_action_proj = nn.Linear(self.action_dim, d)
        self.vae_stack = _encoder_stack(d, a.n_heads, a.dim_feedforward, a.dropout, a.pre_norm, a.n_vae_encoder_layers)
        self.vae_out = nn.Linear(d, 2 * a.latent_dim)
        n_vae = self.horizon + 1 + (state_dim > 0)
        positions = torch.arange(n_vae, dtype=torch.float32)
        self.register_buffer("vae_pos", SinusoidalTimeEmbedding(d)(positions)[None], persistent=False)

    # -- pieces -------------------------------------------------------------------------------------------------

    def _split(self, cond: torch.Tensor) -> list[torch.Tensor]:
        """Flat conditioning ``(B, T * step_dim)`` -> per feature ``(B, T, f_k)`` in :attr:`keys` order."""
        steps = cond.reshape(cond.shape[0], self.cfg.n_obs_steps, -1)
        return list(steps.split(self.key_dims, dim=-1))

    def posterior(
        self, cond: torch.Tensor, actions: torch.Tensor, valid: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """CVAE encoder: ``(mu, log sigma^2)``, each float32 ``(B, latent_dim)``, of ``z`` given conditioning
        ``(B, D)`` and normalised actions ``(B, H, A)``; padded steps (``valid`` False, bool ``(B, H)``) are
        masked out of the attention."""
        b = actions.shape[0]
        tokens = [self.vae_cls.expand(b, -1, -1)]
        if self.vae_state_proj is not None:
            parts = self._split(cond)
            state = torch.cat([parts[i][:, -1] for i in self.vector_slice], dim=-1)  # newest step
            tokens.append(self.vae_state_proj(state)[:, None])
        head = len(tokens)
        tokens.append(self.vae_action_proj(actions))
        x = torch.cat(tokens, dim=1) + self.vae_pos
        mask = None
        if valid is not None:
            mask = torch.cat([torch.zeros(b, head, dtype=torch.bool, device=x.device), ~valid.bool()], dim=1)
        out = self.vae_stack(x, src_key_padding_mask=mask)[:, 0]
        mu, log_var = self.vae_out(out).chunk(2, dim=-1)
        return mu, log_var

    def decode(self, cond: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Normalised chunk ``(B, H, A)`` from conditioning ``(B, D)`` and style ``z`` ``(B, latent_dim)``."""
        tokens = [self.latent_proj(z)[:, None]]
        per_key = [proj(x) for proj, x in zip(self.token_proj, self._split(cond))]  # each (B, T, d)
        tokens.append(torch.stack(per_key, dim=2).flatten(1, 2))  # (B, T * K, d), step-major
        x = torch.cat(tokens, dim=1) + self.encoder_pos.weight[None]
        memory = self.encoder_stack(x)
        queries = self.queries.weight[None].expand(x.shape[0], -1, -1)
        return self.action_head(self.decoder_stack(queries, memory))

    def predict(self, cond: torch.Tensor) -> torch.Tensor:
        """Inference: the chunk ``(B, H, A)`` (normalised) decoded with ``z = 0``, the prior's mean."""
        return self.decode(cond, cond.new_zeros(cond.shape[0], self.cfg.act.latent_dim))

    # -- ChunkModel -------------------------------------------------------------------------------------------

    def draw_noise(
        self, batch_size: int, generator: torch.Generator | None = None, device: torch.device | str = "cpu"
    ) -> dict[str, torch.Tensor]:
        """The reparameterisation draw ``{"noise": N(0, I) float32 (B, latent_dim)}`` (``z = mu + sigma * eps``)."""
        return {"noise": torch.randn(batch_size, self.cfg.act.latent_dim, generator=generator).to(device)}

    def loss_parts(
        self,
        cond: torch.Tensor,
        actions: torch.Tensor,
        noise: Mapping[str, torch.Tensor],
        valid: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """``{"l1": scalar, "kl": scalar, "pred": (B, H, A)}``: the mean absolute error over all ``B * H * A``
        entries (padded steps zeroed, denominator unchanged, as LeRobot's ACT) and the KL divergence of
        ``N(mu, sigma^2)`` from ``N(0, I)`` summed over ``z``'s dimensions and averaged over the batch."""
        mu, log_var = self.posterior(cond, actions, valid)
        z = mu + (0.5 * log_var).exp() * noise["noise"].to(mu)
        pred = self.decode(cond, z)
        err = (pred - actions).abs()
        if valid is not None:
            err = err * valid[..., None].to(err.dtype)
        kl = (-0.5 * (1.0 + log_var - mu.square() - log_var.exp())).sum(-1).mean()
        return {"l1": err.mean(), "kl": kl, "pred": pred}

    def loss(
        self,
        cond: torch.Tensor,
        actions: torch.Tensor,
        noise: Mapping[str, torch.Tensor],
        valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """ACT's objective ``L1 + kl_weight * KL`` (scalar; see :meth:`loss_parts`)."""
        parts = self.loss_parts(cond, actions, noise, valid)
        return parts["l1"] + self.cfg.act.kl_weight * parts["kl"]

    def loss_terms(
        self, cond: torch.Tensor, actions: torch.Tensor, noise: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(reconstruction with z from the posterior, actions)``, both ``(B, H, A)``."""
        return self.loss_parts(cond, actions, noise)["pred"], actions


__all__ = ["ACTModel"]
