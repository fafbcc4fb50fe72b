"""SequenceSampler / SequenceDataset: edge padding, pad masks, subsets, normalized tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from policylink.data.buffer import EpisodeMeta, EpisodeStore
from policylink.data.normalize import Normalizer
from policylink.data.sampler import SequenceDataset, SequenceSampler, split_episodes


def _data(lengths=(4, 3)):
    ends = np.cumsum(lengths)
    # value = 10 * episode + step
    val = np.concatenate([10 * e + np.arange(L) for e, L in enumerate(lengths)]).astype(np.float32)
    return {"observation.state": val[:, None], "action": -val[:, None]}, ends


def test_windows_pad_by_repeating_edges():
    data, ends = _data()
    s = SequenceSampler(data, ends, n_obs_steps=2, horizon=4, obs_keys=["observation.state"])
    assert len(s) == 7  # every step is an anchor
    first = s.sample(0)
    np.testing.assert_array_equal(first["observation.state"][:, 0], [0, 0])
    np.testing.assert_array_equal(first["observation_is_pad"], [True, False])
    np.testing.assert_array_equal(first["action"][:, 0], [0, 0, -1, -2])
    np.testing.assert_array_equal(first["action_is_pad"], [True, False, False, False])
    last_ep0 = s.sample(3)  # anchor t = 3 of a 4-step episode
    assert last_ep0["step"] == 3 and last_ep0["episode_index"] == 0
    np.testing.assert_array_equal(last_ep0["observation.state"][:, 0], [2, 3])
    np.testing.assert_array_equal(last_ep0["action"][:, 0], [-2, -3, -3, -3])
    np.testing.assert_array_equal(last_ep0["action_is_pad"], [False, False, True, True])
    ep1 = s.sample(4)  # never crosses into episode 0
    np.testing.assert_array_equal(ep1["observation.state"][:, 0], [10, 10])
    np.testing.assert_array_equal(ep1["action"][:, 0], [-10, -10, -11, -12])


def test_diffusion_policy_padding_option():
    data, ends = _data((6,))
    s = SequenceSampler(data, ends, n_obs_steps=2, horizon=4, obs_keys=["observation.state"], pad_after=1)
    assert len(s) == 5  # window starts -1..3: diffusion_policy with n_action_steps=2
    with pytest.raises(ValueError, match="pad_before/pad_after"):
        SequenceSampler(data, ends, n_obs_steps=2, horizon=4, obs_keys=["observation.state"], pad_after=4)
    with pytest.raises(KeyError, match="observation.images.top"):
        SequenceSampler(data, ends, n_obs_steps=2, horizon=4, obs_keys=["observation.images.top"])


def test_subset_pads_like_full_set():
    data, ends = _data((4, 3, 5))
    full = SequenceSampler(data, ends, n_obs_steps=2, horizon=3, obs_keys=["observation.state"])
    sub = SequenceSampler(data, ends, n_obs_steps=2, horizon=3, obs_keys=["observation.state"], episodes=[1])
    full_ep1 = [full.sample(i) for i in range(len(full)) if full.sample(i)["episode_index"] == 1]
    assert len(sub) == len(full_ep1) == 3
    for a, b in zip(full_ep1, (sub.sample(i) for i in range(len(sub)))):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    train, val = split_episodes(10, 0.2, seed=0)
    assert len(val) == 2 and len(train) == 8 and not set(train) & set(val)


def test_sequence_dataset_normalized_tensors(tmp_path):
    path = tmp_path / "s.zarr"
    with EpisodeStore(path, "a") as st:
        for e in range(2):
            st.add_episode(
                {
                    "observation.state": np.full((5, 2), e, np.float32),
                    "observation.images.front": np.full((5, 4, 4, 3), 51 * e, np.uint8),
                    "action": np.full((5, 2), 2.0 * e, np.float32),
                },
                EpisodeMeta(task=f"task {e}"),
            )
    stats = {
        "observation.state": {"mean": np.zeros(2), "std": np.ones(2)},
        "observation.images.front": {"mean": np.full((3, 1, 1), 0.1), "std": np.full((3, 1, 1), 0.1)},
        "action": {"min": np.zeros(2), "max": np.full(2, 2.0)},
    }
    norm = Normalizer(
        stats, {"observation.state": "mean_std", "observation.images.front": "mean_std", "action": "min_max"}
    )
    for in_memory in (True, False):
        ds = SequenceDataset(path, n_obs_steps=2, horizon=4, normalizer=norm, in_memory=in_memory)
        assert len(ds) == 10
        item = ds[7]
        assert item["task"] == "task 1"
        assert item["observation.images.front"].shape == (2, 3, 4, 4)
        assert torch.allclose(item["observation.images.front"], torch.ones(2, 3, 4, 4))  # (0.2-0.1)/0.1
        assert torch.equal(item["action"], torch.ones(4, 2))  # 2.0 in [0, 2] -> 1
        assert item["action_is_pad"].dtype == torch.bool
    loader = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=False)
    batch = next(iter(loader))
    assert batch["action"].shape == (4, 4, 2) and batch["observation.state"].shape == (4, 2, 2)
    assert batch["task"] == ["task 0"] * 4
    fast = ds.get_batch([0, 1, 2, 3])  # numpy-stacked batch equals the DataLoader's collation
    assert fast["task"] == batch["task"]
    for k in (
        "observation.state",
        "observation.images.front",
        "action",
        "observation_is_pad",
        "action_is_pad",
        "episode_index",
        "step",
    ):
        assert torch.equal(fast[k], batch[k]), k
    with pytest.raises(KeyError, match="normalizer: no mode"):
        SequenceDataset(path, n_obs_steps=2, horizon=4, normalizer=Normalizer(stats, {"action": "min_max"}))
