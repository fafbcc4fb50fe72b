"""The conditional U-Net's size (:class:`UNetConfig`) and the config part of the policies built on it
(:class:`UNetPolicyConfig`), torch-free so that parsing a config or printing ``--help`` never imports torch; the
network lives in :mod:`policylink.policies.common.unet1d`."""

from __future__ import annotations

from dataclasses import dataclass, field

from policylink.policies.config import PolicyConfig


@dataclass
class UNetConfig:
    """Conditional 1-D U-Net size (see :class:`ConditionalUnet1D`).

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
class UNetPolicyConfig(PolicyConfig):
    """The config part shared by the policies whose network is the conditional U-Net (diffusion, flow).

    Attributes:
        unet: the U-Net's size (:class:`UNetConfig`).
    """

    unet: UNetConfig = field(default_factory=UNetConfig)

    def validate(self) -> UNetPolicyConfig:
        """The base checks plus ``chunk_size`` divisible by ``2 ** (len(unet.down_dims) - 1)``.

        Raises:
            ValueError: names the field, the expected and the received value.
        """
        super().validate()
        multiple = 2 ** (len(self.unet.down_dims) - 1)
        if self.chunk_size % multiple:
            raise ValueError(
                f"policy.chunk_size: expected a multiple of {multiple} (2 ** (levels - 1) for "
                f"unet.down_dims={self.unet.down_dims}), received {self.chunk_size}"
            )
        return self


__all__ = ["UNetConfig", "UNetPolicyConfig"]
