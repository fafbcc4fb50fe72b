"""Pointmap statistics (per channel, fill pixels skipped), the observation transform's channel-first layout, and
the pointmap encoder (alone, stacked with RGB, attended-XYZ readout)."""

import numpy as np
import pytest
import torch

from policylink.adapters.schema import FeatureSpec
from policylink.data.normalize import Normalizer
from policylink.data.processors import Processors
from policylink.data.stats import stats_from_arrays
from policylink.policies.common.encoder_config import EncoderConfig
from policylink.policies.common.encoders import ObservationEncoder
from policylink.policies.common.pointmap_encoder import (
    POINTNET_OUT_DIM,
    PointmapEncoder,
    PointNetEncoder,
    bind_workspaces,
)
from policylink.policies.processing import observation_tensors

PM, IMG, STATE = "observation.pointmaps.top", "observation.images.top", "observation.state"


def _pointmaps() -> np.ndarray:
    """Two 2 x 3 pointmaps: x = col, y = row, z = 10 * frame; pixel (0, 0) of frame 0 is an invalid fill."""
    pm = np.zeros((2, 2, 3, 3), np.float32)
    rows, cols = np.mgrid[0:2, 0:3]
    for f in range(2):
        pm[f, ..., 0], pm[f, ..., 1], pm[f, ..., 2] = cols, rows, 10.0 * f + 1.0
    pm[0, 0, 0] = 0.0
    return pm


def test_pointmap_stats_are_per_channel_over_valid_pixels():
    stats = stats_from_arrays({PM: _pointmaps()})[PM]
    valid = _pointmaps().reshape(-1, 3)[1:]  # the fill pixel dropped: 11 rows
    assert stats["mean"].shape == (3, 1, 1) and stats["count"][0] == 11
    np.testing.assert_allclose(stats["mean"].reshape(3), valid.mean(0))
    np.testing.assert_allclose(stats["min"].reshape(3), [0.0, 0.0, 1.0])
    np.testing.assert_allclose(stats["max"].reshape(3), [2.0, 1.0, 11.0])


def test_observation_tensors_give_normalised_channel_first_pointmaps():
    pm = _pointmaps()
    norm = Normalizer(stats_from_arrays({PM: pm}), {PM: "min_max"})
    feats = {PM: FeatureSpec("float32", (2, 3, 3), unit="m")}
    out = observation_tensors({PM: pm[None]}, feats, Processors.for_keys([PM], norm))[PM]  # (B=1, T=2, 3, H, W)
    assert out.shape == (1, 2, 3, 2, 3)
    # x in [0, 2] -> [-1, 1]; pixel (row 1, col 2) of frame 1: x = 2 -> 1, y = 1 -> 1, z = 11 -> 1
    np.testing.assert_allclose(out[0, 1, :, 1, 2].numpy(), [1.0, 1.0, 1.0], atol=1e-6)
    np.testing.assert_allclose(out[0, 1, 0, 0].numpy(), [-1.0, 0.0, 1.0], atol=1e-6)


def test_uniform_attention_reads_out_the_mean_xyz():
    enc = PointmapEncoder((8, 8), "small_conv", crop_ratio=1.0, num_keypoints=2)
    torch.nn.init.zeros_(enc.keypoints.weight), torch.nn.init.zeros_(enc.keypoints.bias)  # uniform attention
    enc.out = torch.nn.Identity()
    points = torch.randn(3, 3, 8, 8)
    got = enc(points)  # (N, 3K): the mean XYZ per keypoint
    expected = points.mean(dim=(2, 3)).repeat(1, 2)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_observation_encoder_takes_pointmaps_alone_or_stacked_with_rgb():
    cfg = EncoderConfig(vision_backbone="small_conv", crop_ratio=0.9, num_keypoints=4)
    state = FeatureSpec("float32", (2,))
    pm = FeatureSpec("float32", (16, 16, 3), unit="m")
    img = FeatureSpec("uint8", (16, 16, 3), unit="rgb")
    obs = {STATE: torch.zeros(2, 2, 2), PM: torch.randn(2, 2, 3, 16, 16), IMG: torch.rand(2, 2, 3, 16, 16)}
    alone = ObservationEncoder({STATE: state, PM: pm}, 2, cfg)
    assert alone.out_dim == 2 * (2 + 12) and alone(obs).shape == (2, 28)
    stacked = ObservationEncoder({STATE: state, PM: pm, IMG: img}, 2, cfg)
    assert stacked.stacked_images == {PM: IMG} and stacked.image_keys == []
    assert stacked.pointmap_encoders["observation__pointmaps__top"].trunk[0].in_channels == 6
    assert stacked(obs).shape == (2, 28)
    changed = dict(obs, **{IMG: torch.rand(2, 2, 3, 16, 16)})
    stacked.eval()
    assert not torch.allclose(stacked(obs), stacked(changed))  # the RGB channels reach the features
    with pytest.raises(ValueError, match=r"observation.pointmaps.top: expected a float pointmap \(H, W, 3\)"):
        ObservationEncoder({PM: FeatureSpec("float32", (16, 16, 4))}, 1, cfg)


