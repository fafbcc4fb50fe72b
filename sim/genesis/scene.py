"""The Genesis physics of the genesis-world tasks: one CPU scene with the MuJoCo tasks' table and gripper gantry
(loaded from the same MJCF files) plus the 4 cm cube of ``pick_place``, advanced one control period at a time.

``genesis`` is imported inside :func:`init_genesis` only, so importing this module costs nothing.
"""

from __future__ import annotations

import time
from importlib.resources import files
from types import ModuleType
from typing import Any

import mujoco
import numpy as np

from policylink.sim.mujoco.base import CONTROL_FREQUENCY_HZ, asset_path
from policylink.sim.mujoco.rendering import load_llvm_before_gl

GANTRY_JOINTS = ("ee_x", "ee_y", "ee_z", "finger_left", "finger_right")
"""The gantry's slide joints, in the order of every ``(5,)`` robot vector below (m)."""
PARK_POSITION_M = (0.4, 0.4, 0.02)
"""Where the cube rests in tasks without one (``reach``): on the table, 0.15 m outside the gantry's workspace."""
_CUBE_TASK_XML = "pick_place.xml"  # the cube's size, mass and friction are read from this MuJoCo model


def init_genesis() -> ModuleType:
    """Import ``genesis`` and initialise it on the CPU backend (float32) once per process.

    If the caller already initialised Genesis (any backend), that initialisation is kept. Triton (when installed)
    is imported first: once Genesis's kernel compiler (Quadrants, LLVM) has run, importing Triton, as torchvision
    and MuJoCo's first rendered frame here do, segfaults the process.

    Returns:
        the ``genesis`` module.

    Raises:
        ImportError: genesis-world is not installed (install the ``genesis`` extra:
            ``pip install -e ".[genesis]"``).
    """
    load_llvm_before_gl()  # Triton's LLVM must load before Quadrants' JIT runs, else importing it later segfaults
    try:
        import genesis as gs
    except ImportError as err:
        raise ImportError(
            "genesis: the genesis-world backend needs the 'genesis' extra "
            "(pip install -e '.[genesis]', genesis-world==1.4.5)"
        ) from err
    if not gs._initialized:
        gs.init(backend=gs.cpu, precision="32", logging_level="error")
    return gs


class GantryScene:
    """A built Genesis scene: the gantry (fixed base, gravity-compensated like MuJoCo's ``gravcomp="1"``) and a
    free cube, with MuJoCo's timestep, friction cone and impedance ratio read from ``pick_place.xml``.

    One :meth:`step` is one control period (``1 / 10`` s) of ``n_substeps`` physics steps of ``substep_s``
    (0.004 s, 25 substeps). Building compiles Genesis kernels: about 130 s the first time on a 2-core CPU, then
    5-30 s from the kernel cache (``~/.cache/quadrants``). A scene may be shared by several envs used one after
    another (every env reset sets the whole state), never by envs stepped in alternation.

    Attributes:
        build_seconds: wall time of ``scene.build()`` (s).
        substep_s: physics timestep (s).
        n_substeps: physics steps per control period.

    Raises:
        ImportError: genesis-world is not installed.
    """

    def __init__(self) -> None:
        gs = init_genesis()
        ref = mujoco.MjModel.from_xml_path(asset_path(_CUBE_TASK_XML))
        self.substep_s = float(ref.opt.timestep)
        self.n_substeps = int(round(1.0 / (CONTROL_FREQUENCY_HZ * self.substep_s)))
        cube = ref.geom("cube")
        half, mass = float(cube.size[0]), float(ref.body("cube").mass[0])
        elliptic = ref.opt.cone == mujoco.mjtCone.mjCONE_ELLIPTIC
        t0 = time.perf_counter()
        self.scene = gs.Scene(
            sim_options=gs.options.SimOptions(dt=self.n_substeps * self.substep_s, substeps=self.n_substeps),
            rigid_options=gs.options.RigidOptions(
                integrator=gs.integrator.implicitfast,
                friction_cone=gs.friction_cone.elliptic if elliptic else gs.friction_cone.pyramidal,
                impratio=float(ref.opt.impratio),
            ),
            show_viewer=False,
        )
        self.robot = self.scene.add_entity(
            gs.morphs.MJCF(file=_gantry_xml()), material=gs.materials.Rigid(gravity_compensation=1.0)
        )
        self.cube = self.scene.add_entity(
            gs.morphs.Box(size=(2 * half,) * 3, pos=PARK_POSITION_M),
            material=gs.materials.Rigid(rho=mass / (2 * half) ** 3, friction=float(cube.friction[0])),
        )
        self.scene.build()
        self.build_seconds = time.perf_counter() - t0
        self._dofs = [self.robot.get_joint(n).dofs_idx_local[0] for n in GANTRY_JOINTS]
        self._qs = [self.robot.get_joint(n).qs_idx_local[0] for n in GANTRY_JOINTS]

    def set_state(self, robot_q: np.ndarray, robot_target: np.ndarray, cube_qpos: np.ndarray | None) -> None:
        """Teleport to a state at rest.

        Args:
            robot_q: gantry joint positions ``(5,)`` (m), in :data:`GANTRY_JOINTS` order.
            robot_target: position-actuator targets ``(5,)`` (m), same order.
            cube_qpos: cube pose ``(7,)`` = position (m) + quaternion ``wxyz``, or None to park it at
                :data:`PARK_POSITION_M`.
        """
        self.robot.set_qpos(np.asarray(robot_q, dtype=np.float32), qs_idx_local=self._qs, zero_velocity=True)
        if cube_qpos is None:
            cube_qpos = np.array([*PARK_POSITION_M, 1.0, 0.0, 0.0, 0.0])
        self.cube.set_qpos(np.asarray(cube_qpos, dtype=np.float32), zero_velocity=True)
        self.control(robot_target)

    def control(self, robot_target: np.ndarray) -> None:
        """Set the gantry's position-actuator targets ``(5,)`` (m, :data:`GANTRY_JOINTS` order)."""
        self.robot.control_dofs_position(np.asarray(robot_target, dtype=np.float32), dofs_idx_local=self._dofs)

    def step(self) -> None:
        """Advance one control period (``n_substeps`` physics steps)."""
        self.scene.step()

    def robot_qpos(self) -> np.ndarray:
        """Gantry joint positions, float64 ``(5,)`` (m), :data:`GANTRY_JOINTS` order."""
        return _numpy(self.robot.get_qpos(qs_idx_local=self._qs))

    def robot_qvel(self) -> np.ndarray:
        """Gantry joint velocities, float64 ``(5,)`` (m/s), :data:`GANTRY_JOINTS` order."""
        return _numpy(self.robot.get_dofs_velocity(dofs_idx_local=self._dofs))

    def cube_qpos(self) -> np.ndarray:
        """Cube pose, float64 ``(7,)``: position (m) and unit quaternion ``wxyz``."""
        return _numpy(self.cube.get_qpos())


def _gantry_xml() -> str:
    return str(files("policylink.sim.genesis").joinpath("assets", "gantry.xml"))


def _numpy(tensor: Any) -> np.ndarray:
    """A Genesis (torch CPU) tensor as a flat float64 array."""
    return np.asarray(tensor.cpu().numpy(), dtype=np.float64).reshape(-1)
