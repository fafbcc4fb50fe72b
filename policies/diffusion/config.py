"""Configuration of Diffusion Policy (registry name ``diffusion``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from policylink.policies.common.unet_config import UNetPolicyConfig


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
class DiffusionPolicyConfig(UNetPolicyConfig):
    """Diffusion Policy: shared fields (:class:`~policylink.policies.config.PolicyConfig`), the U-Net, and
    :class:`DiffusionConfig` under ``diffusion``."""

    legacy_fields: ClassVar[tuple[str, ...]] = ("flow",)

    diffusion: DiffusionConfig = field(default_factory=DiffusionConfig)

    def validate(self) -> DiffusionPolicyConfig:
        """The shared checks plus ``diffusion.prediction_type`` and the step counts.

        Raises:
            ValueError: names the field, the expected and the received value.
        """
        super().validate()
        d = self.diffusion
        if d.prediction_type not in ("epsilon", "sample"):
            raise ValueError(
                f"policy.diffusion.prediction_type: expected 'epsilon' or 'sample', received {d.prediction_type!r}"
            )
        if not 1 <= d.num_inference_steps <= d.num_train_timesteps:
            raise ValueError(
                f"policy.diffusion.num_inference_steps: expected in [1, num_train_timesteps="
                f"{d.num_train_timesteps}], received {d.num_inference_steps}"
            )
        return self
