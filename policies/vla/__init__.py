"""The small in-house VLA (registry name ``vla``): a vision encoder per camera, a frozen MiniLM-L6 sentence
encoder for the instruction (cached per instruction string), and a transformer flow-matching action expert over
vision, language and state tokens. Importing this package registers the type (its entry point in
``pyproject.toml`` does so on demand). sentence-transformers (extra ``vla``) is imported on first use only.
"""

from __future__ import annotations

from typing import Any

from policylink.policies.registry import register_policy_type
from policylink.policies.vla.config import ExpertConfig, LanguageConfig, VLAPolicyConfig

register_policy_type(
    "vla", VLAPolicyConfig, "policylink.policies.vla.model:VLAModel", adapter="policylink.policies.vla.policy:VLAPolicy"
)


def make_vla_policy(checkpoint: Any = None, **kwargs: Any):
    """Registry factory of ``vla`` (see :func:`policylink.policies.registry.make_policy`)."""
    from policylink.policies.registry import make_policy

    return make_policy("vla", checkpoint, **kwargs)


__all__ = ["ExpertConfig", "LanguageConfig", "VLAPolicyConfig", "make_vla_policy"]
