"""``policylink dataset view STORE [--episode N]``: one episode of an episode store as a static HTML page: an mp4
per camera (captioned with step, time and reward) beside plots of its state, action and reward over time.
Nothing to install beyond ``make`` (matplotlib, PyAV, OpenCV); the page opens in any browser.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from policylink.adapters.schema import ACTION_KEY

IMAGE_PREFIX = "observation.images."
"""Store keys with this prefix are camera frames, uint8 ``(T, H, W, 3)``."""


@dataclass
class ViewConfig:
    """``policylink dataset view STORE [--episode N] [--out DIR]``.

    Attributes:
        path: the episode store.
        episode: the episode index, ``0 <= episode < n_episodes``.
        out: output folder (default ``<store>.view/episode_NNNN`` beside the store).
        fps: playback rate of the videos and time axis of the plots, Hz (0 = the store's recorded fps, else 10).
    """

    path: str = ""
    episode: int = 0
    out: str = ""
    fps: float = 0.0


def view(cfg: ViewConfig) -> Path:
    """Write ``index.html``, ``<camera>.mp4`` per camera and ``curves.png`` for episode ``cfg.episode``; returns the
    page's path.

    Raises:
        ValueError: ``path`` empty, ``episode`` outside ``[0, n_episodes)``, ``fps`` < 0 (each names the field).
        StoreError / FileNotFoundError: ``path`` is not an episode store.
    """
    from policylink.data.buffer import EpisodeStore
    from policylink.data.video import caption_frames, write_video

    if not cfg.path:
        raise ValueError("path: expected an episode store (policylink dataset view STORE), received ''")
    if cfg.fps < 0:
        raise ValueError(f"fps: expected a rate >= 0 Hz (0 = the store's), received {cfg.fps}")
    store = EpisodeStore(cfg.path)
    if not 0 <= cfg.episode < store.n_episodes:
        raise ValueError(
            f"episode: expected an index in [0, {store.n_episodes}) for {cfg.path}, received {cfg.episode}"
        )
    fps = float(cfg.fps or store.info.get("fps") or 10.0)
    out, page = _out_paths(cfg)
    out.mkdir(parents=True, exist_ok=True)
    ep = store.get_episode(cfg.episode)
    n = len(ep[ACTION_KEY])
    reward = ep.get("reward")
    videos = []
    for key in sorted(k for k in ep if k.startswith(IMAGE_PREFIX)):
        texts = [f"step {t}/{n - 1}  {t / fps:.2f} s" + _reward_text(reward, t) for t in range(n)]
        path = out / f"{key[len(IMAGE_PREFIX) :]}.mp4"
        videos.append((key, write_video(path, caption_frames(list(ep[key]), texts), fps=fps)))
    curves = plot_curves(out / "curves.png", ep, fps, _names(store.info))
    rel = [(key, path.relative_to(page.parent)) for key, path in videos]
    page.write_text(_page(cfg, store.episode_meta(cfg.episode), n, fps, rel, curves.relative_to(page.parent)))
    return page


def _out_paths(cfg: ViewConfig) -> tuple[Path, Path]:
    """(asset folder, page path): ``--out page.html`` writes that page with its videos and plot in
    ``page_files/`` beside it; any other ``--out`` is a folder holding ``index.html``; no ``--out`` is
    ``<store>.view/episode_NNNN/``."""
    if cfg.out.lower().endswith((".html", ".htm")):
        page = Path(cfg.out)
        return page.with_name(f"{page.stem}_files"), page
    out = Path(cfg.out or Path(cfg.path).with_name(f"{Path(cfg.path).name}.view") / f"episode_{cfg.episode:04d}")
    return out, out / "index.html"


def plot_curves(path: Path, ep: Mapping[str, np.ndarray], fps: float, names: Mapping[str, Sequence[str]]) -> Path:
    """One PNG with a panel per non-image feature (state vectors, action, reward...) over time in seconds
    (``step / fps``); vector features get one line per dimension, labelled with ``names[key]`` when given."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in ep if not k.startswith(IMAGE_PREFIX) and np.asarray(ep[k]).dtype.kind in "fiub"]
    keys.sort(key=lambda k: (k != ACTION_KEY and not k.startswith("observation."), k))
    fig, axes = plt.subplots(len(keys), 1, figsize=(7, 1.9 * len(keys)), sharex=True, squeeze=False)
    for ax, key in zip(axes[:, 0], keys):
        y = np.asarray(ep[key], np.float64).reshape(len(ep[key]), -1)
        t = np.arange(len(y)) / fps
        labels = list(names.get(key, []))
        labels = labels if len(labels) == y.shape[1] else [str(i) for i in range(y.shape[1])]
        for d in range(y.shape[1]):
            ax.plot(t, y[:, d], lw=1.2, label=labels[d])
        ax.set_title(key, fontsize=9, loc="left")
        if 1 < y.shape[1] <= 12:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    axes[-1, 0].set_xlabel("time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _reward_text(reward: np.ndarray | None, t: int) -> str:
    return "" if reward is None else f"  reward {float(np.asarray(reward)[t]):.3f}"


def _names(info: Mapping[str, Any]) -> dict[str, list[str]]:
    """Feature names the store records, by key: ``info["action"]["names"]`` and ``info["features"][key]["names"]``
    (written by the recorder from the EnvSpec)."""
    entries = {**dict(info.get("features") or {}), ACTION_KEY: info.get("action") or {}}
    return {
        k: [str(x) for x in v["names"]]
        for k, v in entries.items()
        if isinstance(v, Mapping) and isinstance(v.get("names"), list)
    }


def _page(cfg: ViewConfig, meta: Any, n: int, fps: float, videos: list[tuple[str, Path]], curves: Path) -> str:
    """The HTML page; ``videos`` and ``curves`` are paths relative to the page's folder."""
    esc = html.escape
    facts = {
        "store": str(Path(cfg.path).resolve()),
        "episode": cfg.episode,
        "steps": n,
        "duration_s": round(n / fps, 3),
        "task": meta.task,
        "success": meta.success,
        "seed": meta.seed,
        "source": meta.source,
        "quality": meta.quality,
    }
    clips = "".join(
        f'<figure><video src="{esc(p.as_posix())}" controls muted loop width="320"></video>'
        f"<figcaption>{esc(key)}</figcaption></figure>"
        for key, p in videos
    )
    title = f"{esc(Path(cfg.path).name)}: episode {cfg.episode}"
    plot = f'<img src="{esc(curves.as_posix())}" alt="curves">'
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;margin:1.5em}} .row{{display:flex;gap:1em;flex-wrap:wrap;align-items:flex-start}}
figure{{margin:0}} pre{{background:#f4f4f4;padding:.6em}}</style></head><body>
<h1>{title}</h1>
<pre>{esc(json.dumps(facts, indent=2), quote=False)}</pre>
<div class="row">{clips or "<p>no camera frames in this store</p>"}{plot}</div>
</body></html>
"""


__all__ = ["ViewConfig", "plot_curves", "view"]
