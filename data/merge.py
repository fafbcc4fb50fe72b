"""Merging episode stores: :func:`merge` concatenates stores with identical features into a new store, written
beside the output and renamed into place only when complete (inputs are never modified; a killed merge leaves no
partial output). ``policylink dataset merge`` and the learning loop's replay buffer use it."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from policylink.data.buffer import DONE_KEY, REWARD_KEY, EpisodeDataError, EpisodeStore, StoreLockedError
from policylink.data.lock import WriteLock, remove_stale_temporaries


@dataclass
class MergeConfig:
    """``policylink dataset merge --inputs A,B --out C``: concatenate stores with identical features into a new
    store (written next to ``out`` and renamed into place only when complete; inputs are never modified).

    Attributes:
        inputs: episode stores to concatenate, in order; none may be ``out``.
        out: the merged store; must not exist unless ``overwrite``.
        zarr_format: 3 (default) or 2.
        only_success: keep only the episodes whose success flag is True.
        overwrite: replace an existing episode store at ``out``.
    """

    inputs: list[str] = field(default_factory=list)
    out: str = ""
    zarr_format: int = 3
    only_success: bool = False
    overwrite: bool = False


def merge(cfg: MergeConfig) -> int:
    """Concatenate ``cfg.inputs`` (episodes and metadata, in order) into a new store ``cfg.out``.

    The output is written to ``.<out>.merging-<pid>`` beside ``out`` and renamed into place at the end, so a
    failed merge leaves no partial output (and an overwritten store stays intact until then).

    Raises:
        ValueError: no input, no ``out``, ``out`` is one of the inputs, or ``out`` exists without
            ``overwrite``. EpisodeDataError: an input's features differ from the first's (names the feature).
        StoreError / FileNotFoundError: an input (or the store to overwrite) is not an episode store.
    """
    from tqdm import tqdm

    if not cfg.inputs:
        raise ValueError("inputs: expected at least one store path, received none")
    if not cfg.out:
        raise ValueError("out: expected a path, received none (pass --out ...)")
    out = Path(cfg.out)
    for p in remove_stale_temporaries(out, ("merging", "replaced"), restore="replaced"):  # of a killed merge
        print(f"cleaned up {p.name} (left by a killed merge)", file=sys.stderr)
    for p in cfg.inputs:
        if Path(p).resolve() == out.resolve():
            raise ValueError(
                f"out: expected a path that is not one of the inputs, received {cfg.out!r} (also an input)"
            )
    if out.exists():
        if not cfg.overwrite:
            raise ValueError(f"out: {cfg.out!r} already exists; pass --overwrite true to replace it")
        EpisodeStore(out).close()  # only ever replace an episode store (StoreError otherwise)
    sources = [EpisodeStore(p) for p in cfg.inputs]
    _check_same_features(sources)
    lock = WriteLock(out)  # no other writer may touch out meanwhile
    try:
        lock.acquire(timeout=0)
    except TimeoutError as e:
        raise StoreLockedError(f"{out}: being written by {e}; cannot merge into it now") from None
    tmp, old = (out.with_name(f".{out.name}.{tag}-{os.getpid()}") for tag in ("merging", "replaced"))
    kept = 0
    try:
        with EpisodeStore(tmp, "w", zarr_format=cfg.zarr_format) as dst:
            if sources[0].info:
                dst.update_info(**sources[0].info)
            for src in sources:
                for i in tqdm(range(src.n_episodes), desc=f"merge {src.path.name}", unit="ep"):
                    meta = src.episode_meta(i)
                    if cfg.only_success and meta.success is not True:
                        continue
                    dst.add_episode(src.get_episode(i), meta)
                    kept += 1
            total = dst.n_steps
        if out.exists():
            os.replace(out, old)
        os.replace(tmp, out)
    finally:
        lock.release()
        for p in (tmp, old):
            shutil.rmtree(p, ignore_errors=True)
        for p in (tmp.with_name(tmp.name + ".lock"), tmp.with_name(tmp.name + ".lock.owner")):
            p.unlink(missing_ok=True)
    print(f"merged {kept} episodes ({total} steps) from {len(sources)} stores -> {cfg.out}")
    return 0


def _check_same_features(stores: Sequence) -> None:
    """Raise one EpisodeDataError naming the first feature (key, per-step shape or dtype) where a store differs
    from the first store (``reward``/``done`` may be absent: they default per episode)."""
    ref = stores[0]
    for s in stores[1:]:
        if not s.n_episodes or not ref.n_episodes:
            continue
        a, b = set(ref.keys) - {REWARD_KEY, DONE_KEY}, set(s.keys) - {REWARD_KEY, DONE_KEY}
        for k in sorted(a ^ b):
            have, lacks = (ref, s) if k in a else (s, ref)
            raise EpisodeDataError(
                f"inputs: feature {k!r} is in {have.path} but not in {lacks.path}; merge needs identical features"
            )
        for k in sorted(set(ref.keys) & set(s.keys)):
            want = (ref.feature_shape(k), ref.feature_dtype(k))
            got = (s.feature_shape(k), s.feature_dtype(k))
            if want != got:
                raise EpisodeDataError(
                    f"inputs: feature {k!r} is (per-step shape {want[0]}, dtype {want[1]}) in {ref.path} but "
                    f"(per-step shape {got[0]}, dtype {got[1]}) in {s.path}; merge needs identical features"
                )


__all__ = ["MergeConfig", "merge"]
