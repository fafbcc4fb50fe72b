"""The lean observation path of image policies (issue 19): one folded pixel affine, each frame encoded once
per window, and the same actions as the full re-encode path (within float tolerance), resets included."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from policylink.data.normalize import Normalizer
from policylink.policies.common.encoders import ImageEncoder
from policylink.policies.common.frame_features import FrameFeatureCache, pixel_affine
from policylink.policies.registry import make_policy

IMAGE = "observation.images.front"


@pytest.mark.parametrize("mode", ["identity", "mean_std"])
def test_pixel_affine_folds_scale_normalise_and_rescale(mode):
    stats = {
        IMAGE: {"mean": np.array([0.2, 0.5, 0.7]).reshape(3, 1, 1), "std": np.array([0.1, 0.3, 0.25]).reshape(3, 1, 1)}
    }
    norm = Normalizer(stats, {IMAGE: mode})
    scale, shift = pixel_affine(norm, IMAGE, "cpu")
    u = torch.arange(256, dtype=torch.float32).view(1, 1, 256).expand(3, 1, 256)
    expected = norm.normalize_feature(IMAGE, u / 255.0) * 2.0 - 1.0
    torch.testing.assert_close(u * scale.view(3, 1, 1) + shift.view(3, 1, 1), expected, atol=1e-5, rtol=1e-6)
    if mode == "identity":
        torch.testing.assert_close(scale, torch.full((3,), 2.0 / 255.0))
        torch.testing.assert_close(shift, torch.full((3,), -1.0))


def test_pixel_affine_refuses_per_pixel_statistics():
    norm = Normalizer({IMAGE: {"mean": np.zeros((3, 4, 4)), "std": np.ones((3, 4, 4))}}, {IMAGE: "mean_std"})
    with pytest.raises(ValueError, match="per-channel image statistics"):
        pixel_affine(norm, IMAGE, "cpu")


def test_forward_pixels_equals_forward_of_float_frames():
    torch.manual_seed(0)
    enc = ImageEncoder((24, 24), "small_conv", 20 / 24, 4).eval()
    frames = torch.randint(0, 256, (5, 24, 24, 3), dtype=torch.uint8)
    scale, shift = torch.full((3,), 2.0 / 255.0), torch.full((3,), -1.0)
    with torch.no_grad():
        expected = enc(frames.permute(0, 3, 1, 2).float() / 255.0)
        torch.testing.assert_close(enc.forward_pixels(frames, scale, shift), expected, atol=1e-5, rtol=1e-5)


def test_cache_encodes_each_frame_once_and_follows_resets():
    cache = FrameFeatureCache(2)
    calls = []

    def encode(frames):
        calls.append(len(frames))
        return torch.as_tensor(frames, dtype=torch.float32).reshape(len(frames), 1)

    rows = np.arange(3)
    cache.append(np.ones(3, dtype=bool))
    window = np.array([[10, 10], [20, 20], [30, 30]])
    np.testing.assert_array_equal(cache.window_features("k", rows, window, encode)[..., 0], window)
    assert calls == [3]  # a fresh row's repeated first frame once
    cache.append(np.zeros(3, dtype=bool))
    window = np.array([[10, 11], [20, 21], [30, 31]])
    np.testing.assert_array_equal(cache.window_features("k", rows, window, encode)[..., 0], window)
    assert calls == [3, 3]  # only the new frames
    cache.reset(np.array([1]))
    cache.append(np.array([False, True, False]))  # row 1 starts a new episode
    window = np.array([[11, 12], [25, 25], [31, 32]])
    got = cache.window_features("k", np.array([0, 1]), window[:2], encode)
    np.testing.assert_array_equal(got[..., 0], window[:2])
    assert calls == [3, 3, 2] and cache.encoded_frames == 8


def _image_policy(kit, normalizer, store_path):
    cfg = kit.tiny_config("flow", keys=(kit.STATE, kit.IMAGE))
    spec = kit.make_spec(cfg, kit.FEATURES)
    return make_policy("flow", spec=spec, processors=kit.chain(cfg, normalizer), config=cfg, device="cpu", seed=3)


def test_cached_features_give_the_actions_of_full_re_encoding(kit, normalizer, store_path):
    lean = _image_policy(kit, normalizer, store_path)
    full = _image_policy(kit, normalizer, store_path)
    full.model.load_state_dict(lean.model.state_dict())
    full.frame_cache = False
    rng = np.random.default_rng(0)
    b = 3
    for step in range(6):
        obs = {
            kit.STATE: rng.random((b, 3), dtype=np.float32),
            kit.IMAGE: rng.integers(0, 256, (b, 24, 24, 3), dtype=np.uint8),
        }
        if step == 3:
            for p in (lean, full):
                p.reset([0, 2])  # new episodes in rows 0 and 2 only
        for p in (lean, full):
            p.update_observation(obs)
        ids = [1, 2] if step == 4 else None
        np.testing.assert_allclose(lean.predict_action_chunk(ids), full.predict_action_chunk(ids), atol=1e-4)
    # steps 0-3 and 5 encode every row's new frame, step 4 only rows 1 and 2: each frame once
    assert lean._frames.encoded_frames == 5 * b + 2 + 1  # + row 0's frame of step 4, needed again at step 5
    assert full._frames.encoded_frames == 0
