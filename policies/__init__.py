"""policylink.policies: registered policy types, one folder each (``diffusion/``, ``flow/``: config, model),
their shared parts (``common/``) and the registry that config parsing, checkpoints and training dispatch through.

``load_policy(ref, device="auto")`` turns any policy reference (a checkpoint folder, a server address, a registry
name, ``kind:folder``) into a ready PolicyAdapter (:mod:`policylink.policies.loading`); torch is imported only when
a checkpoint is loaded.
"""

from __future__ import annotations

from policylink.policies.loading import load_policy

__all__ = ["load_policy"]