def test_pointnet_feature_is_invariant_to_a_turned_or_shuffled_pixel_grid():
    torch.manual_seed(0)
    enc = PointNetEncoder(crop_ratio=1.0).eval()
    points = torch.randn(2, 3, 8, 8)
    got = enc(points)
    assert got.shape == (2, POINTNET_OUT_DIM)
    # a camera yawed by 90 degrees about its axis sees the same XYZ values on a turned grid
    torch.testing.assert_close(enc(torch.rot90(points, 1, dims=(2, 3))), got, atol=1e-5, rtol=1e-5)
    perm = torch.randperm(64)
    shuffled = points.flatten(2)[:, :, perm].reshape(2, 3, 8, 8)
    torch.testing.assert_close(enc(shuffled), got, atol=1e-5, rtol=1e-5)
    moved = points.clone()
    moved[0, :, 3, 4] += 5.0  # one point moved in the scene: the feature changes, the other sample's does not
    out = enc(moved)
    assert not torch.allclose(out[0], got[0]) and torch.equal(out[1], got[1])


def test_pointnet_is_chosen_by_config_and_stacks_rgb_per_point():
    cfg = EncoderConfig(vision_backbone="small_conv", crop_ratio=0.9, num_keypoints=4, pointmap_encoder="pointnet")
    feats = {
        STATE: FeatureSpec("float32", (2,)),
        PM: FeatureSpec("float32", (16, 16, 3), unit="m"),
        IMG: FeatureSpec("uint8", (16, 16, 3), unit="rgb"),
    }
    enc = ObservationEncoder(feats, 2, cfg).eval()
    pm_enc = enc.pointmap_encoders["observation__pointmaps__top"]
    assert isinstance(pm_enc, PointNetEncoder) and pm_enc.point_mlp[0].in_features == 6
    obs = {STATE: torch.zeros(2, 2, 2), PM: torch.randn(2, 2, 3, 16, 16), IMG: torch.rand(2, 2, 3, 16, 16)}
    assert enc.out_dim == 2 * (2 + POINTNET_OUT_DIM) and enc(obs).shape == (2, enc.out_dim)
    assert not torch.allclose(enc(obs), enc(dict(obs, **{IMG: torch.rand(2, 2, 3, 16, 16)})))
    bad = EncoderConfig(vision_backbone="small_conv", pointmap_encoder="pointcloud")
    with pytest.raises(ValueError, match=r"policy.encoder.pointmap_encoder: expected one of .*'pointcloud'"):
        ObservationEncoder(feats, 2, bad)


def _cloud(*points: tuple[float, float, float]) -> torch.Tensor:
    """Points ``(x, y, z)`` as one pointmap ``(1, 3, 1, P)``."""
    return torch.tensor(points, dtype=torch.float32).T.reshape(1, 3, 1, len(points))


BOX = ((-1.0, -1.0, 0.0), (1.0, 1.0, 1.0))


def test_workspace_masks_points_outside_the_box_out_of_the_max_pool():
    torch.manual_seed(0)
    enc = PointNetEncoder(crop_ratio=1.0, key=PM, workspace=BOX).eval()
    inside = [(0.1, 0.2, 0.3), (-0.5, 0.4, 0.9), (0.9, -0.9, 0.05)]
    got = enc(_cloud(*inside, (0.0, 0.0, -0.5)))  # a table point below the box
    moved = enc(_cloud(*inside, (7.0, -3.0, -9.0)))  # the same slot, another outside point: no change at all
    assert torch.equal(got, moved)
    reference = enc.out(enc.point_mlp(_cloud(*inside).flatten(2).transpose(1, 2)).amax(dim=1))
    torch.testing.assert_close(got, reference, atol=1e-6, rtol=0)  # as if the outside point were not there
    # without the box the same point does count
    plain = PointNetEncoder(crop_ratio=1.0, key=PM).eval()
    plain.load_state_dict(enc.state_dict(), strict=False)
    assert not torch.allclose(plain(_cloud(*inside, (0.0, 0.0, -0.5))), plain(_cloud(*inside, (7.0, -3.0, -9.0))))


def test_workspace_with_no_point_inside_pools_to_zeros_not_nan():
    torch.manual_seed(0)
    enc = PointNetEncoder(crop_ratio=1.0, key=PM, workspace=BOX).eval()
    out = enc(torch.cat([_cloud((0.0, 0.0, -1.0), (5.0, 0.0, 0.5)), _cloud((0.0, 0.0, 0.5), (5.0, 0.0, 0.5))]))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[0], enc.out(torch.zeros(1, 128))[0], atol=0, rtol=0)  # documented: zeros pooled
    assert not torch.allclose(out[0], out[1])  # the second cloud has one point inside


