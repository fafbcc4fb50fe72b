"""MP4 via PyAV: RGB order survives encode/decode, timestamp lookup clamps at the last frame."""

from __future__ import annotations

import numpy as np
import pytest

from policylink.data.video import VideoFrames, decode_video, encode_video


def _rgb_frames():
    frames = np.zeros((6, 16, 16, 3), np.uint8)
    for i in range(6):
        frames[i, ..., i % 3] = 255  # red, green, blue, red, green, blue
    return frames


def test_pure_red_reads_back_red(tmp_path):
    info = encode_video(_rgb_frames(), tmp_path / "v.mp4", fps=10)
    assert info["video.fps"] == 10 and info["video.height"] == 16
    frames, times = decode_video(tmp_path / "v.mp4")
    assert frames.shape == (6, 16, 16, 3)
    np.testing.assert_allclose(times, np.arange(6) / 10, atol=1e-6)
    for i in range(6):
        center = frames[i, 8, 8].astype(int)
        assert center[i % 3] >= 245 and np.delete(center, i % 3).max() <= 10, (i, center)


def test_timestamp_lookup_clamps(tmp_path):
    encode_video(_rgb_frames(), tmp_path / "v.mp4", fps=10)
    v = VideoFrames(tmp_path / "v.mp4")
    got = v.frames_at(np.array([0.0, 0.1, 0.54, 0.56, 9.0]))[:, 8, 8].argmax(-1)
    np.testing.assert_array_equal(got, [0, 1, 2, 2, 2])  # 0.54 -> frame 5 (blue); 0.56, 9.0 -> clamped to 5
    # inside an episode occupying frames 0..3 of the file, a query past its end returns frame 3 (red)
    np.testing.assert_array_equal(v.frames_at(np.array([0.3, 0.45]), first=0, last=3)[:, 8, 8].argmax(-1), [0, 0])
    v.close()


def test_encode_rejects_bad_frames(tmp_path):
    with pytest.raises(ValueError, match="uint8"):
        encode_video(np.zeros((2, 4, 4, 3), np.float32), tmp_path / "x.mp4", fps=10)
    with pytest.raises(ValueError, match="even"):
        encode_video(np.zeros((2, 5, 4, 3), np.uint8), tmp_path / "x.mp4", fps=10)


def test_caption_strips_take_one_colour_or_one_per_frame():
    from policylink.data.video import caption_frames

    frames = [np.zeros((8, 64, 3), np.uint8)] * 3
    one = caption_frames(frames, ["a", "b", "c"], (10, 20, 30))
    per_frame = caption_frames(frames, ["a", "b", "c"], [(60, 60, 60), (60, 60, 60), (200, 50, 40)])
    h = max(12, round(0.09 * 64))
    assert [f.shape for f in per_frame] == [(8 + h, 64, 3)] * 3
    assert [tuple(f[-1, -1]) for f in one] == [(10, 20, 30)] * 3  # a corner pixel of each strip: no text there
    assert [tuple(f[-1, -1]) for f in per_frame] == [(60, 60, 60), (60, 60, 60), (200, 50, 40)]
    with pytest.raises(ValueError, match=r"^colour: expected one RGB triple or 3 of them, received shape \(2, 3\)$"):
        caption_frames(frames, ["a", "b", "c"], [(0, 0, 0), (1, 1, 1)])
