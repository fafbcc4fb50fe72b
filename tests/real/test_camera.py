"""Cameras: colour order (converted once), crop and resize to the policy's feature, newest-frame grabbing (no stale
buffered frames) and frame age, from a fake capture and a synthetic video file."""

import threading

import numpy as np
import pytest

from policylink.adapters.schema import FeatureSpec
from policylink.real.camera import Camera, CameraConfig, CameraError, to_rgb


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class GatedCapture:
    """Delivers frame i (every pixel = i, channels (i, 2i, 3i) in its own order) each time the test opens the gate;
    the clock reads i * period when frame i is grabbed."""

    def __init__(self, clock, period=0.1, shape=(4, 6, 3)):
        self.clock, self.period, self.shape = clock, period, shape
        self.gate = threading.Semaphore(0)
        self.i = 0
        self.released = False

    def isOpened(self):  # noqa: N802
        return True

    def read(self):
        if not self.gate.acquire(timeout=5.0) or self.released:
            return False, None
        self.i += 1
        self.clock.t = self.i * self.period
        frame = np.empty(self.shape, np.uint8)
        frame[...] = (self.i, 2 * self.i, 3 * self.i)
        return True, frame

    def release(self):
        self.released = True
        self.gate.release()


def _camera(color_order, **kw):
    clock = FakeClock()
    cap = GatedCapture(clock)
    cam = Camera(CameraConfig(source="fake", color_order=color_order, fps=10.0, **kw), lambda src: cap, clock)
    return cam.open(), cap, clock


def test_bgr_capture_is_swapped_once_and_rgb_capture_is_not():
    cam, cap, _ = _camera("bgr")
    cap.gate.release()
    assert cam.read().image[0, 0].tolist() == [3, 2, 1]
    cam.close()
    cam, cap, _ = _camera("rgb")
    cap.gate.release()
    assert cam.read().image[0, 0].tolist() == [1, 2, 3]
    cam.close()


def test_read_returns_the_newest_frame_and_its_age_is_within_one_period():
    cam, cap, clock = _camera("rgb")
    cap.gate.release()
    first = cam.read()
    assert (first.index, first.timestamp_s) == (1, pytest.approx(0.1))
    for _ in range(4):  # four frames arrive while the control loop is busy
        cap.gate.release()
    while cam._frame.index < 5:  # the grabber has consumed them (no timing assumption)
        threading.Event().wait(0.001)
    frame = cam.read()
    assert frame.index == 5 and frame.image[0, 0, 0] == 5  # never the stale frames 2..4
    assert cam.dropped == 3
    assert cam.age_s(frame) <= cam.config.frame_period_s
    clock.t += 0.05
    assert cam.age_s(frame) == pytest.approx(0.05)
    with pytest.raises(CameraError, match="no new frame"):
        cam.read(timeout_s=0.0, newer=True)
    cam.close()


def test_crop_and_resize_to_the_policy_feature():
    frame = np.zeros((10, 20, 3), np.uint8)
    frame[2:6, 4:12] = (0, 0, 255)  # red in BGR
    config = CameraConfig(color_order="bgr", crop=(2, 4, 4, 8)).for_feature(FeatureSpec("uint8", (2, 4, 3)))
    out = to_rgb(frame, config)
    assert out.shape == (2, 4, 3) and out.dtype == np.uint8
    assert np.all(out == np.array([255, 0, 0], np.uint8))
    with pytest.raises(CameraError, match="crop"):
        to_rgb(frame, CameraConfig(crop=(8, 0, 4, 4)))


def test_synthetic_video_file_reads_as_rgb(tmp_path):
    cv2 = pytest.importorskip("cv2")
    path = str(tmp_path / "blue.avi")
    writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"MJPG"), 10.0, (32, 24))
    for _ in range(5):
        writer.write(np.full((24, 32, 3), (255, 0, 0), np.uint8))  # pure blue, BGR as OpenCV writes it
    writer.release()
    with Camera(CameraConfig(source=path, color_order="bgr", height=12, width=16)) as cam:
        frame = cam.read(timeout_s=5.0)
    assert frame.image.shape == (12, 16, 3)
    r, g, b = frame.image.reshape(-1, 3).mean(0)
    assert b > 200 and r < 30 and g < 30


def test_bad_configs_name_the_field():
    with pytest.raises(ValueError, match="color_order"):
        CameraConfig(color_order="yuv")
    with pytest.raises(ValueError, match="fps"):
        CameraConfig(fps=0)
    with pytest.raises(CameraError, match="cannot open"):
        Camera(CameraConfig(source="/nonexistent/video.avi")).open()
