"""Normalizer: modes with known values, exact inverse, numpy == torch, constant dims, masks, state_dict."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from policylink.data.normalize import ConstantFeatureWarning, MissingStatsError, Normalizer

STATS = {
    "action": {
        "mean": np.array([1.0, -2.0, 0.5]),
        "std": np.array([2.0, 0.5, 0.1]),
        "min": np.array([-1.0, -4.0, 0.0]),
        "max": np.array([3.0, 0.0, 1.0]),
        "q01": np.array([0.0, -3.0, 0.0]),
        "q99": np.array([2.0, -1.0, 1.0]),
    },
    "observation.state": {
        "mean": np.array([0.0, 5.0]),
        "std": np.array([1.0, 0.0]),
        "min": np.array([-1.0, 5.0]),
        "max": np.array([1.0, 5.0]),
    },
    "observation.images.front": {"mean": np.full((3, 1, 1), 0.5), "std": np.full((3, 1, 1), 0.25)},
}


def test_known_values_per_mode():
    x = np.array([[3.0, 0.0, 1.0]], np.float32)
    cases = {
        "mean_std": [1.0, 4.0, 5.0],
        "min_max": [1.0, 1.0, 1.0],
        "quantile": [2.0, 2.0, 1.0],
        "identity": [3.0, 0.0, 1.0],
    }
    for mode, expected in cases.items():
        n = Normalizer(STATS, {"action": mode})
        np.testing.assert_allclose(n.normalize_feature("action", x)[0], expected, rtol=1e-6)
    n = Normalizer(STATS, {"action": "min_max"})
    np.testing.assert_allclose(n.normalize_feature("action", np.array([-1.0, -4.0, 0.0], np.float32)), [-1, -1, -1])


@pytest.mark.parametrize("mode", ["mean_std", "min_max", "quantile", "identity"])
def test_action_roundtrip_numpy_and_torch_identical(mode):
    n = Normalizer(STATS, {"action": mode})
    a = np.random.default_rng(0).normal(size=(4, 16, 3)).astype(np.float32)
    y_np = n.normalize_feature("action", a)
    y_t = n.normalize_feature("action", torch.from_numpy(a))
    assert isinstance(y_t, torch.Tensor) and y_t.dtype == torch.float32
    np.testing.assert_array_equal(y_np, y_t.numpy())
    back_np = n.unnormalize_feature("action", y_np)
    back_t = n.unnormalize_feature("action", y_t)
    np.testing.assert_array_equal(back_np, back_t.numpy())
    np.testing.assert_allclose(back_np, a, rtol=0, atol=2e-6)


def test_constant_dim_is_finite_and_warns():
    with pytest.warns(ConstantFeatureWarning, match=r"observation.state.*dims \[1\]"):
        n = Normalizer(STATS, {"observation.state": "mean_std"})
    x = np.array([[0.5, 5.0], [0.5, 7.0]], np.float32)
    y = n.normalize_feature("observation.state", x)
    np.testing.assert_array_equal(y, [[0.5, 0.0], [0.5, 2.0]])
    np.testing.assert_array_equal(y, n.normalize_feature("observation.state", torch.from_numpy(x)).numpy())
    with pytest.warns(ConstantFeatureWarning):
        n2 = Normalizer(STATS, {"observation.state": "min_max"})
    assert np.all(np.isfinite(n2.normalize_feature("observation.state", x)))


def test_missing_stats_raise_never_pass_through():
    with pytest.raises(MissingStatsError, match="'observation.environment_state'"):
        Normalizer(STATS, {"observation.environment_state": "mean_std"})
    with pytest.raises(MissingStatsError, match=r"needs stats \['q01', 'q99'\]"):
        Normalizer(STATS, {"observation.images.front": "quantile"})
    n = Normalizer(STATS, {"action": "mean_std"})
    with pytest.raises(MissingStatsError, match="observation.state"):
        n.normalize_feature("observation.state", np.zeros(2, np.float32))
    with pytest.raises(MissingStatsError, match="without a normalization mode"):
        n.normalize({"action": np.zeros(3, np.float32), "observation.state": np.zeros(2, np.float32)})
    out = n.normalize({"action": np.zeros(3, np.float32), "task": "push", "action_is_pad": np.zeros(3, bool)})
    assert out["task"] == "push"
    with pytest.raises(ValueError, match="expected one of"):
        Normalizer(STATS, {"action": "zscore"})
    with pytest.raises(TypeError, match="floating-point"):
        n.normalize_feature("action", np.zeros(3, np.int64))


def test_mask_leaves_gripper_raw_both_ways():
    mask = np.array([True, True, False])
    n = Normalizer(STATS, {"action": "min_max"}, masks={"action": mask})
    a = np.array([[3.0, 0.0, 0.73]], np.float32)
    y = n.normalize_feature("action", a)
    assert y[0, 2] == np.float32(0.73)
    np.testing.assert_allclose(y[0, :2], [1.0, 1.0])
    yt = n.unnormalize_feature("action", torch.tensor([[0.0, 0.0, 0.73]]))
    assert yt[0, 2].item() == float(np.float32(0.73))  # bit-exact
    np.testing.assert_allclose(yt[0, :2].numpy(), [1.0, -2.0])


def test_image_stats_broadcast_over_chw():
    n = Normalizer(STATS, {"observation.images.front": "mean_std"})
    img = torch.full((2, 3, 4, 4), 0.75)  # (To, C, H, W)
    assert torch.allclose(n.normalize_feature("observation.images.front", img), torch.ones(2, 3, 4, 4))


def test_state_dict_roundtrip_through_safetensors(tmp_path):
    from safetensors.numpy import load_file, save_file

    with pytest.warns(ConstantFeatureWarning):
        n = Normalizer(
            STATS,
            {"action": "quantile", "observation.state": "min_max", "observation.images.front": "mean_std"},
            masks={"action": [True, False, True]},
        )
    sd = n.state_dict()
    assert all(isinstance(v, np.ndarray) for v in sd.values())
    save_file(sd, str(tmp_path / "norm.safetensors"))
    m = Normalizer.from_state_dict(load_file(str(tmp_path / "norm.safetensors")))
    assert repr(m) == repr(n)
    batch = {
        "action": np.array([[0.3, -7.0, 0.9]], np.float32),
        "observation.state": np.ones((1, 2), np.float32),
        "observation.images.front": np.full((1, 3, 2, 2), 0.1, np.float32),
    }
    for k, v in n.normalize(batch).items():
        np.testing.assert_array_equal(v, m.normalize(batch)[k])
    m_t = Normalizer.from_state_dict({k: torch.from_numpy(v) for k, v in sd.items()})
    np.testing.assert_array_equal(m_t.normalize(batch)["action"], n.normalize(batch)["action"])
