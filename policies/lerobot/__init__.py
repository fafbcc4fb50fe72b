"""LeRobot policies (diffusion, act, smolvla, pi0, pi05, any ``PreTrainedPolicy``) behind our PolicyAdapter
contract, loaded from a local ``pretrained_model/`` folder with its saved pre/post-processors: registry name
``lerobot`` (``make_policy("lerobot", checkpoint=PATH)``) and the reference ``lerobot:PATH`` accepted wherever a
checkpoint is (``policylink eval --policies name=lerobot:PATH``, ``policylink serve --checkpoint lerobot:PATH``).
lerobot itself is imported only when a checkpoint is loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from policylink.policies.lerobot.loading import (
    LEROBOT_SCHEME,
    LeRobotCheckpointError,
    strip_scheme,
    write_policylink_spec,
)


def make_lerobot_policy(checkpoint: str | Path | None = None, *, device: str = "auto", seed: int = 0, **kwargs: Any):
    """A :class:`~policylink.policies.lerobot.policy.LeRobotPolicy` from a LeRobot checkpoint folder (or
    ``lerobot:PATH``).

    Args:
        checkpoint: the ``pretrained_model/`` folder.
        device: ``"auto"``, ``"cpu"``, ``"cuda[:N]"``. seed: the noise seed of generative types.
        kwargs: ``validate`` (bool) of :class:`LeRobotPolicy`.

    Raises:
        ValueError: no checkpoint. LeRobotCheckpointError: a missing file or field (named). ImportError: lerobot
            (or, for VLM policies, transformers<5) is not installed.
    """
    if checkpoint is None:
        raise ValueError("lerobot policy: expected checkpoint=<pretrained_model folder>, received None")
    from policylink.policies.checkpoint import resolve_device
    from policylink.policies.lerobot.loading import load_lerobot_checkpoint
    from policylink.policies.lerobot.policy import LeRobotPolicy

    components = load_lerobot_checkpoint(checkpoint, device=str(resolve_device(device)))
    return LeRobotPolicy(components, seed=seed, **kwargs)


__all__ = ["LEROBOT_SCHEME", "LeRobotCheckpointError", "make_lerobot_policy", "strip_scheme", "write_policylink_spec"]
