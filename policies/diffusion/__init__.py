"""Diffusion Policy (Chi et al. 2023, arXiv 2303.04137): registry name ``diffusion``."""

from __future__ import annotations

from typing import Any


def make_diffusion_policy(checkpoint: Any = None, **kwargs: Any):
    """Registry factory of ``diffusion`` (see :func:`policylink.policies.policy.make_chunk_policy`)."""
    from policylink.policies.policy import make_chunk_policy

    return make_chunk_policy("diffusion", checkpoint, **kwargs)
