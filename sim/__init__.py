"""policylink.sim: simulated environments (``sim.mujoco`` tasks, ``sim.gym`` foreign gymnasium envs) and their
scripted experts (``sim.experts.make_expert``).

Importing it chooses a headless OpenGL backend for MuJoCo when none is set and there is no display
(:func:`policylink.sim.gl.select_gl_backend`), before any simulator module imports ``mujoco``.
"""

import sys as _sys

if "mujoco" not in _sys.modules:
    from policylink.sim.gl import select_gl_backend as _select_gl_backend

    _select_gl_backend()
