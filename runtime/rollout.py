"""The reference env-facing loop (reset -> observe -> executor asks the policy -> step), batched over a
gymnasium vector env, with per-episode metrics, optional recording and videos; plus ``policylink run``.

The loop itself is a few lines any env-facing code can copy::

    obs, info = vec_env.reset()
    executor.reset()
    while running:
        action = executor.act(as_batch(obs))            # (B, A) float32
        obs, reward, terminated, truncated, info = vec_env.step(action)
        executor.reset(np.flatnonzero(terminated | truncated))   # SAME_STEP autoreset: new episodes begin
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from policylink.adapters.schema import TASK_KEY, EnvSpec, IncompatibleSpecError, compatibility_problems
from policylink.runtime.executors import ChunkExecutor, ExecutorConfig, executor_problems, make_executor

EPISODE_INDEX = "policylink_episode"  # reset-info key: index of the planned episode (-1 = padding)
EPISODE_SEED = "policylink_seed"  # reset-info key: its reset seed (-1 = none)


@dataclass
class EpisodeResult:
    """Metrics of one finished episode.

    Attributes:
        index: the episode's index in the evaluation plan (its seed is fixed by it).
        seed: the env reset seed.
        task: the instruction (``""`` for single-task envs).
        n_steps: control steps up to and including the terminal step.
        sum_reward, max_reward: over those steps.
        success: ``info["is_success"]`` was True at any of those steps.
        inferences: policy calls made for this episode.
        stall_steps: simulated steps the episode waited for inference (see ``LatencyConfig``).
        frames: rendered frames (uint8 ``(H, W, 3)``), first = the episode's reset frame; only when requested.
    """

    index: int
    seed: int
    task: str
    n_steps: int
    sum_reward: float
    max_reward: float
    success: bool
    inferences: int = 0
    stall_steps: int = 0
    frames: list[np.ndarray] | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (without frames)."""
        d = asdict(self)
        d.pop("frames")
        return d


def episode_metrics(
    rewards: Sequence[float], dones: Sequence[bool], successes: Sequence[bool]
) -> tuple[int, float, float, bool]:
    """``(n_steps, sum_reward, max_reward, success)`` of one episode trace, counting steps up to and including
    the first ``done`` only (whatever padding follows is ignored).

    Args:
        rewards, dones, successes: per-step sequences of equal length ``T`` (floats, bools, bools).

    Raises:
        ValueError: lengths differ or the trace is empty.
    """
    r, d, s = np.asarray(rewards, np.float64), np.asarray(dones, bool), np.asarray(successes, bool)
    if not (r.shape == d.shape == s.shape) or r.ndim != 1 or r.size == 0:
        raise ValueError(
            f"episode trace: expected three equal non-empty 1-D sequences, received lengths "
            f"{r.shape}, {d.shape}, {s.shape}"
        )
    n = int(np.argmax(d)) + 1 if d.any() else r.size
    return n, float(r[:n].sum()), float(r[:n].max()), bool(s[:n].any())


class EpisodePlan(gym.Wrapper):
    """Gives one vector-env slot its planned episodes: the k-th reset uses the k-th ``(index, seed)``; resets
    after the plan is exhausted are padding (index -1). Truncates episodes at ``max_episode_steps``.

    The reset info carries ``policylink_episode`` and ``policylink_seed`` (ints) so the loop knows which
    planned episode a slot is running, with any vector env and autoreset.
    """

    def __init__(self, env: gym.Env, plan: Sequence[tuple[int, int]], max_episode_steps: int):
        super().__init__(env)
        self._plan = list(plan)
        self._next = 0
        self._max_steps = int(max_episode_steps)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Reset with the next planned seed (the ``seed`` argument is ignored: the plan decides)."""
        index, seed = self._plan[self._next] if self._next < len(self._plan) else (-1, None)
        self._next += 1
        self._t = 0
        obs, info = self.env.reset(seed=seed, options=options)
        info = dict(info)
        info[EPISODE_INDEX] = int(index)
        info[EPISODE_SEED] = -1 if seed is None else int(seed)
        return obs, info

    def step(self, action):
        """Step, truncating at ``max_episode_steps``."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._t += 1
        return obs, reward, terminated, truncated or self._t >= self._max_steps, info


