"""``policylink record``: roll a scripted expert in an environment and store the episodes in a zarr episode store.

Example::

    policylink record --env push --expert noisy --episodes 50 --out outputs/data/push.zarr --seed 0 \\
        --obs-mode state+image
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from policylink.adapters.obs_modes import check_obs_mode, obs_mode_env_kwargs
from policylink.adapters.schema import FAULT_INFO
from policylink.data.episode_meta import EpisodeMeta
from policylink.data.recorder import EpisodeRecorder
from policylink.runtime.rollout import (
    BorrowedEnv,
    EpisodeResult,
    EpisodeSubscriber,
    RecorderSubscriber,
    make_vector_env,
    rollout,
)

EXPERTS = ("expert", "noisy", "poor")
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, as a shell reports Ctrl-C


class RecordInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`record`; ``summary`` counts the complete episodes kept in the store (the episode in
    progress is discarded)."""

    def __init__(self, summary: RecordSummary, path: str):
        super().__init__(f"interrupted: kept {summary.episodes} complete episodes in {path}")
        self.summary = summary
        self.path = path


@dataclass
class RecordConfig:
    """Options of ``policylink record``.

    Attributes:
        env: registered environment name (``reach``, ``push``, ``pick_place``, ``insert``, ``multitask``...).
        expert: scripted expert quality: ``expert``, ``noisy`` or ``poor``.
        episodes: number of episodes to record (>= 1).
        out: episode store path (``.zarr``); appended to when it exists.
        seed: seed of the first episode; episode ``i`` resets the env and the expert with ``seed + i``. Default
            (None): 0 for a new store, and one past the highest recorded seed when appending, so a re-run adds
            new episodes instead of repeating seeds. An explicit seed that repeats recorded ones is warned about.
        obs_mode: observations to record: ``state``, ``image``, ``state+image``, ``image+proprio`` (frames
            plus the robot's own state only), ``pointmap+proprio`` or ``image+pointmap+proprio`` (robot-frame
            pointmaps per camera, metres). The expert always acts on the full state.
        image_size: camera image side, pixels.
        dart_noise: DART noise injection (Laskey et al. 2017): when > 0, each executed action is the expert's
            action plus Gaussian noise with this std, as a fraction of each dimension's half range (clipped to
            the limits), while the recorded action is the expert's clean one: demos that show how to recover
            from small deviations. 0 (default) executes the recorded action. Must be in [0, 1].
        perturbation: mid-episode perturbations of a MuJoCo task while recording, as fields of
            ``PerturbationConfig`` (e.g. ``{displacement: 0.03, force: 2.0}``): the scripted expert reads the true
            state every step and recovers, so the demos show recoveries from displaced objects. None: none. Fields:
            ``action_noise_std``, ``action_delay_steps``, ``displacement`` (m), ``displacement_steps`` (default
            ``[10, 30]``), ``force`` (N), ``force_probability`` (default 0.05 per step), ``force_duration_steps``.
        gap: a reality gap of a MuJoCo task (:mod:`policylink.sim.mujoco.gap`): a preset name (``worn_gantry``...)
            or a YAML file; each episode's drawn parameters go into its metadata (``EpisodeMeta.gap``). The
            expert reads the true state and acts through the gap's dynamics. An episode whose physics diverges
            (the env's ``info["fault"]``) is left out of the store, counted in the summary and its seed printed
            (:class:`DemoRecorderSubscriber`). None: the nominal simulator.
        randomize: with ``gap``, domain randomisation: each episode draws every gap parameter uniformly between
            its nominal value and ``nominal + randomize * (value - nominal)`` (0: the gap's values as they are).
        max_steps: step cap per episode, >= 1 (default None: the env's ``max_episode_steps``).
        zarr_format: 3 (default) or 2 for a new store.
        lock_timeout: seconds to wait when another process is writing the store (0 = fail at once).
    """

    env: str = "push"
    expert: str = "expert"
    episodes: int = 10
    out: str = "outputs/data/episodes.zarr"
    seed: int | None = None
    obs_mode: str = "state"
    image_size: int = 96
    dart_noise: float = 0.0
    perturbation: dict[str, Any] | None = None
    gap: str | None = None
    randomize: float = 0.0
    max_steps: int | None = None
    zarr_format: int = 3
    lock_timeout: float = 0.0


