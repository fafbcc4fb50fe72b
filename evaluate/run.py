"""``policylink run``: one policy on one environment through the rollout loop, printing each episode's result;
plus what every policy-running command shares (count checks, thread caps, policy references, the cell check).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from policylink.adapters.config_checks import require_counts, require_positive
from policylink.adapters.schema import IncompatibleSpecError
from policylink.evaluate.refs import with_gap
from policylink.runtime.checks import cell_problems, limit_threads
from policylink.runtime.executors import ExecutorConfig, make_executor
from policylink.runtime.operator import TakeoverRule
from policylink.runtime.rollout import RegistryEnvFn, env_spec_of, make_vector_env, plan_episodes, rollout


@dataclass
class RunConfig:
    """``policylink run``: one policy on one environment.

    Attributes:
        policy: a checkpoint folder, a server address (``tcp://host:port`` of ``policylink serve``, ``xpl://host:port``
            of an XPolicyLab model server) or a registry name.
        env: an environment registry name (``push``, ``reacher``...).
        episodes: number of episodes.
        seed: episode ``i`` resets with seed ``seed + i`` (default 100000: away from the seeds ``record`` uses,
            ``0..N-1``; a warning names any overlap with the seeds a checkpoint's demonstrations were recorded with).
        num_envs: parallel envs in the vector env.
        device: torch device for checkpoints: ``"auto"`` (CUDA when present), ``"cpu"`` or ``"cuda[:N]"``.
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
            instead of ``env`` (:mod:`policylink.real.deploy`); or ``sim:TASK``, the sim-as-real robot of ``TASK``
            in this process behind its safety layer (``env_kwargs`` go to the task: ``{gap: worn_gantry}``).
        hz: control frequency on the robot, Hz (None = the robot's own).
        lockstep: ``sim:TASK`` robots only: the simulated world's clock advances only while the loop waits for
            its next period (inference takes no simulated time; :mod:`policylink.real.lockstep`): deterministic
            and independent of the machine's load. False = real time.
        inject_latency_ms: make each inference take at least this long (deployment benchmarks).
        teleop: ``keyboard`` lets a human take over on the robot from this terminal (space toggles, wasd/rf move
            ``teleop_step`` per key press, x = e-stop); ``expert``: on a ``sim:TASK`` robot the task's scripted
            expert stands in for the operator under ``takeover``'s rule (:mod:`policylink.runtime.operator`);
            None = off. Takeover steps are recorded with ``deploy.source`` = human.
        teleop_step: action units per key press.
        takeover: when the simulated operator (``teleop: expert``) takes over (:class:`TakeoverRule`).
        gap: a reality gap of a MuJoCo task (a preset name such as ``worn_gantry``, or a YAML file), on ``env`` or on
            a ``sim:TASK`` robot; the same as ``env_kwargs: {gap: NAME}``. None: nominal sim.

    Raises:
        ValueError: ``episodes < 1``, ``num_envs < 1``, ``threads < 0`` or ``hz <= 0``; ``gap`` and a different
            ``env_kwargs`` gap.
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
    lockstep: bool = False
    inject_latency_ms: float = 0.0
    teleop: str | None = None
    teleop_step: float = 0.01
    takeover: TakeoverRule = field(default_factory=TakeoverRule)
    gap: str | None = None

    def __post_init__(self) -> None:
        require_counts(self, episodes=1, num_envs=1, threads=0, seed=0)
        self.env_kwargs = with_gap(self.env_kwargs, self.gap)
        if self.hz is not None:
            require_positive(self, "hz")


def run_policy(cfg: RunConfig) -> int:
    """Run ``cfg.policy`` on ``cfg.env`` (or on the robot at ``cfg.robot``) for ``cfg.episodes`` episodes through the
    rollout loop, printing each episode's result and the success rate; returns the exit code.

    Raises:
        ValueError: missing ``policy``/``env``, bad counts or executor settings.
        IncompatibleSpecError: the policy, env and executor do not fit (checked before any episode runs).
        FileNotFoundError, UnknownNameError: the policy or env reference cannot be resolved (checked first, before
            torch or the simulator is imported).
    """
    from policylink.adapters.registry import check_env_name
    from policylink.evaluate.refs import require_policy_refs

    if cfg.env and not cfg.robot:  # names and folders first: a typo is reported before any heavy import
        check_env_name(cfg.env, "env")
    if cfg.policy:
        require_policy_refs([(cfg.policy, cfg.policy)], [cfg.env], field="policy")
    if cfg.robot:
        raise ValueError(
            f"robot: run_policy runs on a simulated env; deploy to {cfg.robot!r} with "
            "policylink.real.deploy.run_on_robot (policylink run --robot)"
        )
    if not cfg.policy or not cfg.env:
        raise ValueError(
            f"--policy and --env: expected both (see policylink run --help), received policy={cfg.policy!r} "
            f"env={cfg.env!r}"
        )
    limit_threads(cfg.threads)
    from policylink.evaluate.refs import checkpoint_env_kwargs_of, warn_recorded_seed_overlap
    from policylink.policies import load_policy

    env_kwargs = dict(cfg.env_kwargs)
    if "obs_mode" not in env_kwargs:
        env_kwargs.update(checkpoint_env_kwargs_of([(cfg.policy, cfg.policy)], [cfg.env]))
    warn_recorded_seed_overlap([cfg.policy], cfg.seed, cfg.episodes)
    env_fn = RegistryEnvFn(cfg.env, **env_kwargs)
    probe = env_fn()
    spec = env_spec_of(probe)
    probe.close()
    policy = load_policy(cfg.policy, cfg.device, cfg.seed, cfg.cfg_scale, env_spec=spec)  # xpl:// takes the env's
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
