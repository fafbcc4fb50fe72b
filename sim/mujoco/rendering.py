"""Offscreen RGB rendering of a MuJoCo scene: fast by default (no shadows, no multisampling, offscreen buffer
sized to the image), ``"pretty"`` for videos.

MuJoCo's :class:`mujoco.Renderer` reads the OpenGL buffer bottom-up and flips it, so frames come out upright
(row 0 is the top of the image) and not mirrored (image right is the camera's +x axis).
"""

from __future__ import annotations

import functools
import importlib.util

import mujoco
import numpy as np

RENDER_QUALITIES = ("fast", "pretty")


@functools.cache
def load_llvm_before_gl() -> None:
    """Load Triton (if installed) before the first OpenGL context is made in this process.

    Mesa's software renderer (llvmpipe, behind EGL/OSMesa) and Triton (pulled in by torch/torchvision) each
    bring their own LLVM; when Triton's loads *after* a GL context exists, the process segfaults in
    ``triton/knobs.py`` the first time torchvision is imported. Loading Triton first (~0.2 s, once) avoids it.
    Nothing is imported when Triton is absent.
    """
    if importlib.util.find_spec("triton") is not None:
        importlib.import_module("triton")


def configure_visual_quality(model: mujoco.MjModel, quality: str, height: int, width: int) -> None:
    """Set the model's offscreen visual settings for ``quality`` and make the buffer hold ``height x width``.

    ``"fast"``: ``shadowsize = 0``, ``offsamples = 0`` (about 60x faster under a software renderer);
    ``"pretty"``: 4096-pixel shadow maps, 4x multisampling. The offscreen buffer is set to exactly the largest
    frame that will be rendered from this model (MuJoCo allocates it once per renderer).

    Raises:
        ValueError: ``quality`` is not one of :data:`RENDER_QUALITIES`.
    """
    if quality not in RENDER_QUALITIES:
        raise ValueError(f"render_quality: expected one of {RENDER_QUALITIES}, received {quality!r}")
    pretty = quality == "pretty"
    model.vis.quality.shadowsize = 4096 if pretty else 0
    model.vis.quality.offsamples = 4 if pretty else 0
    model.vis.global_.offwidth = max(int(width), 1)
    model.vis.global_.offheight = max(int(height), 1)


class FrameRenderer:
    """Render uint8 RGB frames ``(H, W, 3)`` from named cameras of one model.

    Call :func:`configure_visual_quality` on the model first, with a buffer at least ``height x width``.

    Args:
        model: the compiled model.
        height, width: frame size in pixels.

    Raises:
        ValueError: a non-positive size, or a size larger than the model's offscreen buffer.
    """

    def __init__(self, model: mujoco.MjModel, height: int, width: int):
        if height < 1 or width < 1:
            raise ValueError(f"image_size: expected positive height and width, received ({height}, {width})")
        buf = (model.vis.global_.offheight, model.vis.global_.offwidth)
        if height > buf[0] or width > buf[1]:
            raise ValueError(f"image_size: expected at most the offscreen buffer {buf}, received ({height}, {width})")
        self.model = model
        self.height, self.width = int(height), int(width)
        self._renderer: mujoco.Renderer | None = None  # created lazily: an env without images needs no GL

    def render(self, data: mujoco.MjData, camera: str) -> np.ndarray:
        """A fresh uint8 ``(H, W, 3)`` RGB frame of ``camera`` for the current ``data``.

        Camera poses are refreshed first (``mj_camlight``), so a frame is valid right after a reset.

        Raises:
            KeyError: ``camera`` is not a camera of the model (the message lists the available ones).
        """
        self._update_scene(data, camera)
        return self._renderer.render().copy()

    def render_depth(self, data: mujoco.MjData, camera: str) -> np.ndarray:
        """A fresh float32 ``(H, W)`` z-depth frame of ``camera``, metres (distance along the optical axis, as
        :class:`mujoco.Renderer` linearises the depth buffer; background reads as the far clipping distance).

        Raises:
            KeyError: ``camera`` is not a camera of the model.
        """
        self._update_scene(data, camera)
        self._renderer.enable_depth_rendering()
        try:
            return self._renderer.render().astype(np.float32)
        finally:
            self._renderer.disable_depth_rendering()

    def _update_scene(self, data: mujoco.MjData, camera: str) -> None:
        """Check ``camera``, make the GL context on first use, refresh camera poses and the scene."""
        if mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_CAMERA, camera) < 0:
            names = [self.model.camera(i).name for i in range(self.model.ncam)]
            raise KeyError(f"camera: expected one of {names}, received {camera!r}")
        if self._renderer is None:
            load_llvm_before_gl()
            self._renderer = mujoco.Renderer(self.model, self.height, self.width)
        mujoco.mj_camlight(self.model, data)
        self._renderer.update_scene(data, camera=camera)

    def close(self) -> None:
        """Free the GL context (idempotent)."""
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
