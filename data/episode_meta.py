"""Per-episode metadata (:class:`EpisodeMeta`) and how the episode store codes it as integers.

Each field is one int per episode in ``meta/episode_<field>`` (:data:`META_ARRAYS` gives the dtype and the fill
value that means unknown): ``success`` 1 / 0 / -1, ``seed`` or -1, and the strings ``task``, ``source``,
``quality`` and ``gap`` as indices into a vocabulary (field -> list of words, :data:`STRING_FIELDS`) kept in the
store's root attributes. A code of -1, or one outside the vocabulary, reads as unknown, so a store without these arrays
(diffusion_policy's) reads as all unknown. The store itself is :class:`policylink.data.buffer.EpisodeStore`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

SOURCES = ("expert", "policy", "human", "unknown")
STRING_FIELDS = ("task", "source", "quality", "gap")
META_ARRAYS = {  # name -> (dtype, fill meaning "unknown")
    "episode_success": ("int8", -1),
    "episode_seed": ("int64", -1),
    "episode_task": ("int32", -1),
    "episode_source": ("int32", -1),
    "episode_quality": ("int32", -1),
    "episode_gap": ("int32", -1),
}


@dataclass(frozen=True)
class EpisodeMeta:
    """Per-episode metadata.

    Attributes:
        task: language instruction (``""`` for single-task envs).
        success: whether the episode succeeded (``info["is_success"]``), or None when unknown.
        seed: the env reset seed, or None.
        source: who acted: ``"expert"`` (scripted), ``"policy"`` (rollout), ``"human"`` (teleop) or
            ``"unknown"``.
        quality: free-form quality tag (``"expert"``, ``"noisy"``, ``"poor"``, a checkpoint name...).
        gap: the reality-gap parameters the episode ran under, as JSON (the env's reset info
            ``"reality_gap"``: :meth:`policylink.sim.mujoco.gap.RealityGap.to_json`), ``""`` for none or unknown.
    """

    task: str = ""
    success: bool | None = None
    seed: int | None = None
    source: str = "unknown"
    quality: str = ""
    gap: str = ""

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"EpisodeMeta.source: expected one of {SOURCES}, received {self.source!r}")
        if self.seed is not None and int(self.seed) < 0:
            raise ValueError(f"EpisodeMeta.seed: expected a non-negative int or None, received {self.seed}")


def read_vocab(attrs: Mapping[str, Any]) -> dict[str, list[str]]:
    """The vocabulary, field -> words, from the store's ``policylink`` root attributes (a missing field reads as
    no words)."""
    vocab = dict(attrs.get("vocab", {}))
    return {f: list(vocab.get(f, [])) for f in STRING_FIELDS}


def encode_meta(meta: EpisodeMeta, vocab_index: Callable[[str, str], int]) -> dict[str, int]:
    """The int code of each ``meta/episode_*`` array for ``meta``.

    Args:
        meta: the episode's metadata.
        vocab_index: ``(field, word) -> index`` in the store's vocabulary, adding the word when it is new.

    Returns:
        array name (every key of :data:`META_ARRAYS`) -> code, -1 for unknown success or seed.
    """
    return {
        "episode_success": -1 if meta.success is None else int(meta.success),
        "episode_seed": -1 if meta.seed is None else int(meta.seed),
        **{f"episode_{f}": vocab_index(f, getattr(meta, f)) for f in STRING_FIELDS},
    }


def decode_meta(codes: Mapping[str, int], vocab: Mapping[str, Sequence[str]]) -> EpisodeMeta:
    """Inverse of :func:`encode_meta`: ``codes`` by array name (-1, or an index outside ``vocab``, reads as
    unknown: ``success``/``seed`` None, ``task``/``quality`` ``""``, ``source`` ``"unknown"``)."""

    def word(field: str, default: str) -> str:
        j = codes[f"episode_{field}"]
        return vocab[field][j] if 0 <= j < len(vocab[field]) else default

    return EpisodeMeta(
        task=word("task", ""),
        success=None if codes["episode_success"] < 0 else bool(codes["episode_success"]),
        seed=None if codes["episode_seed"] < 0 else codes["episode_seed"],
        source=word("source", "unknown"),
        quality=word("quality", ""),
        gap=word("gap", ""),
    )


def append_meta_codes(group: Any, arrays: dict[str, Any], n: int, codes: Mapping[str, int]) -> None:
    """Write episode ``n``'s ``codes`` (from :func:`encode_meta`) as row ``n`` of the ``meta/episode_*`` arrays.

    Args:
        group: the store's zarr ``meta`` group.
        arrays: its arrays by name, updated in place with any array created here.
        n: the episode's index (the number of committed episodes before it); every array grows to ``n + 1`` rows.
        codes: array name -> int code.

    An array missing from ``arrays`` (a foreign store gaining metadata) is created with its unknown fill
    (:data:`META_ARRAYS`) written for the ``n`` earlier episodes.
    """
    for name, value in codes.items():
        if name not in arrays:
            dtype, fill = META_ARRAYS[name]
            arrays[name] = group.create_array(name, shape=(0,), chunks=(4096,), dtype=dtype, fill_value=fill)
            if n:  # foreign store gaining metadata: earlier episodes are unknown
                arrays[name].resize((n,))
                arrays[name][:] = np.full(n, fill, dtype=dtype)
        arr = arrays[name]
        arr.resize((n + 1,))
        arr[n] = value


__all__ = [
    "META_ARRAYS",
    "SOURCES",
    "STRING_FIELDS",
    "EpisodeMeta",
    "append_meta_codes",
    "decode_meta",
    "encode_meta",
    "read_vocab",
]
