"""A reality gap for the MuJoCo tasks: what differs between the simulator a policy was trained in and the robot it
runs on -- dynamics (friction, mass and inertia, joint damping, actuator gain, deadband, backlash, action delay),
sensing (joint noise and bias, object-pose noise, camera extrinsics and intrinsics, lighting, image noise,
dropped frames) and timing (latencies and jitter, honoured by the sim-as-real robot, ``real/sim_robot.py``).

A :class:`RealityGap` is a frozen, validated, JSON/YAML-serialisable description; every parameter is either one
number (a fixed gap: "this robot") or a ``[low, high]`` range (a distribution, sampled per episode). ``randomize``
turns a fixed gap into the distribution of domain randomisation (Tobin et al. 2017, arXiv 1703.06907; Peng et al.
2018, arXiv 1710.06537): each parameter uniform between its nominal value and ``nominal + randomize * (value -
nominal)``. Named presets are YAML files shipped in ``policylink/sim/mujoco/gaps/`` (:func:`preset_names`); a
mapping or a file may inherit one with ``base: NAME`` and hold what differs. :mod:`.gap_runtime` applies a gap to a
task's ``mjModel`` and its observations and actions.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np

Param = float | tuple[float, float]
"""One gap parameter: a number, or a ``(low, high)`` range sampled uniformly per episode."""

MAX_DELAY_STEPS = 20  # control steps (2 s at 10 Hz)


def _bounds(low: float, high: float, what: str) -> dict[str, Any]:
    return {"low": low, "high": high, "what": what}


@dataclass(frozen=True)
class DynamicsGap:
    """Physics differences, applied to the task's ``mjModel`` at each reset (from the nominal values).

    Attributes:
        friction_scale: factor on every geom's sliding friction (``geom_friction[:, 0]``).
        mass_scale: factor on every body's mass and rotational inertia (``body_mass``, ``body_inertia``).
        damping_scale: factor on every joint's damping (``dof_damping``).
        actuator_gain_scale: factor on the position servos' stiffness ``kp`` (``actuator_gainprm[:, 0]`` and
            ``-actuator_biasprm[:, 1]``): a weaker, laggier servo.
        deadband_m: end-effector displacement commands below this (m, per axis) do not move the robot.
        backlash_m: play of each end-effector axis (m): after a reversal the first ``backlash_m`` of motion is
            lost (a hysteresis of width ``backlash_m``).
        action_delay_steps: actions take effect this many control steps late (an integer).
    """

    friction_scale: Param = 1.0
    mass_scale: Param = 1.0
    damping_scale: Param = 1.0
    actuator_gain_scale: Param = 1.0
    deadband_m: Param = 0.0
    backlash_m: Param = 0.0
    action_delay_steps: Param = 0


@dataclass(frozen=True)
class SensingGap:
    """Sensor differences, applied to each observation (never to the privileged state scripted experts read).

    Attributes:
        joint_noise_std: Gaussian noise on the robot's own state entries (the task's ``n_proprio`` leading
            entries of ``observation.state``), in their units (m; 1 for a gripper opening), fresh every step.
        joint_bias: bound of a per-episode constant offset on the same entries (uniform in ``+-joint_bias``): a
            miscalibrated encoder.
        object_noise_std: Gaussian noise on the other state entries (object and goal poses: what a perception
            system estimates), fresh every step, in their units.
        camera_yaw_deg, camera_pitch_deg, camera_distance_m: extrinsics shift of every camera about the task's
            workspace centre (:class:`~policylink.sim.mujoco.cameras.CameraPoseShift`), per episode.
        camera_fovy_deg: intrinsics shift: added to each camera's vertical field of view (degrees).
        light_scale: factor on every light's diffuse intensity.
        image_noise_std: Gaussian noise on camera frames, uint8 levels (0-255).
        drop_frame_probability: chance per step that the observation is not refreshed (the previous one is
            returned again: a dropped camera frame / stale sensor message).
    """

    joint_noise_std: Param = 0.0
    joint_bias: Param = 0.0
    object_noise_std: Param = 0.0
    camera_yaw_deg: Param = 0.0
    camera_pitch_deg: Param = 0.0
    camera_distance_m: Param = 0.0
    camera_fovy_deg: Param = 0.0
    light_scale: Param = 1.0
    image_noise_std: Param = 0.0
    drop_frame_probability: Param = 0.0


@dataclass(frozen=True)
class TimingGap:
    """Timing of the sim-as-real robot (``policylink robot --sim``; :class:`policylink.real.sim_robot.SimTiming`),
    milliseconds; an in-process env ignores it (use ``dynamics.action_delay_steps`` there).

    Attributes:
        observation_latency_ms: age of the observation the robot reports.
        actuation_latency_ms: delay before a received action can act.
        jitter_ms: each control tick fires up to this much after its deadline.
    """

    observation_latency_ms: float = 0.0
    actuation_latency_ms: float = 0.0
    jitter_ms: float = 0.0


# field -> (low, high, what) of its valid values; the nominal value is the dataclass default
LIMITS: dict[str, dict[str, Any]] = {
    "friction_scale": _bounds(0.01, 100.0, "a factor in [0.01, 100]"),
    "mass_scale": _bounds(0.01, 100.0, "a factor in [0.01, 100]"),
    "damping_scale": _bounds(0.0, 100.0, "a factor in [0, 100]"),
    "actuator_gain_scale": _bounds(0.01, 100.0, "a factor in [0.01, 100]"),
    "deadband_m": _bounds(0.0, 0.1, "a distance in [0, 0.1] m"),
    "backlash_m": _bounds(0.0, 0.1, "a distance in [0, 0.1] m"),
    "action_delay_steps": _bounds(0, MAX_DELAY_STEPS, f"an integer number of steps in [0, {MAX_DELAY_STEPS}]"),
    "joint_noise_std": _bounds(0.0, 1.0, "a std in [0, 1] (state units)"),
    "joint_bias": _bounds(0.0, 1.0, "a bound in [0, 1] (state units)"),
    "object_noise_std": _bounds(0.0, 1.0, "a std in [0, 1] (state units)"),
    "camera_yaw_deg": _bounds(-180.0, 180.0, "degrees in [-180, 180]"),
    "camera_pitch_deg": _bounds(-89.0, 89.0, "degrees in [-89, 89]"),
    "camera_distance_m": _bounds(-1.0, 2.0, "metres in [-1, 2]"),
    "camera_fovy_deg": _bounds(-60.0, 60.0, "degrees in [-60, 60]"),
    "light_scale": _bounds(0.0, 10.0, "a factor in [0, 10]"),
    "image_noise_std": _bounds(0.0, 255.0, "uint8 levels in [0, 255]"),
    "drop_frame_probability": _bounds(0.0, 1.0, "a probability in [0, 1]"),
    "observation_latency_ms": _bounds(0.0, 10_000.0, "milliseconds in [0, 10000]"),
    "actuation_latency_ms": _bounds(0.0, 10_000.0, "milliseconds in [0, 10000]"),
    "jitter_ms": _bounds(0.0, 10_000.0, "milliseconds in [0, 10000]"),
}
GROUPS = {"dynamics": DynamicsGap, "sensing": SensingGap, "timing": TimingGap}


@dataclass(frozen=True)
class RealityGap:
    """A reality gap: see the module docstring.

    Attributes:
        name: preset name (or ``"custom"``), recorded with each episode.
        description: what the gap stands for, one line.
        seed: seeds the per-episode draws (ranges, bias, noise): episode reset seed ``s`` draws from
            ``np.random.default_rng([seed, s])``, so a gap is reproducible and independent of the task's own
            generator (the same reset seed gives the same initial state with or without a gap).
        randomize: 0 keeps the values; ``r > 0`` samples each parameter per episode uniformly between its nominal
            value and ``nominal + r * (value - nominal)`` (clipped to the valid range; ranges stay ranges).
        dynamics, sensing, timing: the parameters (:class:`DynamicsGap`, :class:`SensingGap`,
            :class:`TimingGap`).

    Raises:
        ValueError: a value of the wrong type or outside its valid range, a range with ``low > high``, a
            fractional ``action_delay_steps``; the message names the field (``RealityGap.dynamics.mass_scale:
            expected ..., received ...``).
    """

    name: str = "custom"
    description: str = ""
    seed: int = 0
    randomize: float = 0.0
    dynamics: DynamicsGap = field(default_factory=DynamicsGap)
    sensing: SensingGap = field(default_factory=SensingGap)
    timing: TimingGap = field(default_factory=TimingGap)

    def __post_init__(self) -> None:
        if not isinstance(self.seed, (int, np.integer)) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"RealityGap.seed: expected an int >= 0, received {self.seed!r}")
        if not _is_number(self.randomize) or not 0.0 <= self.randomize <= 10.0:
            raise ValueError(f"RealityGap.randomize: expected a spread in [0, 10], received {self.randomize!r}")
        for group, cls in GROUPS.items():
            value = getattr(self, group)
            if not isinstance(value, cls):
                raise ValueError(f"RealityGap.{group}: expected a {cls.__name__}, received {value!r}")
            for f in fields(cls):
                object.__setattr__(value, f.name, _checked_param(f"{group}.{f.name}", getattr(value, f.name)))

    # ------------------------------------------------------------------------------------------- construction
    @classmethod
    def from_mapping(cls, doc: Mapping[str, Any], where: str = "RealityGap") -> RealityGap:
        """A gap from a mapping (a YAML document): top-level ``name``, ``description``, ``seed``, ``randomize``,
        ``base`` (a preset name or file to start from) and the groups ``dynamics``, ``sensing``, ``timing``.

        ``where`` names the mapping in messages (``"gap"`` for an env's ``gap`` kwarg).

        Raises:
            ValueError: an unknown key (``UnknownNameError``: ``<where>.dynamics: expected one of [...], received
                'mass'; did you mean 'mass_scale'?``), a group that is not a mapping, a bad value (``<where>.
                dynamics.mass_scale: expected ..., received ...``).
        """
        from policylink.adapters.registry import UnknownNameError, unknown_name_message

        doc = dict(doc)
        base = doc.pop("base", None)
        try:
            merged = _merge(load_gap(base).to_dict(), doc) if base is not None else doc
        except UnknownNameError as e:  # load_gap names the field "gap"; here it is <where>.base
            raise UnknownNameError(f"{where}.base{str(e).removeprefix('gap')}") from None
        top = ["name", "description", "seed", "randomize", *GROUPS]
        unknown = sorted(map(str, set(merged) - set(top)))
        if unknown:
            raise UnknownNameError(unknown_name_message(where, unknown[0], [*top, "base"]))
        kwargs = {k: merged[k] for k in ("name", "description", "seed", "randomize") if k in merged}
        for group, gcls in GROUPS.items():
            sub = merged.get(group) or {}
            if not isinstance(sub, Mapping):
                raise ValueError(f"{where}.{group}: expected a mapping of fields, received {sub!r}")
            names = [f.name for f in fields(gcls)]
            bad = sorted(map(str, set(sub) - set(names)))
            if bad:
                raise UnknownNameError(unknown_name_message(f"{where}.{group}", bad[0], names))
            kwargs[group] = gcls(**{k: _as_param(v) for k, v in sub.items()})
        try:
            return cls(**kwargs)
        except ValueError as e:  # the checks name the class: RealityGap.dynamics.mass_scale
            message = str(e)
            if where == cls.__name__ or not message.startswith(cls.__name__):
                raise
            raise ValueError(where + message[len(cls.__name__) :]) from None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (ranges as 2-lists); :meth:`from_mapping` of it gives an equal gap."""
        out = dataclasses.asdict(self)
        for group in GROUPS:
            out[group] = {k: list(v) if isinstance(v, tuple) else v for k, v in out[group].items()}
        return out

    def to_json(self) -> str:
        """:meth:`to_dict` as compact JSON with sorted keys (what an episode's metadata records)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    # ---------------------------------------------------------------------------------------------- sampling
    @property
    def is_distribution(self) -> bool:
        """True when some parameter is a range or ``randomize > 0``: each episode draws its own values."""
        return self.randomize > 0 or any(isinstance(v, tuple) for _, v in self.params())

    def params(self) -> list[tuple[str, Param]]:
        """``("group.field", value)`` of every parameter, in declaration order."""
        return [(f"{g}.{f.name}", getattr(getattr(self, g), f.name)) for g, c in GROUPS.items() for f in fields(c)]

    def ranges(self) -> dict[str, tuple[float, float]]:
        """``{"group.field": (low, high)}`` each episode's value is drawn from (``low == high`` when fixed), after
        ``randomize`` (see the class docstring)."""
        out = {}
        for key, value in self.params():
            low, high = value if isinstance(value, tuple) else (value, value)
            if self.randomize > 0 and not isinstance(value, tuple):
                nominal = _nominal(key)
                lim = LIMITS[key.split(".")[1]]
                far = float(np.clip(nominal + self.randomize * (value - nominal), lim["low"], lim["high"]))
                low, high = min(nominal, far), max(nominal, far)
            out[key] = (low, high)
        return out

    def sample(self, rng: np.random.Generator) -> RealityGap:
        """One episode's fixed gap: every range drawn uniformly from ``rng`` (``action_delay_steps`` as an integer
        in ``[low, high]``); ``randomize`` 0. A fixed gap returns itself (no draw)."""
        if not self.is_distribution:
            return self
        groups: dict[str, dict[str, float]] = {g: {} for g in GROUPS}
        for key, (low, high) in self.ranges().items():
            group, name = key.split(".")
            if name == "action_delay_steps":
                v: float = int(rng.integers(int(round(low)), int(round(high)) + 1))
            else:
                v = float(rng.uniform(low, high)) if high > low else float(low)
            groups[group][name] = v
        return dataclasses.replace(self, randomize=0.0, **{g: cls(**groups[g]) for g, cls in GROUPS.items()})


def _nominal(key: str) -> float:
    group, name = key.split(".")
    return float(next(f.default for f in fields(GROUPS[group]) if f.name == name))


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and math.isfinite(v)


def _as_param(v: Any) -> Any:
    """A YAML value as a parameter: lists become tuples (ranges); anything else is checked later."""
    return tuple(v) if isinstance(v, list) else v


def _checked_param(key: str, value: Any) -> Param:
    """``value`` checked against :data:`LIMITS` (a number, or a ``(low, high)`` range of numbers)."""
    name = key.split(".")[1]
    lim = LIMITS[name]
    expected = f"{lim['what']}, or a [low, high] range of them"
    items = list(value) if isinstance(value, (tuple, list)) else [value]
    ok = len(items) in (1, 2) if isinstance(value, (tuple, list)) else True
    ok = ok and all(_is_number(v) and lim["low"] <= v <= lim["high"] for v in items)
    if ok and name == "action_delay_steps":
        ok = all(float(v).is_integer() for v in items)
    if ok and len(items) == 2:
        ok = items[0] <= items[1]
        expected = "a range [low, high] with low <= high"
    if not ok:
        raise ValueError(f"RealityGap.{key}: expected {expected}, received {value!r}")
    cast = int if name == "action_delay_steps" else float
    if isinstance(value, (tuple, list)):
        return (cast(items[0]), cast(items[-1]))
    return cast(value)


def _merge(base: dict, over: Mapping) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


# ----------------------------------------------------------------------------------------------------- presets
_LOADING: contextvars.ContextVar[tuple[Path, ...]] = contextvars.ContextVar("_LOADING", default=())
"""The gap files being loaded (resolved paths), outermost first: a ``base`` chain that comes back to one is a cycle."""


def preset_dir() -> Path:
    """Folder of the shipped presets (``policylink/sim/mujoco/gaps``: package data)."""
    return Path(str(files("policylink.sim.mujoco").joinpath("gaps")))


def preset_names() -> list[str]:
    """Names of the shipped presets, sorted."""
    return sorted(p.stem for p in preset_dir().glob("*.yaml"))


def load_gap(ref: RealityGap | Mapping[str, Any] | str | Path | None) -> RealityGap | None:
    """A :class:`RealityGap` from itself, a mapping of its fields, a preset name (:func:`preset_names`) or a YAML
    file path; None for None (or ``"none"``). A file's relative ``base`` path names a file beside it when one is
    there (else it is read from the working directory, or as a preset name).

    Raises:
        ValueError: an unknown preset name that is no existing file (``UnknownNameError``: lists the presets and
            the closest one), invalid YAML, a file that is not a mapping, a chain of ``base`` files that comes back
            to a file (``gap: <file>: base: expected a chain of files that ends in a preset, received a cycle a ->
            b -> a``), or a bad field (named).
    """
    if ref is None or isinstance(ref, RealityGap):
        return ref
    if isinstance(ref, Mapping):
        return RealityGap.from_mapping(ref, where="gap")
    text = str(ref)
    if text == "none":
        return None
    path = Path(text).expanduser()
    if not path.is_file():
        preset = preset_dir() / f"{text}.yaml"
        if not preset.is_file():
            from policylink.adapters.registry import UnknownNameError, unknown_name_message

            raise UnknownNameError(unknown_name_message("gap", text, preset_names(), other="a YAML file path"))
        path = preset
    import yaml

    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"gap: {path}: invalid YAML: {e}") from None
    if not isinstance(doc, Mapping):
        raise ValueError(f"gap: {path}: expected a YAML mapping, received {type(doc).__name__}")
    doc = dict(doc)
    doc.setdefault("name", path.stem)
    base = doc.get("base")
    if isinstance(base, str) and not Path(base).expanduser().is_absolute() and (path.parent / base).is_file():
        doc["base"] = str(path.parent / base)  # a relative base names a file beside this one
    chain = _LOADING.get()
    here = path.resolve()
    if here in chain:
        cycle = " -> ".join(str(f) for f in (*chain[chain.index(here) :], here))
        expected = "expected a chain of files that ends in a preset"
        raise ValueError(f"gap: {path}: base: {expected}, received a cycle {cycle}")
    token = _LOADING.set((*chain, here))
    try:
        return RealityGap.from_mapping(doc)
    except ValueError as e:
        if str(e).startswith("gap: "):  # a base file's own message already names its file
            raise
        raise ValueError(f"gap: {path}: {e}") from None
    finally:
        _LOADING.reset(token)


__all__ = [
    "LIMITS",
    "DynamicsGap",
    "Param",
    "RealityGap",
    "SensingGap",
    "TimingGap",
    "load_gap",
    "preset_dir",
    "preset_names",
]