@dataclass(frozen=True)
class RecordSummary:
    """What a recording run produced: episodes kept, frames (steps), successes, seconds, and the episodes left out
    because their physics diverged (``faulted``: the env's step info carried ``"fault"``; see
    :class:`DemoRecorderSubscriber`)."""

    episodes: int
    frames: int
    successes: int
    seconds: float
    faulted: int = 0

    @property
    def success_rate(self) -> float:
        """Fraction of recorded episodes with ``info["is_success"]``."""
        return self.successes / self.episodes if self.episodes else 0.0

    def __str__(self) -> str:
        fps = self.frames / self.seconds if self.seconds > 0 else float("nan")
        left_out = f", {self.faulted} left out (physics diverged)" if self.faulted else ""
        return (
            f"recorded {self.episodes} episodes, {self.frames} frames, success rate "
            f"{self.success_rate:.2f} ({self.successes}/{self.episodes}), {fps:.0f} frames/s{left_out}"
        )


def record(cfg: RecordConfig, env: Any = None, expert: Any = None, progress: bool = True) -> RecordSummary:
    """Record ``cfg.episodes`` expert episodes into ``cfg.out``.

    Args:
        cfg: the options.
        env: an already built EnvAdapter (default: ``make_env(cfg.env, obs_mode=..., image_size=...)``).
        expert: an object with ``reset(seed)`` and ``act(obs, env) -> float32 (A,)`` (default:
            ``policylink.sim.experts.make_expert(env, cfg.expert, seed=<first seed>)``).
        progress: show a tqdm bar.

    Raises:
        UnknownNameError: ``cfg.env`` is no registered environment (when ``env`` is None).
        ValueError: bad ``obs_mode``, ``expert``, ``episodes``, ``max_steps`` or ``seed``.
        StoreLockedError: the store is being written. RecordInterrupted: Ctrl-C (complete episodes are kept).
    """
    from tqdm import tqdm

    from policylink.adapters.registry import check_env_name

    if env is None:
        check_env_name(cfg.env, "env")
    _validate(cfg)
    if env is None:
        from policylink.adapters.registry import make_env

        extra = {"perturbation": cfg.perturbation} if cfg.perturbation is not None else {}
        if cfg.gap is not None:
            extra["gap"] = {"base": cfg.gap, "randomize": cfg.randomize} if cfg.randomize else cfg.gap
        env = make_env(cfg.env, **obs_mode_env_kwargs(cfg.obs_mode, cfg.image_size), **extra)
    from policylink.data.buffer import EpisodeStore

    store = EpisodeStore(cfg.out, "a", zarr_format=cfg.zarr_format, lock_timeout=cfg.lock_timeout)
    counts = {"episodes": 0, "frames": 0, "successes": 0, "faulted": 0}
    recording = None
    t0 = time.perf_counter()
    try:
        first = _first_seed(store, cfg.seed, cfg.episodes)
        quality = cfg.expert + (f"+dart{cfg.dart_noise:g}" if cfg.dart_noise > 0 else "")
        quality += "+perturbed" if _perturbed(cfg) else ""
        if expert is None:
            from policylink.sim.experts import make_expert

            expert = make_expert(env, quality=cfg.expert, seed=first)
        perturb = _dart_perturb(env, cfg.dart_noise, first) if cfg.dart_noise > 0 else None
        bar = tqdm(total=cfg.episodes, desc=f"record {cfg.env}", unit="ep", disable=not progress)
        with EpisodeRecorder(store, env_spec=env.env_spec) as rec, bar:
            recording = DemoRecorderSubscriber(rec, EpisodeMeta(source="expert", quality=quality))

            def count(result: EpisodeResult) -> None:
                bar.update(1)
                if result.index in recording.faulted:
                    counts["faulted"] += 1
                    return
                _, success, n = recording.committed[result.index]
                counts["episodes"] += 1
                counts["frames"] += n
                counts["successes"] += int(success)
                bar.set_postfix(success=f"{counts['successes'] / counts['episodes']:.2f}", frames=counts["frames"])

            source = ScriptedSource([_expert_act(expert, env)], [expert.reset])
            seeds = range(first, first + cfg.episodes)
            record_episodes(env, source, recording, seeds, cfg.max_steps, perturb, count)
    except KeyboardInterrupt:
        summary = _summary(counts, t0)
        raise RecordInterrupted(summary, cfg.out) from None
    finally:
        store.close()
        if recording is not None and recording.faulted:
            _report_faulted(recording.faulted, cfg.out)
    return _summary(counts, t0)


