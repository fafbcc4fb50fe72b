"""policylink environments as inspect-robots embodiments: any :class:`~policylink.adapters.env.EnvAdapter` behind
inspect-robots' ``Embodiment`` protocol (:class:`EnvEmbodiment`), and the factories registered in the
``inspect_robots.embodiments`` entry-point group.

- ``policylink/<task>``: the MuJoCo tasks (``reach``, ``push``, ``pick_place``, ``insert``, ``memory``,
  ``multitask``); ``-E k=v`` are the env factory's keyword arguments (``obs_mode=state+image``, ``image_size=64``).
- ``policylink/genesis_reach``, ``policylink/genesis_pick_place``: the same tasks on Genesis physics (the
  ``genesis`` extra; the first scene build compiles kernels, about 70 s).
- ``policylink/sim_robot``: the sim-as-real robot (:class:`~policylink.real.sim_robot.SimRobot`, ``-E task=reach``)
  behind its safety layer (:class:`~policylink.real.robot.SafeRobot`), stepped in real time, with the latency,
  jitter and ``time_scale`` options of ``policylink robot --sim``; it paces itself (``self_paced``).
- ``policylink/robot``: a robot served by ``policylink robot`` (``-E address=tcp://HOST:PORT``), in real time behind
  its safety layer; success comes from the robot when it is a simulator.
- ``policylink``: any registered environment, ``-E env=NAME``.

Each env's ``reset(seed)`` takes inspect-robots' trial seed; a scene's instruction must be one the env poses (a
multi-instruction env such as ``multitask`` is reset with it: ``options={"task": instruction}``). A step that
terminates with ``info["is_success"]`` ends the trial with ``termination_reason="success"`` (what the
``success_at_end`` scorer reads); the env's truncation (``max_episode_steps``) is a truncation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inspect_robots.embodiment import (
    PRIVILEGED_SUCCESS,
    RESETTABLE,
    SEEDABLE,
    SELF_PACED,
    EmbodimentBase,
    EmbodimentInfo,
)
from inspect_robots.errors import ConfigError
from inspect_robots.scene import Scene
from inspect_robots.types import Action, Observation, StepResult

from policylink.adapters.env import EnvAdapter
from policylink.adapters.schema import SpecError
from policylink.plugins.inspect_robots.spaces import (
    action_array,
    action_box,
    observation_space,
    spec_docs,
    to_observation,
)

MUJOCO_TASKS = ("reach", "push", "pick_place", "insert", "memory", "multitask")
"""The MuJoCo tasks registered as embodiments ``policylink/<task>`` and tasks ``policylink/<task>``."""

GENESIS_TASKS = {"genesis_reach": "reach", "genesis_pick_place": "pick_place"}
"""Genesis envs and the MuJoCo task each one simulates (its scenes are that task's)."""

SIM_CAPABILITIES = frozenset({SEEDABLE, RESETTABLE, PRIVILEGED_SUCCESS})


def target_kind(env: str) -> str:
    """The scene target kind an env realises: ``policylink/<task>`` of the MuJoCo task it simulates
    (``genesis_reach`` -> ``policylink/reach``)."""
    return f"policylink/{GENESIS_TASKS.get(env, env)}"


class EnvEmbodiment(EmbodimentBase):
    """An :class:`~policylink.adapters.env.EnvAdapter` as an inspect-robots embodiment.

    Args:
        env: the env (owned: closed by :meth:`close`).
        name: the embodiment's name in logs (``policylink/reach``).
        target_kinds: scene target kinds it realises (inspect-robots' compatibility check refuses other tasks'
            scenes); empty = any.
        is_simulated, capabilities: as ``EmbodimentInfo``.
        close_fn: what :meth:`close` calls (default ``env.close``).

    Raises:
        SpecError: the env's action control mode has no inspect-robots equivalent (``joint_torque``,
            ``ee_velocity``).

    Attributes:
        info: the ``EmbodimentInfo``: action ``Box`` with semantics and limits, cameras and state fields of the
            env's features, ``control_hz`` = the env's control frequency, the operating notes as ``docs``.
        env_spec: the env's :class:`~policylink.adapters.schema.EnvSpec`.
    """

    def __init__(
        self,
        env: EnvAdapter,
        name: str,
        target_kinds: frozenset[str] = frozenset(),
        *,
        is_simulated: bool = True,
        capabilities: frozenset[str] = SIM_CAPABILITIES,
        close_fn: Callable[[], None] | None = None,
    ):
        self.env = env
        self.env_spec = env.unwrapped.env_spec
        spec = self.env_spec
        self.info = EmbodimentInfo(
            name=name,
            action_space=action_box(spec.action),
            observation_space=observation_space(spec.observation_features),
            control_hz=float(spec.control_frequency),
            is_simulated=is_simulated,
            capabilities=frozenset(capabilities),
            supported_target_kinds=frozenset(target_kinds),
            docs=spec_docs(spec),
            environment_id=f"policylink:{spec.name}",
        )
        self._close = close_fn or env.close

    def reset(self, scene: Scene, *, seed: int | None = None) -> Observation:
        """Reset the env with ``seed`` (for a multi-instruction env, with the scene's instruction) and return its
        first observation.

        Raises:
            ConfigError: the scene's instruction is not one the env poses (names ``scene.instruction`` and the
                env's instructions).
        """
        tasks = self.env_spec.tasks
        if tasks and scene.instruction not in tasks:
            shown = list(tasks[:4]) + (["..."] if len(tasks) > 4 else [])
            raise ConfigError(
                f"scene.instruction: expected one of the instructions env {self.env_spec.name!r} poses {shown} "
                f"(run a policylink/<task> task, or pass one of them to --instruction), received {scene.instruction!r}"
            )
        options = {"task": scene.instruction} if len(tasks) > 1 else None
        obs, _ = self.env.reset(seed=seed, options=options)
        return to_observation(obs, self.env_spec.observation_features)

    def step(self, action: Action) -> StepResult:
        """Step the env with ``action.data`` as float32 ``(A,)`` (clipped by the env to its limits).

        Returns:
            ``StepResult``: the observation, the env's reward, ``terminated`` with ``termination_reason``
            ``"success"`` when the env terminated on success (``"terminated"`` otherwise), the env's
            ``truncated``, ``info`` with ``is_success`` (bool) and, where the env reports it, ``progress``.

        Raises:
            ActionError: ``action.data`` is not ``A`` numbers (names the field and the dimensions).
        """
        a = action_array(action, self.env_spec.action)
        obs, reward, terminated, truncated, env_info = self.env.step(a)
        success = bool(env_info.get("is_success", False))
        info: dict[str, Any] = {"is_success": success}
        if "progress" in env_info:
            info["progress"] = float(env_info["progress"])
        reason = ("success" if success else "terminated") if terminated else None
        return StepResult(
            observation=to_observation(obs, self.env_spec.observation_features),
            reward=float(reward),
            terminated=bool(terminated),
            termination_reason=reason,
            truncated=bool(truncated),
            info=info,
        )

    def close(self) -> None:
        """Close the env (or call ``close_fn``)."""
        self._close()


def _config_error(what: str, e: Exception) -> ConfigError:
    """Our errors (unknown names, bad kwargs, unmappable specs) as inspect-robots' ``ConfigError``, which its CLI
    prints as one line; the message names ``what`` and keeps ours (the field, expected and received)."""
    return ConfigError(f"{what}: {e}")


def _make_env(env: str, env_kwargs: dict[str, Any]) -> EnvAdapter:
    from policylink.adapters.registry import make_env

    try:
        return make_env(env, **env_kwargs)
    except (KeyError, ValueError, TypeError) as e:
        raise _config_error(f"embodiment policylink env {env!r}", e) from None


def env_embodiment(env: str, name: str | None = None, **env_kwargs: Any) -> EnvEmbodiment:
    """Embodiment of registered env ``env`` built with ``env_kwargs`` (its factory's keyword arguments).

    Raises:
        ConfigError: an unknown env (names the closest), a keyword the env factory does not take, or a control mode
            inspect-robots cannot express; the message names the field.
    """
    built = _make_env(env, env_kwargs)
    try:
        return EnvEmbodiment(built, name or f"policylink/{env}", frozenset({target_kind(env)}))
    except SpecError as e:
        built.close()
        raise _config_error(f"embodiment policylink env {env!r}", e) from None


def policylink_embodiment(env: str = "", **env_kwargs: Any) -> EnvEmbodiment:
    """Entry point ``policylink``: any registered env, ``-E env=NAME`` (other ``-E`` are the env's kwargs).

    Raises:
        ConfigError: ``env`` missing or unknown (the message lists the registered envs), or as
            :func:`env_embodiment`.
    """
    if not env:
        from policylink.adapters.registry import available_envs

        raise ConfigError(f"env: expected a registered policylink env (-E env=NAME), one of {available_envs()}")
    return env_embodiment(env, name=f"policylink/{env}", **env_kwargs)


def _registered(env: str) -> Callable[..., EnvEmbodiment]:
    def factory(**env_kwargs: Any) -> EnvEmbodiment:
        return env_embodiment(env, **env_kwargs)

    factory.__name__ = factory.__qualname__ = env
    factory.__doc__ = f"Entry point ``policylink/{env}``: the ``{env}`` env; ``-E`` are its factory's kwargs."
    return factory


reach, push, pick_place, insert, memory, multitask = (_registered(t) for t in MUJOCO_TASKS)
genesis_reach, genesis_pick_place = (_registered(t) for t in GENESIS_TASKS)


def sim_robot(
    task: str = "reach",
    observation_latency_ms: float = 0.0,
    actuation_latency_ms: float = 0.0,
    jitter_ms: float = 0.0,
    seed: int = 0,
    time_scale: float = 1.0,
    watchdog_ms: float = 500.0,
    **env_kwargs: Any,
) -> EnvEmbodiment:
    """Entry point ``policylink/sim_robot``: task ``task`` as the sim-as-real robot with ``policylink robot --sim``'s
    options (milliseconds; ``time_scale`` its wall-clock speed), behind its safety layer (the task's limits, a
    ``watchdog_ms`` watchdog), stepped in real time at ``control_frequency * time_scale`` wall-clock Hz. ``info``
    keeps the task's control rate (simulated seconds).

    Raises:
        ConfigError: an unknown task, bad env kwargs or timing values (names the field).
    """
    from policylink.real.robot import SafeRobot
    from policylink.real.robots import RobotConfig, build_robot, safety_config

    what = f"embodiment policylink/sim_robot task {task!r}"
    try:
        cfg = RobotConfig(
            sim=task,
            sim_kwargs=dict(env_kwargs),
            observation_latency_ms=observation_latency_ms,
            actuation_latency_ms=actuation_latency_ms,
            jitter_ms=jitter_ms,
            seed=seed,
            time_scale=time_scale,
            watchdog_ms=watchdog_ms,
        )
        driver = build_robot(cfg)
    except (KeyError, ValueError, TypeError) as e:
        raise _config_error(what, e) from None
    try:
        env = SafeRobot(driver, safety_config(cfg, driver), hz=driver.env_spec.control_frequency * time_scale)
        caps = SIM_CAPABILITIES | {SELF_PACED}
        return EnvEmbodiment(env, "policylink/sim_robot", frozenset({target_kind(task)}), capabilities=caps)
    except (SpecError, ValueError) as e:  # an unmappable control mode, a bad safety value
        driver.disconnect()
        raise _config_error(what, e) from None


def robot(
    address: str = "", hz: float | None = None, timeout_s: float = 5.0, curve_keys: str | None = None
) -> EnvEmbodiment:
    """Entry point ``policylink/robot``: the robot served by ``policylink robot`` at ``address`` (``tcp://``),
    stepped in real time at ``hz`` (default its control frequency) behind the server's safety layer. Episode ends
    and success come from the robot: a simulator behind the server reports them; hardware runs to the task's
    ``max_steps`` (score it with inspect-robots' operator grader). Not ``seedable`` nor ``privileged_success``:
    the server does not say whether a simulator stands behind it.

    Raises:
        ConfigError: no ``address``; the robot server does not answer within ``timeout_s`` (names the address).
    """
    if not address:
        raise ConfigError(
            "address: expected the robot server's address (-E address=tcp://HOST:PORT of policylink robot)"
        )
    from policylink.adapters.protocol import ProtocolError
    from policylink.real.server import RemoteRobot

    what = f"embodiment policylink/robot address {address!r}"
    try:
        env = RemoteRobot(address, hz=hz, timeout_s=timeout_s, curve_keys=curve_keys)
    except (OSError, RuntimeError, ValueError, ProtocolError) as e:  # TimeoutError, RemoteError, bad keys
        raise _config_error(what, e) from None
    try:
        caps = frozenset({RESETTABLE, SELF_PACED})
        return EnvEmbodiment(env, "policylink/robot", is_simulated=False, capabilities=caps)
    except SpecError as e:
        env.close()
        raise _config_error(what, e) from None


__all__ = [
    "GENESIS_TASKS",
    "MUJOCO_TASKS",
    "EnvEmbodiment",
    "env_embodiment",
    "policylink_embodiment",
    "robot",
    "sim_robot",
    "target_kind",
]
