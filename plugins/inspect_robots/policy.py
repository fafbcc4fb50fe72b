"""policylink policies as inspect-robots policies: entry point ``policylink`` of the ``inspect_robots.policies``
group, ``-P policy=REF`` with any reference :func:`policylink.policies.load_policy` accepts (a checkpoint folder, a
``tcp://HOST:PORT`` of ``policylink serve``, ``kind:folder``, a registry name).

The policy runs behind one of policylink's chunk executors (``-P executor=receding_horizon|temporal_ensemble|
async|corrective``, ``-P n_action_steps=N``), exactly as ``policylink run`` runs it: inspect-robots asks for an
action every control step (each ``act`` returns a chunk of one action and ``config.replan_interval = 1``), the
executor feeds every observation to the policy's history window and plans a new chunk when one is due. So a policy
with an observation history (``n_obs_steps > 1``) sees consecutive steps, and ``policylink run`` on the same env
with the same seeds executes the same actions. ``ActionChunk.inference_latency_s`` is set on the steps where the
executor called the policy (what inspect-robots' log averages), None on the steps served from the queue.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from inspect_robots.embodiment import EmbodimentInfo
from inspect_robots.errors import CompatibilityError, ConfigError
from inspect_robots.policy import PolicyBase, PolicyConfig, PolicyInfo
from inspect_robots.rollout import TrialRecord
from inspect_robots.scene import Scene
from inspect_robots.types import Action, ActionChunk, Observation

from policylink.adapters.policy import PolicyAdapter
from policylink.adapters.schema import IMAGE_PREFIX, SpecError
from policylink.plugins.inspect_robots.spaces import action_box, camera_name, observation_batch, observation_space
from policylink.runtime.executors import ExecutorConfig, make_executor


class BindError(CompatibilityError, SystemExit):
    """A policy that does not fit the embodiment it is bound to (:meth:`PolicylinkPolicy.bind`), as one line.

    inspect-robots' ``run`` prints the message of a ``ConfigError`` raised while it builds a component but lets a
    ``CompatibilityError`` raised by ``eval`` end the process with its traceback; as a ``SystemExit`` too (code:
    the message), this one ends ``inspect-robots run`` on its one line (exit 1) after the CLI's cleanup, while a
    program still catches it as a ``CompatibilityError`` (or any ``Exception``)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.code = message


def _env_flag(embodiment: str) -> str:
    """``-P env=push`` for embodiment ``policylink/push`` (a registered env's), else ``-P env=NAME``."""
    from policylink.adapters.registry import available_envs

    name = embodiment.removeprefix("policylink/")
    return f"-P env={name}" if embodiment.startswith("policylink/") and name in available_envs() else "-P env=NAME"


@dataclass(frozen=True)
class PolicylinkPolicyConfig(PolicyConfig):
    """inspect-robots' ``PolicyConfig`` (recorded in the eval log as ``policy_config``) plus how policylink executes
    the policy's chunks.

    Attributes:
        action_horizon, replan_interval: 1 (``act`` returns the one action the executor chose for this step).
        executor: the :class:`~policylink.runtime.executors.ExecutorKind` value.
        n_action_steps: actions executed from each chunk before re-planning (or the query period).
        chunk_size, n_obs_steps: the policy's prediction horizon ``H`` and observation window, steps.
        reference: the policy reference it was loaded from.
    """

    executor: str = "receding_horizon"
    n_action_steps: int = 1
    chunk_size: int = 1
    n_obs_steps: int = 1
    reference: str = ""


