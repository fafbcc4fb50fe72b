"""MP4 encoding and decoding of uint8 RGB frames with PyAV (FFmpeg), and frame lookup by timestamp.

Frames stay RGB end to end: they are handed to FFmpeg as ``rgb24`` and read back as ``rgb24`` (OpenCV only draws
captions, on RGB arrays, so no BGR reordering). A timestamp maps to frame ``round((t - t0) * fps)``, clamped into
the valid range, so a query a hair past the last frame returns the last frame instead of indexing past it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_CODEC = "libx264"


def encode_video(
    frames: np.ndarray, path: str | os.PathLike, fps: float, *, codec: str = DEFAULT_CODEC, crf: int = 18, gop: int = 2
) -> dict[str, Any]:
    """Write uint8 RGB frames ``(T, H, W, 3)`` to an mp4 at ``fps`` Hz.

    Args:
        frames: uint8 ``(T, H, W, 3)``; ``H`` and ``W`` even (yuv420p).
        path: output file (parent folders are created).
        fps: frame rate, Hz.
        codec: FFmpeg encoder (``libx264``, ``libsvtav1``...).
        crf: constant rate factor (lower = better quality).
        gop: keyframe interval, frames (small = fast random access, as LeRobot's ``g=2``).

    Returns:
        LeRobot's ``video.*`` info fields (height, width, codec, pix_fmt, fps, channels, is_depth_map, has_audio).

    Raises:
        ValueError: wrong dtype/shape, odd size, or ``T == 0``.
    """
    import av

    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or len(frames) == 0:
        raise ValueError(f"frames: expected uint8 (T>0, H, W, 3), received {frames.dtype} {frames.shape}")
    h, w = frames.shape[1:3]
    if h % 2 or w % 2:
        raise ValueError(f"frames: expected even height and width for yuv420p, received {h}x{w}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rate = _rate(fps)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        stream.options = {"crf": str(crf), "g": str(gop)}
        for img in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return {
        "video.height": int(h),
        "video.width": int(w),
        "video.codec": codec,
        "video.pix_fmt": "yuv420p",
        "video.is_depth_map": False,
        "video.fps": float(fps),
        "video.channels": 3,
        "has_audio": False,
    }


def pad_to_even(frames: np.ndarray) -> np.ndarray:
    """uint8 frames ``(T, H, W, 3)`` with an odd height or width grown by one row/column (edge pixels repeated),
    as yuv420p needs even sizes: ``(T, H + H % 2, W + W % 2, 3)``. Even frames are returned unchanged."""
    frames = np.asarray(frames)
    h, w = frames.shape[1:3]
    if h % 2 or w % 2:
        frames = np.pad(frames, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)), mode="edge")
    return frames


CAPTION_MIN_WIDTH = 64
"""Frames narrower than this (px) get no caption: the text would not be legible."""


def write_video(path: str | Path, frames: Sequence[np.ndarray], fps: float) -> Path:
    """Encode uint8 RGB frames ``(H, W, 3)`` as an H.264 mp4 at ``fps`` Hz with
    :func:`encode_video` (odd sizes padded to even for yuv420p). Returns the path.

    Raises:
        ValueError: no frames, or frames of different shapes.
    """
    if not frames:
        raise ValueError("frames: expected at least one frame, received none")
    shapes = {np.shape(f) for f in frames}
    if len(shapes) != 1:
        raise ValueError(f"frames: expected one shape for every frame, received {sorted(shapes)}")
    encode_video(pad_to_even(np.stack([np.asarray(f, np.uint8) for f in frames])), path, fps=float(fps))
    return Path(path)


def caption_frames(
    frames: Sequence[np.ndarray],
    texts: Sequence[str],
    colour: tuple[int, int, int] | Sequence[tuple[int, int, int]] = (40, 40, 40),
) -> list[np.ndarray]:
    """Burn one line of text per frame into a caption strip added below it (the frame's pixels are untouched).

    Args:
        frames: ``T`` uint8 RGB frames ``(H, W, 3)`` of one shape.
        texts: ``T`` captions (ASCII; OpenCV's Hershey font), white on the strip.
        colour: RGB of the strip, one for every frame or ``T`` of them (e.g. grey while an episode runs, then green
            for a success or red for a failure on its last frame).

    Returns:
        ``T`` uint8 frames ``(H + h, W, 3)`` with a strip of height ``h = max(12, round(0.09 W))`` px, or the frames
        unchanged when ``W`` < :data:`CAPTION_MIN_WIDTH`.

    Raises:
        ValueError: ``len(texts) != len(frames)``, or ``T`` colours of another count or not RGB triples.
    """
    if len(texts) != len(frames):
        raise ValueError(f"texts: expected one caption per frame ({len(frames)}), received {len(texts)}")
    colours = np.asarray(colour, dtype=np.int64)
    if colours.ndim == 1:
        colours = np.broadcast_to(colours, (len(frames), colours.shape[0]))
    if colours.shape != (len(frames), 3):
        raise ValueError(f"colour: expected one RGB triple or {len(frames)} of them, received shape {colours.shape}")
    if not len(frames) or frames[0].shape[1] < CAPTION_MIN_WIDTH:
        return [np.asarray(f, np.uint8) for f in frames]
    import cv2

    w = frames[0].shape[1]
    h = max(12, round(0.09 * w))
    font = cv2.FONT_HERSHEY_SIMPLEX
    widest = max(cv2.getTextSize(t, font, 1.0, 1)[0][0] for t in texts) or 1
    scale = min(h / 32.0, (w - 6) / widest)  # the longest caption fits the width
    out = []
    for frame, text, rgb in zip(frames, texts, colours):
        strip = np.empty((h, w, 3), np.uint8)
        strip[:] = rgb
        cv2.putText(strip, text, (3, int(h * 0.72)), font, scale, (255, 255, 255), 1, cv2.LINE_AA)
        out.append(np.concatenate([np.asarray(frame, np.uint8), strip], axis=0))
    return out


def decode_video(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """All frames of ``path`` as uint8 RGB ``(T, H, W, 3)`` and their presentation times float64 ``(T,)`` (s)."""
    reader = VideoFrames(path)
    reader.decode_all()
    return np.stack(reader.frames), np.asarray(reader.times)


class VideoFrames:
    """Sequential PyAV decoder of one video file with timestamp lookup.

    Args:
        path: the video file.
        fps: frame rate used to map timestamps to frame indices (default: the stream's average rate).

    Raises:
        FileNotFoundError: no such file.
    """

    def __init__(self, path: str | os.PathLike, fps: float | None = None):
        import av

        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"video: no file at {str(self.path)!r}")
        self._container = av.open(str(self.path))
        stream = self._container.streams.video[0]
        self.fps = float(fps if fps is not None else stream.average_rate)
        self._iter = self._container.decode(stream)
        self.frames: list[np.ndarray] = []
        self.times: list[float] = []
        self._done = False

    def frames_at(self, timestamps: np.ndarray, first: int = 0, last: int | None = None) -> np.ndarray:
        """Frames for ``timestamps`` (s, from the file start) as uint8 ``(N, H, W, 3)``.

        Indices are ``round(t * fps)`` clamped into ``[first, last]`` (``last`` defaults to the file's last
        frame), e.g. the frame range of one episode inside a concatenated file.

        Raises:
            ValueError: the file holds no frame in ``[first, last]``.
        """
        idx = np.rint(np.asarray(timestamps, np.float64) * self.fps).astype(np.int64)
        want_last = int(idx.max()) if last is None else int(last)
        self._decode_until(max(want_last, first))
        n = len(self.frames)
        hi = n - 1 if last is None else min(int(last), n - 1)
        if hi < first:
            raise ValueError(f"video {str(self.path)!r}: expected frames {first}..{last}, file has {n}")
        return np.stack([self.frames[i] for i in np.clip(idx, first, hi)])

    def decode_all(self) -> None:
        """Decode every remaining frame."""
        self._decode_until(None)

    def close(self) -> None:
        """Close the file."""
        self._container.close()

    def _decode_until(self, index: int | None) -> None:
        while not self._done and (index is None or len(self.frames) <= index):
            try:
                frame = next(self._iter)
            except StopIteration:
                self._done = True
                break
            self.frames.append(frame.to_ndarray(format="rgb24"))
            self.times.append(float(frame.time) if frame.time is not None else len(self.times) / self.fps)


def _rate(fps: float) -> Any:
    from fractions import Fraction

    return Fraction(fps).limit_denominator(1001)


__all__ = [
    "write_video",
    "CAPTION_MIN_WIDTH",
    "DEFAULT_CODEC",
    "VideoFrames",
    "caption_frames",
    "decode_video",
    "encode_video",
    "pad_to_even",
]
