"""Every execution path of a 1-D convolution computes ``conv1d`` (within float tolerance), and the measured
choice is cached per (shape, device, dtype), skips failing paths and falls back to PyTorch's conv."""

from __future__ import annotations

import pytest
import torch

from policylink.policies.common import conv_paths
from policylink.policies.common.conv_paths import (
    ConvKey,
    PathSelector,
    available_paths,
    conv_key,
    pick_fastest,
    run_path,
    set_forced_path,
)
from policylink.policies.common.unet1d import ConditionalUnet1D, GemmConv1d

SHAPES = [  # (b, h, c_in, c_out, k, stride, pad)
    (1, 16, 8, 12, 5, 1, 2),
    (2, 4, 16, 8, 5, 1, 2),  # padding is 30 % of the windows (deepest U-Net level)
    (8, 8, 6, 10, 5, 1, 2),
    (3, 2, 4, 4, 5, 1, 2),  # taps at offset +-2 reach no real input at H = 2
    (2, 16, 8, 8, 3, 2, 1),  # stride 2 (down-sampling)
    (2, 9, 5, 7, 1, 1, 0),  # 1x1 residual conv
]


@pytest.fixture(autouse=True)
def _measured():
    set_forced_path(None)
    yield
    set_forced_path(None)


@pytest.mark.parametrize("shape", SHAPES)
def test_every_path_equals_torch_conv(shape):
    b, h, c_in, c_out, k, stride, pad = shape
    torch.manual_seed(0)
    conv = GemmConv1d(c_in, c_out, k, stride=stride, padding=pad)
    x = torch.randn(b, c_in, h)
    paths = available_paths(conv_key(conv, x))
    assert paths[:1] == ("torch",) and "im2col" in paths and ("taps" in paths) == (stride == 1 and pad > 0)
    with torch.no_grad():
        for scale in (1.0, 2.0):  # an in-place weight update invalidates every cached layout
            conv.weight.mul_(scale)
            expected = torch.nn.functional.conv1d(x, conv.weight, conv.bias, stride=stride, padding=pad)
            for name in paths:
                got = run_path(name, conv, x)
                assert got.shape == expected.shape, name
                torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5, msg=name)


def test_unet_output_is_the_same_whatever_path(monkeypatch):
    torch.manual_seed(0)
    net = ConditionalUnet1D(3, 10, down_dims=(16, 32, 64), time_embed_dim=16).eval()
    x, t, cond = torch.randn(2, 8, 3), torch.tensor([7.0]), torch.randn(2, 10)
    with torch.no_grad():
        set_forced_path("torch")
        ref = net(x, t, cond)
        for name in conv_paths.PATHS[1:]:
            set_forced_path(name)
            torch.testing.assert_close(net(x, t, cond), ref, atol=2e-5, rtol=1e-5, msg=name)
        set_forced_path(None)
        selector = conv_paths.SELECTOR  # the one GemmConv1d uses, measuring every conv of this tiny net
        monkeypatch.setattr(selector, "min_macs", 0)
        selector.clear()
        torch.testing.assert_close(net(x, t, cond), ref, atol=2e-5, rtol=1e-5)
    assert len(selector.choices) >= 5 and set(selector.choices.values()) <= set(conv_paths.PATHS)
    selector.clear()


def test_choice_is_measured_once_per_key_and_keyed_by_shape_device_dtype():
    conv = GemmConv1d(8, 8, 5, padding=2)
    selector = PathSelector(min_macs=0)
    x1, x2 = torch.randn(1, 8, 16), torch.randn(2, 8, 16)
    with torch.no_grad():
        first = selector.choose(conv, x1)
        assert selector.choose(conv, x1) == first and len(selector.timings) == 1
        selector.choose(conv, x2)
        selector.choose(conv, x1.double())
    keys = list(selector.timings)
    assert len(keys) == 3
    assert {(k.batch, k.dtype) for k in keys} == {(1, "torch.float32"), (2, "torch.float32"), (1, "torch.float64")}
    assert all(k.device == "cpu" for k in keys)
    assert set(selector.timings[keys[0]]) == set(available_paths(keys[0]))
    assert "onednn" not in selector.timings[keys[2]]  # float64: no oneDNN path
    cuda = ConvKey(8, 8, 5, 1, 2, 1, 16, "cuda:0", "torch.float32")
    assert cuda != keys[0] and available_paths(cuda) == ("torch", "im2col", "taps")
    selector.clear()
    assert not selector.choices and selector.measured_seconds == 0.0


def test_small_convs_and_untimed_devices_run_torch_unmeasured():
    conv = GemmConv1d(4, 4, 5, padding=2)
    selector = PathSelector()  # default threshold: 4 x 4 x 5 x 8 MACs is far below it
    with torch.no_grad():
        assert selector.choose(conv, torch.randn(1, 4, 8)) == "torch"
        meta = GemmConv1d(64, 64, 5, padding=2, device="meta")
        x = torch.empty(4, 64, 64, device="meta")
        assert PathSelector(min_macs=0).choose(meta, x) == "torch"
        assert meta(x).shape == (4, 64, 64) and meta(x).device.type == "meta"
    assert not selector.timings


