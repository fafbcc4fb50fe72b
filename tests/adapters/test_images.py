"""Image convention: uint8 and float [0, 1] give identical policy input; out-of-range floats are errors."""

import numpy as np
import pytest

from policylink.adapters.images import ImageScaleError, to_float_chw, to_uint8_hwc


def test_uint8_and_float_frames_give_identical_input():
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, size=(2, 8, 6, 3), dtype=np.uint8)
    as_float = frame.astype(np.float32) / 255.0
    a, b = to_float_chw(frame), to_float_chw(as_float)
    assert a.dtype == np.float32 and a.shape == (2, 3, 8, 6)
    np.testing.assert_array_equal(a, b)
    assert a[0, 0, 0, 0] == np.float32(frame[0, 0, 0, 0]) / np.float32(255)


def test_channel_order_is_kept():
    frame = np.zeros((4, 4, 3), np.uint8)
    frame[..., 0] = 255  # pure red
    chw = to_float_chw(frame)
    assert chw[0].min() == 1.0 and chw[1].max() == 0.0 and chw[2].max() == 0.0
    np.testing.assert_array_equal(to_uint8_hwc(chw), frame)


def test_float_outside_unit_range_is_an_error_not_a_rescale():
    with pytest.raises(
        ImageScaleError,
        match=r"observation.images.top: expected float values in \[0, 1\], "
        r"received range \[0, 255\]",
    ):
        frame = np.full((4, 4, 3), 255.0, np.float32)
        frame[0, 0, 0] = 0.0
        to_float_chw(frame, key="observation.images.top")


def test_layout_and_dtype_errors():
    with pytest.raises(ImageScaleError, match=r"expected RGB layout \(\.\.\., H, W, 3\), received shape \(3, 4, 4\)"):
        to_float_chw(np.zeros((3, 4, 4), np.uint8))
    with pytest.raises(ImageScaleError, match="expected dtype uint8 or float"):
        to_float_chw(np.zeros((4, 4, 3), np.int32))
