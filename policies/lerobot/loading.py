"""Loading a LeRobot checkpoint folder (``pretrained_model/``): the ``lerobot:`` reference scheme, the folder check,
the LeRobot import (with the one compatibility shim it needs here), the policy with its saved pre/post-processor
pipelines, and the :class:`~policylink.adapters.schema.PolicySpec` of the folder.

A LeRobot ``pretrained_model/`` folder (``lerobot-train`` or ``policy.save_pretrained`` +
``processor.save_pretrained``) holds::

    config.json                                  the PreTrainedConfig (with its ``type``: diffusion, act, pi0 ...)
    model.safetensors                            the weights
    policy_preprocessor.json (+ *.safetensors)   rename, batch dim, device, normaliser (its statistics)
    policy_postprocessor.json (+ *.safetensors)  unnormaliser, device

LeRobot records no control mode, units or limits of the actions, nor the control rate, so the folder also needs
``policylink.json`` (``{"action": ActionSpec.to_dict(), "control_frequency": HZ}``, optionally ``"env_kwargs"``:
the observation mode it was trained with; written by :func:`write_policylink_spec`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policylink.adapters.obs_modes import check_obs_mode, obs_mode_env_kwargs
from policylink.adapters.schema import IMAGE_PREFIX, ActionSpec, FeatureSpec, PolicySpec
from policylink.policies.serialization import load_json, save_json

LEROBOT_SCHEME = "lerobot:"
"""Prefix of a LeRobot checkpoint reference: ``lerobot:/path/to/pretrained_model``."""
CONFIG_FILE = "config.json"
MODEL_FILE = "model.safetensors"
PREPROCESSOR_FILE = "policy_preprocessor.json"
POSTPROCESSOR_FILE = "policy_postprocessor.json"
SPEC_FILE = "policylink.json"

CHUNK_LENGTH_FIELD = {"diffusion": "n_action_steps"}
"""LeRobot type -> the config field giving the length of ``predict_action_chunk``'s output (default ``chunk_size``;
Diffusion Policy returns its ``n_action_steps`` executed actions, not its ``horizon``)."""


class LeRobotCheckpointError(FileNotFoundError):
    """A LeRobot checkpoint folder is missing a file or a field (the message names it)."""


@dataclass
class LeRobotComponents:
    """What a LeRobot checkpoint folder loads into.

    Attributes:
        policy: the ``lerobot.policies.pretrained.PreTrainedPolicy`` (eval mode).
        preprocessor: the saved ``PolicyProcessorPipeline`` run on each observation (dict of tensors).
        postprocessor: the saved ``PolicyProcessorPipeline`` run on a whole action chunk ``(B, H, A)``.
        spec: the :class:`PolicySpec` (features from ``config.json``, action spec and rate from ``policylink.json``).
        path: the folder.
    """

    policy: Any
    preprocessor: Any
    postprocessor: Any
    spec: PolicySpec
    path: Path


def strip_scheme(ref: str) -> str | None:
    """The folder of a ``lerobot:PATH`` reference, or None for any other reference."""
    return ref[len(LEROBOT_SCHEME) :] if isinstance(ref, str) and ref.startswith(LEROBOT_SCHEME) else None


def import_lerobot_policies() -> Any:
    """Import ``lerobot.policies.factory`` (returned) and make it importable next to ``transformers>=5``.

    lerobot 0.4.4 supports ``transformers<5`` only: with 5.x installed (sentence-transformers 6 needs it) importing
    ``lerobot.policies`` fails in its GR00T module, which breaks every LeRobot policy. We then tell LeRobot that
    transformers is unavailable (``lerobot.utils.import_utils._transformers_available = False``), so the policies
    that do not need it (diffusion, act, vqbet, tdmpc) load; pi0 / pi05 / smolvla then need an environment with
    ``transformers>=4.57,<5``.

    Raises:
        ImportError: lerobot is not installed (``make lerobot`` installs it).
    """
    import sys

    if "lerobot.policies.factory" not in sys.modules:
        try:
            import lerobot.utils.import_utils as import_utils
        except ImportError as e:
            raise ImportError(f"LeRobot policies need lerobot==0.4.4 (make lerobot): {e}") from None
        if import_utils._transformers_available and _major_version("transformers") >= 5:
            import_utils._transformers_available = False
    import lerobot.policies.factory as factory

    return factory


def load_lerobot_checkpoint(path: str | Path, device: str = "cpu") -> LeRobotComponents:
    """Load a LeRobot ``pretrained_model/`` folder: policy, saved processors, spec.

    Args:
        path: the folder (or ``lerobot:PATH``).
        device: torch device of the policy and of the preprocessor's device step.

    Raises:
        LeRobotCheckpointError: the folder, a file or ``config.json``'s ``type`` is missing.
        ImportError: lerobot is not installed, or the policy type needs what is not (transformers for pi0).
    """
    folder = Path(strip_scheme(str(path)) or path).expanduser()
    check_lerobot_folder(folder)
    factory = import_lerobot_policies()
    from lerobot.configs.policies import PreTrainedConfig

    cfg = PreTrainedConfig.from_pretrained(str(folder))
    cfg.device = str(device)
    policy = factory.get_policy_class(cfg.type).from_pretrained(str(folder), config=cfg)
    policy.to(device).eval()
    pre, post = factory.make_pre_post_processors(
        cfg, pretrained_path=str(folder), preprocessor_overrides={"device_processor": {"device": str(device)}}
    )
    spec = lerobot_spec(cfg, read_policylink_spec(folder), _inverse_rename_map(pre))
    return LeRobotComponents(policy, pre, post, spec, folder)


def check_lerobot_folder(folder: Path) -> None:
    """Raise :class:`LeRobotCheckpointError` naming what a LeRobot checkpoint folder lacks."""
    if not folder.is_dir():
        raise LeRobotCheckpointError(f"LeRobot checkpoint folder not found: {str(folder)!r}")
    needed = (CONFIG_FILE, MODEL_FILE, PREPROCESSOR_FILE, POSTPROCESSOR_FILE)
    missing = [f for f in needed if not (folder / f).is_file()]
    if missing:
        raise LeRobotCheckpointError(
            f"LeRobot checkpoint {str(folder)!r}: missing {missing} (a pretrained_model/ folder holds config.json, "
            "model.safetensors and the saved policy_preprocessor/policy_postprocessor pipelines)"
        )
    cfg = load_json(folder / CONFIG_FILE)
    if not isinstance(cfg.get("type"), str):
        raise LeRobotCheckpointError(
            f"{folder / CONFIG_FILE}: expected a 'type' field (the LeRobot policy type: diffusion, act, pi0, pi05, "
            f"smolvla ...), received {cfg.get('type')!r} (draccus>=0.11 drops it in save_pretrained; add it back)"
        )


def read_policylink_spec(folder: Path) -> dict[str, Any]:
    """``policylink.json`` of a LeRobot checkpoint: ``{"action": ActionSpec dict, "control_frequency": Hz}``.

    Raises:
        LeRobotCheckpointError: the file is missing or lacks ``action`` / ``control_frequency``.
    """
    file = folder / SPEC_FILE
    doc = load_json(file) if file.is_file() else {}
    missing = [k for k in ("action", "control_frequency") if k not in doc]
    if missing:
        raise LeRobotCheckpointError(
            f"{file}: expected {missing} (LeRobot records no action control mode, units, limits or rate); write it "
            "with policylink.policies.lerobot.write_policylink_spec(folder, env_spec)"
        )
    return doc


def write_policylink_spec(
    folder: str | Path,
    action: ActionSpec,
    control_frequency: float,
    obs_mode: str | None = None,
    image_size: int | None = None,
) -> Path:
    """Write ``policylink.json`` into a LeRobot checkpoint folder: the action spec, the control rate (Hz) and,
    optionally, the env observation mode (and camera side, px) the policy was trained with, which ``policylink
    eval`` then selects by itself; e.g. ``write_policylink_spec(path, spec.action, spec.control_frequency,
    "state+image", 96)`` with ``spec = env.env_spec``. Returns the file.

    Raises:
        ValueError: an unknown ``obs_mode``.
    """
    doc: dict[str, Any] = {"action": action.to_dict(), "control_frequency": float(control_frequency)}
    if obs_mode is not None:
        doc["env_kwargs"] = obs_mode_env_kwargs(check_obs_mode(obs_mode), image_size)
    return save_json(Path(folder) / SPEC_FILE, doc)


def lerobot_env_kwargs(folder: str | Path) -> dict[str, Any] | None:
    """The env kwargs (``obs_mode``, ``image_size``) recorded in a LeRobot checkpoint's ``policylink.json``, or None
    when ``folder`` has none (not a LeRobot checkpoint, or written without ``obs_mode``)."""
    file = Path(folder) / SPEC_FILE
    try:
        kw = load_json(file).get("env_kwargs") if file.is_file() else None
    except (OSError, ValueError, AttributeError):
        return None
    return dict(kw) if isinstance(kw, dict) and isinstance(kw.get("obs_mode"), str) else None


def lerobot_spec(cfg: Any, extra: Mapping[str, Any], env_keys: Mapping[str, str] | None = None) -> PolicySpec:
    """The PolicySpec of a LeRobot config: ``STATE``/``ENV`` features float32 ``(D,)``, ``VISUAL`` features
    ``(C, H, W)`` as our uint8 ``(H, W, C)`` cameras, ``task`` (str) for language policies (pi0, pi05, smolvla),
    ``n_obs_steps``, the chunk length (:data:`CHUNK_LENGTH_FIELD`), ``n_action_steps``; ``extra`` gives the
    ActionSpec and control rate (:func:`read_policylink_spec`). ``env_keys`` maps a policy input key to the key the
    observation carries (the inverse of the preprocessor's rename map; default the same key).

    Raises:
        ValueError: the ActionSpec's dimension differs from the config's action feature.
    """
    from lerobot.configs.types import FeatureType

    feats: dict[str, FeatureSpec] = {}
    for name, ft in cfg.input_features.items():
        key = (env_keys or {}).get(name, name)
        if ft.type == FeatureType.VISUAL:
            c, h, w = ft.shape
            feats[key] = FeatureSpec("uint8", (h, w, c), unit="rgb")
        elif ft.type in (FeatureType.STATE, FeatureType.ENV):
            feats[key] = FeatureSpec("float32", tuple(ft.shape))
    if _is_language_policy(cfg):
        feats["task"] = FeatureSpec("string", ())
    action = ActionSpec.from_dict(extra["action"])
    want = int(cfg.output_features["action"].shape[0])
    if action.dim != want:
        raise ValueError(f"policylink.json action: expected {want} dimensions (config.json), received {action.dim}")
    chunk = int(getattr(cfg, CHUNK_LENGTH_FIELD.get(cfg.type, "chunk_size")))
    return PolicySpec(
        feats,
        action,
        n_obs_steps=int(cfg.n_obs_steps),
        chunk_size=chunk,
        n_action_steps=min(int(cfg.n_action_steps), chunk),
        control_frequency=float(extra["control_frequency"]),
    )


def image_keys(spec: PolicySpec) -> list[str]:
    """Camera keys of ``spec`` (``observation.images.*``), in order."""
    return [k for k in spec.observation_features if k.startswith(IMAGE_PREFIX)]


LANGUAGE_TYPES = frozenset({"pi0", "pi05", "pi0_fast", "smolvla", "xvla", "groot", "wall_x"})
"""LeRobot policy types that read the ``task`` instruction."""


def _inverse_rename_map(preprocessor: Any) -> dict[str, str]:
    """Policy input key -> observation key: the inverse of the preprocessor's rename steps (observation key ->
    policy key); empty when it renames nothing."""
    from lerobot.processor import RenameObservationsProcessorStep

    out: dict[str, str] = {}
    for step in preprocessor.steps:
        if isinstance(step, RenameObservationsProcessorStep):
            out.update({new: old for old, new in step.rename_map.items()})
    return out


def _is_language_policy(cfg: Any) -> bool:
    return cfg.type in LANGUAGE_TYPES


def _major_version(package: str) -> int:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return int(version(package).split(".")[0])
    except (PackageNotFoundError, ValueError):
        return 0


__all__ = [
    "CHUNK_LENGTH_FIELD",
    "LANGUAGE_TYPES",
    "LEROBOT_SCHEME",
    "LeRobotCheckpointError",
    "LeRobotComponents",
    "check_lerobot_folder",
    "import_lerobot_policies",
    "lerobot_env_kwargs",
    "lerobot_spec",
    "load_lerobot_checkpoint",
    "read_policylink_spec",
    "strip_scheme",
    "write_policylink_spec",
]
