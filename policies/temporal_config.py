"""The long-horizon memory settings (:class:`SegaConfig`, ``policy.memory``), torch-free so that parsing a config
or printing ``--help`` never imports torch; the module itself lives in :mod:`policylink.policies.temporal`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MEMORY_KINDS = ("none", "sega")
"""Values of ``policy.memory``: ``none`` (the window encoder alone) or ``sega`` (SeedPolicy's gated memory)."""


@dataclass
class SegaConfig:
    """SEGA memory size and training chain (SeedPolicy, arXiv 2603.05117: 60 tokens x 256, 6 layers, 8 heads;
    the defaults here are small for CPU training).

    Attributes:
        tokens: ``N``, latent state tokens.
        width: ``W``, token width (state and observation tokens); a multiple of ``heads``.
        layers: parallel state->obs / obs->state cross-attention layers.
        heads: attention heads.
        mlp_ratio: hidden size of each block's MLP as a multiple of ``W``.
        train_windows: ``K``, consecutive observation windows per training sample (one chain ends at the sample's
            anchor; windows before the episode start are skipped, and the state enters the chain's first window
            as the reset state). Cover the episode length / ``policy.n_action_steps`` to train memory of the
            episode's start.
        detach_every: cut the gradient through the carried state every this many windows (1 = SeedPolicy's
            fully detached carry-over; 0 = never within a chain: back-propagation through the whole chain).
    """

    tokens: int = 16
    width: int = 64
    layers: int = 2
    heads: int = 4
    mlp_ratio: float = 2.0
    train_windows: int = 8
    detach_every: int = 1

    def validate(self, memory: str) -> SegaConfig:
        """Return self if consistent with ``policy.memory``.

        Raises:
            ValueError: names the field, the expected and the received value.
        """
        if memory not in MEMORY_KINDS:
            raise ValueError(f"policy.memory: expected one of {MEMORY_KINDS}, received {memory!r}")
        for name in ("tokens", "width", "layers", "heads", "train_windows"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"policy.sega.{name}: expected >= 1, received {getattr(self, name)}")
        if self.width % self.heads:
            raise ValueError(f"policy.sega.width: expected a multiple of heads={self.heads}, received {self.width}")
        if self.detach_every < 0 or self.mlp_ratio <= 0:
            raise ValueError(
                f"policy.sega: expected detach_every >= 0 and mlp_ratio > 0, received detach_every="
                f"{self.detach_every}, mlp_ratio={self.mlp_ratio}"
            )
        return self


def chain_windows(policy_cfg: Any) -> dict[str, int]:
    """Dataset window kwargs for ``policy_cfg``'s memory: ``{"chain_windows": K, "chain_stride":
    n_action_steps}`` for ``memory: sega`` (consecutive windows as the executor sees them), ``{}`` otherwise."""
    if getattr(policy_cfg, "memory", "none") != "sega":
        return {}
    return {"chain_windows": int(policy_cfg.sega.train_windows), "chain_stride": int(policy_cfg.n_action_steps)}


__all__ = ["MEMORY_KINDS", "SegaConfig", "chain_windows"]