def test_no_workspace_keeps_the_old_encoder_weights_and_outputs():
    torch.manual_seed(0)
    enc = PointNetEncoder(crop_ratio=0.9).eval()
    assert sorted(enc.state_dict()) == [
        "out.0.bias", "out.0.weight", "out.1.bias", "out.1.weight",
        "point_mlp.0.bias", "point_mlp.0.weight", "point_mlp.1.bias", "point_mlp.1.weight",
        "point_mlp.3.bias", "point_mlp.3.weight", "point_mlp.4.bias", "point_mlp.4.weight",
    ]  # fmt: skip
    points = torch.randn(2, 3, 10, 10)
    cropped = points[:, :, 0:9, 0:9]  # the eval centre crop of 10 px at 0.9: 9 px from row/col 0
    reference = enc.out(enc.point_mlp(cropped.flatten(2).transpose(1, 2)).amax(dim=1))  # the pre-workspace formula
    assert torch.equal(enc(points), reference)
    cfg = EncoderConfig(vision_backbone="small_conv", pointmap_encoder="pointnet")
    model = ObservationEncoder({PM: FeatureSpec("float32", (10, 10, 3), unit="m")}, 1, cfg)
    assert not any("workspace" in k for k in model.state_dict())
    assert model.pointmap_encoders["observation__pointmaps__top"].crop.ratio == 0.9


def test_bind_workspaces_maps_the_box_through_the_pointmap_normaliser():
    pm = _pointmaps()  # x in [0, 2], y in [0, 1], z in [1, 11] over valid pixels
    norm = Normalizer(stats_from_arrays({PM: pm}), {PM: "min_max"})
    cfg = EncoderConfig(
        vision_backbone="small_conv", pointmap_encoder="pointnet", workspace_lower=[0.5, 0.0, 1.0],
        workspace_upper=[2.0, 0.5, 6.0], pointmap_crop=False,
    )  # fmt: skip
    model = ObservationEncoder({PM: FeatureSpec("float32", (2, 3, 3), unit="m")}, 1, cfg)
    assert bind_workspaces(model, norm) == 1
    enc = model.pointmap_encoders["observation__pointmaps__top"]
    assert enc.crop.ratio == 1.0
    # min_max: x 0.5 -> -0.5, 2 -> 1; y 0 -> -1, 0.5 -> 0; z 1 -> -1, 6 -> 0
    torch.testing.assert_close(enc.workspace_lower, torch.tensor([-0.5, -1.0, -1.0]), atol=1e-6, rtol=0)
    torch.testing.assert_close(enc.workspace_upper, torch.tensor([1.0, 0.0, 0.0]), atol=1e-6, rtol=0)
    assert bind_workspaces(model, None) == 1  # no normalise step: metres
    torch.testing.assert_close(enc.workspace_upper, torch.tensor([2.0, 0.5, 6.0]))


def test_pointmap_crop_off_leaves_pointmaps_out_of_the_crop_step():
    from types import SimpleNamespace

    from policylink.policies.processing import processors_for

    feats = {PM: FeatureSpec("float32", (16, 16, 3), unit="m"), IMG: FeatureSpec("uint8", (16, 16, 3), unit="rgb"),
             "observation.images.wrist": FeatureSpec("uint8", (16, 16, 3), unit="rgb")}  # fmt: skip
    for crop, keys in ((True, [IMG, PM, "observation.images.wrist"]), (False, ["observation.images.wrist"])):
        cfg = SimpleNamespace(
            observation_keys=sorted(feats), n_obs_steps=1, memory="none",
            encoder=EncoderConfig(crop_ratio=0.9, pointmap_crop=crop),
        )  # fmt: skip
        step = processors_for(cfg, feats, None).step("crop")
        assert sorted(step["keys"]) == sorted(keys)  # the image stacked with the pointmap goes uncropped too


def test_workspace_config_errors_name_the_field():
    feats = {PM: FeatureSpec("float32", (8, 8, 3), unit="m")}
    cases = [
        (dict(pointmap_encoder="pointnet", workspace_lower=[0.0, 0.0, 0.0]), r"workspace_upper: expected \[x, y, z\]"),
        (dict(pointmap_encoder="pointnet", workspace_lower=[0.0, 0.0], workspace_upper=[1.0, 1.0, 1.0]),
         r"workspace_lower: expected \[x, y, z\] in metres, received \[0.0, 0.0\]"),
        (dict(pointmap_encoder="pointnet", workspace_lower=[0.0, 0.0, 1.0], workspace_upper=[1.0, 1.0, 1.0]),
         r"workspace_upper: expected above workspace_lower"),
        (dict(workspace_lower=[0.0, 0.0, 0.0], workspace_upper=[1.0, 1.0, 1.0]), r"needs pointmap_encoder 'pointnet'"),
    ]  # fmt: skip
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            ObservationEncoder(feats, 1, EncoderConfig(vision_backbone="small_conv", **kwargs))
