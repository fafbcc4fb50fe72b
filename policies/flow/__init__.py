"""Flow-matching chunk policy (velocity field on the shared U-Net, Euler sampler with guidance): registry name
``flow``."""

from __future__ import annotations

from typing import Any


def make_flow_policy(checkpoint: Any = None, **kwargs: Any):
    """Registry factory of ``flow`` (see :func:`policylink.policies.policy.make_chunk_policy`)."""
    from policylink.policies.policy import make_chunk_policy

    return make_chunk_policy("flow", checkpoint, **kwargs)
