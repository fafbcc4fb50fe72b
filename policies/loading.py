"""The one way to get a policy: :func:`load_policy` turns any policy reference into a ready PolicyAdapter, the
same everywhere a policy is named (``run``, ``eval``, ``serve``, deployment, Python).

A reference is one of: a server address (``tcp://``, ``ipc://``: a :class:`~policylink.adapters.transport.
RemotePolicy` with the capabilities its server advertises; ``xpl://HOST:PORT[?options]``: any XPolicyLab model
server, :func:`policylink.adapters.xpolicylab.load_remote`, its spec from the env it runs on), a checkpoint
folder (config, weights, normaliser and spec inside), a typed checkpoint ``kind:folder`` (the factory of registry
name ``kind`` with ``checkpoint=folder``, e.g. ``lerobot:/path/to/pretrained_model``), a policy registry name (its
factory, no arguments), or a zero-argument callable returning a policy. torch is imported only when a checkpoint
is loaded.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

REMOTE_SCHEMES = ("tcp://", "ipc://", "xpl://")
"""Address prefixes of a served policy: our ZeroMQ protocol (``tcp://``, ``ipc://``) and XPolicyLab's websocket
protocol (``xpl://``)."""


def kind_ref(ref: Any) -> tuple[str, str] | None:
    """``(kind, folder)`` of a typed checkpoint reference ``kind:folder`` (``lerobot:/path/to/pretrained_model``):
    ``kind`` is a policy registry name whose factory takes ``checkpoint=folder``; None for any other reference
    (plain folders, names, ``tcp://`` / ``ipc://`` addresses)."""
    if not isinstance(ref, str) or ref.startswith(REMOTE_SCHEMES):
        return None
    kind, sep, folder = ref.partition(":")
    if not sep or not folder or not kind.isidentifier():
        return None
    return kind, folder


def load_policy(
    ref: Any, device: Any = "auto", seed: int = 0, cfg_scale: float | None = None, env_spec: Any = None
) -> Any:
    """A ready PolicyAdapter from a policy reference (see the module docstring for the forms).

    Args:
        ref: the reference (str, path or zero-argument callable).
        device: ``"auto"`` (CUDA when present), ``"cpu"``, ``"cuda:0"``... (local policies).
        seed: seed of the sampler's noise (local policies).
        cfg_scale: classifier-free guidance weight replacing a checkpoint folder's ``policy.cfg_scale`` (None =
            keep it); an evaluation option, never written back into the checkpoint.

    Raises:
        FileNotFoundError: the reference looks like a path (contains ``/``) but no such folder exists.
        UnknownNameError: neither an address, a path, nor a registered name (the message lists the names).
        CheckpointError: a checkpoint folder with missing or inconsistent files, or an old (pickle) layout.
        ValueError: a registered name that cannot be built without a checkpoint (``diffusion``, ``flow``); a bad
            ``cfg_scale``, or one given for a reference that is not a checkpoint folder (a served policy uses the
            server's: ``policylink serve --cfg_scale``).
        env_spec: the :class:`~policylink.adapters.schema.EnvSpec` the policy will run on; an ``xpl://`` server
            that advertises no spec takes its observation features, action and control frequency from it
            (:func:`policylink.adapters.xpolicylab.spec_from_env`). Ignored by every other reference.
    """
    path = Path(str(ref)).expanduser()
    if cfg_scale is not None and (callable(ref) or not path.is_dir()):
        raise ValueError(
            f"cfg_scale: applies to a checkpoint folder loaded here, received it with policy {ref!r} (a served "
            f"policy uses the server's: policylink serve --checkpoint DIR --cfg_scale W)"
        )
    if callable(ref):
        return ref()
    ref = str(ref)
    if ref.startswith("xpl://"):
        from policylink.adapters.xpolicylab import load_remote

        return load_remote(ref, env_spec)
    if ref.startswith(REMOTE_SCHEMES):
        from policylink.adapters.transport import RemotePolicy

        return RemotePolicy(ref)
    from policylink.adapters.registry import policy_factory

    typed = kind_ref(ref)
    if typed is not None:
        kind, folder = typed
        return policy_factory(kind)(checkpoint=str(Path(folder).expanduser()), device=device, seed=seed)
    if path.is_dir():
        from policylink.policies.registry import load_checkpoint  # torch: only now

        return load_checkpoint(path, device=device, seed=seed, cfg_scale=cfg_scale)
    if "/" in ref or os.sep in ref or path.exists():
        kind = "not a folder" if path.exists() else "not found"
        raise FileNotFoundError(
            f"checkpoint folder {kind}: {ref} (policylink train writes <output_dir>/checkpoints/last)"
        )
    factory = policy_factory(ref)  # UnknownNameError lists the available names
    try:
        return factory()
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"policy {ref!r} needs a checkpoint: pass the checkpoint folder instead of the name (policylink train "
            f"writes <output_dir>/checkpoints/last); building it without one failed: {e}"
        ) from None


__all__ = ["REMOTE_SCHEMES", "kind_ref", "load_policy"]
