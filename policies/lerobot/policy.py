"""A LeRobot ``PreTrainedPolicy`` behind our batched :class:`~policylink.adapters.policy.PolicyAdapter` contract.

Per chunk: our history windows (uint8 HWC cameras, float32 state, ``(B, n_obs_steps, ...)``) -> LeRobot tensors
(cameras CHW float in ``[0, 1]``, our keys, which the preprocessor's own rename step maps) -> the saved
preprocessor, one observation step at a time -> the policy's observation queues (rebuilt from our window, whose
first-observation padding is LeRobot's own warm-up) -> ``predict_action_chunk`` -> the saved postprocessor on the
whole chunk ``(B, H, A)`` at once -> float32 numpy in the ActionSpec's units.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from policylink.adapters.policy import HistoryPolicy
from policylink.adapters.schema import ACTION_KEY, TASK_KEY
from policylink.policies.lerobot.loading import LeRobotComponents


class LeRobotPolicy(HistoryPolicy):
    """A loaded LeRobot checkpoint (:func:`~policylink.policies.lerobot.loading.load_lerobot_checkpoint`) as a
    PolicyAdapter. Per-row resets work (LeRobot's own queues are batch-wide): the queues are rebuilt from our
    per-row windows before each chunk.

    Args:
        components: the loaded policy, pre/post-processors and spec.
        seed: seed of the policy's randomness: each chunk runs under a fresh torch seed drawn from a generator
            seeded with ``seed`` (``torch.random.fork_rng``, so the caller's global RNG is left alone); the same seed
            gives the same chunks, whatever noise the LeRobot sampler draws inside.
        validate: validate observations against the spec.
    """

    def __init__(self, components: LeRobotComponents, *, seed: int = 0, validate: bool = True):
        super().__init__(components.spec, validate=validate)
        self.components = components
        self.lerobot_policy = components.policy
        self.config = components.policy.config
        self.device = torch.device(self.config.device or "cpu")
        self._generator = torch.Generator(device="cpu")
        self.reseed(seed)

    def reseed(self, seed: int) -> None:
        """Restart the noise stream from ``seed``."""
        self.seed = int(seed)
        self._generator.manual_seed(self.seed)

    def next_chunk_seed(self) -> int:
        """The torch seed the next chunk runs under (drawn from the generator seeded by :meth:`reseed`)."""
        return int(torch.randint(0, 2**62, (1,), generator=self._generator))

    def lerobot_observation(self, history: Mapping[str, np.ndarray], step: int, tasks: list[str] | None) -> dict:
        """Step ``step`` of the windows as a LeRobot observation (before its preprocessor): cameras uint8 ``(B, H,
        W, 3)`` -> float32 ``(B, 3, H, W)`` in ``[0, 1]``, other arrays float32, our keys (the preprocessor's rename
        step maps them to the policy's), ``task`` a list of ``B`` str."""
        obs: dict[str, Any] = {}
        for key, feat in self.spec.observation_features.items():
            if feat.is_string:
                continue
            x = torch.from_numpy(np.ascontiguousarray(history[key][:, step]))
            if feat.is_image:
                x = x.permute(0, 3, 1, 2).to(torch.float32) / 255.0
            obs[key] = x.to(torch.float32)
        if TASK_KEY in self.spec.observation_features:
            obs[TASK_KEY] = list(tasks or [""] * len(next(iter(history.values()))))
        return obs

    def postprocess(self, chunk: torch.Tensor) -> np.ndarray:
        """A normalised chunk ``(B, H, A)`` through the saved postprocessor at once (unnormaliser, any chunk-level
        decoding such as relative/delta actions) -> float32 numpy ``(B, H, A)``."""
        return np.asarray(self.components.postprocessor(chunk).detach().cpu().numpy(), dtype=np.float32)

    def _predict(self, history: dict[str, np.ndarray], pad_mask: np.ndarray, tasks: list[str] | None) -> np.ndarray:
        steps = [self._preprocess(self.lerobot_observation(history, t, tasks)) for t in range(len(pad_mask[0]))]
        policy = self.lerobot_policy
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.next_chunk_seed())
            batch = _fill_queues(policy, steps) if self.spec.n_obs_steps > 1 else steps[-1]
            chunk = policy.predict_action_chunk(batch)
        return self.postprocess(chunk)

    def _preprocess(self, obs: dict[str, Any]) -> dict[str, Any]:
        """The saved preprocessor on one observation step; the empty ``action`` slot it adds is dropped (LeRobot's
        ``select_action`` drops it too, and a queued policy would queue it)."""
        out = dict(self.components.preprocessor(obs))
        out.pop(ACTION_KEY, None)
        return out


def _fill_queues(policy: Any, steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Rebuild a LeRobot policy's observation queues from our window (oldest first; its padding repeats the first
    observation, as LeRobot's ``populate_queues`` does at warm-up). Cameras are also stacked under
    ``observation.images`` when the policy queues them that way (Diffusion Policy, VQ-BeT), as its
    ``select_action`` does. Returns the newest step as ``predict_action_chunk`` expects it."""
    from lerobot.policies.utils import populate_queues
    from lerobot.utils.constants import OBS_IMAGES

    policy.reset()
    cams = list(policy.config.image_features)
    for step in steps:
        if cams and OBS_IMAGES in policy._queues:
            step = {**step, OBS_IMAGES: torch.stack([step[k] for k in cams], dim=-4)}
        policy._queues = populate_queues(policy._queues, step)
    return step


__all__ = ["LeRobotPolicy"]
