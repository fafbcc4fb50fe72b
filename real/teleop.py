"""Human takeover: a :class:`Teleoperator` whose actions replace the policy's while it is engaged (the deployment
loop records those steps with source ``human``, so later fine-tuning can tell interventions apart), and
:class:`KeyboardTeleop`, driven by key events (from a terminal reader, or injected by tests).

Keys (default map, end-effector delta control): ``w``/``s`` +x/-x, ``a``/``d`` +y/-y, ``r``/``f`` +z/-z, space
toggles takeover, ``x`` requests an e-stop. Each key press moves ``step`` units along its axis on the next step.
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

STEP_SOURCES = ("policy", "human")
"""Per-step ``source`` codes recorded by the deployment loop: index 0 = policy, 1 = human."""

DEFAULT_KEYS: dict[str, tuple[int, float]] = {
    "w": (0, 1.0),
    "s": (0, -1.0),
    "a": (1, 1.0),
    "d": (1, -1.0),
    "r": (2, 1.0),
    "f": (2, -1.0),
}
"""Key -> (action dimension, sign)."""


@runtime_checkable
class Teleoperator(Protocol):
    """A human input device.

    - ``engaged``: True while the human has taken over.
    - ``action(obs)``: float32 ``(A,)`` for this step (called only while engaged).
    - ``estop_requested``: True once the human asked for an e-stop (the loop latches the robot's).
    """

    @property
    def engaged(self) -> bool: ...

    @property
    def estop_requested(self) -> bool: ...

    def action(self, obs: Mapping[str, Any]) -> np.ndarray: ...


class KeyboardTeleop:
    """Keyboard takeover over an ``A``-dimensional delta action.

    Args:
        action_dim: ``A``.
        step: action magnitude per key press, in the action's units (e.g. 0.01 m).
        keys: key -> (dimension, sign) (default :data:`DEFAULT_KEYS`); dimensions must be ``< A``.
        toggle_key, estop_key: engage/release and e-stop keys.

    Raises:
        ValueError: a key maps to a dimension outside ``0..A-1``, or ``step <= 0``.
    """

    def __init__(
        self,
        action_dim: int,
        step: float = 0.01,
        keys: Mapping[str, tuple[int, float]] | None = None,
        toggle_key: str = " ",
        estop_key: str = "x",
    ):
        self.keys = dict(DEFAULT_KEYS if keys is None else keys)
        bad = {k: d for k, (d, _) in self.keys.items() if not 0 <= d < action_dim}
        if bad:
            raise ValueError(f"keys: expected dimensions in 0..{action_dim - 1}, received {bad}")
        if not step > 0:
            raise ValueError(f"step: expected > 0, received {step}")
        self.action_dim, self.step = int(action_dim), float(step)
        self.toggle_key, self.estop_key = toggle_key, estop_key
        self._events: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._engaged = False
        self._estop = False
        self._reader: threading.Thread | None = None

    def press(self, key: str) -> None:
        """Inject one key event (thread-safe; the terminal reader calls this too)."""
        self._events.put(key)

    @property
    def engaged(self) -> bool:
        """True while taken over (after processing the pending toggle/e-stop events)."""
        self._drain(apply_motion=False)
        return self._engaged

    @property
    def estop_requested(self) -> bool:
        """True once the e-stop key was pressed."""
        self._drain(apply_motion=False)
        return self._estop

    def action(self, obs: Mapping[str, Any]) -> np.ndarray:
        """float32 ``(A,)``: the sum of the motion keys pressed since the last step (zeros = hold still)."""
        return self._drain(apply_motion=True)

    def start_terminal(self) -> None:
        """Read keys from the terminal (stdin in cbreak mode) on a daemon thread; POSIX only."""
        import termios
        import tty

        fd = sys.stdin.fileno()
        old = termios.tcgetattr(fd)

        def run() -> None:
            try:
                tty.setcbreak(fd)
                while True:
                    self.press(sys.stdin.read(1))
            finally:
                termios.tcsetattr(fd, termios.TCSADRAIN, old)

        self._reader = threading.Thread(target=run, daemon=True, name="policylink-keyboard")
        self._reader.start()

    def _drain(self, apply_motion: bool) -> np.ndarray:
        """Apply pending events: toggles and e-stop always; motion keys only when ``apply_motion`` (kept otherwise)."""
        action = np.zeros(self.action_dim, np.float32)
        kept = []
        while True:
            try:
                key = self._events.get_nowait()
            except queue.Empty:
                break
            if key == self.toggle_key:
                self._engaged = not self._engaged
            elif key == self.estop_key:
                self._estop = True
            elif key in self.keys:
                if apply_motion:
                    dim, sign = self.keys[key]
                    action[dim] += sign * self.step
                else:
                    kept.append(key)
        for key in kept:
            self._events.put(key)
        return action


__all__ = ["DEFAULT_KEYS", "STEP_SOURCES", "KeyboardTeleop", "Teleoperator"]
