"""LeRobot dataset v3.0 interop: export an :class:`EpisodeStore` to LeRobot's on-disk layout and import one back.

Written with pyarrow/pandas/PyAV only (LeRobot itself is not needed) and checked against ``lerobot==0.4.4``'s
``LeRobotDataset`` in the tests. The layout (LeRobot ``CODEBASE_VERSION = "v3.0"``)::

    meta/info.json                               fps, totals, path templates, features (dtype, shape, names)
    meta/stats.json                              per-feature mean/std/min/max/q01/q99/count (images (3, 1, 1))
    meta/tasks.parquet                           task string (index) -> task_index
    meta/episodes/chunk-000/file-000.parquet     one row per episode: length, tasks, data and video locations
    data/chunk-000/file-000.parquet              one row per frame: features + timestamp, frame_index, ...
    videos/<camera>/chunk-000/file-000.mp4       (video mode) all episodes of a camera, concatenated in time

Key map: our ``reward`` / ``done`` are LeRobot's ``next.reward`` / ``next.done``; every other key is shared.
Images are exported as ``image`` features (PNG bytes in the parquet; no video decoder needed to read them) or,
with ``video=True``, as ``video`` features (mp4, RGB kept). Our per-episode metadata travels in extra episode
columns ``policylink/success``, ``policylink/seed``, ``policylink/source``, ``policylink/quality``, and what LeRobot
does not record of the store's info (the ActionSpec, feature units) in ``info.json["policylink"]``.
:func:`open_lerobot` reads a LeRobot folder for training with no import step (a cached :func:`import_lerobot`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from policylink.data.buffer import DONE_KEY, REWARD_KEY, EpisodeStore
from policylink.data.episode_meta import EpisodeMeta
from policylink.data.stats import compute_stats, is_image_array
from policylink.data.video import DEFAULT_CODEC, VideoFrames, encode_video

CODEBASE_VERSION = "v3.0"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-000/file-000.parquet"
TO_LEROBOT = {REWARD_KEY: "next.reward", DONE_KEY: "next.done"}
FROM_LEROBOT = {v: k for k, v in TO_LEROBOT.items()}
DEFAULT_FEATURES = ("timestamp", "frame_index", "episode_index", "index", "task_index")
_META_PREFIX = "policylink/"
_CARRIED_INFO = ("action", "features")  # store info that info.json["policylink"] carries
_SCALAR_KEY = "scalar_features"  # info.json["policylink"]: our per-step scalars (shape ()), LeRobot's shape [1]


class LeRobotFormatError(ValueError):
    """A LeRobot dataset folder is missing a file or field, or has an unsupported version or feature."""


def export_lerobot(
    store: EpisodeStore,
    root: str | os.PathLike,
    *,
    fps: float | None = None,
    video: bool = False,
    codec: str = DEFAULT_CODEC,
    robot_type: str | None = None,
    progress: bool = False,
) -> Path:
    """Write ``store`` as a LeRobot v3.0 dataset folder at ``root``.

    Args:
        store: the episode store (every committed episode is exported).
        root: output folder; must not exist or be empty.
        fps: frame rate, Hz (default: ``store.info["fps"]``, written by the recorder).
        video: write camera features as mp4 ``video`` features instead of PNG ``image`` features.
        codec: FFmpeg encoder for ``video=True``.
        robot_type: optional ``robot_type`` in ``info.json``.
        progress: show a tqdm bar over episodes.

    Returns:
        ``root`` as a Path.

    Raises:
        LeRobotFormatError: no fps, a non-empty ``root``, an empty store, or a feature LeRobot cannot hold
            (non-image arrays with more than one dimension).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = Path(root)
    if root.exists() and any(root.iterdir()):
        raise LeRobotFormatError(f"root: expected a new or empty folder, received non-empty {str(root)!r}")
    fps = float(fps if fps is not None else store.info.get("fps", 0.0))
    if not fps > 0:
        raise LeRobotFormatError("fps: expected > 0 Hz (pass fps= or record with an env_spec), received none")
    if store.n_episodes == 0:
        raise LeRobotFormatError(f"store {str(store.path)!r}: expected at least one episode, received 0")
    keys = store.keys
    cams = [k for k in keys if is_image_array(store.array(k))]
    features = _features(store, keys, cams, video)
    metas = store.all_meta()
    tasks = list(dict.fromkeys(m.task for m in metas))
    schema = _schema(store, keys, cams, video)
    (root / "meta").mkdir(parents=True, exist_ok=True)
    data_file = root / DATA_PATH.format(chunk_index=0, file_index=0)
    data_file.parent.mkdir(parents=True, exist_ok=True)
    episodes: list[dict[str, Any]] = []
    videos: dict[str, list[np.ndarray]] = {c: [] for c in cams} if video else {}
    it: Any = range(store.n_episodes)
    if progress:
        from tqdm import tqdm

        it = tqdm(it, desc="export lerobot", unit="ep")
    with pq.ParquetWriter(str(data_file), schema) as writer:
        for i in it:
            ep, meta, sl = store.get_episode(i), metas[i], store.episode_slice(i)
            for c in videos:
                videos[c].append(ep[c])
            cols = _episode_columns(ep, keys, cams, video, sl, fps, i, tasks.index(meta.task))
            writer.write_table(pa.table({f.name: cols[f.name] for f in schema}, schema=schema))
            episodes.append(_episode_row(i, meta, sl, cams if video else [], fps))
    for c, clips in videos.items():
        features[c]["info"] = encode_video(
            np.concatenate(clips), root / VIDEO_PATH.format(video_key=c, chunk_index=0, file_index=0), fps, codec=codec
        )
    _write_meta(root, store, features, episodes, tasks, fps, robot_type, video)
    return root