def _summary(counts: Mapping[str, int], t0: float) -> RecordSummary:
    """The :class:`RecordSummary` of the counts so far (``t0``: ``time.perf_counter()`` at the start)."""
    c = counts
    return RecordSummary(c["episodes"], c["frames"], c["successes"], time.perf_counter() - t0, c["faulted"])


def _report_faulted(faulted: Mapping[int, tuple[int, str]], out: str) -> None:
    """Say on stderr which episodes were left out of ``out`` because their physics diverged (seed and reason)."""
    seeds = [seed for seed, _ in (faulted[i] for i in sorted(faulted))]
    first = faulted[min(faulted)][1]
    print(
        f"record: left {len(faulted)} episode(s) out of {out}: physics diverged (seeds {seeds}; first: {first})",
        file=sys.stderr,
    )


class DemoRecorderSubscriber(RecorderSubscriber):
    """A :class:`~policylink.runtime.rollout.RecorderSubscriber` for demonstrations: an episode that ends on
    diverged physics (its step info carries ``"fault"``, as a gapped MuJoCo task's does:
    :func:`policylink.sim.mujoco.gap_runtime.physics_fault`) is not kept as a demonstration: it is left out of
    the store (nothing of it is written) and listed in ``faulted``. Under ``worn_gantry`` ~7% of the expert's lifts
    diverge and fling the cube to 1e2-1e7 m; one such frame sets the min-max normaliser's range of the object
    entries for the whole store.

    Attributes:
        faulted: ``{episode index: (reset seed, fault message)}`` of the episodes left out.
        committed: as the base class: the episodes written.
    """

    def __init__(self, recorder: Any, meta: Any = None):
        super().__init__(recorder, meta)
        self.faulted: dict[int, tuple[int, str]] = {}
        self._fault: dict[int, str] = {}

    def on_reset(self, slot: int, index: int, seed: int, info: Mapping[str, Any]) -> None:
        """As the base class; the slot's fault is cleared."""
        self._fault.pop(slot, None)
        super().on_reset(slot, index, seed, info)

    def on_step(self, slot, obs, action, reward, done, info) -> None:
        """As the base class; a step info's ``"fault"`` marks the episode."""
        super().on_step(slot, obs, action, reward, done, info)
        if info.get(FAULT_INFO):
            self._fault[slot] = str(info[FAULT_INFO])

    def on_episode_end(self, slot: int, result: EpisodeResult) -> None:
        """Commit the episode, or discard it when it faulted (listed in ``faulted``)."""
        fault = self._fault.pop(slot, None)
        if fault is None:
            super().on_episode_end(slot, result)
            return
        self.on_abort(slot)
        self.faulted[result.index] = (result.seed, fault)


class ScriptedSource(EpisodeSubscriber):
    """An :class:`~policylink.runtime.rollout.ActionSource` from per-row step functions (a scripted expert, a
    hand-written controller): row ``j`` acts with ``acts[j](obs) -> float32 (A,)`` on its own observation
    (arrays without batch dim), and ``resets[j](seed)`` is called when a planned episode starts there (pass the
    source to the loop among its subscribers too, so it hears the resets).

    Args:
        acts: one step function per vector-env slot (``B`` of them).
        resets: optional, one ``reset(seed)`` per slot (an expert's, which reseeds its own noise).

    Raises:
        ValueError: ``resets`` is given with another length than ``acts``; the batch has another size than ``B``.
    """

    def __init__(self, acts: Sequence[Callable[[Mapping[str, Any]], Any]], resets: Sequence[Callable] | None = None):
        if resets is not None and len(resets) != len(acts):
            raise ValueError(f"resets: expected one per step function ({len(acts)}), received {len(resets)}")
        self.acts, self.resets = list(acts), None if resets is None else list(resets)
        self.inferences = np.zeros(len(self.acts), np.int64)
        self.stall_steps = np.zeros(len(self.acts), np.int64)

    def act(self, obs_batch: Mapping[str, Any]) -> np.ndarray:
        """float32 ``(B, A)``: each row's step function on its observation."""
        from policylink.adapters.validation import batch_size_of

        b = batch_size_of(obs_batch)
        if b != len(self.acts):
            raise ValueError(f"observation batch size: expected {len(self.acts)} (one per step function), received {b}")
        return np.stack(
            [np.asarray(f({k: v[j] for k, v in obs_batch.items()}), np.float32) for j, f in enumerate(self.acts)]
        )

    def reset(self, env_ids: Sequence[int] | None = None) -> None:
        """Nothing to clear (the step functions are reset with their episode's seed in :meth:`on_reset`)."""

    def on_reset(self, slot: int, index: int, seed: int, info: Mapping[str, Any]) -> None:
        """``resets[slot](seed)`` for the episode starting in ``slot``."""
        if self.resets is not None:
            self.resets[slot](None if seed < 0 else seed)


