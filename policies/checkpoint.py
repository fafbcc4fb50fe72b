"""Checkpoint folders: everything needed to rebuild a policy, and to resume its training.

Layout::

    <dir>/config.yaml             {"policy": {"type": name, ...PolicyConfig}, "train": training config (optional)}
    <dir>/model.safetensors       model weights (the EMA weights during training)
    <dir>/normalizer.safetensors  Normalizer.state_dict() arrays
    <dir>/policy_spec.json        PolicySpec.to_dict()
    <dir>/training_state.pt       optional: optimizer, LR scheduler, step, RNG states, raw and EMA weights

A folder is written under a temporary name and renamed into place, so a killed trainer never leaves a
half-written checkpoint behind.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from policylink.adapters.obs_modes import obs_mode_env_kwargs
from policylink.adapters.schema import PolicySpec
from policylink.data.normalize import Normalizer
from policylink.policies.config import PolicyConfig, build_model
from policylink.policies.model import ChunkModel

CONFIG_FILE = "config.yaml"
MODEL_FILE = "model.safetensors"
NORMALIZER_FILE = "normalizer.safetensors"
SPEC_FILE = "policy_spec.json"
TRAINING_STATE_FILE = "training_state.pt"


class CheckpointError(FileNotFoundError):
    """A checkpoint folder is missing a file or holds an inconsistent one."""


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` -> CUDA when available, else CPU; ``"cpu"``, ``"cuda"``, ``"cuda:N"`` (or a torch.device).

    Raises:
        ValueError: an unknown device string, or CUDA requested on a machine without a usable CUDA device
            (names ``device``, the expected and the received value).
    """
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device: expected 'auto', 'cpu' or 'cuda[:N]', received {str(device)!r}") from None
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise ValueError(f"device: {str(device)!r} requested but CUDA is not available here (use 'auto' or 'cpu')")
        if dev.index is not None and dev.index >= n:
            raise ValueError(f"device: expected cuda:0 .. cuda:{n - 1}, received {str(device)!r}")
    return dev


def checkpoint_env_kwargs(path: str | Path) -> dict[str, Any] | None:
    """The env observation settings a checkpoint was trained with: ``{"obs_mode": str}`` plus ``image_size``
    (pixels) for image modes, from ``config.yaml``'s ``train.dataset``; None when ``path`` is not a checkpoint
    folder or its config does not say."""
    cfg = Path(path) / CONFIG_FILE
    if not cfg.is_file():
        return None
    try:
        dataset = dict((yaml.safe_load(cfg.read_text()) or {}).get("train", {}).get("dataset", {}))
    except (yaml.YAMLError, AttributeError, TypeError, ValueError):
        return None
    mode = dataset.get("obs_mode")
    if not isinstance(mode, str):
        return None
    return obs_mode_env_kwargs(mode, dataset.get("image_size"))


def save_checkpoint(
    path: str | Path,
    *,
    model: ChunkModel,
    normalizer: Normalizer,
    spec: PolicySpec,
    training_state: Mapping[str, Any] | None = None,
    train_config: Mapping[str, Any] | None = None,
) -> Path:
    """Write a checkpoint folder at ``path`` (replacing an existing one atomically). Returns ``path``.

    Args:
        model: the weights to serve (pass the EMA model during training).
        normalizer: the normaliser used in training.
        spec: the PolicySpec.
        training_state: optional dict saved with ``torch.save`` as ``training_state.pt`` (for resume).
        train_config: optional plain dict stored under ``train`` in ``config.yaml``.
    """
    from safetensors.torch import save_file

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    doc = {"policy": model.cfg.to_dict()}
    if train_config is not None:
        doc["train"] = dict(train_config)
    (tmp / CONFIG_FILE).write_text(yaml.safe_dump(doc, sort_keys=False))
    weights = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(weights, str(tmp / MODEL_FILE))
    save_file(
        {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in normalizer.state_dict().items()},
        str(tmp / NORMALIZER_FILE),
    )
    (tmp / SPEC_FILE).write_text(json.dumps(spec.to_dict(), indent=1))
    if training_state is not None:
        torch.save(dict(training_state), tmp / TRAINING_STATE_FILE)
    old = path.with_name(path.name + ".old")
    if path.exists():
        path.rename(old)
    tmp.rename(path)
    if old.exists():
        shutil.rmtree(old)
    return path


def load_components(path: str | Path) -> tuple[PolicyConfig, PolicySpec, ChunkModel, Normalizer]:
    """Read config, spec, model (weights loaded, on CPU, eval mode) and normaliser from a checkpoint folder.

    The config's ``type`` selects the registered policy type (:func:`policylink.policies.config.build_model`), which
    builds the model; :func:`policylink.policies.registry.load_policy` wraps the parts in a PolicyAdapter.

    Raises:
        CheckpointError: a required file is missing, or the weights do not fit the config.
    """
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(
            f"checkpoint folder not found: {str(path)!r} (policylink train writes <output_dir>/checkpoints/last)"
        )
    for name in (CONFIG_FILE, MODEL_FILE, NORMALIZER_FILE, SPEC_FILE):
        if not (path / name).is_file():
            raise CheckpointError(
                f"checkpoint {str(path)!r}: missing {name} (expected {CONFIG_FILE}, "
                f"{MODEL_FILE}, {NORMALIZER_FILE}, {SPEC_FILE})"
            )
    doc = yaml.safe_load((path / CONFIG_FILE).read_text())
    cfg = PolicyConfig.from_dict(doc["policy"])
    spec = PolicySpec.from_dict(json.loads((path / SPEC_FILE).read_text()))
    model = build_model(cfg, spec.observation_features, spec.action.dim)
    try:
        model.load_state_dict(load_file(str(path / MODEL_FILE)))
    except RuntimeError as e:
        raise CheckpointError(f"checkpoint {str(path)!r}: {MODEL_FILE} does not fit {CONFIG_FILE}: {e}") from e
    normalizer = Normalizer.from_state_dict(load_file(str(path / NORMALIZER_FILE)))
    return cfg, spec, model.eval(), normalizer


def load_training_state(path: str | Path, device: str | torch.device = "cpu") -> dict[str, Any]:
    """The ``training_state.pt`` dict of a checkpoint folder. Raises CheckpointError when absent."""
    f = Path(path) / TRAINING_STATE_FILE
    if not f.is_file():
        raise CheckpointError(
            f"checkpoint {str(path)!r}: missing {TRAINING_STATE_FILE} (not a training checkpoint; cannot resume)"
        )
    return torch.load(f, map_location=device, weights_only=False)