def _episode_columns(
    ep: dict[str, np.ndarray], keys: list[str], cams: list[str], video: bool, sl: slice, fps: float, i: int, task: int
) -> dict[str, Any]:
    """Parquet columns of episode ``i`` (global rows ``sl``): features (PNG images unless ``video``), timestamps
    (s), frame/episode/global/task indices."""
    cols: dict[str, Any] = {}
    for k in keys:
        if k not in cams:
            cols[TO_LEROBOT.get(k, k)] = _column(ep[k])
        elif not video:
            cols[k] = [{"bytes": _png(img), "path": None} for img in ep[k]]
    frame = np.arange(sl.stop - sl.start)
    cols["timestamp"] = (frame / fps).astype(np.float32)
    cols["frame_index"], cols["episode_index"] = frame, np.full(len(frame), i)
    cols["index"], cols["task_index"] = np.arange(sl.start, sl.stop), np.full(len(frame), task)
    return cols


def _episode_row(i: int, meta: Any, sl: slice, video_cams: list[str], fps: float) -> dict[str, Any]:
    """The ``meta/episodes`` row of episode ``i``: lengths, index ranges, our metadata, video time ranges (s)."""
    row = {
        "episode_index": i,
        "tasks": [meta.task],
        "length": sl.stop - sl.start,
        "data/chunk_index": 0,
        "data/file_index": 0,
        "dataset_from_index": sl.start,
        "dataset_to_index": sl.stop,
        "meta/episodes/chunk_index": 0,
        "meta/episodes/file_index": 0,
        f"{_META_PREFIX}success": -1 if meta.success is None else int(meta.success),
        f"{_META_PREFIX}seed": -1 if meta.seed is None else int(meta.seed),
        f"{_META_PREFIX}source": meta.source,
        f"{_META_PREFIX}quality": meta.quality,
    }
    for c in video_cams:
        row.update(
            {
                f"videos/{c}/chunk_index": 0,
                f"videos/{c}/file_index": 0,
                f"videos/{c}/from_timestamp": sl.start / fps,
                f"videos/{c}/to_timestamp": sl.stop / fps,
            }
        )
    return row


