"""Cameras for real robots: OpenCV capture (device index, video file or stream URL) with a declared colour order,
crop and resize to the policy's image feature, capture timestamps, and a background grabber so the control loop
always gets the newest frame (never the stale frames OpenCV buffers). Frames leave as HWC uint8 RGB, the
contract's image layout (DESIGN.md section 2); OpenCV is imported only when a capture is opened.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import numpy as np

from policylink.adapters.schema import FeatureSpec
from policylink.real.robot import Clock


class CameraError(RuntimeError):
    """A capture that cannot be opened, or no frame within the timeout (names the source)."""


class ColorOrder(StrEnum):
    """Channel order a capture delivers: OpenCV devices and files give ``bgr``; some drivers already give ``rgb``."""

    RGB = "rgb"
    BGR = "bgr"


class Capture(Protocol):
    """The part of ``cv2.VideoCapture`` the grabber uses (tests pass a fake)."""

    def isOpened(self) -> bool: ...  # noqa: N802 (OpenCV's name)

    def read(self) -> tuple[bool, np.ndarray | None]: ...

    def release(self) -> None: ...


@dataclass(frozen=True)
class CameraConfig:
    """One camera.

    Attributes:
        source: a device index (``0``), a video file path, or a stream URL (``rtsp://...``).
        color_order: a :class:`ColorOrder` value: what the capture delivers (converted to RGB once).
        height, width: output size, pixels (None = the capture's); frames are resized after the crop.
        crop: ``(top, left, height, width)`` in capture pixels, applied first (None = whole frame).
        fps: the capture's frame rate, Hz (requested from devices; ``frame_period_s`` bounds a fresh frame's age).

    Raises:
        ValueError: unknown colour order, non-positive size or fps, or a negative crop (names the field).
    """

    source: int | str = 0
    color_order: str = ColorOrder.BGR.value
    height: int | None = None
    width: int | None = None
    crop: tuple[int, int, int, int] | None = None
    fps: float = 30.0

    def __post_init__(self) -> None:
        try:
            ColorOrder(self.color_order)
        except ValueError:
            raise ValueError(f"color_order: expected 'rgb' or 'bgr', received {self.color_order!r}") from None
        for name in ("height", "width"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, int) and v > 0):
                raise ValueError(f"{name}: expected a positive int or None, received {v!r}")
        if self.crop is not None and (len(self.crop) != 4 or min(self.crop) < 0 or min(self.crop[2:]) == 0):
            raise ValueError(
                f"crop: expected (top, left, height, width) >= 0 with a non-empty size, received {self.crop!r}"
            )
        if not self.fps > 0:
            raise ValueError(f"fps: expected > 0 Hz, received {self.fps!r}")

    @property
    def frame_period_s(self) -> float:
        """``1 / fps``, seconds."""
        return 1.0 / self.fps

    def for_feature(self, feature: FeatureSpec) -> CameraConfig:
        """This config resized to an image feature's ``(H, W, 3)`` (the policy's spec)."""
        h, w, _ = feature.shape
        return CameraConfig(self.source, self.color_order, int(h), int(w), self.crop, self.fps)


@dataclass(frozen=True)
class Frame:
    """One captured frame: ``image`` uint8 ``(H, W, 3)`` RGB, ``timestamp_s`` (the clock when it was grabbed),
    ``index`` (frames grabbed so far, 1 = the first)."""

    image: np.ndarray
    timestamp_s: float
    index: int


def to_rgb(frame: np.ndarray, config: CameraConfig) -> np.ndarray:
    """Crop, resize and reorder one capture frame ``(H0, W0, 3)`` uint8 into the config's RGB ``(H, W, 3)``.

    Raises:
        CameraError: the frame is not ``(H, W, 3)`` or the crop falls outside it."""
    if frame.ndim != 3 or frame.shape[2] != 3:
        raise CameraError(f"frame: expected (H, W, 3), received shape {frame.shape}")
    if config.crop is not None:
        top, left, h, w = config.crop
        if top + h > frame.shape[0] or left + w > frame.shape[1]:
            raise CameraError(f"crop: {config.crop} falls outside the {frame.shape[:2]} frame")
        frame = frame[top : top + h, left : left + w]
    if config.color_order == ColorOrder.BGR.value:
        frame = frame[..., ::-1]
    h, w = config.height or frame.shape[0], config.width or frame.shape[1]
    if (h, w) != frame.shape[:2]:
        import cv2

        frame = cv2.resize(np.ascontiguousarray(frame), (w, h), interpolation=cv2.INTER_AREA)
    return np.ascontiguousarray(frame, dtype=np.uint8)


class Camera:
    """A capture read continuously by a background grabber; :meth:`read` returns the newest frame.

    Args:
        config: the :class:`CameraConfig`.
        capture_factory: ``source -> Capture`` (default ``cv2.VideoCapture`` with a one-frame buffer).
        clock: monotonic clock for the timestamps, seconds.

    Attributes:
        dropped: frames grabbed but never read (superseded by a newer one).
        failures: consecutive failed grabs.
    """

    def __init__(
        self,
        config: CameraConfig,
        capture_factory: Callable[[Any], Capture] | None = None,
        clock: Clock = time.monotonic,
    ):
        self.config, self.clock = config, clock
        self._factory = capture_factory or _opencv_capture(config)
        self._cap: Capture | None = None
        self._frame: Frame | None = None
        self._returned = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.dropped = self.failures = 0
        self._error: Exception | None = None

    def open(self) -> Camera:
        """Open the capture and start the grabber.

        Raises:
            CameraError: the source cannot be opened."""
        cap = self._factory(self.config.source)
        if not cap.isOpened():
            raise CameraError(f"camera {self.config.source!r}: cannot open (no such device, file or stream)")
        self._cap = cap
        self._stop.clear()
        self._thread = threading.Thread(target=self._grab, daemon=True, name=f"policylink-camera-{self.config.source}")
        self._thread.start()
        return self

    def read(self, timeout_s: float = 1.0, newer: bool = False) -> Frame:
        """The newest frame (waiting for the first one, or with ``newer`` for one not returned before).

        Raises:
            CameraError: no frame within ``timeout_s``, or the grabber failed (its error is named)."""
        deadline = self.clock() + timeout_s
        with self._cond:
            while self._frame is None or (newer and self._frame.index <= self._returned):
                if self._error is not None:
                    raise CameraError(f"camera {self.config.source!r}: {self._error}")
                left = deadline - self.clock()
                if left <= 0 or self._stop.is_set():
                    raise CameraError(f"camera {self.config.source!r}: no new frame within {timeout_s:g} s")
                self._cond.wait(min(left, 0.05))
            frame = self._frame
            self._returned = frame.index
            return frame

    def age_s(self, frame: Frame) -> float:
        """Seconds since ``frame`` was grabbed."""
        return self.clock() - frame.timestamp_s

    def close(self) -> None:
        """Stop the grabber and release the capture."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        if self._cap is not None:
            self._cap.release()
            self._cap = None

    def __enter__(self) -> Camera:
        return self.open()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _grab(self) -> None:
        """Read frames as fast as the capture gives them; keep only the newest."""
        index = 0
        while not self._stop.is_set():
            ok, raw = self._cap.read()
            if not ok or raw is None:
                self.failures += 1
                if self.failures > 3 * self.config.fps:  # ~3 s of failures: the stream is gone
                    with self._cond:
                        self._error = CameraError(f"{self.failures} failed grabs in a row")
                        self._cond.notify_all()
                    return
                self._stop.wait(self.config.frame_period_s)
                continue
            stamp = self.clock()
            self.failures = 0
            try:
                image = to_rgb(raw, self.config)
            except CameraError as e:
                with self._cond:
                    self._error = e
                    self._cond.notify_all()
                return
            index += 1
            with self._cond:
                if self._frame is not None and self._frame.index > self._returned:
                    self.dropped += 1
                self._frame = Frame(image, stamp, index)
                self._cond.notify_all()


def _opencv_capture(config: CameraConfig) -> Callable[[Any], Capture]:
    def make(source: Any) -> Capture:
        import cv2

        cap = cv2.VideoCapture(source)
        cap.set(cv2.CAP_PROP_BUFFERSIZE, 1)
        if isinstance(source, int):
            cap.set(cv2.CAP_PROP_FPS, config.fps)
        return cap

    return make


__all__ = ["Camera", "CameraConfig", "CameraError", "Capture", "ColorOrder", "Frame", "to_rgb"]
