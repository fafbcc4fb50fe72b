"""``policylink run``: one policy on one environment through the rollout loop, printing each episode's result;
plus what every policy-running command shares (count checks, thread caps, policy references, the cell check).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from policylink.adapters.compatibility import compatibility_problems
from policylink.adapters.schema import EnvSpec, IncompatibleSpecError
from policylink.runtime.executors import ExecutorConfig, executor_problems, make_executor
from policylink.runtime.rollout import RegistryEnvFn, env_spec_of, make_vector_env, plan_episodes, rollout


@dataclass
class RunConfig:
    """``policylink run``: one policy on one environment.

    Attributes:
        policy: a registry name, a checkpoint folder, or a server address (``tcp://host:port``).
        env: an environment registry name (``push``, ``reacher``...).
        episodes: number of episodes.
        seed: episode ``i`` resets with seed ``seed + i`` (default 100000: away from the seeds ``record`` uses,
            ``0..N-1``; a warning names any overlap with the seeds a checkpoint's demonstrations were recorded with).
        num_envs: parallel envs in the vector env.
        device: torch device for checkpoints (``auto``, ``cpu``, ``cuda:0``).
        cfg_scale: classifier-free guidance weight ``w`` of a checkpoint trained with advantage conditioning (0 =
            unconditional, 1 = conditional, > 1 guided); None = the checkpoint's own ``policy.cfg_scale``.
        record: optional zarr store path; the episodes are appended to it (``quality: perturbed`` when
            ``env_kwargs`` switches a perturbation on).
        env_kwargs: keyword arguments of the env factory (``obs_mode``, ``image_size``...; mid-episode
            perturbations of the MuJoCo tasks: ``{perturbation: {displacement: 0.03, force: 2.0}}``, fields of
            ``PerturbationConfig``); without ``obs_mode``, a checkpoint's own observation mode and image size are used.
        executor: how chunks are executed (:class:`ExecutorConfig`).
        threads: torch CPU threads (0 = torch's default). One thread is the default because small chunk
            policies gain nothing from more on CPU and slow down many times over when the cores are shared.
        robot: a robot server address (``tcp://host:port``, ``policylink robot``): run on it in real time
            instead of ``env`` (:mod:`policylink.runtime.deploy`).
        hz: control rate on the robot (None = its control frequency).
        inject_latency_ms: make each inference take at least this long (deployment benchmarks).
        teleop: ``keyboard`` lets a human take over on the robot from this terminal (space toggles, wasd/rf move
            ``teleop_step`` per key press, x = e-stop); None = off.
        teleop_step: action units per key press.

    Raises:
        ValueError: ``episodes < 1``, ``num_envs < 1`` or ``threads < 0``.
    """

    policy: str = ""
    env: str = ""
    episodes: int = 1
    seed: int = 100_000
    num_envs: int = 1
    device: str = "auto"
    cfg_scale: float | None = None
    record: str | None = None
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    threads: int = 1
    robot: str | None = None
    hz: float | None = None
    inject_latency_ms: float = 0.0
    teleop: str | None = None
    teleop_step: float = 0.01

    def __post_init__(self) -> None:
        require_counts(self, episodes=1, num_envs=1, threads=0)


def require_counts(config: Any, prefix: str = "", **minimums: int) -> None:
    """Check integer fields of a config: ``require_counts(cfg, episodes=1)`` requires ``cfg.episodes >= 1``;
    ``prefix`` (``"critic."``) is put before the field's name in the message.

    Raises:
        ValueError: the first field below its minimum (naming the field, the minimum and the value).
    """
    for name, low in minimums.items():
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{prefix}{name}: expected an integer >= {low}, received {value!r}")


def require_positive(config: Any, *names: str, prefix: str = "") -> None:
    """Check float fields of a config: ``require_positive(cfg, "lr")`` requires ``cfg.lr > 0``.

    Raises:
        ValueError: the first field not above 0 (``prefix`` + its name, the expectation and the value).
    """
    for name in names:
        if not getattr(config, name) > 0:
            raise ValueError(f"{prefix}{name}: expected > 0, received {getattr(config, name)}")


def require_output_folder(out: str | Path, field: str = "out", **inputs: str | Path | None) -> None:
    """Refuse an output folder that would replace or rename what a command reads: an existing file, or a path
    that is, lies inside or contains one of ``inputs`` (option name -> path; empty ones are skipped). Call it
    before anything is written.

    Raises:
        ValueError: naming ``field``, the expected and the received path.
    """
    path = Path(out)
    if path.is_file():
        raise ValueError(f"{field}: expected a folder (or a new path), received an existing file {str(out)!r}")
    here = path.resolve()
    for name, given in inputs.items():
        other = Path(given).resolve() if given else None
        if other is not None and (here == other or here.is_relative_to(other) or other.is_relative_to(here)):
            raise ValueError(f"{field}: expected a folder other than {name} {str(given)!r} (neither inside it nor "
                             f"containing it), received {str(out)!r}")  # fmt: skip


def limit_threads(n: int = 1) -> None:
    """Cap torch's CPU threads at ``n`` (0 = leave torch's default) and Mesa's llvmpipe renderer at ``n``
    (``LP_NUM_THREADS``, before the first GL context; an explicit setting wins).

    Measured on the 2-core shared machine (load ~4): one diffusion inference (B=2) took 2.7 s with 2 torch
    threads and 0.07 s with 1 (threads spin while waiting for busy cores).
    """
    if n <= 0:
        return
    os.environ.setdefault("LP_NUM_THREADS", str(n))
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)


def cell_problems(
    label: str, policy_spec: Any, env_label: str, env_spec: EnvSpec, executor: ExecutorConfig
) -> list[str]:
    """Why policy ``label`` cannot run on env ``env_label`` with ``executor``: the contract's
    :func:`~policylink.adapters.compatibility.compatibility_problems` then the executor's, each as
    ``"<policy> x <env>: <problem>"`` (one format for ``policylink run`` and ``policylink eval``)."""
    problems = compatibility_problems(policy_spec, env_spec) + executor_problems(policy_spec, executor)
    return [f"{label} x {env_label}: {p}" for p in problems]


def main(argv: Sequence[str] | None = None) -> int:
    """``policylink run --policy X --env Y --episodes N``: print each episode's result and the success rate.

    Raises:
        ValueError: missing ``--policy``/``--env``, bad counts or executor settings.
        IncompatibleSpecError: the policy, env and executor do not fit (checked before any episode runs).
        FileNotFoundError, UnknownNameError: the policy or env reference cannot be resolved (checked first, before
            torch or the simulator is imported).
    """
    from policylink.runtime.cli import parse_config

    cfg = parse_config(RunConfig, list(sys.argv[1:] if argv is None else argv), prog="policylink run")
    from policylink.adapters.registry import check_env_name
    from policylink.runtime.eval_refs import require_policy_refs

    if cfg.env and not cfg.robot:  # names and folders first: a typo is reported before any heavy import
        check_env_name(cfg.env, "env")
    if cfg.policy:
        require_policy_refs([(cfg.policy, cfg.policy)], [cfg.env], field="policy")
    if cfg.policy and cfg.robot:
        from policylink.runtime.deploy import run_on_robot

        limit_threads(cfg.threads)
        return run_on_robot(cfg)
    if not cfg.policy or not cfg.env:
        raise ValueError(
            f"--policy and --env: expected both (see policylink run --help), received policy={cfg.policy!r} "
            f"env={cfg.env!r}"
        )
    limit_threads(cfg.threads)
    from policylink.policies import load_policy
    from policylink.runtime.eval_refs import checkpoint_env_kwargs_of, warn_recorded_seed_overlap

    env_kwargs = dict(cfg.env_kwargs)
    if "obs_mode" not in env_kwargs:
        env_kwargs.update(checkpoint_env_kwargs_of([(cfg.policy, cfg.policy)], [cfg.env]))
    warn_recorded_seed_overlap([cfg.policy], cfg.seed, cfg.episodes)
    env_fn = RegistryEnvFn(cfg.env, **env_kwargs)
    probe = env_fn()
    spec = env_spec_of(probe)
    probe.close()
    policy = load_policy(cfg.policy, cfg.device, cfg.seed, cfg.cfg_scale)
    limit_threads(cfg.threads)  # torch may have been imported by the load
    problems = cell_problems(cfg.policy, policy.spec, cfg.env, spec, cfg.executor)
    if problems:
        raise IncompatibleSpecError(problems)
    vec = make_vector_env(env_fn, plan_episodes(cfg.episodes, cfg.seed, cfg.num_envs), spec.max_episode_steps)
    executor = make_executor(policy, cfg.executor)
    recorder, subscribers = None, []
    if cfg.record:
        from policylink.data.episode_meta import EpisodeMeta
        from policylink.data.recorder import EpisodeRecorder
        from policylink.runtime.rollout import RecorderSubscriber
        from policylink.sim.mujoco.perturbations import perturbation_on

        recorder = EpisodeRecorder(cfg.record, env_spec=spec)  # perturbed rollouts stay told apart from clean ones
        meta = EpisodeMeta(
            source="policy", quality="perturbed" if perturbation_on(env_kwargs.get("perturbation")) else ""
        )
        subscribers = [RecorderSubscriber(recorder, meta)]
    try:
        results = rollout(
            vec,
            executor,
            cfg.episodes,
            subscribers=subscribers,
            progress=lambda r: print(
                f"episode {r.index} seed {r.seed}: success={r.success} steps={r.n_steps} sum_reward={r.sum_reward:.3f}"
            ),
        )
    finally:
        executor.close()
        vec.close()
        if recorder is not None:
            recorder.close()
    n_ok = sum(r.success for r in results)
    print(f"success: {n_ok}/{len(results)} ({100.0 * n_ok / max(len(results), 1):.1f}%)")
    return 0