def make_vector_env(
    env_fn: Callable[[], gym.Env],
    plans: Sequence[Sequence[tuple[int, int]]],
    max_episode_steps: int,
    asynchronous: bool = False,
) -> gym.vector.VectorEnv:
    """A ``SyncVectorEnv`` (or ``AsyncVectorEnv``) of ``len(plans)`` envs, slot ``j`` running ``plans[j]``,
    with ``AutoresetMode.SAME_STEP`` (a finished slot is reset inside the same ``step`` call)."""
    fns = [_PlannedEnvFn(env_fn, plan, max_episode_steps) for plan in plans]
    cls = gym.vector.AsyncVectorEnv if asynchronous else gym.vector.SyncVectorEnv
    return cls(fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def plan_episodes(n_episodes: int, seed: int, num_envs: int, first_index: int = 0) -> list[list[tuple[int, int]]]:
    """Round-robin plan: episode ``i`` (seed ``seed + i``) runs in slot ``(i - first_index) % num_envs``."""
    plans: list[list[tuple[int, int]]] = [[] for _ in range(num_envs)]
    for k in range(n_episodes):
        i = first_index + k
        plans[k % num_envs].append((i, seed + i))
    return plans


def rollout(
    vec_env: gym.vector.VectorEnv,
    executor: ChunkExecutor,
    n_episodes: int,
    *,
    recorder: Any = None,
    video_episodes: Sequence[int] = (),
    source: str = "policy",
    progress: Callable[[EpisodeResult], None] | None = None,
) -> list[EpisodeResult]:
    """Run ``n_episodes`` planned episodes (see :class:`EpisodePlan`) and return their results by index.

    Args:
        vec_env: a vector env from :func:`make_vector_env` (SAME_STEP autoreset).
        executor: chooses each step's actions ``(B, A)``.
        n_episodes: how many planned episodes to finish (padding episodes are run but not counted).
        recorder: an optional ``policylink.data.recorder.EpisodeRecorder``; each episode is committed
            with its seed and success when it ends.
        video_episodes: indices of the episodes whose frames to keep (the env must render ``rgb_array``).
        source: the recorder's ``EpisodeMeta.source``.
        progress: called with each finished episode.

    Returns:
        Results sorted by episode index.
    """
    b = vec_env.num_envs
    obs, info = vec_env.reset()
    executor.reset()
    cur, seeds = np.asarray(info[EPISODE_INDEX]).copy(), np.asarray(info[EPISODE_SEED]).copy()
    traces: list[dict[str, list]] = [_new_trace() for _ in range(b)]
    want_video = set(int(i) for i in video_episodes)
    frames: dict[int, list[np.ndarray]] = {}
    for j in range(b):
        _begin(j, cur, seeds, recorder, want_video, frames, vec_env, source)
    results: dict[int, EpisodeResult] = {}
    while len(results) < n_episodes:
        batch = as_batch(obs)
        action = executor.act(batch)
        next_obs, reward, terminated, truncated, info = vec_env.step(action)
        done = np.logical_or(terminated, truncated)
        step_success = _success(info, done, b)
        for j in range(b):
            if cur[j] < 0:
                continue
            tr = traces[j]
            tr["reward"].append(float(reward[j]))
            tr["done"].append(bool(done[j]))
            tr["success"].append(bool(step_success[j]))
            if recorder is not None:
                recorder.add_step(_row(batch, j), action[j], float(reward[j]), bool(done[j]), slot=j)
            if j in frames and not done[j]:
                frames[j].append(_render(vec_env, j))
        finished = np.flatnonzero(done)
        for j in finished:
            if cur[j] >= 0:
                n, total, best, ok = episode_metrics(traces[j]["reward"], traces[j]["done"], traces[j]["success"])
                res = EpisodeResult(
                    int(cur[j]),
                    int(seeds[j]),
                    str(traces[j]["task"]),
                    n,
                    total,
                    best,
                    ok,
                    int(executor.inferences[j]),
                    int(executor.stall_steps[j]),
                    frames.pop(j, None),
                )
                results[res.index] = res
                if recorder is not None:
                    recorder.end_episode(success=ok, slot=j)
                if progress is not None:
                    progress(res)
            cur[j], seeds[j] = int(info[EPISODE_INDEX][j]), int(info[EPISODE_SEED][j])
            traces[j] = _new_trace()
        if finished.size:
            executor.reset(finished.tolist())
            for j in finished:
                _begin(j, cur, seeds, recorder, want_video, frames, vec_env, source)
        obs = next_obs
    return [results[i] for i in sorted(results)]


def as_batch(obs: Mapping[str, Any]) -> dict[str, Any]:
    """A vector env's observation as a policy batch: arrays ``(B, ...)``, ``task`` a list of ``B`` str."""
    out = {k: v for k, v in obs.items() if k != TASK_KEY}
    if TASK_KEY in obs:
        out[TASK_KEY] = [str(s) for s in obs[TASK_KEY]]
    return out


@dataclass
class RunConfig:
    """``policylink run``: one policy on one environment.

    Attributes:
        policy: a registry name, a checkpoint folder, or a server address (``tcp://host:port``).
        env: an environment registry name (``push``, ``reacher``...).
        episodes: number of episodes.
        seed: episode ``i`` resets with seed ``seed + i``.
        num_envs: parallel envs in the vector env.
        device: torch device for checkpoints (``auto``, ``cpu``, ``cuda:0``).
        record: optional zarr store path; the episodes are appended to it.
        env_kwargs: keyword arguments of the env factory (``obs_mode``, ``image_size``...).
        executor: how chunks are executed (:class:`ExecutorConfig`).
        threads: torch CPU threads (0 = torch's default). One thread is the default because small chunk
            policies gain nothing from more on CPU and slow down many times over when the cores are shared.

    Raises:
        ValueError: ``episodes < 1``, ``num_envs < 1`` or ``threads < 0``.
    """

    policy: str = ""
    env: str = ""
    episodes: int = 1
    seed: int = 0
    num_envs: int = 1
    device: str = "auto"
    record: str | None = None
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    threads: int = 1

    def __post_init__(self) -> None:
        require_counts(self, episodes=1, num_envs=1, threads=0)


def require_counts(config: Any, **minimums: int) -> None:
    """Check integer fields of a config: ``require_counts(cfg, episodes=1)`` requires ``cfg.episodes >= 1``.

    Raises:
        ValueError: the first field below its minimum (naming the field, the minimum and the value).
    """
    for name, low in minimums.items():
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name}: expected an integer >= {low}, received {value!r}")


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