def import_lerobot(
    root: str | os.PathLike,
    out: str | os.PathLike,
    *,
    zarr_format: int = 3,
    lock_timeout: float = 0.0,
    progress: bool = False,
) -> EpisodeStore:
    """Read a LeRobot v3.0 dataset folder into a new episode store at ``out`` (returned open read-only).

    ``image`` features are decoded from their PNG/JPEG bytes (or files), ``video`` features with PyAV at the
    frame ``round((from_timestamp + timestamp) * fps)``, clamped to the episode's frames. Tasks become the
    episode metadata; ``next.reward`` / ``next.done`` become ``reward`` / ``done``.

    Raises:
        LeRobotFormatError: missing ``meta/info.json`` or another version than v3.x.
        StoreLockedError: ``out`` is being written by another process.
    """
    import pandas as pd
    import pyarrow.parquet as pq

    root = Path(root)
    info_path = root / "meta" / "info.json"
    if not info_path.exists():
        raise LeRobotFormatError(f"root: expected a LeRobot dataset with meta/info.json, none in {str(root)!r}")
    info = json.loads(info_path.read_text())
    if not str(info.get("codebase_version", "")).startswith("v3"):
        raise LeRobotFormatError(
            f"info.json codebase_version: expected v3.x, received {info.get('codebase_version')!r}"
        )
    fps = float(info["fps"])
    feats = {k: v for k, v in info["features"].items() if k not in DEFAULT_FEATURES}
    episodes = pd.concat([pd.read_parquet(p) for p in sorted((root / "meta" / "episodes").glob("*/*.parquet"))])
    episodes = episodes.sort_values("episode_index").reset_index(drop=True)
    tasks_df = pd.read_parquet(root / "meta" / "tasks.parquet")
    task_of = {int(ix): str(name) for name, ix in zip(tasks_df.index, tasks_df["task_index"])}
    data = pq.ParquetDataset(str(root / "data")).read().to_pandas().sort_values("index").reset_index(drop=True)
    readers: dict[tuple[str, int, int], VideoFrames] = {}
    store = EpisodeStore(out, "w", zarr_format=zarr_format, lock_timeout=lock_timeout)
    store.update_info(
        fps=fps,
        features={
            FROM_LEROBOT.get(k, k): {
                "dtype": "uint8" if v["dtype"] in ("image", "video") else v["dtype"],
                "shape": list(v["shape"]),
                "names": _names(v),
                "unit": None,
            }
            for k, v in feats.items()
        },
        source="lerobot",
        robot_type=info.get("robot_type"),
    )
    carried = dict(info.get(_META_PREFIX.rstrip("/")) or {})  # our ActionSpec, units, env (our export)
    scalars = set(carried.pop(_SCALAR_KEY, ()))
    store.update_info(**carried)
    it: Any = episodes.iterrows()
    if progress:
        from tqdm import tqdm

        it = tqdm(it, total=len(episodes), desc="import lerobot", unit="ep")
    for _, ep in it:
        rows = data.iloc[int(ep["dataset_from_index"]) : int(ep["dataset_to_index"])]
        arrays = _episode_arrays(ep, rows, feats, root, info, fps, readers, scalars)
        meta = _episode_meta(ep, task_of, rows)
        store.add_episode(arrays, meta)
    for r in readers.values():
        r.close()
    store.close()
    return EpisodeStore(out, "r")


def is_lerobot_dataset(root: str | os.PathLike) -> bool:
    """True when ``root`` is a LeRobot dataset folder: it holds ``meta/info.json`` with a ``codebase_version``."""
    info = Path(root) / "meta" / "info.json"
    try:
        return info.is_file() and "codebase_version" in json.loads(info.read_text())
    except (OSError, ValueError):
        return False


def open_lerobot(root: str | os.PathLike, cache: str | os.PathLike | None = None) -> EpisodeStore:
    """A LeRobot v3.0 dataset folder as an episode store (read-only), for training straight from it: read once with
    :func:`import_lerobot` into a cache store keyed by the folder's path, file sizes and modification times, and
    reused while they are unchanged.

    Args:
        root: the LeRobot dataset folder (``meta/info.json``, ``data/``, ``videos/``).
        cache: the cache folder (default ``$POLICYLINK_CACHE/lerobot``, else ``~/.cache/policylink/lerobot``).

    Raises:
        LeRobotFormatError: ``root`` is not a LeRobot v3 dataset (names ``meta/info.json``).
    """
    import hashlib
    import shutil

    root = Path(root).resolve()
    if not is_lerobot_dataset(root):
        raise LeRobotFormatError(f"root: expected a LeRobot dataset with meta/info.json, none in {str(root)!r}")
    files = sorted(p for sub in ("meta", "data", "videos") for p in (root / sub).rglob("*") if p.is_file())
    digest = hashlib.sha1(str(root).encode())
    for p in files:
        st = p.stat()
        digest.update(f"{p.relative_to(root)}:{st.st_size}:{st.st_mtime_ns};".encode())
    home = Path(os.environ.get("POLICYLINK_CACHE", Path.home() / ".cache" / "policylink")) / "lerobot"
    base = Path(cache) if cache is not None else home
    out = base / f"{root.name}-{digest.hexdigest()[:16]}.zarr"
    if not out.exists():
        from policylink.data.lock import remove_stale_temporaries

        remove_stale_temporaries(out, ("importing",))  # left by a killed reader
        tmp = out.with_name(f".{out.name}.importing-{os.getpid()}")
        import_lerobot(root, tmp).close()
        for leftover in (tmp.with_name(tmp.name + ".lock"), tmp.with_name(tmp.name + ".lock.owner")):
            leftover.unlink(missing_ok=True)
        try:
            tmp.rename(out)
        except OSError:  # another process finished the same import first
            shutil.rmtree(tmp, ignore_errors=True)
    return EpisodeStore(out, "r")


