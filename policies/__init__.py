"""policylink.policies: registered policy types, one folder each (``diffusion/``, ``flow/``: config, model),
their shared parts (``common/``) and the registry that config parsing, checkpoints and training dispatch through.

``load_policy(path, device="auto")`` turns a checkpoint folder into a ready PolicyAdapter; torch is imported
only when it is called.
"""

from __future__ import annotations

from typing import Any


def load_policy(path: Any, device: Any = "auto", seed: int = 0, cfg_scale: float | None = None):
    """Load a checkpoint folder as a PolicyAdapter (see :func:`policylink.policies.registry.load_policy`)."""
    from policylink.policies.registry import load_policy as _load  # torch: only when called

    return _load(path, device=device, seed=seed, cfg_scale=cfg_scale)


__all__ = ["load_policy"]
