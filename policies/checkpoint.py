"""Checkpoint folders: everything needed to rebuild a policy, and to resume its training. Tensors are safetensors,
everything else JSON, all written through :mod:`policylink.policies.serialization` (never pickle).

Layout::

    <dir>/config.json                  {"policy": {"type": name, ...PolicyConfig}, "train": training config (optional)}
    <dir>/model.safetensors            model weights (the EMA weights during training)
    <dir>/normalizer.safetensors       Normalizer.state_dict() arrays (the statistics of the processors' normalize step)
    <dir>/processors.json              the policy's processor chain (data.processors.Processors.to_dict(); folders
                                         written before it derive the chain from their config)
    <dir>/policy_spec.json             PolicySpec.to_dict()
    <dir>/training_state.safetensors   optional, for resume: the tensors and arrays of the training state (optimizer,
    <dir>/training_state.json            LR scheduler, EMA, RNG states, raw weights) and its JSON skeleton (save_tree)

A folder is written under a temporary name and renamed into place, so a killed trainer never leaves a
half-written checkpoint behind. Folders of the previous layout (``config.yaml``, ``training_state.pt``) still load
for inference (their YAML is read with ``yaml.safe_load``); their pickled ``training_state.pt`` is refused with a
:class:`~policylink.policies.serialization.LegacyFormatError` that says what to do. Importing this module imports
no torch.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from policylink.adapters.obs_modes import obs_mode_env_kwargs
from policylink.adapters.schema import PolicySpec
from policylink.data.normalize import Normalizer
from policylink.data.processors import MODEL_STEPS, PROCESSORS_FILE, ProcessorError, Processors
from policylink.policies.config import PolicyConfig, build_model
from policylink.policies.serialization import (
    load_json,
    load_tensors,
    load_tree,
    refuse_legacy,
    save_json,
    save_tensors,
    save_tree,
)

if TYPE_CHECKING:
    import torch

    from policylink.policies.model import ChunkModel

CONFIG_FILE = "config.json"
MODEL_FILE = "model.safetensors"
NORMALIZER_FILE = "normalizer.safetensors"
SPEC_FILE = "policy_spec.json"
TRAINING_STATE = "training_state"
"""Stem of the training state: ``training_state.safetensors`` + ``training_state.json``."""
TRAINING_STATE_FILES = (f"{TRAINING_STATE}.safetensors", f"{TRAINING_STATE}.json")
LEGACY_CONFIG_FILE = "config.yaml"
"""The config file of folders written before :data:`CONFIG_FILE` (safe YAML: still read)."""
LEGACY_TRAINING_STATE_FILE = "training_state.pt"
"""The pickled training state of folders written before :data:`TRAINING_STATE_FILES` (refused)."""


class CheckpointError(FileNotFoundError):
    """A checkpoint folder is missing a file or holds an inconsistent one."""


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` -> CUDA when available, else CPU; ``"cpu"``, ``"cuda"``, ``"cuda:N"`` (or a torch.device).

    Raises:
        ValueError: an unknown device string, or CUDA requested on a machine without a usable CUDA device
            (names ``device``, the expected and the received value).
    """
    import torch  # the folder format itself needs no torch: reading a config stays light

    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):  # 'mps', 'meta'...: torch parses them, nothing here runs them
        raise ValueError(f"device: expected 'auto', 'cpu' or 'cuda[:N]', received {str(device)!r}") from None
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise ValueError(f"device: {str(device)!r} requested but CUDA is not available here (use 'auto' or 'cpu')")
        if dev.index is not None and dev.index >= n:
            raise ValueError(f"device: expected cuda:0 .. cuda:{n - 1}, received {str(device)!r}")
    return dev


