"""Encoders and U-Net: spatial-softmax keypoints, crops, GroupNorm-only ResNet, shapes, config errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from policylink.adapters.schema import FeatureSpec
from policylink.policies.common.backbones import RandomCrop, SpatialSoftmax, resnet18_groupnorm
from policylink.policies.common.encoders import EncoderConfig, ObservationEncoder
from policylink.policies.common.unet1d import ConditionalUnet1D, UNetConfig
from policylink.policies.registry import make_config


def test_spatial_softmax_finds_a_sharp_peak():
    ss = SpatialSoftmax(1, 1)
    with torch.no_grad():
        ss.keypoints.weight.fill_(1.0)
        ss.keypoints.bias.zero_()
    fmap = torch.zeros(1, 1, 5, 9)
    fmap[0, 0, 4, 0] = 100.0  # bottom-left pixel: x = -1, y = +1
    torch.testing.assert_close(ss(fmap), torch.tensor([[-1.0, 1.0]]), atol=1e-4, rtol=0)


def test_random_crop_train_and_eval():
    x = torch.arange(2 * 10 * 10, dtype=torch.float32).reshape(2, 1, 10, 10)
    crop = RandomCrop(0.8)
    crop.eval()
    torch.testing.assert_close(crop(x), x[:, :, 1:9, 1:9])  # centre crop 8 x 8
    crop.train()
    out = crop(x, generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 1, 8, 8)
    for i in range(2):  # each crop is a contiguous block of its own image
        top, left = divmod(int(out[i, 0, 0, 0]) - 100 * i, 10)
        torch.testing.assert_close(out[i], x[i, :, top : top + 8, left : left + 8])
    with pytest.raises(ValueError, match=r"crop_ratio: expected a value in \(0, 1\], received 1.5"):
        RandomCrop(1.5)
    rgb = torch.rand(2, 3, 10, 10)  # training crops come back NCHW-contiguous (a channels-last view slowed the trunk)
    assert crop(rgb, generator=torch.Generator().manual_seed(0)).is_contiguous()


def test_resnet18_has_groupnorm_only():
    net = resnet18_groupnorm()
    assert not any(isinstance(m, nn.BatchNorm2d) for m in net.modules())
    assert sum(isinstance(m, nn.GroupNorm) for m in net.modules()) == 20
    assert net(torch.zeros(1, 3, 84, 84)).shape == (1, 512, 3, 3)


def test_observation_encoder_shapes_and_text_rejected():
    feats = {
        "observation.state": FeatureSpec("float32", (5,)),
        "observation.images.a": FeatureSpec("uint8", (32, 32, 3)),
        "observation.images.b": FeatureSpec("uint8", (32, 32, 3)),
    }
    enc = ObservationEncoder(
        feats, 2, EncoderConfig(vision_backbone="small_conv", num_keypoints=4, state_hidden_dims=[16], state_out_dim=8)
    )
    obs = {
        "observation.state": torch.zeros(3, 2, 5),
        "observation.images.a": torch.rand(3, 2, 3, 32, 32),
        "observation.images.b": torch.rand(3, 2, 3, 32, 32),
    }
    assert enc.out_dim == 2 * (8 + 2 * 8) and enc(obs).shape == (3, 48)
    with pytest.raises(ValueError, match="task: expected an image"):
        ObservationEncoder({"task": FeatureSpec("string", ())}, 2, EncoderConfig())


def test_unet_shape_and_config_errors():
    net = ConditionalUnet1D(3, 10, (16, 32, 64), kernel_size=3, n_groups=8, time_embed_dim=16)
    out = net(torch.randn(2, 16, 3), torch.tensor([0, 50]), torch.randn(2, 10))
    assert out.shape == (2, 16, 3)
    with pytest.raises(ValueError, match="down_dims: expected multiples of n_groups=8"):
        ConditionalUnet1D(3, 10, (12, 32))
    with pytest.raises(ValueError, match=r"policy.chunk_size: expected a multiple of 4 .* received 10"):
        make_config("flow", chunk_size=10, unet=UNetConfig(down_dims=[8, 16, 32])).validate()
    with pytest.raises(ValueError, match="policy.type: expected one of .* received 'gan'"):
        make_config("gan").validate()


@pytest.mark.parametrize(
    ("b", "h", "c_in", "c_out", "k", "stride", "pad"),
    [
        (1, 16, 8, 12, 5, 1, 2),  # im2col GEMM
        (2, 4, 16, 8, 5, 1, 2),  # per-tap GEMMs: padding is 30 % of the windows
        (8, 8, 6, 10, 5, 1, 2),  # per-tap GEMMs: B * H >= 64
        (3, 2, 4, 4, 5, 1, 2),  # taps at offset +-2 reach no real input at H = 2
        (2, 16, 8, 8, 3, 2, 1),  # stride 2 (down-sampling): im2col
        (2, 9, 5, 7, 1, 1, 0),  # 1x1 residual conv
    ],
)
def test_gemm_conv_equals_torch_conv_at_inference(b, h, c_in, c_out, k, stride, pad):
    from policylink.policies.common.unet1d import GemmConv1d

    torch.manual_seed(0)
    conv = GemmConv1d(c_in, c_out, k, stride=stride, padding=pad)
    x = torch.randn(b, c_in, h)
    expected = torch.nn.functional.conv1d(x, conv.weight, conv.bias, stride=stride, padding=pad)
    with torch.no_grad():
        got = conv(x)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        conv.weight.mul_(2.0)  # an in-place weight update invalidates the cached matrices
        expected = torch.nn.functional.conv1d(x, conv.weight, conv.bias, stride=stride, padding=pad)
        torch.testing.assert_close(conv(x), expected, atol=1e-5, rtol=1e-5)
