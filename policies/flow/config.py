"""Configuration of the flow-matching chunk policy (registry name ``flow``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from policylink.policies.common.unet_config import UNetPolicyConfig

TIME_SAMPLINGS = ("uniform", "beta")


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
class FlowPolicyConfig(UNetPolicyConfig):
    """The flow policy: shared fields (:class:`~policylink.policies.config.PolicyConfig`), the U-Net, and
    :class:`FlowConfig` under ``flow``."""

    legacy_fields: ClassVar[tuple[str, ...]] = ("diffusion",)

    flow: FlowConfig = field(default_factory=FlowConfig)

    def validate(self) -> FlowPolicyConfig:
        """The shared checks plus ``flow.time_sampling`` and ``flow.num_steps``.

        Raises:
            ValueError: names the field, the expected and the received value.
        """
        super().validate()
        if self.flow.time_sampling not in TIME_SAMPLINGS:
            raise ValueError(
                f"policy.flow.time_sampling: expected 'uniform' or 'beta', received {self.flow.time_sampling!r}"
            )
        if self.flow.num_steps < 1:
            raise ValueError(f"policy.flow.num_steps: expected >= 1, received {self.flow.num_steps}")
        return self
