"""Image convention at the edge: frames are uint8 RGB HWC on the wire and in datasets.

A policy that wants float CHW in ``[0, 1]`` converts once with :func:`to_float_chw`; a uint8 frame and the
same frame already given as float in ``[0, 1]`` produce identical policy input, and a float frame outside
``[0, 1]`` is an error (never a silent rescale).
"""

from __future__ import annotations

import numpy as np


class ImageScaleError(ValueError):
    """A float image is outside ``[0, 1]`` or an image has the wrong layout."""


def to_float_chw(image: np.ndarray, key: str = "image") -> np.ndarray:
    """Convert ``(..., H, W, 3)`` RGB images to float32 ``(..., 3, H, W)`` in ``[0, 1]``.

    Args:
        image: uint8 in ``[0, 255]``, or float16/32/64 already in ``[0, 1]``.
        key: feature name used in error messages.

    Returns:
        float32 array ``(..., 3, H, W)``; uint8 input is divided by 255 in float32.

    Raises:
        ImageScaleError: layout is not ``(..., H, W, 3)``, dtype is neither uint8 nor float, or a float
            image has values outside ``[0, 1]`` (e.g. a 0-255 float frame).
    """
    image = np.asarray(image)
    if image.ndim < 3 or image.shape[-1] != 3:
        raise ImageScaleError(f"{key}: expected RGB layout (..., H, W, 3), received shape {image.shape}")
    if image.dtype == np.uint8:
        out = image.astype(np.float32) / np.float32(255.0)
    elif image.dtype.kind == "f":
        lo, hi = float(np.min(image)), float(np.max(image))
        if lo < 0.0 or hi > 1.0 or not np.isfinite(lo + hi):
            raise ImageScaleError(
                f"{key}: expected float values in [0, 1], received range [{lo:.4g}, {hi:.4g}] "
                "(pass uint8 frames for 0-255 data)"
            )
        out = image.astype(np.float32)
    else:
        raise ImageScaleError(f"{key}: expected dtype uint8 or float in [0, 1], received {image.dtype}")
    return np.ascontiguousarray(np.moveaxis(out, -1, -3))


def to_uint8_hwc(image: np.ndarray, key: str = "image") -> np.ndarray:
    """Convert float32 ``(..., 3, H, W)`` in ``[0, 1]`` back to uint8 ``(..., H, W, 3)`` (rounding to nearest).

    Raises:
        ImageScaleError: layout is not ``(..., 3, H, W)`` or values are outside ``[0, 1]``.
    """
    image = np.asarray(image)
    if image.ndim < 3 or image.shape[-3] != 3:
        raise ImageScaleError(f"{key}: expected CHW layout (..., 3, H, W), received shape {image.shape}")
    lo, hi = float(np.min(image)), float(np.max(image))
    if lo < 0.0 or hi > 1.0:
        raise ImageScaleError(f"{key}: expected float values in [0, 1], received range [{lo:.4g}, {hi:.4g}]")
    return np.ascontiguousarray(np.moveaxis(np.rint(image * 255.0).astype(np.uint8), -3, -1))
