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

OBS_MODES = ("state", "image", "state+image")


@dataclass
class RecordConfig:
    """Options of ``policylink record``.

    Attributes:
        env: registered environment name (``reach``, ``push``, ``pick_place``, ``insert``, ``multitask``...).
        expert: scripted expert quality: ``expert``, ``noisy`` or ``poor``.
        episodes: number of episodes to record.
        out: episode store path (``.zarr``); appended to when it exists.
        seed: seed of episode 0; episode ``i`` resets the env and the expert with ``seed + i``.
        obs_mode: observations to record: ``state``, ``image`` or ``state+image``.
        image_size: camera image side, pixels.
        max_steps: step cap per episode (default: the env's ``max_episode_steps``).
        zarr_format: 3 (default) or 2 for a new store.
        lock_timeout: seconds to wait when another process is writing the store (0 = fail at once).
    """

    env: str = "push"
    expert: str = "expert"
    episodes: int = 10
    out: str = "outputs/data/episodes.zarr"
    seed: int = 0
    obs_mode: str = "state"
    image_size: int = 96
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
            ``policylink.sim.experts.make_expert(env, cfg.expert, seed=cfg.seed)``).
        progress: show a tqdm bar.

    Raises:
        ValueError: bad ``obs_mode`` or ``episodes``. StoreLockedError: the store is being written.
    """
    from tqdm import tqdm

    if cfg.obs_mode not in OBS_MODES:
        raise ValueError(f"obs_mode: expected one of {OBS_MODES}, received {cfg.obs_mode!r}")
    if cfg.episodes < 1:
        raise ValueError(f"episodes: expected >= 1, received {cfg.episodes}")
    if env is None:
        from policylink.adapters.registry import make_env

        env = make_env(cfg.env, obs_mode=cfg.obs_mode, image_size=cfg.image_size)
    if expert is None:
        from policylink.sim.experts import make_expert

        expert = make_expert(env, quality=cfg.expert, seed=cfg.seed)
    from policylink.data.buffer import EpisodeStore

    store = EpisodeStore(cfg.out, "a", zarr_format=cfg.zarr_format, lock_timeout=cfg.lock_timeout)
    frames = successes = 0
    t0 = time.perf_counter()
    with EpisodeRecorder(store, env_spec=env.env_spec) as rec:
        bar = tqdm(range(cfg.episodes), desc=f"record {cfg.env}", unit="ep", disable=not progress)
        for i in bar:
            seed = cfg.seed + i
            expert.reset(seed)
            _, success, n = record_episode(
                env,
                lambda obs: expert.act(obs, env),
                rec,
                seed=seed,
                meta=EpisodeMeta(source="expert", quality=cfg.expert),
                max_steps=cfg.max_steps,
            )
            frames += n
            successes += int(success)
            bar.set_postfix(success=f"{successes / (i + 1):.2f}", frames=frames)
    store.close()
    return RecordSummary(cfg.episodes, frames, successes, time.perf_counter() - t0)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``policylink record``; prints the summary. Returns 0 on success."""
    from policylink.runtime.cli import parse_config

    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = parse_config(RecordConfig, _underscore_flags(argv), prog="policylink record")
    summary = record(cfg)
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
