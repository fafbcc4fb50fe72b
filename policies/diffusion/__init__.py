"""Diffusion Policy (Chi et al. 2023, arXiv 2303.04137): registry name ``diffusion``. Importing this package
registers the type (its entry point in ``pyproject.toml`` does so on demand).
"""

from __future__ import annotations

from typing import Any

from policylink.policies.diffusion.config import DiffusionConfig, DiffusionPolicyConfig
from policylink.policies.registry import register_policy_type

register_policy_type("diffusion", DiffusionPolicyConfig, "policylink.policies.diffusion.model:DiffusionModel")


def make_diffusion_policy(checkpoint: Any = None, **kwargs: Any):
    """Registry factory of ``diffusion`` (see :func:`policylink.policies.registry.make_policy`)."""
    from policylink.policies.registry import make_policy

    return make_policy("diffusion", checkpoint, **kwargs)


__all__ = ["DiffusionConfig", "DiffusionPolicyConfig", "make_diffusion_policy"]