def read_checkpoint_config(path: str | Path) -> dict[str, Any] | None:
    """The config document of checkpoint folder ``path``, ``{"policy": {...}, "train": {...}}`` (``train`` only
    when the trainer wrote it), from ``config.json`` (or the older layout's ``config.yaml``); None when ``path``
    holds neither. Imports no torch.

    Raises:
        CheckpointError: the file is not a JSON (YAML) mapping.
    """
    path = Path(path)
    try:
        if (path / CONFIG_FILE).is_file():
            doc, name = load_json(path / CONFIG_FILE), CONFIG_FILE
        elif (path / LEGACY_CONFIG_FILE).is_file():
            doc, name = yaml.safe_load((path / LEGACY_CONFIG_FILE).read_text()), LEGACY_CONFIG_FILE
        else:
            return None
    except (ValueError, yaml.YAMLError) as e:
        raise CheckpointError(f"checkpoint {str(path)!r}: unreadable config: {e}") from e
    if not isinstance(doc, dict):
        raise CheckpointError(f"checkpoint {str(path)!r}: {name}: expected a mapping, received {type(doc).__name__}")
    return doc


def checkpoint_env_kwargs(path: str | Path) -> dict[str, Any] | None:
    """The env observation settings a checkpoint was trained with: ``{"obs_mode": str}`` plus ``image_size``
    (pixels) for image modes, from the config's ``train.dataset``; None when ``path`` is not a checkpoint folder or
    its config does not say."""
    try:
        dataset = dict(((read_checkpoint_config(path) or {}).get("train") or {}).get("dataset") or {})
    except (CheckpointError, AttributeError, TypeError, ValueError):
        return None
    mode = dataset.get("obs_mode")
    if not isinstance(mode, str):
        return None
    return obs_mode_env_kwargs(mode, dataset.get("image_size"))


def save_checkpoint(
    path: str | Path,
    *,
    model: ChunkModel,
    spec: PolicySpec,
    processors: Processors | None = None,
    training_state: Mapping[str, Any] | None = None,
    train_config: Mapping[str, Any] | None = None,
    normalizer: Normalizer | None = None,
) -> Path:
    """Write a checkpoint folder at ``path`` (replacing an existing one atomically). Returns ``path``.

    Args:
        model: the weights to serve (pass the EMA model during training).
        spec: the PolicySpec.
        processors: the policy's processor chain (required), written as ``processors.json``, the statistics of
            its ``normalize`` step as ``normalizer.safetensors`` (none: empty).
        training_state: optional nested state for resume (optimizer / scheduler / EMA ``state_dict()``, RNG states,
            step...), written with :func:`~policylink.policies.serialization.save_tree` as
            ``training_state.safetensors`` + ``training_state.json``.
        train_config: optional plain dict stored under ``train`` in ``config.json``.
        normalizer: deprecated alias of ``processors`` for one release: the chain of ``model.cfg`` with it
            (:func:`~policylink.policies.processing.processors_for`; warns).

    Raises:
        SerializationError: ``training_state`` or ``train_config`` holds a value that cannot be saved without pickle.
        ValueError: both ``processors`` and ``normalizer``. TypeError: neither.
    """
    from policylink.policies.processing import chain_of  # torch: only when a checkpoint is written

    processors = chain_of(processors, normalizer, model.cfg, model.features, "save_checkpoint")
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    doc = {"policy": model.cfg.to_dict()}
    if train_config is not None:
        doc["train"] = dict(train_config)
    save_json(tmp / CONFIG_FILE, doc)
    save_tensors(tmp / MODEL_FILE, model.state_dict())
    save_tensors(tmp / NORMALIZER_FILE, {} if processors.normalizer is None else processors.normalizer.state_dict())
    save_json(tmp / PROCESSORS_FILE, processors.to_dict())
    save_json(tmp / SPEC_FILE, spec.to_dict())
    if training_state is not None:
        save_tree(tmp / TRAINING_STATE, dict(training_state))
    old = path.with_name(path.name + ".old")
    if path.exists():
        path.rename(old)
    tmp.rename(path)
    if old.exists():
        shutil.rmtree(old)
    return path


