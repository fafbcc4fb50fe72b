"""Headless OpenGL backend choice for MuJoCo rendering, made before ``mujoco`` is imported.

MuJoCo reads ``MUJOCO_GL`` once, at import (``glfw`` needs a display, ``egl`` and ``osmesa`` render offscreen).
Without a display and without ``MUJOCO_GL``, its default (``glfw``) dies at the first rendered frame with a
``gladLoadGL`` error. :func:`select_gl_backend` picks the first offscreen backend whose library loads, so
``policylink`` commands render the same way inside and outside ``make``. An explicit ``MUJOCO_GL`` always wins.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Callable, MutableMapping

GL_ENV = "MUJOCO_GL"
OFFSCREEN_BACKENDS = ("egl", "osmesa")
"""Tried in this order: EGL (Mesa's llvmpipe or a GPU driver; ~50x faster than OSMesa here), then OSMesa."""

_LIBRARIES = {"egl": ("EGL", "libEGL.so.1"), "osmesa": ("OSMesa", "libOSMesa.so.8")}
_INSTALL_HINT = "apt-get install libegl1 libgl1 (EGL) or libosmesa6 (OSMesa)"


def library_loads(backend: str) -> bool:
    """True when the shared library of ``backend`` (``"egl"`` or ``"osmesa"``) can be loaded with ctypes.

    Raises:
        ValueError: an unknown backend name.
    """
    if backend not in _LIBRARIES:
        raise ValueError(f"{GL_ENV}: expected one of {OFFSCREEN_BACKENDS}, received {backend!r}")
    short, soname = _LIBRARIES[backend]
    for name in (ctypes.util.find_library(short), soname):
        if not name:
            continue
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return False


def select_gl_backend(
    environ: MutableMapping[str, str] | None = None, loads: Callable[[str], bool] = library_loads
) -> str | None:
    """Set ``MUJOCO_GL`` (and ``PYOPENGL_PLATFORM``) to a working offscreen backend when none is chosen.

    Keeps an explicit ``MUJOCO_GL``; keeps MuJoCo's default (``glfw``) when a display is available (``DISPLAY``
    or ``WAYLAND_DISPLAY``); otherwise picks the first of :data:`OFFSCREEN_BACKENDS` whose library loads. When none
    loads, prints one line to stderr saying rendering is unavailable and what to install, and leaves the
    variables unset (state-only observations still work).

    Args:
        environ: the environment to read and update (default ``os.environ``).
        loads: ``backend -> bool`` probe (default :func:`library_loads`).

    Returns:
        The backend now in effect (``"egl"``, ``"osmesa"``, the explicit value), or None (MuJoCo's default, or
        nothing usable).
    """
    env = os.environ if environ is None else environ
    if env.get(GL_ENV):
        return env[GL_ENV]
    if env.get("DISPLAY") or env.get("WAYLAND_DISPLAY"):
        return None
    for backend in OFFSCREEN_BACKENDS:
        if loads(backend):
            env[GL_ENV] = backend
            env.setdefault("PYOPENGL_PLATFORM", backend)
            return backend
    print(
        f"policylink: no display and no offscreen OpenGL library ({', '.join(OFFSCREEN_BACKENDS)}): image "
        f"observations and videos cannot render; {_INSTALL_HINT}, or set {GL_ENV}",
        file=sys.stderr,
    )
    return None
