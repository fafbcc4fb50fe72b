"""Typed configuration of the chunk policies (Diffusion Policy and flow matching): one dataclass tree, saved
as ``config.yaml`` in every checkpoint and parsed from training YAML files with draccus.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from policylink.policies.encoders import EncoderConfig

POLICY_TYPES = ("diffusion", "flow")


@dataclass
class UNetConfig:
    """Conditional 1-D U-Net size (see :class:`policylink.policies.unet1d.ConditionalUnet1D`).

    Attributes:
        down_dims: channels per level; ``chunk_size`` must be divisible by ``2 ** (len(down_dims) - 1)``.
        kernel_size: temporal kernel size (odd).
        n_groups: GroupNorm groups.
        time_embed_dim: sinusoidal time-embedding size.
    """

    down_dims: list[int] = field(default_factory=lambda: [256, 512, 1024])
    kernel_size: int = 5
    n_groups: int = 8
    time_embed_dim: int = 128


@dataclass
class DiffusionConfig:
    """DDPM training / DDIM sampling (Ho et al. 2020; Song et al. 2021) through ``diffusers`` schedulers.

    Attributes:
        num_train_timesteps: DDPM steps at training time (Diffusion Policy: 100).
        beta_schedule: ``diffusers`` beta schedule (``"squaredcos_cap_v2"`` = squared cosine, Nichol & Dhariwal).
        num_inference_steps: DDIM steps at inference (Diffusion Policy: 10).
        prediction_type: ``"epsilon"`` (noise) or ``"sample"`` (clean chunk).
        clip_sample: clip the predicted clean chunk to ``[-clip_sample_range, clip_sample_range]`` (normalised).
        clip_sample_range: clipping bound in normalised action units.
    """

    num_train_timesteps: int = 100
    beta_schedule: str = "squaredcos_cap_v2"
    num_inference_steps: int = 10
    prediction_type: str = "epsilon"
    clip_sample: bool = True
    clip_sample_range: float = 1.0


@dataclass
class FlowConfig:
    """Flow matching with the standard convention (DESIGN section 4): ``x_t = t*a + (1-t)*eps``.

    Attributes:
        num_steps: Euler steps from ``t = 0`` (noise) to ``t = 1`` (actions).
        time_sampling: training-time distribution of ``t``: ``"uniform"`` on ``[0, 1]``, or ``"beta"``
            (``t = 1 - s``, ``s ~ Beta(1.5, 1)``, pi0's emphasis on noisy times).
        time_scale: factor applied to ``t`` before the sinusoidal embedding (the U-Net's embedding is tuned
            for integer-like timesteps).
    """

    num_steps: int = 10
    time_sampling: str = "uniform"
    time_scale: float = 100.0


@dataclass
class PolicyConfig:
    """Everything that defines a chunk policy besides its PolicySpec and normaliser.

    Attributes:
        type: ``"diffusion"`` or ``"flow"``.
        observation_keys: observation features the policy reads (state vectors and/or camera images).
        n_obs_steps: observation horizon ``T`` (Diffusion Policy: 2).
        chunk_size: prediction horizon ``H`` (16).
        n_action_steps: action horizon executed before replanning (8).
        encoder, unet, diffusion, flow: the parts' settings (``diffusion`` is read by type ``diffusion`` only,
            ``flow`` by type ``flow`` only).
        ema_max_decay: EMA decay ceiling; the decay warms up as ``1 - (1 + step) ** -ema_power``.
        ema_power: EMA warm-up exponent (Diffusion Policy: 0.75).
        state_norm_mode: normaliser mode for state vectors (``min_max`` maps to ``[-1, 1]``).
        action_norm_mode: normaliser mode for actions.
        mask_padded_actions: leave the padded steps past an episode's end out of the loss (they repeat the
            last action; wrong for delta actions when episodes end at success).
        image_norm_mode: normaliser mode for camera images (already in ``[0, 1]``; the image encoder maps them
            to ``[-1, 1]``).
    """

    type: str = "diffusion"
    observation_keys: list[str] = field(default_factory=lambda: ["observation.state"])
    n_obs_steps: int = 2
    chunk_size: int = 16
    n_action_steps: int = 8
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    unet: UNetConfig = field(default_factory=UNetConfig)
    diffusion: DiffusionConfig = field(default_factory=DiffusionConfig)
    flow: FlowConfig = field(default_factory=FlowConfig)
    ema_max_decay: float = 0.9999
    ema_power: float = 0.75
    state_norm_mode: str = "min_max"
    action_norm_mode: str = "min_max"
    image_norm_mode: str = "identity"
    mask_padded_actions: bool = True

    def validate(self) -> PolicyConfig:
        """Return self if consistent; raise ValueError naming the field, expected and received value."""
        if self.type not in POLICY_TYPES:
            raise ValueError(f"policy.type: expected one of {POLICY_TYPES}, received {self.type!r}")
        multiple = 2 ** (len(self.unet.down_dims) - 1)
        if self.chunk_size % multiple:
            raise ValueError(
                f"policy.chunk_size: expected a multiple of {multiple} (2 ** (levels - 1) for "
                f"unet.down_dims={self.unet.down_dims}), received {self.chunk_size}"
            )
        if not 1 <= self.n_action_steps <= self.chunk_size:
            raise ValueError(
                f"policy.n_action_steps: expected in [1, chunk_size={self.chunk_size}], received {self.n_action_steps}"
            )
        if self.n_obs_steps < 1:
            raise ValueError(f"policy.n_obs_steps: expected >= 1, received {self.n_obs_steps}")
        if not self.observation_keys:
            raise ValueError("policy.observation_keys: expected at least one key, received []")
        if self.flow.time_sampling not in ("uniform", "beta"):
            raise ValueError(
                f"policy.flow.time_sampling: expected 'uniform' or 'beta', received {self.flow.time_sampling!r}"
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (YAML-ready)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PolicyConfig:
        """Inverse of :meth:`to_dict`; unknown fields raise ValueError naming them."""
        import draccus

        try:
            return draccus.decode(cls, d)
        except Exception as e:  # draccus raises several types; re-raise with the config's name
            raise ValueError(f"policy config: {e}") from e