def load_policy_ref(ref: Any, device: str = "auto", seed: int = 0) -> Any:
    """A PolicyAdapter from a reference: a server address (``tcp://``, ``ipc://``), a checkpoint folder, a
    policy registry name, or a zero-argument callable returning a policy.

    Raises:
        FileNotFoundError: the reference looks like a path (contains ``/``) but no such folder exists.
        UnknownNameError: neither an address, a path, nor a registered name.
        ValueError: a registered name that cannot be built without a checkpoint (``diffusion``, ``flow``).
    """
    if callable(ref):
        return ref()
    ref = str(ref)
    if ref.startswith(("tcp://", "ipc://")):
        from policylink.adapters.transport import RemotePolicy

        return RemotePolicy(ref)
    path = Path(ref).expanduser()
    if path.is_dir():
        from policylink.policies import load_policy

        return load_policy(str(path), device=device, seed=seed)
    if "/" in ref or os.sep in ref or path.exists():
        kind = "not a folder" if path.exists() else "not found"
        raise FileNotFoundError(
            f"checkpoint folder {kind}: {ref} (policylink train writes <output_dir>/checkpoints/last)"
        )
    from policylink.adapters.registry import policy_factory

    factory = policy_factory(ref)  # UnknownNameError lists the available names
    try:
        return factory()
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"policy {ref!r} needs a checkpoint: pass the checkpoint folder instead of the name (policylink train "
            f"writes <output_dir>/checkpoints/last); building it without one failed: {e}"
        ) from None


class RegistryEnvFn:
    """Picklable ``() -> EnvAdapter`` for an environment registry name and factory kwargs."""

    def __init__(self, name: str, **kwargs: Any):
        self.name, self.kwargs = name, dict(kwargs)

    def __call__(self) -> gym.Env:
        from policylink.adapters.registry import make_env

        return make_env(self.name, **self.kwargs)


def env_spec_of(env: gym.Env) -> EnvSpec:
    """The :class:`EnvSpec` of an EnvAdapter (``env.env_spec``, through gymnasium wrappers).

    Raises:
        TypeError: the env carries no ``env_spec``.
    """
    try:
        return env.get_wrapper_attr("env_spec")
    except AttributeError:
        raise TypeError(
            f"env: expected an EnvAdapter with an env_spec attribute, received {type(env).__name__}"
        ) from None