def load_components(path: str | Path) -> tuple[PolicyConfig, PolicySpec, ChunkModel, Processors]:
    """Read config, spec, model (weights loaded, on CPU, eval mode) and processor chain from a checkpoint folder.

    The config's ``type`` selects the registered policy type (:func:`policylink.policies.config.build_model`), which
    builds the model; :func:`policylink.policies.registry.load_checkpoint` wraps the parts in a PolicyAdapter. The
    chain is the folder's ``processors.json`` with the statistics of ``normalizer.safetensors`` (its normaliser:
    ``processors.normalizer``), or, for a folder written before that file existed, the chain derived from its config
    (:func:`~policylink.policies.processing.processors_for`).

    Raises:
        CheckpointError: a required file is missing, the weights do not fit the config, ``processors.json`` is
            malformed, or its model-side steps (``crop``, ``tokenize``) or frame stack disagree with the config the
            model is built from (names the step).
    """
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(
            f"checkpoint folder not found: {str(path)!r} (policylink train writes <output_dir>/checkpoints/last)"
        )
    doc = read_checkpoint_config(path)
    missing = [name for name in (MODEL_FILE, NORMALIZER_FILE, SPEC_FILE) if not (path / name).is_file()]
    if doc is None or missing:
        raise CheckpointError(
            f"checkpoint {str(path)!r}: missing {', '.join(([CONFIG_FILE] if doc is None else []) + missing)} "
            f"(expected {CONFIG_FILE}, {MODEL_FILE}, {NORMALIZER_FILE}, {SPEC_FILE})"
        )
    if "policy" not in doc:
        raise CheckpointError(f"checkpoint {str(path)!r}: config: expected a 'policy' section, received {sorted(doc)}")
    cfg = PolicyConfig.from_dict(doc["policy"])
    spec = PolicySpec.from_dict(load_json(path / SPEC_FILE))
    model = build_model(cfg, spec.observation_features, spec.action.dim)
    try:
        model.load_state_dict(load_tensors(path / MODEL_FILE))
    except RuntimeError as e:
        raise CheckpointError(f"checkpoint {str(path)!r}: {MODEL_FILE} does not fit the config: {e}") from e
    normalizer = Normalizer.from_state_dict(load_tensors(path / NORMALIZER_FILE))
    return cfg, spec, model.eval(), _load_processors(path, cfg, spec, normalizer)


def _load_processors(path: Path, cfg: PolicyConfig, spec: PolicySpec, normalizer: Normalizer) -> Processors:
    """The chain of :func:`load_components` (see there)."""
    from policylink.policies.processing import processors_for

    derived = processors_for(cfg, spec.observation_features, normalizer)
    file = path / PROCESSORS_FILE
    if not file.is_file():
        return derived
    try:
        saved = Processors.from_dict(load_json(file), normalizer)
    except (ProcessorError, ValueError) as e:
        raise CheckpointError(f"checkpoint {str(path)!r}: {PROCESSORS_FILE}: {e}") from e
    for name in (*MODEL_STEPS, "frame_stack"):
        if saved.step(name) != derived.step(name):
            raise CheckpointError(
                f"checkpoint {str(path)!r}: {PROCESSORS_FILE}: step {name!r} is {saved.step(name)}, the config's "
                f"model expects {derived.step(name)}"
            )
    return saved


def load_training_state(path: str | Path, device: str | torch.device = "cpu") -> dict[str, Any]:
    """The training state saved in checkpoint folder ``path`` (what ``save_checkpoint(training_state=...)`` got, with
    the same nesting and types; tensors on ``device``). Keep the default ``"cpu"`` for a state holding
    ``torch.get_rng_state()``: ``torch.set_rng_state`` refuses a tensor elsewhere, while ``load_state_dict`` of a
    module or optimizer moves CPU tensors to the parameters' device itself.

    Raises:
        LegacyFormatError: the folder holds only the old pickled ``training_state.pt`` (it is never unpickled).
        CheckpointError: no training state (an inference-only checkpoint; cannot resume).
    """
    refuse_legacy(
        path,
        TRAINING_STATE_FILES[0],
        LEGACY_TRAINING_STATE_FILE,
        "Resuming from it is not possible: train again without --resume (or into a new --output_dir); the weights "
        f"in {MODEL_FILE} still load for evaluation.",
    )
    if not all((Path(path) / name).is_file() for name in TRAINING_STATE_FILES):
        raise CheckpointError(
            f"checkpoint {str(path)!r}: missing {' + '.join(TRAINING_STATE_FILES)} (not a training checkpoint; "
            "cannot resume)"
        )
    return load_tree(Path(path) / TRAINING_STATE, device)