def test_a_failing_path_is_dropped_and_losers_weights_freed(monkeypatch):
    def broken(layer, x):
        raise RuntimeError("this build has no such kernel")

    monkeypatch.setitem(conv_paths.RUNNERS, "taps", broken)
    monkeypatch.setitem(conv_paths.RUNNERS, "onednn", broken)
    conv = GemmConv1d(8, 8, 5, padding=2)
    selector = PathSelector(min_macs=0)
    x = torch.randn(1, 8, 16)
    with torch.no_grad():
        chosen = selector.choose(conv, x)
    assert chosen in ("torch", "im2col")
    assert set(selector.timings[conv_key(conv, x)]) == {"torch", "im2col"}
    assert set(conv.__dict__.get("_path_weights", {})) <= {chosen}


def test_pick_fastest_prefers_earlier_paths_within_the_margin():
    assert pick_fastest({"torch": 1.0, "im2col": 0.98}) == "torch"
    assert pick_fastest({"torch": 1.0, "taps": 0.5, "im2col": 0.6}) == "taps"
    assert pick_fastest({"im2col": 2.0, "onednn": 1.0}) == "onednn"
    assert pick_fastest({}) == "torch"


def test_forced_path_falls_back_where_it_cannot_run_and_rejects_unknown_names():
    set_forced_path("taps")
    strided = GemmConv1d(8, 8, 3, stride=2, padding=1)
    assert conv_paths.SELECTOR.choose(strided, torch.randn(1, 8, 8)) == "torch"
    assert conv_paths.SELECTOR.choose(GemmConv1d(8, 8, 5, padding=2), torch.randn(1, 8, 8)) == "taps"
    with pytest.raises(ValueError, match="POLICYLINK_CONV_PATH: expected one of .* received 'fft'"):
        set_forced_path("fft")
    with pytest.raises(ValueError, match="conv path: expected one of .* received 'fft'"):
        run_path("fft", strided, torch.randn(1, 8, 8))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_paths_equal_torch_conv():
    conv = GemmConv1d(64, 32, 5, padding=2).cuda()
    x = torch.randn(2, 64, 16, device="cuda")
    with torch.no_grad():
        expected = torch.nn.functional.conv1d(x, conv.weight, conv.bias, padding=2)
        for name in available_paths(conv_key(conv, x)):
            torch.testing.assert_close(run_path(name, conv, x), expected, atol=1e-4, rtol=1e-4, msg=name)
        assert PathSelector(min_macs=0).choose(conv, x) in available_paths(conv_key(conv, x))


@pytest.mark.parametrize(
    ("n", "c_in", "c_out", "k", "stride", "pad", "hw"), [(1, 3, 8, 7, 2, 3, 20), (2, 8, 8, 3, 1, 1, 9)]
)
def test_conv2d_paths_equal_torch_conv_and_encoders_use_them(monkeypatch, n, c_in, c_out, k, stride, pad, hw):
    from policylink.policies.common.conv_paths import MeasuredConv2d, use_measured_convs
    from policylink.policies.common.encoders import ImageEncoder

    torch.manual_seed(0)
    conv = use_measured_convs(torch.nn.Sequential(torch.nn.Conv2d(c_in, c_out, k, stride, pad)))[0]
    assert type(conv) is MeasuredConv2d
    x = torch.randn(n, c_in, hw, hw)
    key = conv_key(conv, x)
    assert key.width == hw and available_paths(key) in (("torch",), ("torch", "onednn"))
    assert key.macs == n * ((hw + 2 * pad - k) // stride + 1) ** 2 * k * k * c_in * c_out
    with torch.no_grad():
        expected = torch.nn.functional.conv2d(x, conv.weight, conv.bias, stride, pad)
        for name in available_paths(key):
            torch.testing.assert_close(run_path(name, conv, x), expected, atol=1e-5, rtol=1e-5, msg=name)
        monkeypatch.setattr(conv_paths.SELECTOR, "min_macs", 0)
        torch.testing.assert_close(conv(x), expected, atol=1e-5, rtol=1e-5)
        assert conv_paths.SELECTOR.path_for(key) in available_paths(key)
    enc = ImageEncoder((24, 24), "small_conv", 1.0, 4)
    assert all(type(m) is not torch.nn.Conv2d for m in enc.trunk.modules())
    conv_paths.SELECTOR.clear()


def test_a_layer_with_cached_onednn_weights_deep_copies_and_pickles():
    # EMA deep-copies the model after the image encoder's shape probe ran its convolutions; oneDNN's blocked
    # weights are opaque tensors that copy.deepcopy cannot copy (it raised NotImplementedError in training)
    import copy
    import pickle

    from policylink.policies.common.conv_paths import MeasuredConv2d, use_measured_convs

    torch.manual_seed(0)
    conv = use_measured_convs(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, 1, 1)))[0]
    assert type(conv) is MeasuredConv2d
    x = torch.randn(2, 3, 12, 12)
    if "onednn" not in available_paths(conv_key(conv, x)):
        pytest.skip("this torch build has no oneDNN convolution")
    with torch.no_grad():
        expected = run_path("onednn", conv, x)
        assert "onednn" in conv.__dict__["_path_weights"]
        for twin in (copy.deepcopy(conv), pickle.loads(pickle.dumps(conv))):
            assert twin.__dict__["_path_weights"] == {}  # the cache is rebuilt, not copied
            torch.testing.assert_close(run_path("onednn", twin, x), expected)
            torch.testing.assert_close(twin.weight, conv.weight)
