"""Trunk mode "fast" (issue 35): the closed-form Mish, the GEMM keypoint readout and oneDNN's bfloat16 convolution
compute the exact trunk's values within their rounding, only at inference; the default mode is bit-identical to
PyTorch's modules."""

from __future__ import annotations

import pytest
import torch

from policylink.policies.common import conv_paths
from policylink.policies.common.backbones import SpatialSoftmax, TrunkMish, mish_closed_form
from policylink.policies.common.conv_paths import available_paths, conv_key, run_path, set_trunk_mode
from policylink.policies.common.encoders import ImageEncoder


@pytest.fixture(autouse=True)
def _exact_after():
    yield
    set_trunk_mode("exact")
    conv_paths.SELECTOR.clear()


def test_closed_form_mish_matches_torch_within_rounding():
    x = torch.cat([torch.linspace(-60.0, 60.0, 20001), torch.tensor([-1e4, -88.0, 0.0, 19.9, 20.1, 1e4])])
    expected = torch.nn.functional.mish(x)
    got = mish_closed_form(x)
    assert torch.isfinite(got).all()
    # ~1 ulp of x (float32): 1e-6 relative to max(|x|, 1)
    assert ((got - expected).abs() / x.abs().clamp(min=1.0)).max().item() < 2e-6
    assert got[x == 0].item() == 0.0 and got[-1].item() == 1e4  # identity above the clamp
    assert -0.31 < got.min().item() < -0.30  # Mish's minimum, -0.3088 at x = -1.19


def test_trunk_mode_is_checked_and_exact_by_default():
    assert conv_paths.trunk_mode() == "exact"
    with pytest.raises(ValueError, match="POLICYLINK_TRUNK.*'fastest'"):
        set_trunk_mode("fastest")
    x = torch.randn(2, 4, 5, 5)
    with torch.no_grad():
        assert torch.equal(TrunkMish()(x), torch.nn.functional.mish(x))  # exact: PyTorch's kernel itself
        set_trunk_mode("fast")
        fast = TrunkMish()(x)
        assert not torch.equal(fast, torch.nn.functional.mish(x))  # the other formula ran
    torch.testing.assert_close(fast, torch.nn.functional.mish(x), atol=1e-6, rtol=0)
    assert torch.equal(TrunkMish()(x), torch.nn.functional.mish(x))  # autograd on: always exact


def test_gemm_keypoints_equal_the_1x1_conv():
    torch.manual_seed(0)
    ss = SpatialSoftmax(8, 4)
    feats = torch.randn(3, 8, 6, 7)
    with torch.no_grad():
        exact = ss(feats)
        set_trunk_mode("fast")
        fast = ss(feats)
    assert exact.shape == fast.shape == (3, 8)
    torch.testing.assert_close(fast, exact, atol=1e-6, rtol=1e-6)


def test_fast_conv_keys_offer_bf16_only_for_2d_float32_on_onednn():
    conv = torch.nn.Conv2d(8, 16, 3, 1, 1)
    x = torch.randn(2, 8, 12, 12)
    exact_key = conv_key(conv, x)
    set_trunk_mode("fp32")
    assert not conv_key(conv, x).reduced  # fp32: float32 convolutions only
    set_trunk_mode("fast")
    fast_key = conv_key(conv, x)
    assert not exact_key.reduced and fast_key.reduced and exact_key != fast_key  # choices kept per mode
    assert "onednn_bf16" not in available_paths(exact_key)
    assert not conv_key(torch.nn.Conv1d(8, 16, 3, padding=1), x[..., 0]).reduced  # 1-D (U-Net): never reduced
    if "onednn" not in available_paths(fast_key) or not conv_paths._native_bf16():
        assert "onednn_bf16" not in available_paths(fast_key)
        pytest.skip("no oneDNN convolution or no native bfloat16 on this CPU")
    assert available_paths(fast_key)[-1] == "onednn_bf16"
    measured = conv_paths.PathSelector(min_macs=0)
    assert measured.choose(conv, x) == measured.path_for(fast_key) == "onednn_bf16"  # not timed: no load dependence
    assert measured.choices == {}
    with torch.no_grad():
        out = run_path("onednn_bf16", conv, x)
        expected = torch.nn.functional.conv2d(x, conv.weight, conv.bias, 1, 1)
    assert out.dtype == torch.float32 and out.shape == expected.shape
    torch.testing.assert_close(out, expected, atol=3e-2, rtol=2e-2)  # bfloat16 inputs: ~3 significant digits
    assert not torch.equal(out, expected)


@pytest.mark.parametrize(("mode", "tol"), [("fp32", 1e-5), ("fast", 2e-2)])
def test_small_conv_encoder_fast_modes_are_close_and_training_untouched(mode, tol):
    torch.manual_seed(0)
    enc = ImageEncoder((32, 32), "small_conv", 0.9, 8).eval()
    x = torch.rand(4, 3, 32, 32)
    train_exact = enc(x).detach()  # autograd on: PyTorch's modules
    with torch.no_grad():
        exact = enc(x)
        set_trunk_mode(mode)
        fast = enc(x)
    assert fast.shape == exact.shape == (4, 16) and not torch.equal(fast, exact)
    torch.testing.assert_close(fast, exact, atol=tol / 4, rtol=tol)
    assert torch.equal(enc(x).detach(), train_exact)  # autograd on: the same modules, whatever the mode