def record_episodes(
    env: Any,
    source: ScriptedSource,
    recording: RecorderSubscriber,
    seeds: Sequence[int | None],
    max_steps: int | None = None,
    perturb: Callable[[np.ndarray], np.ndarray] | None = None,
    progress: Callable[[EpisodeResult], None] | None = None,
) -> dict[int, tuple[int, bool, int]]:
    """Record one episode per reset seed in ``seeds`` (episode ``i`` resets with ``seeds[i]``; None = unseeded)
    in the caller's ``env`` (left open) with ``source`` acting, through the rollout loop; returns
    ``recording.committed`` (``{i: (store index, success, n_steps)}``). ``max_steps`` caps each episode (None:
    the env's limit); ``perturb`` and ``progress`` are the loop's. An exception discards the unfinished episode
    and propagates."""
    plan = [list(enumerate(seeds))]
    vec = make_vector_env(lambda: BorrowedEnv(env), plan, max_steps)
    try:
        rollout(vec, source, len(plan[0]), subscribers=[source, recording], progress=progress, perturb=perturb)
    finally:
        vec.close()
    return recording.committed


def record_episode(
    env: Any,
    act: Callable[[Mapping[str, Any]], Any],
    recorder: EpisodeRecorder,
    *,
    seed: int | None = None,
    meta: EpisodeMeta | None = None,
    max_steps: int | None = None,
    execute: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[int, bool, int]:
    """Run one episode of ``env`` with ``act(obs) -> action (A,)`` and commit it (through the rollout loop).

    Args:
        env: an EnvAdapter (gymnasium API, ``info["is_success"]``); it stays open.
        act: callable from the current observation dict to a float32 action ``(A,)``.
        recorder: where the episode goes (recorder slot 0).
        seed: env reset seed (recorded in the metadata).
        meta: source / quality / task tags (its ``seed`` is replaced by ``seed``).
        max_steps: step cap, >= 1 (default None: ``env.env_spec.max_episode_steps``).
        execute: optional ``execute(action) -> action (A,)``: the action sent to the env, while ``act``'s
            action is the one recorded (DART noise injection, Laskey et al. 2017, "DART: Noise Injection for
            Robust Imitation Learning": the demonstrator's clean action is the label of a state reached by
            perturbed execution). Default None: the recorded action is executed.

    Returns:
        ``(episode_index, success, n_steps)``; success is True if ``info["is_success"]`` was ever True.
        An exception inside the loop aborts the episode (nothing is stored) and propagates.

    Raises:
        ValueError: ``max_steps`` < 1.
    """
    if max_steps is not None and int(max_steps) < 1:
        raise ValueError(f"max_steps: expected an int >= 1 or None (the env's limit), received {max_steps}")
    recording = RecorderSubscriber(recorder, meta or EpisodeMeta())
    perturb = None if execute is None else (lambda a: np.stack([execute(row) for row in a]))
    record_episodes(env, ScriptedSource([act]), recording, [seed], max_steps, perturb)
    return recording.committed[0]


def _expert_act(expert: Any, env: Any) -> Callable[[Mapping[str, Any]], Any]:
    """The expert's step function: ``expert.act(obs with the privileged state, env)``."""
    return lambda obs: expert.act(_expert_observation(env, dict(obs)), env)


def _expert_observation(env: Any, obs: dict[str, Any]) -> dict[str, Any]:
    """What the scripted expert reads: ``obs`` with ``observation.state`` set to the env's full
    ``privileged_state()`` when it has one (so the expert acts alike in every observation mode)."""
    from policylink.adapters.schema import STATE_KEY

    base = getattr(env, "unwrapped", env)
    return {**obs, STATE_KEY: base.privileged_state()} if hasattr(base, "privileged_state") else obs


def _dart_perturb(env: Any, noise: float, seed: int) -> Callable[[np.ndarray], np.ndarray]:
    """``perturb(actions)`` for the loop: float32 ``(B, A)`` actions plus Gaussian noise of ``noise`` x half range
    (one generator seeded with ``seed`` for the run), clipped to the ActionSpec's limits.

    Raises:
        ValueError: the action limits are not finite."""
    spec = env.unwrapped.env_spec.action
    low, high = spec.low_array, spec.high_array
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
        raise ValueError(f"dart_noise: expected an action space with finite limits, received low={low} high={high}")
    rng = np.random.default_rng(seed)

    def perturb(action: np.ndarray) -> np.ndarray:
        noisy = action + rng.normal(0.0, noise, action.shape) * (high - low) / 2.0
        return np.clip(noisy, low, high).astype(np.float32)

    return perturb


def _validate(cfg: RecordConfig) -> None:
    """Raise ValueError naming the first bad field of ``cfg`` (expected vs received; an unknown ``expert`` quality is
    an UnknownNameError, a ValueError too, that names the closest one)."""
    from policylink.adapters.registry import UnknownNameError, unknown_name_message

    check_obs_mode(cfg.obs_mode)
    if cfg.expert not in EXPERTS:
        raise UnknownNameError(unknown_name_message("expert", cfg.expert, EXPERTS))
    if cfg.episodes < 1:
        raise ValueError(f"episodes: expected an int >= 1, received {cfg.episodes}")
    if not 0.0 <= cfg.dart_noise <= 1.0:
        raise ValueError(f"dart_noise: expected a value in [0, 1], received {cfg.dart_noise}")
    if cfg.max_steps is not None and cfg.max_steps < 1:
        raise ValueError(f"max_steps: expected an int >= 1 (or omit it for the env's limit), received {cfg.max_steps}")
    if cfg.randomize and cfg.gap is None:
        raise ValueError(f"randomize: expected a gap to randomise (--gap NAME), received randomize={cfg.randomize}")
    if cfg.seed is not None and cfg.seed < 0:
        raise ValueError(f"seed: expected an int >= 0 (or omit it to continue the store), received {cfg.seed}")
    _check_perturbation(cfg)


def _check_perturbation(cfg: RecordConfig) -> None:
    """Check ``cfg.perturbation`` as ``make_env`` checks the env kwarg it becomes: against the env's kwargs config
    when it has one, then by :class:`PerturbationConfig` itself.

    Raises:
        EnvKwargsError: one line naming the env, the field path (``perturbation.force``), expected and received.
    """
    from policylink.adapters.registry import EnvKwargsError, UnknownNameError, check_env_kwargs

    if cfg.perturbation is None:
        return
    try:
        check_env_kwargs(cfg.env, {"perturbation": cfg.perturbation})
    except UnknownNameError as e:
        if str(e).startswith(f"{cfg.env!r} env kwarg"):
            raise
    try:
        _perturbed(cfg)
    except ValueError as e:
        message = str(e).replace("PerturbationConfig.", "perturbation.", 1)
        raise EnvKwargsError(f"{cfg.env!r} env kwarg {message}") from None


def _perturbed(cfg: RecordConfig) -> bool:
    from policylink.sim.mujoco.perturbations import perturbation_on  # MuJoCo only when asked for

    return perturbation_on(cfg.perturbation)


def _first_seed(store: Any, seed: int | None, episodes: int) -> int:
    """Seed of the first new episode: ``seed``, or one past the highest seed recorded in ``store`` (0 when none).
    Warns on stderr when an explicit ``seed`` repeats seeds that the store already holds."""
    recorded = {m.seed for m in store.all_meta() if m.seed is not None}
    if seed is None:
        first = max(recorded) + 1 if recorded else 0
        if recorded:
            print(
                f"record: {store.path} already holds seeds up to {first - 1}; continuing from seed {first}",
                file=sys.stderr,
            )
        return first
    repeats = sorted(recorded & set(range(seed, seed + episodes)))
    if repeats:
        print(
            f"WARNING: record: {store.path} already holds {len(repeats)} of seeds {seed}..{seed + episodes - 1} "
            f"(first {repeats[0]}); those episodes will be recorded again. Omit --seed to continue after the "
            f"highest recorded seed ({max(recorded)}).",
            file=sys.stderr,
        )
    return seed