def _episode_arrays(
    ep: Any,
    rows: Any,
    feats: dict[str, Any],
    root: Path,
    info: dict[str, Any],
    fps: float,
    readers: dict,
    scalars: set[str] = frozenset(),
) -> dict[str, np.ndarray]:
    """Our arrays of one LeRobot episode (its ``meta/episodes`` row ``ep`` and data ``rows``): video frames at the
    rows' timestamps (decoders cached in ``readers`` per file), decoded images, and numeric columns (reward/done
    and the per-step scalars our export named, ``scalars``, as ``(T,)``)."""
    arrays = {}
    for k, ft in feats.items():
        if ft["dtype"] == "video":
            vkey = (k, int(ep[f"videos/{k}/chunk_index"]), int(ep[f"videos/{k}/file_index"]))
            if vkey not in readers:
                readers[vkey] = VideoFrames(
                    root / info["video_path"].format(video_key=k, chunk_index=vkey[1], file_index=vkey[2]), fps=fps
                )
            start = float(ep[f"videos/{k}/from_timestamp"])
            first = int(round(start * fps))
            last = int(round(float(ep[f"videos/{k}/to_timestamp"]) * fps)) - 1
            arrays[k] = readers[vkey].frames_at(start + rows["timestamp"].to_numpy(np.float64), first, last)
        elif ft["dtype"] == "image":
            arrays[k] = np.stack([_decode_image(v, root) for v in rows[k]])
        elif k in FROM_LEROBOT:  # our reward / done are (T,)
            arrays[FROM_LEROBOT[k]] = _from_column(rows[k], ft).reshape(len(rows))
        else:
            x = _from_column(rows[k], ft)
            arrays[k] = x.reshape(len(rows)) if k in scalars else x
    return arrays


def _features(store: EpisodeStore, keys: list[str], cams: list[str], video: bool) -> dict[str, dict[str, Any]]:
    known = store.info.get("features", {})
    action_names = store.info.get("action", {}).get("names")
    out: dict[str, dict[str, Any]] = {}
    for k in keys:
        shape = list(store.feature_shape(k))
        if k in cams:
            out[k] = {"dtype": "video" if video else "image", "shape": shape, "names": ["height", "width", "channels"]}
            continue
        if len(shape) > 1:
            raise LeRobotFormatError(f"{k}: expected a 1-D feature or an image, received per-step shape {shape}")
        dtype = str(store.feature_dtype(k))
        names = action_names if k == "action" else (known.get(k) or {}).get("names")
        out[TO_LEROBOT.get(k, k)] = {"dtype": dtype, "shape": shape or [1], "names": names}
    out.update(
        {
            "timestamp": {"dtype": "float32", "shape": [1], "names": None},
            **{k: {"dtype": "int64", "shape": [1], "names": None} for k in DEFAULT_FEATURES[1:]},
        }
    )
    return out


def _schema(store: EpisodeStore, keys: list[str], cams: list[str], video: bool) -> Any:
    import pyarrow as pa

    fields = []
    for k in keys:
        if k in cams:
            if not video:
                fields.append(pa.field(k, pa.struct([("bytes", pa.binary()), ("path", pa.string())])))
            continue
        typ = pa.from_numpy_dtype(store.feature_dtype(k))
        shape = store.feature_shape(k)
        n = int(np.prod(shape)) if shape else 1
        fields.append(pa.field(TO_LEROBOT.get(k, k), typ if n == 1 else pa.list_(typ, n)))
    fields += [pa.field("timestamp", pa.float32())] + [pa.field(k, pa.int64()) for k in DEFAULT_FEATURES[1:]]
    return pa.schema(fields)


