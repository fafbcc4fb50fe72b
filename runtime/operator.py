"""A simulated operator for deployments on the sim-as-real robot: the task's scripted expert stands in for the
human who takes over a real arm. It is a :class:`~policylink.real.teleop.Teleoperator` (``engaged``,
``action(obs)``, ``estop_requested``), so the deployment loop treats it exactly as a keyboard takeover: while it is
engaged its actions replace the policy's and the recorded steps carry ``deploy.source = 1`` (``human``).

The takeover rule (:class:`TakeoverRule`) is deliberately simple and reads only what an operator watching the arm
would judge, the task's goal distance (``env.unwrapped.goal_distance_now``: for ``pick_place`` gripper-to-cube
plus cube-to-goal, metres):

- **stall**: from step ``min_step`` on, when the best goal distance of the episode has not improved by at least
  ``min_improvement`` over the last ``stall_steps`` steps, the operator takes over;
- **random**: independently, at step ``at_step`` the operator takes over with probability ``probability`` (drawn
  once per episode from ``seed`` and the episode count; 0 = off).

Once engaged, the operator keeps control until the episode ends (it finishes the task, as in HG-DAgger /
RECAP-style interventions); the next episode starts with the policy in control. Episodes are told apart by the
task's step counter (``env.unwrapped.elapsed_steps`` falls back to 0 at a reset).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class TakeoverRule:
    """When the simulated operator takes over (see the module docstring).

    Attributes:
        stall_steps: window of the stall test, control steps (0 = no stall takeover).
        min_improvement: the goal distance must fall by at least this much over the window (task units; metres for
            the MuJoCo tasks).
        min_step: no stall takeover before this step.
        at_step: step of the random takeover (None = off).
        probability: probability of the random takeover at ``at_step``, in [0, 1].
        quality: the scripted expert's quality (``expert``, ``noisy``, ``poor``).
        seed: seeds the random takeover draws and the expert.

    Raises:
        ValueError: a negative count, ``min_improvement < 0``, ``probability`` outside [0, 1], or a rule that can
            never fire (``stall_steps == 0`` and no random takeover) -- each names the field.
    """

    stall_steps: int = 10
    min_improvement: float = 0.01
    min_step: int = 10
    at_step: int | None = None
    probability: float = 0.0
    quality: str = "expert"
    seed: int = 0

    def __post_init__(self) -> None:
        from policylink.adapters.registry import UnknownNameError, unknown_name_message
        from policylink.sim.experts import QUALITIES

        if self.quality not in QUALITIES:
            raise UnknownNameError(unknown_name_message("takeover.quality", self.quality, QUALITIES))
        for name in ("stall_steps", "min_step"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"takeover.{name}: expected >= 0 steps, received {getattr(self, name)}")
        if self.at_step is not None and int(self.at_step) < 0:
            raise ValueError(f"takeover.at_step: expected >= 0 steps or None, received {self.at_step}")
        if not (np.isfinite(self.min_improvement) and self.min_improvement >= 0):
            raise ValueError(f"takeover.min_improvement: expected a finite value >= 0, received {self.min_improvement}")
        if not 0.0 <= float(self.probability) <= 1.0:
            raise ValueError(f"takeover.probability: expected a value in [0, 1], received {self.probability}")
        if self.stall_steps == 0 and (self.at_step is None or self.probability == 0):
            raise ValueError(
                "takeover: the rule never fires; set stall_steps > 0, or at_step with probability > 0 "
                f"(received stall_steps={self.stall_steps}, at_step={self.at_step}, probability={self.probability})"
            )


class ScriptedOperator:
    """The scripted expert of ``env``'s task as a human operator under a :class:`TakeoverRule`.

    Args:
        env: the task env the robot runs (a MuJoCo task: ``elapsed_steps``, ``goal_distance_now``,
            ``privileged_state``; the expert may read its privileged state, as a person sees the scene).
        rule: the :class:`TakeoverRule`.

    Attributes:
        episodes: episodes seen; ``takeovers``: episodes in which it took over; ``takeover_step``: the step of this
            episode's takeover (None while the policy has control); ``reason``: ``stall`` or ``random``.

    Raises:
        ValueError: ``env`` is not a task with ``elapsed_steps`` and ``goal_distance_now`` (names the env class and
            what it lacks; ``--teleop expert`` on ``sim:metaworld/<task>``, say).
        KeyError: no scripted expert for the task (from :func:`policylink.sim.experts.make_expert`).
    """

    def __init__(self, env: Any, rule: TakeoverRule | None = None):
        from policylink.sim.experts import make_expert

        self.env, self.rule = env, rule or TakeoverRule()
        u = env.unwrapped
        missing = [a for a in ("elapsed_steps", "goal_distance_now", "privileged_state") if not hasattr(u, a)]
        if missing:
            raise ValueError(
                f"teleop: 'expert' (the simulated operator) needs one of policylink's MuJoCo tasks (its step counter "
                f"and goal distance); the env {type(u).__name__} lacks {missing}"
            )
        self.expert = make_expert(env, self.rule.quality, seed=self.rule.seed)
        self.episodes = self.takeovers = 0
        self.takeover_step: int | None = None
        self.reason = ""
        self._last_step = -1
        self._history: deque[float] = deque(maxlen=self.rule.stall_steps + 1)
        self._best = np.inf
        self._random_fires = False

    @property
    def engaged(self) -> bool:
        """True once the rule fired in this episode (updated from the env's current step)."""
        self._update()
        return self.takeover_step is not None

    @property
    def estop_requested(self) -> bool:
        """Always False: the simulated operator never asks for an e-stop."""
        return False

    def action(self, obs: Mapping[str, Any]) -> np.ndarray:
        """The expert's float32 ``(A,)`` action for the current scene (``obs`` is passed to it)."""
        return np.asarray(self.expert.act(obs, self.env), np.float32)

    def _update(self) -> None:
        """Advance the episode's stall tracker to the env's current step; start a new episode on a reset."""
        u = self.env.unwrapped
        step = int(u.elapsed_steps)
        if step < self._last_step or self._last_step < 0:
            self._new_episode()
        if step == self._last_step:
            return
        self._last_step = step
        if self.takeover_step is not None:
            return
        d = u.goal_distance_now(np.asarray(u.privileged_state(), np.float32).tolist())
        self._best = min(self._best, np.inf if d is None else float(d))
        self._history.append(self._best)
        r = self.rule
        if r.at_step is not None and step >= r.at_step and self._random_fires:
            self._engage(step, "random")
        elif r.stall_steps and step >= max(r.min_step, r.stall_steps) and len(self._history) > r.stall_steps:
            if self._history[0] - self._history[-1] < r.min_improvement:
                self._engage(step, "stall")

    def _engage(self, step: int, reason: str) -> None:
        self.takeover_step, self.reason = step, reason
        self.takeovers += 1
        self.expert.reset(self.rule.seed + self.episodes)

    def _new_episode(self) -> None:
        self.episodes += 1
        self.takeover_step, self.reason = None, ""
        self._history.clear()
        self._best = np.inf
        rng = np.random.default_rng([self.rule.seed, self.episodes])
        self._random_fires = bool(rng.random() < self.rule.probability)


__all__ = ["ScriptedOperator", "TakeoverRule"]
