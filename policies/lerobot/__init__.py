"""LeRobot policies (diffusion, act, smolvla, pi0, pi05, any ``PreTrainedPolicy``) behind our PolicyAdapter
contract, loaded from a local ``pretrained_model/`` folder with its saved pre/post-processors: registry name
``lerobot`` (``make_policy("lerobot", checkpoint=PATH)``) and the reference ``lerobot:PATH`` accepted wherever a
checkpoint is (``policylink eval --policies name=lerobot:PATH``, ``policylink serve --checkpoint lerobot:PATH``).
lerobot itself is imported only when a checkpoint is loaded.

What a user needs locally, per type:

- every type: ``lerobot==0.4.4`` (``make lerobot``) and the checkpoint folder with ``config.json`` (its ``type``
  field), ``model.safetensors``, the saved ``policy_preprocessor`` / ``policy_postprocessor`` (``.json`` and their
  ``.safetensors`` statistics), plus our ``policylink.json`` (:func:`write_policylink_spec`).
- diffusion, act (and vqbet, tdmpc): nothing else (tested here, offline, against LeRobot's own outputs).
- pi0, pi05: ``transformers>=4.57.1,<5`` in the environment (not next to the ``vla`` extra, whose
  sentence-transformers 6 needs transformers 5) and the PaliGemma tokenizer ``google/paligemma-3b-pt-224`` in the
  Hugging Face cache (the saved tokenizer step loads it by name; then ``HF_HUB_OFFLINE=1`` works).
- smolvla: the same transformers, and ``HuggingFaceTB/SmolVLM2-500M-Video-Instruct`` (config, processor) in the
  Hugging Face cache (the model is built from it before the checkpoint's weights are loaded).

Not testable on this machine (no transformers<5 next to the vla extra, no weights, CPU only): loading and running
pi0 / pi05 / smolvla checkpoints end to end. Tested offline for them: their configs map to our spec (``task``,
HWC cameras, chunk 50), and :mod:`~policylink.policies.lerobot.flow_time`'s time conversion reproduces
``PI0Pytorch.sample_actions``'s loop exactly on a stub action expert with a known answer.
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