def _write_meta(
    root: Path,
    store: EpisodeStore,
    features: dict[str, Any],
    episodes: list[dict[str, Any]],
    tasks: list[str],
    fps: float,
    robot_type: str | None,
    video: bool,
) -> None:
    import pandas as pd

    stats = compute_stats(store)
    stats_json = {TO_LEROBOT.get(k, k): {s: np.asarray(v).tolist() for s, v in st.items()} for k, st in stats.items()}
    (root / "meta" / "stats.json").write_text(json.dumps(stats_json, indent=2))
    pd.DataFrame({"task_index": np.arange(len(tasks))}, index=pd.Index(tasks)).to_parquet(
        root / "meta" / "tasks.parquet"
    )
    ep_file = root / EPISODES_PATH
    ep_file.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(episodes).to_parquet(ep_file, index=False)
    info = {
        "codebase_version": CODEBASE_VERSION,
        "robot_type": robot_type,
        "total_episodes": store.n_episodes,
        "total_frames": store.n_steps,
        "total_tasks": len(tasks),
        "chunks_size": 1000,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 200,
        "fps": int(fps) if fps == int(fps) else fps,
        "splits": {"train": f"0:{store.n_episodes}"},
        "data_path": DATA_PATH,
        "video_path": VIDEO_PATH if video else None,
        "features": features,
        # what LeRobot does not record (ActionSpec, env, units), restored by import_lerobot
        _META_PREFIX.rstrip("/"): {
            **{k: store.info[k] for k in _CARRIED_INFO if k in store.info},
            _SCALAR_KEY: [k for k in store.keys if store.feature_shape(k) == ()],
        },
    }
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))


def _column(x: np.ndarray) -> Any:
    """Per-frame values: scalars for one-element features (LeRobot's ``Value``), rows of lists otherwise."""
    x = np.asarray(x)
    if x.ndim == 1 or (x.ndim == 2 and x.shape[1] == 1):
        return x.reshape(-1)
    return list(x.reshape(len(x), -1))


def _from_column(col: Any, ft: Mapping[str, Any]) -> np.ndarray:
    shape = tuple(ft["shape"])
    values = np.stack([np.asarray(v) for v in col]) if col.dtype == object else col.to_numpy()
    return values.astype(ft["dtype"]).reshape(len(col), *shape)


def _png(img: np.ndarray) -> bytes:
    import cv2

    ok, buf = cv2.imencode(".png", np.ascontiguousarray(img[..., ::-1]))  # OpenCV wants BGR
    if not ok:
        raise LeRobotFormatError(f"image: PNG encoding failed for shape {img.shape}")
    return buf.tobytes()


def _decode_image(value: Mapping[str, Any], root: Path) -> np.ndarray:
    import cv2

    raw = value.get("bytes")
    if raw is None:
        raw = (root / value["path"]).read_bytes()
    img = cv2.imdecode(np.frombuffer(raw, np.uint8), cv2.IMREAD_COLOR)
    return np.ascontiguousarray(img[..., ::-1])  # BGR -> RGB


def _names(ft: Mapping[str, Any]) -> list[str] | None:
    names = ft.get("names")
    if isinstance(names, dict):  # older LeRobot: {"motors": [...]}
        names = next(iter(names.values()), None)
    if ft["dtype"] in ("image", "video") or names is None or len(names) != (ft["shape"] or [1])[-1]:
        return None
    return [str(n) for n in names]


def _episode_meta(ep: Any, task_of: Mapping[int, str], rows: Any) -> EpisodeMeta:
    tasks = ep.get("tasks")
    task = str(tasks[0]) if tasks is not None and len(tasks) else task_of.get(int(rows["task_index"].iloc[0]), "")

    def field(name: str, default: Any) -> Any:
        v = ep.get(_META_PREFIX + name, default)
        return default if v is None or (isinstance(v, float) and np.isnan(v)) else v

    success, seed = int(field("success", -1)), int(field("seed", -1))
    return EpisodeMeta(
        task=task,
        success=None if success < 0 else bool(success),
        seed=None if seed < 0 else seed,
        source=str(field("source", "unknown")),
        quality=str(field("quality", "")),
    )


__all__ = [
    "CODEBASE_VERSION",
    "LeRobotFormatError",
    "export_lerobot",
    "import_lerobot",
    "is_lerobot_dataset",
    "open_lerobot",
]
