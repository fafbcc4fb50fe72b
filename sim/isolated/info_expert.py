"""An expert whose action the isolated env process computes and puts in each reset/step info as
``expert_action`` (MetaWorld's scripted policies, the ACT paper's ALOHA script): the host side only reads it and,
for the ``noisy``/``poor`` qualities, perturbs it. Families subclass :class:`InfoExpert` with their noise table and
how noise applies to their action."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

__all__ = ["InfoExpert"]


class InfoExpert:
    """The env process's ``expert_action`` for the latest observation, optionally with Gaussian noise.

    Subclasses set :attr:`family` (named in errors), :attr:`noise_table` (quality -> noise std in the action's
    units), :attr:`missing_hint` (how to get expert actions turned on) and implement :meth:`perturb`.

    Args:
        quality: a key of :attr:`noise_table` (``"expert"`` adds no noise).
        seed: seeds the noise (:meth:`reset` reseeds it).

    Raises:
        ValueError: unknown ``quality`` (names the expected and the received value).
    """

    family: ClassVar[str] = ""
    noise_table: ClassVar[dict[str, float]] = {}
    missing_hint: ClassVar[str] = ""

    def __init__(self, quality: str = "expert", seed: int | None = None):
        if quality not in self.noise_table:
            raise ValueError(f"quality: expected one of {list(self.noise_table)}, received {quality!r}")
        self.noise = self.noise_table[quality]
        self.rng = np.random.default_rng(seed)

    def reset(self, seed: int | None = None) -> None:
        """Reseed the noise."""
        self.rng = np.random.default_rng(seed)

    def act(self, obs: Any, env: Any) -> np.ndarray:
        """float32 ``(A,)``: the env's ``expert_action`` for its latest observation (a copy), perturbed when the
        quality has noise.

        Raises:
            RuntimeError: the env's info has no ``expert_action`` (its expert actions are off; says how to fix).
        """
        info = getattr(env.unwrapped, "last_info", {})
        if "expert_action" not in info:
            raise RuntimeError(f"{self.family} expert: the env's info has no 'expert_action'; {self.missing_hint}")
        a = np.array(info["expert_action"], np.float32)
        return self.perturb(a) if self.noise else a

    def perturb(self, action: np.ndarray) -> np.ndarray:
        """float32 ``(A,)``: ``action`` with this quality's noise (``self.noise``, drawn from ``self.rng``)."""
        raise NotImplementedError
