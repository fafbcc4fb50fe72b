"""``policylink record``: roll a scripted expert in an environment and store the episodes in a zarr episode store.

Example::

    policylink record --env push --expert noisy --episodes 50 --out outputs/data/push.zarr --seed 0 \\
        --obs-mode state+image
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from policylink.data.buffer import EpisodeMeta
from policylink.data.recorder import EpisodeRecorder, record_episode

OBS_MODES = ("state", "image", "state+image", "image+proprio")
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
        obs_mode: observations to record: ``state``, ``image``, ``state+image`` or ``image+proprio`` (frames
            plus the robot's own state only). The expert always acts on the full state.
        image_size: camera image side, pixels.
        dart_noise: DART noise injection (Laskey et al. 2017): when > 0, each executed action is the expert's
            action plus Gaussian noise with this std, as a fraction of each dimension's half range (clipped to
            the limits), while the recorded action is the expert's clean one: demos that show how to recover
            from small deviations. 0 (default) executes the recorded action. Must be in [0, 1].
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
    max_steps: int | None = None
    zarr_format: int = 3
    lock_timeout: float = 0.0


@dataclass(frozen=True)
class RecordSummary:
    """What a recording run produced: episodes, frames (steps), successes and frames per second."""

    episodes: int
    frames: int
    successes: int
    seconds: float

    @property
    def success_rate(self) -> float:
        """Fraction of recorded episodes with ``info["is_success"]``."""
        return self.successes / self.episodes if self.episodes else 0.0

    def __str__(self) -> str:
        fps = self.frames / self.seconds if self.seconds > 0 else float("nan")
        return (
            f"recorded {self.episodes} episodes, {self.frames} frames, success rate "
            f"{self.success_rate:.2f} ({self.successes}/{self.episodes}), {fps:.0f} frames/s"
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
        ValueError: bad ``obs_mode``, ``expert``, ``episodes``, ``max_steps`` or ``seed``.
        StoreLockedError: the store is being written. RecordInterrupted: Ctrl-C (complete episodes are kept).
    """
    from tqdm import tqdm

    _validate(cfg)
    if env is None:
        from policylink.adapters.registry import make_env

        env = make_env(cfg.env, obs_mode=cfg.obs_mode, image_size=cfg.image_size)
    from policylink.data.buffer import EpisodeStore

    store = EpisodeStore(cfg.out, "a", zarr_format=cfg.zarr_format, lock_timeout=cfg.lock_timeout)
    done = frames = successes = 0
    t0 = time.perf_counter()
    try:
        first = _first_seed(store, cfg.seed, cfg.episodes)
        quality = cfg.expert + (f"+dart{cfg.dart_noise:g}" if cfg.dart_noise > 0 else "")
        if expert is None:
            from policylink.sim.experts import make_expert

            expert = make_expert(env, quality=cfg.expert, seed=first)
        execute = _dart_execute(env, cfg.dart_noise, first) if cfg.dart_noise > 0 else None
        with EpisodeRecorder(store, env_spec=env.env_spec) as rec:
            bar = tqdm(range(cfg.episodes), desc=f"record {cfg.env}", unit="ep", disable=not progress)
            for i in bar:
                seed = first + i
                expert.reset(seed)
                _, success, n = record_episode(
                    env,
                    lambda obs: expert.act(_expert_observation(env, obs), env),
                    rec,
                    seed=seed,
                    meta=EpisodeMeta(source="expert", quality=quality),
                    max_steps=cfg.max_steps,
                    execute=execute,
                )
                done, frames, successes = done + 1, frames + n, successes + int(success)
                bar.set_postfix(success=f"{successes / done:.2f}", frames=frames)
    except KeyboardInterrupt:
        summary = RecordSummary(done, frames, successes, time.perf_counter() - t0)
        raise RecordInterrupted(summary, cfg.out) from None
    finally:
        store.close()
    return RecordSummary(cfg.episodes, frames, successes, time.perf_counter() - t0)


def _expert_observation(env: Any, obs: dict[str, Any]) -> dict[str, Any]:
    """What the scripted expert reads: ``obs`` with ``observation.state`` set to the env's full
    ``privileged_state()`` when it has one (so the expert acts alike in every observation mode)."""
    from policylink.adapters.schema import STATE_KEY

    base = getattr(env, "unwrapped", env)
    return {**obs, STATE_KEY: base.privileged_state()} if hasattr(base, "privileged_state") else obs


def _dart_execute(env: Any, noise: float, seed: int) -> Any:
    """``execute(action)`` for :func:`record_episode`: the action plus Gaussian noise of ``noise`` x half range
    (one generator seeded with ``seed`` for the run), clipped to the ActionSpec's limits. float32 ``(A,)``.

    Raises:
        ValueError: the action limits are not finite."""
    import numpy as np

    spec = env.unwrapped.env_spec.action
    low, high = spec.low_array, spec.high_array
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
        raise ValueError(f"dart_noise: expected an action space with finite limits, received low={low} high={high}")
    rng = np.random.default_rng(seed)

    def execute(action: Any) -> Any:
        noisy = action + rng.normal(0.0, noise, action.shape) * (high - low) / 2.0
        return np.clip(noisy, low, high).astype(np.float32)

    return execute


def _validate(cfg: RecordConfig) -> None:
    """Raise ValueError naming the first bad field of ``cfg`` (expected vs received)."""
    if cfg.obs_mode not in OBS_MODES:
        raise ValueError(f"obs_mode: expected one of {', '.join(OBS_MODES)}, received {cfg.obs_mode!r}")
    if cfg.expert not in EXPERTS:
        raise ValueError(f"expert: expected one of {', '.join(EXPERTS)}, received {cfg.expert!r}")
    if cfg.episodes < 1:
        raise ValueError(f"episodes: expected an int >= 1, received {cfg.episodes}")
    if not 0.0 <= cfg.dart_noise <= 1.0:
        raise ValueError(f"dart_noise: expected a value in [0, 1], received {cfg.dart_noise}")
    if cfg.max_steps is not None and cfg.max_steps < 1:
        raise ValueError(f"max_steps: expected an int >= 1 (or omit it for the env's limit), received {cfg.max_steps}")
    if cfg.seed is not None and cfg.seed < 0:
        raise ValueError(f"seed: expected an int >= 0 (or omit it to continue the store), received {cfg.seed}")


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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``policylink record``; prints the summary. Returns 0 on success."""
    from policylink.runtime.cli import parse_config

    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = parse_config(RecordConfig, _underscore_flags(argv), prog="policylink record")
    try:
        summary = record(cfg)
    except RecordInterrupted as e:
        print(f"\n{e}", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    print(f"{summary} -> {cfg.out}")
    return 0


def _underscore_flags(argv: list[str]) -> list[str]:
    """``--obs-mode x`` -> ``--obs_mode x`` (dashed spellings of the config's field names)."""
    out = []
    for a in argv:
        if a.startswith("--") and a != "--":
            name, eq, value = a[2:].partition("=")
            a = "--" + name.replace("-", "_") + eq + value
        out.append(a)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