class PolicylinkPolicy(PolicyBase):
    """A :class:`~policylink.adapters.policy.PolicyAdapter` behind a chunk executor as an inspect-robots policy
    (one episode at a time: a batch of one).

    Args:
        policy: the policy.
        name: ``PolicyInfo.name`` (in the eval log).
        executor: how chunks are executed (:class:`~policylink.runtime.executors.ExecutorConfig`).
        reference: the reference the policy came from (``PolicyInfo.checkpoint``).
        env: the policylink env it was checked against when loaded (``-P env=NAME``; "" for none).

    Raises:
        SpecError: the policy's control mode has no inspect-robots equivalent.
        ExecutorConfigError: ``executor`` asks for more than the policy's chunk provides.
    """

    def __init__(
        self,
        policy: PolicyAdapter,
        name: str,
        executor: ExecutorConfig | None = None,
        reference: str = "",
        env: str = "",
    ):
        self.policy = policy
        self.env = env
        self.spec = policy.spec
        self.executor = make_executor(policy, executor or ExecutorConfig())
        self.info = PolicyInfo(
            name=name,
            action_space=action_box(self.spec.action),
            observation_space=observation_space(self.spec.observation_features),
            control_hz=float(self.spec.control_frequency),
            checkpoint=reference or None,
        )
        self.config = PolicylinkPolicyConfig(
            action_horizon=1,
            replan_interval=1,
            executor=self.executor.config.kind,
            n_action_steps=self.executor.n_action_steps,
            chunk_size=self.spec.chunk_size,
            n_obs_steps=self.spec.n_obs_steps,
            reference=reference,
        )
        self._instruction: str | None = None

    def bind(self, embodiment_info: EmbodimentInfo) -> None:
        """Check, before inspect-robots' own compatibility check (control mode and key names), the action size (both
        sizes and their names, :func:`action_size_problem`), the size of every camera and the shape of every state
        field the policy reads, against the embodiment's declarations.

        Raises:
            BindError: a CompatibilityError on one line naming each mismatch (field, expected by the policy,
                declared by the embodiment) and, for a policy loaded without ``-P env=NAME``, that parameter.
        """
        cams = {c.name: c for c in embodiment_info.observation_space.cameras}
        state = embodiment_info.observation_space.state
        fields = {f.key: f for f in state.fields} if state is not None else {}
        box = embodiment_info.action_space
        labels = box.semantics.dim_labels if box.semantics is not None else None
        size = action_size_problem(self.spec.action, box.dim, labels, f"embodiment {embodiment_info.name!r}")
        problems = [size] if size is not None else []
        for key, feat in self.spec.observation_features.items():
            if feat.is_image and key.startswith(IMAGE_PREFIX) and camera_name(key) in cams:
                cam = cams[camera_name(key)]
                if (cam.height, cam.width, cam.channels) != feat.shape:
                    problems.append(f"camera {camera_name(key)!r} ({key}): expected {feat.shape} (policy), "
                                    f"received {(cam.height, cam.width, cam.channels)} (embodiment)")  # fmt: skip
            elif key in fields and tuple(fields[key].shape) != feat.shape:
                problems.append(f"state[{key!r}]: expected shape {feat.shape} (policy), received "
                                f"{tuple(fields[key].shape)} (embodiment)")  # fmt: skip
        if problems:
            hint = "" if self.env else f" (not checked at load: {_env_flag(embodiment_info.name)} was not given)"
            where = f"policy {self.info.name!r} on embodiment {embodiment_info.name!r}"
            raise BindError(f"{where}: {'; '.join(problems)}{hint}")

    def reset(self, scene: Scene) -> None:
        """Start an episode: clear the executor's queue and the policy's history (as the rollout loop does between
        episodes) and keep the scene's instruction for observations that carry none."""
        self.executor.reset(None if self.executor.queue is None else [0])
        self._instruction = scene.instruction

    def act(self, observation: Observation) -> ActionChunk:
        """The action for this step, float32 ``(A,)`` in the ActionSpec's units, as a chunk of one.

        Raises:
            ObservationError: a camera, state entry or instruction the policy reads is missing, or has the wrong
                shape or dtype (names the field); inspect-robots records it as a failed trial.
        """
        start = time.perf_counter()
        before = int(self.executor.inferences.sum())
        batch = observation_batch(observation, self.spec.observation_features, self._instruction)
        action = self.executor.act(batch)[0]
        planned = int(self.executor.inferences.sum()) > before
        return ActionChunk(
            actions=[Action(data=action)],
            control_hz=float(self.spec.control_frequency),
            inference_latency_s=time.perf_counter() - start if planned else None,
        )

    def on_trial_end(self, record: TrialRecord, log_dir: str, run_id: str) -> None:
        """Record in the trial's metadata (the eval log's ``trial_metadata``) what ``policylink run`` reports per
        episode: ``policylink.seed`` (the env reset seed), ``policylink.success`` (``info["is_success"]`` at any
        step), ``policylink.n_steps`` and ``policylink.inferences`` (chunks planned)."""
        success = any(bool(s.result.info.get("is_success", False)) for s in record.steps)
        record.metadata["policylink"] = {
            "seed": record.seed,
            "success": success,
            "n_steps": len(record.steps),
            "inferences": int(self.executor.inferences.sum()),
        }

    def close(self) -> None:
        """Stop the executor's background worker (async) and close a remote policy's connection."""
        self.executor.close()
        close = getattr(self.policy, "close", None)
        if callable(close):
            close()


def action_size_problem(action: Any, dim: int, labels: Any, where: str) -> str | None:
    """None when the policy's :class:`~policylink.adapters.schema.ActionSpec` ``action`` has ``dim`` entries, else
    the one line naming both sizes and their names: ``"action size: expected 2 (embodiment 'policylink/push': ['dx',
    'dy']), received 3 (policy: ['dx', 'dy', 'dz'])"`` (``where`` names the embodiment or env; ``labels`` its
    action names, or None when it declares none)."""
    if action.dim == dim:
        return None
    names = f": {list(labels)}" if labels else ""
    return f"action size: expected {dim} ({where}{names}), received {action.dim} (policy: {list(action.names)})"


