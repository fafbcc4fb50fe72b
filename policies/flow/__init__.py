"""Flow-matching chunk policy (velocity field on the shared U-Net, Euler sampler with guidance): registry name
``flow``. Importing this package registers the type (its entry point in ``pyproject.toml`` does so on demand).
"""

from __future__ import annotations

from typing import Any

from policylink.policies.flow.config import FlowConfig, FlowPolicyConfig
from policylink.policies.registry import register_policy_type

register_policy_type("flow", FlowPolicyConfig, "policylink.policies.flow.model:FlowModel")


def make_flow_policy(checkpoint: Any = None, **kwargs: Any):
    """Registry factory of ``flow`` (see :func:`policylink.policies.registry.make_policy`)."""
    from policylink.policies.registry import make_policy

    return make_policy("flow", checkpoint, **kwargs)


__all__ = ["FlowConfig", "FlowPolicyConfig", "make_flow_policy"]