def cell_problems(
    label: str, policy_spec: Any, env_label: str, env_spec: EnvSpec, executor: ExecutorConfig
) -> list[str]:
    """Why policy ``label`` cannot run on env ``env_label`` with ``executor``: the contract's
    :func:`~policylink.adapters.schema.compatibility_problems` then the executor's, each as
    ``"<policy> x <env>: <problem>"`` (one format for ``policylink run`` and ``policylink eval``)."""
    problems = compatibility_problems(policy_spec, env_spec) + executor_problems(policy_spec, executor)
    return [f"{label} x {env_label}: {p}" for p in problems]


def main(argv: Sequence[str] | None = None) -> int:
    """``policylink run --policy X --env Y --episodes N``: print each episode's result and the success rate.

    Raises:
        ValueError: missing ``--policy``/``--env``, bad counts or executor settings.
        IncompatibleSpecError: the policy, env and executor do not fit (checked before any episode runs).
        FileNotFoundError, UnknownNameError: the policy or env reference cannot be resolved.
    """
    from policylink.runtime.cli import parse_config

    cfg = parse_config(RunConfig, list(sys.argv[1:] if argv is None else argv), prog="policylink run")
    if not cfg.policy or not cfg.env:
        raise ValueError(
            f"--policy and --env: expected both (see policylink run --help), received policy={cfg.policy!r} "
            f"env={cfg.env!r}"
        )
    limit_threads(cfg.threads)
    env_fn = RegistryEnvFn(cfg.env, **cfg.env_kwargs)
    probe = env_fn()
    spec = env_spec_of(probe)
    probe.close()
    policy = load_policy_ref(cfg.policy, cfg.device, cfg.seed)
    limit_threads(cfg.threads)  # torch may have been imported by the load
    problems = cell_problems(cfg.policy, policy.spec, cfg.env, spec, cfg.executor)
    if problems:
        raise IncompatibleSpecError(problems)
    vec = make_vector_env(env_fn, plan_episodes(cfg.episodes, cfg.seed, cfg.num_envs), spec.max_episode_steps)
    executor = make_executor(policy, cfg.executor)
    recorder = None
    if cfg.record:
        from policylink.data.recorder import EpisodeRecorder

        recorder = EpisodeRecorder(cfg.record, env_spec=spec)
    try:
        results = rollout(
            vec,
            executor,
            cfg.episodes,
            recorder=recorder,
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


def _new_trace() -> dict[str, Any]:
    return {"reward": [], "done": [], "success": [], "task": ""}


def _begin(j, cur, seeds, recorder, want_video, frames, vec_env, source) -> None:
    """Open slot ``j``'s new planned episode in the recorder and grab its first frame when filmed."""
    if cur[j] < 0:
        return
    if recorder is not None:
        from policylink.data.buffer import EpisodeMeta

        recorder.start_episode(EpisodeMeta(seed=int(seeds[j]), source=source), slot=j)
    if int(cur[j]) in want_video:
        frames[j] = [_render(vec_env, j)]


def _row(batch: Mapping[str, Any], j: int) -> dict[str, Any]:
    return {k: v[j] for k, v in batch.items()}


def _success(info: Mapping[str, Any], done: np.ndarray, b: int) -> np.ndarray:
    """Per-slot ``is_success`` of this step (the final info for slots that finished and were reset)."""
    now = np.asarray(info.get("is_success", np.zeros(b, bool)), bool)
    final = info.get("final_info", {})
    if "is_success" in final:
        now = np.where(done, np.asarray(final["is_success"], bool), now)
    return now


def _render(vec_env: gym.vector.VectorEnv, j: int) -> np.ndarray:
    if isinstance(vec_env, gym.vector.SyncVectorEnv):
        frame = vec_env.envs[j].render()
    else:
        frame = vec_env.call("render")[j]
    if frame is None:
        raise ValueError(
            "video: expected env.render() to return an rgb_array frame, received None; create the "
            "env with render_mode='rgb_array'"
        )
    return np.asarray(frame, dtype=np.uint8)


class _PlannedEnvFn:
    """Picklable env constructor for vector envs (AsyncVectorEnv sends it to a subprocess)."""

    def __init__(self, env_fn: Callable[[], gym.Env], plan: Sequence[tuple[int, int]], max_episode_steps: int):
        self.env_fn, self.plan, self.max_episode_steps = env_fn, list(plan), max_episode_steps

    def __call__(self) -> gym.Env:
        return EpisodePlan(self.env_fn(), self.plan, self.max_episode_steps)
