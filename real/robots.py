"""A robot from its reference, as ``policylink robot`` serves it: a driver class (``module:Class``), a LeRobot robot
(``lerobot:<type>``) or one of our simulated tasks run in real time (the sim-as-real robot), plus the
:class:`~policylink.real.safety.SafetyConfig` its options give."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from policylink.adapters.config_checks import require_choice, require_integers_within, require_within
from policylink.real.robot import Robot
from policylink.real.safety import SafetyConfig, TimeoutAction


@dataclass
class RobotConfig:
    """Options of ``policylink robot``.

    Attributes:
        sim: a registered task served as a sim-as-real robot (exclusive with ``driver``).
        sim_kwargs: keyword arguments of the task factory (``obs_mode``, ``image_size``...).
        gap: sim-as-real: a reality gap, a preset name (``worn_gantry``, ``noisy_sensors``, ``moved_camera``,
            ``lab_robot``) or a YAML file (``policylink.sim.mujoco.gap``): dynamics and sensing inside the task,
            and its ``timing`` section for the latency / jitter options left at 0.
        driver: ``lerobot:<RobotConfig type>`` or ``module:factory`` returning a :class:`Robot`.
        driver_kwargs: keyword arguments of the driver factory (the LeRobot ``RobotConfig`` fields for lerobot).
        low: LeRobot motor lower limit (one value for every motor), in ``unit``.
        high: LeRobot motor upper limit (one value for every motor), in ``unit``.
        unit: LeRobot motor unit (``%`` of range, ``deg`` or ``rad``).
        hz: LeRobot control frequency (Hz).
        observation_latency_ms: sim-as-real: an observation read at ``t`` shows the state at ``t`` minus this (ms).
        actuation_latency_ms: sim-as-real: an action received at ``t`` acts from the first tick after ``t`` plus
            this (ms).
        jitter_ms: sim-as-real: each control tick fires up to this much after its deadline (uniform, seeded; ms).
        seed: sim-as-real: seed of the tick jitter.
        time_scale: sim-as-real wall-clock speed (0.5 = ticks at half the task's control frequency).
        watchdog_ms: hold (or stop) when no action arrives this long after the session's first; 0 = off.
        on_timeout: what the watchdog does when it trips: ``hold`` (send the hold command) or ``stop``
            (``Robot.stop()``).
        max_step: largest change of any action dimension from one control period to the next, in the action's
            units (None = the limits only).
        bind: ZMQ address to serve on (loopback by default; elsewhere needs ``curve_keys`` or ``insecure``).
        curve_keys: folder of CURVE keys, as ``policylink serve``.
        insecure: serve on a non-loopback address without encryption, as ``policylink serve``.
        duration_s: stop after this many seconds (None = until Ctrl-C / SIGTERM).
    """

    sim: str | None = None
    sim_kwargs: dict[str, Any] = field(default_factory=dict)
    gap: str | None = None
    driver: str | None = None
    driver_kwargs: dict[str, Any] = field(default_factory=dict)
    low: float = -100.0
    high: float = 100.0
    unit: str = "%"
    hz: float = 30.0
    observation_latency_ms: float = 0.0
    actuation_latency_ms: float = 0.0
    jitter_ms: float = 0.0
    seed: int = 0
    time_scale: float = 1.0
    watchdog_ms: float = 500.0
    on_timeout: str = "hold"
    max_step: float | None = None
    bind: str = "tcp://127.0.0.1:5556"
    curve_keys: str | None = None
    insecure: bool = False
    duration_s: float | None = None

    def __post_init__(self) -> None:
        """Check the numbers and names before anything is built, naming the flag as typed without its dashes
        (``jitter_ms: expected a value in [0, inf), received -5.0``: milliseconds, as the flag says).

        Raises:
            ValueError: a negative or non-finite latency, jitter or watchdog (ms), ``time_scale``, ``hz``,
                ``max_step`` or ``duration_s`` not above 0, a negative ``seed``, an unknown ``on_timeout``.
        """
        require_within(self, observation_latency_ms="[0, inf)", actuation_latency_ms="[0, inf)", jitter_ms="[0, inf)")
        require_within(self, watchdog_ms="[0, inf)", time_scale="(0, inf)", hz="(0, inf)")
        require_integers_within(self, seed="[0, inf)")
        require_choice(self, on_timeout=[a.value for a in TimeoutAction])
        for name in ("max_step", "duration_s"):
            if getattr(self, name) is not None:
                require_within(self, **{name: "(0, inf)"})


def check_robot_reference(cfg: RobotConfig) -> None:
    """Check that ``cfg`` names one robot: a ``sim`` task or a ``driver`` of the form ``lerobot:<type>`` /
    ``module:factory`` (what :func:`build_robot` needs before it imports or builds anything).

    Raises:
        ValueError: neither or both of ``sim``/``driver``; a ``driver`` without ``:`` (each names the flags)."""
    if (cfg.sim is None) == (cfg.driver is None):
        raise ValueError(
            f"--sim / --driver: expected exactly one (--sim TASK, or --driver lerobot:<type> or module:factory), "
            f"received sim={cfg.sim!r} driver={cfg.driver!r}"
        )
    if cfg.driver is not None and not cfg.driver.partition(":")[2]:
        raise ValueError(f"--driver: expected 'lerobot:<type>' or 'module:factory', received {cfg.driver!r}")


def build_robot(cfg: RobotConfig, clock: Any = None) -> Robot:
    """The driver or sim-as-real robot of ``cfg`` (not yet behind its safety layer). ``clock``: the sim-as-real
    robot's clock, and then it does not tick by itself (the caller ticks it: :class:`~policylink.real.lockstep.
    LockstepClock`); None = wall time, its own tick thread.

    Raises:
        ValueError: neither or both of ``sim``/``driver``; a malformed ``driver`` reference.
        UnknownNameError: an unknown task.
    """
    check_robot_reference(cfg)
    if cfg.sim is not None:
        from policylink.real.sim_robot import TIMING_MS_FIELDS, SimRobot, SimTiming, gap_timing_ms
        from policylink.runtime.rollout import RegistryEnvFn

        env = RegistryEnvFn(cfg.sim, **cfg.sim_kwargs, **({"gap": cfg.gap} if cfg.gap else {}))()
        ms = {k: getattr(cfg, k) for k in TIMING_MS_FIELDS}
        ms = {k: v or (gap_timing_ms(env) or {}).get(k, 0.0) for k, v in ms.items()}  # a flag given wins
        timing = SimTiming.from_ms(**ms, seed=cfg.seed, time_scale=cfg.time_scale)
        if clock is not None:
            return SimRobot(env, timing, clock=clock, realtime=False)
        return SimRobot(env, timing)
    kind, _, name = cfg.driver.partition(":")
    if kind == "lerobot":
        from policylink.real.lerobot import LeRobotBridgeConfig, make_lerobot_robot

        bridge = LeRobotBridgeConfig(low=cfg.low, high=cfg.high, unit=cfg.unit, control_frequency=cfg.hz)
        return make_lerobot_robot(name, cfg.driver_kwargs, bridge)
    return driver_factory(cfg.driver)(**cfg.driver_kwargs)


def driver_factory(driver: str) -> Any:
    """The factory named by ``driver`` (``"module:factory"``), imported.

    Raises:
        ValueError: the module itself is not found, or has no attribute ``factory`` (each names ``--driver``, the
            expected and the received reference). A module the driver's own module imports and that is missing
            stays a ``ModuleNotFoundError`` (the CLI says what to install).
    """
    kind, _, name = driver.partition(":")
    try:
        module = importlib.import_module(kind)
    except ModuleNotFoundError as e:
        if e.name is None or not (kind == e.name or kind.startswith(e.name + ".")):
            raise
        raise ValueError(
            f"--driver: expected 'module:factory' with an importable module, received {driver!r} "
            f"(no module named {e.name!r})"
        ) from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ValueError(
            f"--driver: expected 'module:factory' naming a callable of module {kind!r}, received {driver!r} "
            f"({kind}.{name} is {'missing' if factory is None else type(factory).__name__})"
        )
    return factory


def safety_config(cfg: RobotConfig, robot: Robot) -> SafetyConfig:
    """The robot's :class:`SafetyConfig`: its ActionSpec limits with ``cfg``'s watchdog and step bound.

    Raises:
        SafetyConfigError: a value that cannot be honoured (names the field)."""
    return SafetyConfig.from_action_spec(
        robot.env_spec.action,
        watchdog_s=cfg.watchdog_ms / 1e3 if cfg.watchdog_ms else None,
        on_timeout=cfg.on_timeout,
        max_step=cfg.max_step,
    )


__all__ = ["RobotConfig", "build_robot", "check_robot_reference", "driver_factory", "safety_config"]
