"""ACT, the Action Chunking Transformer (Zhao et al. 2023, arXiv 2304.13705): a CVAE transformer over action
chunks, registry name ``act``. Importing this package registers the type (its entry point in ``pyproject.toml``
does so on demand). Train it with ``policylink train --config configs/train/act_push_state.yaml``; evaluate with
temporal ensembling through the runtime's executor (``--executor.kind temporal_ensemble``).
"""

from __future__ import annotations

from typing import Any

from policylink.policies.act.config import ACTConfig, ACTPolicyConfig
from policylink.policies.registry import register_policy_type

register_policy_type(
    "act", ACTPolicyConfig, "policylink.policies.act.model:ACTModel", adapter="policylink.policies.act.policy:ACTPolicy"
)


def make_act_policy(checkpoint: Any = None, **kwargs: Any):
    """Registry factory of ``act`` (see :func:`policylink.policies.registry.make_policy`)."""
    from policylink.policies.registry import make_policy

    return make_policy("act", checkpoint, **kwargs)


__all__ = ["ACTConfig", "ACTPolicyConfig", "make_act_policy"]
