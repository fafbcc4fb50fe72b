"""Execution paths of a 1-D convolution at inference, and the choice among them by measuring each once per
(shape, device, dtype) (issue 19: "never slower, on any machine").

The same ``Conv1d`` (``groups=1``, ``dilation=1``, integer zero padding) can run as:

- ``"torch"``: PyTorch's own ``conv1d`` (oneDNN/MKL-DNN on CPU, cuDNN on CUDA);
- ``"onednn"``: oneDNN's convolution with the weights reordered once into its blocked layout and kept
  (``torch.ops.mkldnn._convolution_pointwise``, the kernel inductor uses; CPU, float32/bfloat16 only): no
  per-call weight re-layout;
- ``"im2col"``: one GEMM over unfolded windows, reading the layer's own weight memory as a ``(C_in * k,
  C_out)`` matrix (no copy);
- ``"taps"``: stride 1 only, one GEMM per kernel tap over only the output rows that tap reaches (skips the
  multiplications by padding zeros), cached ``(k, C_out, C_in)`` weights.

Which is fastest depends on the CPU (cache sizes, AVX-512 or not, the MKL and oneDNN kernels it dispatches to),
the batch and the sequence length: on one Xeon PyTorch's convolution wins, on one EPYC the GEMM forms win by
1.2-3.5x. :class:`PathSelector` therefore times every available path on the first call with a new
:class:`ConvKey` and keeps the fastest for that key (a dict lookup on later calls). All paths compute the same
convolution; outputs differ only by float summation order (``tests/policies/common/test_conv_paths.py``
compares every path with ``conv1d`` within float tolerance). For bit-reproducible runs across processes pin one
path with ``POLICYLINK_CONV_PATH=torch`` (or :func:`set_forced_path`). Convolutions under
:data:`MIN_MEASURED_MACS` multiply-adds always run ``"torch"`` (timing them costs more than any path saves;
this also keeps tiny test models deterministic across processes). ``torch.compile`` is not a candidate: it
compiles for seconds per shape on one CPU thread, far beyond the load-time budget of a few hundred ms (the small
image trunk with a dynamic batch: 31-584 s on a loaded 2-core Xeon, ``benchmarks/results/corrector.md`` round 9).

**Trunk mode** (issue 35): ``"exact"`` (the default) runs only the float32 paths above. ``"fast"`` (``$POLICYLINK_TRUNK
=fast`` or :func:`set_trunk_mode`) trades float rounding for speed in image trunks at inference (autograd off):
a float32 2-D convolution runs ``"onednn_bf16"`` (bfloat16 inputs and weights, float32 accumulation inside oneDNN,
float32 out; relative differences ~1e-3) on a CPU with native bfloat16 arithmetic (AVX512-BF16 or AMX), always,
not by timing (a timed choice between float32 and bfloat16 would make the latents depend on the machine's load;
elsewhere bfloat16 is emulated and slow, so the float32 paths are measured as in mode ``"exact"``), and
:mod:`~policylink.policies.common.backbones` switches Mish and the keypoint readout to cheaper formulations.
Training (autograd on) is unaffected. The 1-D convolutions (the U-Net's) are never reduced. ``"fp32"`` is ``"fast"``
without bfloat16: the Mish and keypoint formulations only (float32 rounding differences, ~1e-7 relative).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

PATHS = ("torch", "onednn", "im2col", "taps", "onednn_bf16")  # order = preference on ties
DEFAULT_PATH = "torch"
REDUCED_PATH = "onednn_bf16"  # trunk mode "fast", 2-D, where available: taken without timing
MIN_MEASURED_MACS = 1 << 22  # ~4M multiply-adds (~0.2-0.5 ms on one CPU thread); smaller convs run "torch"
TIMED_CALLS = 2  # timed calls per close candidate (1 for clearly slower ones); the best is kept
RETIME_WITHIN = 0.3  # paths within 30 % of the best after one call each are timed again
TIE_MARGIN = 0.03  # a later path must be this much faster than the best so far to replace it
ENV_VAR = "POLICYLINK_CONV_PATH"
TRUNK_MODES = ("exact", "fp32", "fast")
TRUNK_ENV_VAR = "POLICYLINK_TRUNK"


@dataclass(frozen=True)
class ConvKey:
    """What the speed of a convolution depends on: layer geometry, input ``(B, C_in, H)``, device and dtype."""

    c_in: int
    c_out: int
    kernel: int
    stride: int
    padding: int
    batch: int
    length: int
    device: str  # str(torch.device), e.g. "cpu", "cuda:0"
    dtype: str  # e.g. "torch.float32"

    width: int = 0  # W of a 2-D convolution (square kernel, stride and padding); 0 for 1-D
    reduced: bool = False  # trunk mode "fast" when keyed: reduced-precision paths are candidates

    @property
    def macs(self) -> int:
        """Multiply-adds of one call."""
        out = max((self.length + 2 * self.padding - self.kernel) // self.stride + 1, 0)
        if self.width:
            out *= max((self.width + 2 * self.padding - self.kernel) // self.stride + 1, 0) * self.kernel
        return self.batch * out * self.kernel * self.c_in * self.c_out


def conv_key(layer: nn.Conv1d | nn.Conv2d, x: torch.Tensor) -> ConvKey:
    """The :class:`ConvKey` of running ``layer`` on ``x`` ``(B, C_in, H)`` or ``(B, C_in, H, W)``."""
    k, stride, pad = layer.kernel_size[0], layer.stride[0], layer.padding[0]
    width = x.shape[3] if x.dim() == 4 else 0
    return ConvKey(
        x.shape[1], layer.out_channels, k, stride, pad, x.shape[0], x.shape[2], str(x.device), str(x.dtype), width,
        _trunk_mode == "fast" and width > 0,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------- the paths
class PathWeights(dict):
    """A layer's cache: path name -> (key, weights in that path's layout). A copy of the layer (``copy.deepcopy``,
    as EMA does; pickling) starts with an empty cache: oneDNN's blocked weights are opaque tensors that cannot be
    copied, and every entry is rebuilt from the copy's own weight on its first call anyway."""

    def __deepcopy__(self, memo: dict) -> PathWeights:
        return PathWeights()

    def __reduce__(self):
        return (PathWeights, ())