def policylink_policy(
    policy: str = "",
    device: str = "auto",
    seed: int = 0,
    cfg_scale: float | None = None,
    executor: str = "receding_horizon",
    n_action_steps: int | None = None,
    ensemble_m: float = 0.01,
    threads: int = 1,
    env: str = "",
    obs_mode: str | None = None,
    image_size: int | None = None,
) -> PolicylinkPolicy:
    """Entry point ``policylink``: ``-P policy=REF`` loaded by :func:`policylink.policies.load_policy` (``device``,
    ``seed`` of the sampler's noise, ``cfg_scale``) behind executor ``executor`` (``n_action_steps``, ``ensemble_m``:
    :class:`~policylink.runtime.executors.ExecutorConfig`); ``threads`` caps torch's CPU threads (0 = torch's
    default), as ``policylink run --threads``. An XPolicyLab model server (``xpl://HOST:PORT``) advertises no spec:
    ``env`` names the policylink env whose features, action and rate it takes (``obs_mode``, ``image_size``: that
    env's observation mode), as ``policylink run --policy xpl://... --env NAME`` does; for any other policy ``env``
    names the embodiment's env, so that an action size that does not fit it is refused here, as one line, rather
    than when the evaluation starts.

    Raises:
        ConfigError: no ``policy``; a reference that cannot be loaded (missing folder, unknown name, a server that
            does not answer); an unknown ``env``, or one whose action size differs from the policy's (both sizes
            named); bad executor settings or a control mode inspect-robots cannot express. The message names the
            field, the expected and the received value.
    """
    if not policy:
        raise ConfigError(
            "policy: expected a policylink policy reference (-P policy=CHECKPOINT_DIR or -P policy=tcp://HOST:PORT)"
        )
    _check_numbers(seed, threads, n_action_steps, image_size, ensemble_m, cfg_scale)
    from policylink.adapters.protocol import ProtocolError
    from policylink.policies import load_policy
    from policylink.runtime.checks import limit_threads

    try:
        config = ExecutorConfig(kind=executor, n_action_steps=n_action_steps, ensemble_m=ensemble_m)
    except ValueError as e:
        raise ConfigError(f"policylink policy: {e}") from None
    env_spec = _env_spec(env, obs_mode, image_size) if env else None
    limit_threads(threads)
    try:
        loaded = load_policy(policy, device=device, seed=seed, cfg_scale=cfg_scale, env_spec=env_spec)
    except (OSError, KeyError, ValueError, RuntimeError, ProtocolError) as e:  # not found, unknown, dead server
        raise ConfigError(f"policy {policy!r}: {e}") from None
    limit_threads(threads)  # torch may have been imported by the load
    if env_spec is not None:
        action = env_spec.action
        size = action_size_problem(loaded.spec.action, action.dim, action.names, f"env {env!r}")
        if size is not None:
            close = getattr(loaded, "close", None)
            if callable(close):
                close()  # a served policy's connection
            raise ConfigError(f"policy {policy!r}: {size}")
    try:
        return PolicylinkPolicy(loaded, f"policylink:{policy}", config, reference=policy, env=env)
    except (SpecError, ValueError) as e:
        raise ConfigError(f"policy {policy!r}: {e}") from None


def _check_numbers(
    seed: Any, threads: Any, n_action_steps: Any, image_size: Any, ensemble_m: Any, cfg_scale: Any
) -> None:
    """Check the numeric ``-P`` parameters as inspect-robots passes them (``-P seed=x`` arrives as the string
    ``'x'``), before anything is loaded.

    Raises:
        ConfigError: the first one of the wrong type or range (``-P seed: expected an integer in [0, inf),
            received 'x'``).
    """
    import numbers
    from types import SimpleNamespace

    from policylink.adapters.config_checks import require_integers_within

    given = SimpleNamespace(seed=seed, threads=threads, n_action_steps=n_action_steps, image_size=image_size)
    intervals = {"seed": "[0, inf)", "threads": "[0, inf)", "n_action_steps": "[1, inf)", "image_size": "[1, inf)"}
    try:
        require_integers_within(
            given, prefix="-P ", **{k: v for k, v in intervals.items() if getattr(given, k) is not None}
        )
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for name, value in (("ensemble_m", ensemble_m), ("cfg_scale", cfg_scale)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
            raise ConfigError(f"-P {name}: expected a number, received {value!r}")


def _env_spec(env: str, obs_mode: str | None, image_size: int | None) -> Any:
    """The EnvSpec of registered env ``env`` in observation mode ``obs_mode`` (None: the env's default).

    Raises:
        ConfigError: an unknown env, mode or image size (names the field)."""
    from policylink.adapters.obs_modes import obs_mode_env_kwargs
    from policylink.adapters.registry import make_env

    kwargs = obs_mode_env_kwargs(obs_mode, image_size) if obs_mode else {}
    try:
        probe = make_env(env, **kwargs)
    except (KeyError, ValueError, TypeError) as e:
        raise ConfigError(f"policylink policy env {env!r}: {e}") from None
    spec = probe.unwrapped.env_spec
    probe.close()
    return spec


__all__ = ["BindError", "PolicylinkPolicy", "PolicylinkPolicyConfig", "action_size_problem", "policylink_policy"]