def _cached(layer: nn.Conv1d, name: str, extra: tuple, build: Callable[[torch.Tensor], object]):
    """Weights of ``layer`` in the layout of path ``name``, rebuilt when the weight tensor changes (in-place
    update, new tensor, device, dtype) or ``extra`` (e.g. the input shape) differs."""
    w = layer.weight
    key = (w._version, w.data_ptr(), w.device, w.dtype, extra)
    store = layer.__dict__.setdefault("_path_weights", PathWeights())
    hit = store.get(name)
    if hit is None or hit[0] != key:
        hit = store[name] = (key, build(w.detach()))
    return hit[1]


def _run_torch(layer: nn.Conv1d | nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    return layer._conv_forward(x, layer.weight, layer.bias)


def _run_im2col(layer: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
    """One GEMM over the unfolded windows, rows ordered ``(C_in, k)`` so the weight ``(C_out, C_in * k)`` is
    the layer's own memory read transposed (no weight copy)."""
    k, stride, pad = layer.kernel_size[0], layer.stride[0], layer.padding[0]
    weight = layer.weight.view(layer.out_channels, -1).t()  # (C_in * k, C_out)
    if pad:
        x = nn.functional.pad(x, (pad, pad))
    b, c = x.shape[:2]
    cols = x.unfold(2, k, stride)  # (B, C_in, H_out, k)
    h_out = cols.shape[2]
    cols = cols.transpose(1, 2).reshape(b * h_out, c * k)
    out = torch.addmm(layer.bias, cols, weight) if layer.bias is not None else cols @ weight
    return out.view(b, h_out, -1).transpose(1, 2)


def _run_taps(layer: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
    """Stride-1 convolution as ``k`` GEMMs, tap ``j`` over the output rows whose window reaches a real input at
    offset ``j - padding``. ``(B, C_in, H)`` -> ``(B, C_out, H_out)``."""
    k, pad = layer.kernel_size[0], layer.padding[0]
    b, c, h = x.shape
    h_out = h + 2 * pad - k + 1
    taps = _taps_weight(layer)  # (k, C_out, C_in)
    xt = x.transpose(1, 2).contiguous()  # (B, H, C_in)
    c_out = taps.shape[1]
    out = x.new_zeros(b, h_out, c_out) if layer.bias is None else layer.bias.expand(b, h_out, -1).clone()
    for j in range(k):
        shift = j - pad
        lo, hi = max(0, -shift), min(h_out, h - shift)  # output rows reached by this tap
        if lo < hi:
            rows = xt[:, lo + shift : hi + shift].reshape(b * (hi - lo), c)
            out[:, lo:hi] += (rows @ taps[j].t()).view(b, hi - lo, -1)
    return out.transpose(1, 2)


def _run_onednn(layer: nn.Conv1d | nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    if x.dim() == 4:
        pad, stride, dil = list(layer.padding), list(layer.stride), list(layer.dilation)
        return torch.ops.mkldnn._convolution_pointwise(
            x, _onednn_weight(layer, x), layer.bias, pad, stride, dil, layer.groups, "none", [], ""
        )
    pad, stride = [0, layer.padding[0]], [1, layer.stride[0]]
    out = torch.ops.mkldnn._convolution_pointwise(
        x.unsqueeze(2), _onednn_weight(layer, x), layer.bias, pad, stride, [1, 1], 1, "none", [], ""
    )
    return out.squeeze(2)


def _run_onednn_bf16(layer: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """2-D only: oneDNN's convolution on bfloat16 copies of ``x`` and of the (cached, reordered) weights and
    bias; the result is cast back to ``x.dtype``. ``(N, C_in, H, W)`` -> ``(N, C_out, H', W')``."""
    pad, stride, dil = list(layer.padding), list(layer.stride), list(layer.dilation)
    weight, bias = _onednn_bf16_weight(layer, x)
    out = torch.ops.mkldnn._convolution_pointwise(
        x.to(torch.bfloat16), weight, bias, pad, stride, dil, layer.groups, "none", [], ""
    )
    return out.to(x.dtype)


def _onednn_bf16_weight(layer: nn.Conv2d, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weight in bfloat16, reordered into oneDNN's blocked layout for inputs shaped like ``x``, and the bias
    in bfloat16 (``None`` without one)."""
    reorder = torch._C._nn.mkldnn_reorder_conv2d_weight
    pad, stride, dil, size = list(layer.padding), list(layer.stride), list(layer.dilation), list(x.shape)

    def build(w: torch.Tensor):
        bias = None if layer.bias is None else layer.bias.detach().to(torch.bfloat16)
        return reorder(w.to(torch.bfloat16).to_mkldnn(), pad, stride, dil, layer.groups, size), bias

    return _cached(layer, "onednn_bf16", tuple(size), build)


def _taps_weight(layer: nn.Conv1d) -> torch.Tensor:
    """``(k, C_out, C_in)``: one matrix per kernel tap, read transposed by the GEMMs (a cheap copy: only the
    small kernel axis moves)."""
    return _cached(layer, "taps", (), lambda w: w.permute(2, 0, 1).contiguous())


def _onednn_weight(layer: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
    """The weight reordered into oneDNN's blocked layout for inputs shaped like ``x`` (a 1-D kernel as 1 x k)."""
    reorder = torch._C._nn.mkldnn_reorder_conv2d_weight
    if x.dim() == 4:
        pad, stride, dil, size = list(layer.padding), list(layer.stride), list(layer.dilation), list(x.shape)
        return _cached(
            layer, "onednn", tuple(size), lambda w: reorder(w.to_mkldnn(), pad, stride, dil, layer.groups, size)
        )
    pad, stride = [0, layer.padding[0]], [1, layer.stride[0]]
    size = [x.shape[0], x.shape[1], 1, x.shape[2]]
    return _cached(
        layer, "onednn", tuple(size), lambda w: reorder(w.unsqueeze(2).to_mkldnn(), pad, stride, [1, 1], 1, size)
    )


RUNNERS: dict[str, Callable[[nn.Conv1d, torch.Tensor], torch.Tensor]] = {
    "torch": _run_torch,
    "onednn": _run_onednn,
    "im2col": _run_im2col,
    "taps": _run_taps,
    "onednn_bf16": _run_onednn_bf16,
}


def run_path(name: str, layer: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)`` computed by path ``name``: ``(B, C_in, H)`` -> ``(B, C_out, H_out)``.

    Raises:
        ValueError: an unknown path name (expected one of :data:`PATHS`).
    """
    runner = RUNNERS.get(name)
    if runner is None:
        raise ValueError(f"conv path: expected one of {PATHS}, received {name!r}")
    return runner(layer, x)


def prepare_path(name: str, layer: nn.Conv1d, x: torch.Tensor) -> None:
    """Build path ``name``'s cached weight layout for ``layer`` on inputs shaped like ``x`` (no convolution).

    Raises:
        RuntimeError, NotImplementedError: the path's ops are missing from this torch build or device.
    """
    if name == "taps":
        _taps_weight(layer)
    elif name == "onednn":
        _onednn_weight(layer, x)
    elif name == "onednn_bf16":
        _onednn_bf16_weight(layer, x)


def available_paths(key: ConvKey) -> tuple[str, ...]:
    """The paths that can run ``key``: ``"taps"`` only at stride 1 with padding, ``"onednn"`` only on CPU for
    float32/bfloat16 when this torch build has oneDNN, ``"onednn_bf16"`` only for a float32 2-D key made in trunk
    mode ``"fast"`` (``key.reduced``) on such a CPU with native bfloat16 arithmetic; ``"torch"`` and ``"im2col"``
    everywhere."""
    paths = ["torch"]
    onednn = key.device == "cpu" and key.dtype in ("torch.float32", "torch.bfloat16") and _has_onednn()
    if onednn:
        paths.append("onednn")
    if key.width:  # 2-D: PyTorch's conv or oneDNN with reordered weights
        if onednn and key.reduced and key.dtype == "torch.float32" and _native_bf16():
            paths.append("onednn_bf16")
        return tuple(paths)
    paths.append("im2col")
    if key.stride == 1 and key.padding:
        paths.append("taps")
    return tuple(paths)


def _has_onednn() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_convolution_pointwise")


def _native_bf16() -> bool:
    """This CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX tiles)."""
    cpu = getattr(torch, "cpu", None)
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(cpu, name, lambda: False)() for name in checks)


# -------------------------------------------------------------------------------------------- the choice
_forced: str | None = None
_trunk_mode = "exact"


def set_trunk_mode(mode: str) -> None:
    """Set the process-wide trunk mode, ``"exact"`` (default), ``"fp32"`` or ``"fast"`` (module docstring).
    Initialised from ``$POLICYLINK_TRUNK``. Convolution choices are kept per mode (:class:`ConvKey`).

    Raises:
        ValueError: ``mode`` not in :data:`TRUNK_MODES`.
    """
    global _trunk_mode
    if mode not in TRUNK_MODES:
        raise ValueError(f"{TRUNK_ENV_VAR}: expected one of {TRUNK_MODES}, received {mode!r}")
    _trunk_mode = mode


def trunk_mode() -> str:
    """The process-wide trunk mode, one of :data:`TRUNK_MODES`."""
    return _trunk_mode


def fast_inference() -> bool:
    """True when the cheaper, not bit-identical formulations apply: trunk mode ``"fp32"`` or ``"fast"`` and
    autograd off."""
    return _trunk_mode != "exact" and not torch.is_grad_enabled()


def set_forced_path(name: str | None) -> None:
    """Run every convolution through path ``name`` (``None``: measure). Initialised from ``$POLICYLINK_CONV_PATH``.

    Raises:
        ValueError: an unknown path name.
    """
    global _forced
    if name is not None and name not in PATHS:
        raise ValueError(f"{ENV_VAR}: expected one of {PATHS}, received {name!r}")
    _forced = name


class PathSelector:
    """Chooses and remembers the fastest path per :class:`ConvKey`.

    Args:
        min_macs: convolutions below this many multiply-adds run :data:`DEFAULT_PATH` unmeasured.
        timed_calls: timed calls per candidate (after one untimed warm-up call); the minimum counts.

    A path that raises on the warm-up call (an op this build lacks) is dropped for that key; if all but
    ``"torch"`` fail, ``"torch"`` is chosen. Devices other than CPU and CUDA (e.g. ``meta``) are never timed.
    ``measured_seconds`` is the total time spent measuring (the load-time cost).
    """

    def __init__(self, min_macs: int = MIN_MEASURED_MACS, timed_calls: int = TIMED_CALLS):
        self.min_macs, self.timed_calls = int(min_macs), int(timed_calls)
        self.choices: dict[ConvKey, str] = {}
        self.timings: dict[ConvKey, dict[str, float]] = {}  # seconds per call, per measured path
        self.measured_seconds = 0.0

    def choose(self, layer: nn.Conv1d, x: torch.Tensor) -> str:
        """The path for running ``layer`` on ``x`` (measured on the first call with this key; ``"onednn_bf16"``
        unmeasured wherever it is available: trunk mode ``"fast"``)."""
        key = conv_key(layer, x)
        if _forced is not None:
            return _forced if _forced in available_paths(key) else DEFAULT_PATH
        if key.reduced and REDUCED_PATH in available_paths(key):
            return REDUCED_PATH
        path = self.choices.get(key)
        if path is None:
            path = self.choices[key] = self._measure(key, layer, x)
        return path

    def path_for(self, key: ConvKey) -> str:
        """The path :meth:`choose` takes for ``key`` now, without measuring: the pinned one, the choice made,
        or :data:`DEFAULT_PATH`."""
        if _forced is not None:
            return _forced if _forced in available_paths(key) else DEFAULT_PATH
        if key.reduced and REDUCED_PATH in available_paths(key):
            return REDUCED_PATH
        return self.choices.get(key, DEFAULT_PATH)

    def clear(self) -> None:
        """Forget every choice (the next calls measure again)."""
        self.choices.clear()
        self.timings.clear()
        self.measured_seconds = 0.0

    def _measure(self, key: ConvKey, layer: nn.Conv1d, x: torch.Tensor) -> str:
        """Time each available path: one call each (cached weight layouts built beforehand, untimed), then
        ``timed_calls - 1`` more for the paths within :data:`RETIME_WITHIN` of the best (the close calls)."""
        if key.macs < self.min_macs or x.device.type not in ("cpu", "cuda"):
            return DEFAULT_PATH
        t_start = time.perf_counter()
        sync = torch.cuda.synchronize if x.device.type == "cuda" else (lambda: None)
        times: dict[str, float] = {}
        for name in available_paths(key):
            try:
                prepare_path(name, layer, x)
                times[name] = _time_call(name, layer, x, sync)
            except (RuntimeError, NotImplementedError, AttributeError, TypeError):
                continue  # an op this build or device lacks: not a candidate
        for _ in range(self.timed_calls - 1):
            best = min(times.values(), default=0.0)
            for name in [n for n, t in times.items() if t <= best * (1.0 + RETIME_WITHIN)]:
                times[name] = min(times[name], _time_call(name, layer, x, sync))
        self.timings[key] = times
        chosen = pick_fastest(times)
        store = layer.__dict__.get("_path_weights", {})
        for name in [n for n in store if n != chosen]:
            del store[name]  # the losers' weight copies
        self.measured_seconds += time.perf_counter() - t_start
        return chosen


def _time_call(name: str, layer: nn.Conv1d, x: torch.Tensor, sync: Callable[[], None]) -> float:
    sync()
    t0 = time.perf_counter()
    run_path(name, layer, x)
    sync()
    return time.perf_counter() - t0


def pick_fastest(times: dict[str, float]) -> str:
    """The fastest path of ``times`` (seconds per call), in :data:`PATHS` order; a later path must be more than
    :data:`TIE_MARGIN` faster to win (stable choices under timing noise). Empty: :data:`DEFAULT_PATH`."""
    best = None
    for name in PATHS:
        t = times.get(name)
        if t is not None and (best is None or t < times[best] * (1.0 - TIE_MARGIN)):
            best = name
    return best or DEFAULT_PATH


class MeasuredConv2d(nn.Conv2d):
    """``nn.Conv2d`` that, when autograd is off, runs the faster of PyTorch's conv and oneDNN with weights
    reordered once, measured per :class:`ConvKey` (PyTorch's CPU conv re-lays out the weights on every call:
    ResNet-18 on one 84x84 frame took 54 ms that way against 18 ms with reordered weights on one loaded EPYC
    core); in trunk mode ``"fast"`` also ``"onednn_bf16"``. Square kernel, stride and padding, ``groups=1``,
    ``dilation=1`` only; others run PyTorch's conv. Input ``(N, C_in, H, W)`` -> ``(N, C_out, H', W')``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            torch.is_grad_enabled()
            or x.dim() != 4
            or self.groups != 1
            or self.dilation != (1, 1)
            or isinstance(self.padding, str)
            or self.padding_mode != "zeros"
            or len({*self.kernel_size}) > 1
            or len({*self.stride}) > 1
            or len({*self.padding}) > 1
        ):
            return super().forward(x)
        return run_path(SELECTOR.choose(self, x), self, x)


def use_measured_convs(module: nn.Module) -> nn.Module:
    """Turn every plain ``nn.Conv2d`` inside ``module`` into a :class:`MeasuredConv2d` (same parameters and
    state dict; the class of each instance changes in place). Returns ``module``."""
    for m in module.modules():
        if type(m) is nn.Conv2d:
            m.__class__ = MeasuredConv2d
    return module


SELECTOR = PathSelector()  # the process-wide choices used by GemmConv1d and MeasuredConv2d
set_forced_path(os.environ.get(ENV_VAR) or None)
set_trunk_mode(os.environ.get(TRUNK_ENV_VAR) or "exact")
