"""SequenceSampler / SequenceDataset: edge padding, pad masks, subsets, normalized tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from policylink.data.buffer import EpisodeStore
from policylink.data.episode_meta import EpisodeMeta
from policylink.data.normalize import Normalizer
from policylink.data.processors import Processors
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
        chain = Processors.for_keys(["observation.state", "observation.images.front"], norm, n_obs_steps=2)
        ds = SequenceDataset(path, n_obs_steps=2, horizon=4, processors=chain, in_memory=in_memory)
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
        chain = Processors.for_keys(["observation.state"], Normalizer(stats, {"action": "min_max"}))
        SequenceDataset(path, n_obs_steps=2, horizon=4, processors=chain)


@pytest.fixture
def reward_store(tmp_path):
    """Episode 0: 5 steps, r_t = t + 1, done on its last step; episode 1: 3 steps, r = 10, 20, 30, never done
    (a time-limit end). State = 10 * episode + t."""
    path = tmp_path / "r.zarr"
    with EpisodeStore(path, "a") as st:
        st.add_episode(
            {
                "observation.state": np.arange(5, dtype=np.float32)[:, None],
                "action": np.arange(5, dtype=np.float32)[:, None],
                "reward": np.arange(1, 6, dtype=np.float32),
            },
            EpisodeMeta(success=True, seed=3, source="expert", quality="good"),
        )
        st.add_episode(
            {
                "observation.state": 10 + np.arange(3, dtype=np.float32)[:, None],
                "action": np.zeros((3, 1), np.float32),
                "reward": np.array([10, 20, 30], np.float32),
                "done": np.zeros(3, bool),
            },
            EpisodeMeta(success=False, source="policy", quality="poor"),
        )
    return path


def test_step_and_episode_fields_on_request(reward_store):
    ds = SequenceDataset(
        reward_store,
        n_obs_steps=2,
        horizon=4,
        step_fields=["reward", "done"],
        episode_fields=["success", "seed", "source", "quality"],
    )
    item = ds[4]  # episode 0, anchor t = 4: action window steps 3 .. 6 (5, 6 past the end repeat step 4)
    np.testing.assert_array_equal(item["reward"].numpy(), [4, 5, 5, 5])
    np.testing.assert_array_equal(item["done"].numpy(), [False, True, True, True])
    assert item["reward"].dtype == torch.float32 and item["done"].dtype == torch.bool
    assert (int(item["success"]), int(item["seed"]), item["source"], item["quality"]) == (1, 3, "expert", "good")
    batch = ds.get_batch([0, 5, 7])
    np.testing.assert_array_equal(batch["reward"].numpy(), [[1, 1, 2, 3], [10, 10, 20, 30], [20, 30, 30, 30]])
    np.testing.assert_array_equal(batch["success"].numpy(), [1, 0, 0])
    np.testing.assert_array_equal(batch["seed"].numpy(), [3, -1, -1])
    assert batch["source"] == ["expert", "policy", "policy"] and batch["quality"] == ["good", "poor", "poor"]
    plain = SequenceDataset(reward_store, n_obs_steps=2, horizon=4)
    assert "reward" not in plain[0] and "success" not in plain.get_batch([0])
    with pytest.raises(KeyError, match=r"step_fields \['labels'\]: not in the store"):
        SequenceDataset(reward_store, n_obs_steps=2, horizon=4, step_fields=["labels"])
    with pytest.raises(ValueError, match=r"episode_fields: expected a subset of .*received unknown \['grade'\]"):
        SequenceDataset(reward_store, n_obs_steps=2, horizon=4, episode_fields=["grade"])


def test_chunk_transitions_exact_returns_ends_and_padding(reward_store):
    ds = SequenceDataset(reward_store, n_obs_steps=2, horizon=4, step_fields=["reward", "done"])
    assert ds.chunk_length == 3
    # windows: 0..4 = episode 0 anchors t = 0..4, 5..7 = episode 1 anchors t = 0..2
    tr = ds.get_transitions([0, 2, 3, 4, 5, 6], gamma=0.5)
    expected_return = [
        1 + 0.5 * 2 + 0.25 * 3,  # t=0: full chunk r0..r2
        3 + 0.5 * 4 + 0.25 * 5,  # t=2: r2..r4, the episode's last step inside
        4 + 0.5 * 5,  # t=3: 2 steps inside, the padded third adds nothing
        5,  # t=4: 1 step
        10 + 0.5 * 20 + 0.25 * 30,  # episode 1, t=0
        20 + 0.5 * 30,  # episode 1, t=1
    ]
    np.testing.assert_array_equal(tr["return"].numpy(), np.float32(expected_return))
    np.testing.assert_array_equal(tr["discount"].numpy(), np.float32([0.125, 0.125, 0.25, 0.5, 0.125, 0.25]))
    np.testing.assert_array_equal(tr["terminal"].numpy(), [False, True, True, True, False, False])
    np.testing.assert_array_equal(tr["next_is_pad"].numpy(), [False, True, True, True, True, True])
    # s_{t+3}: t=0 -> steps 2, 3; past the end -> the window ending at the last step (4, or 12 in episode 1)
    np.testing.assert_array_equal(
        tr["next.observation.state"][..., 0].numpy(), [[2, 3], [3, 4], [3, 4], [3, 4], [11, 12], [11, 12]]
    )
    assert not tr["next.observation_is_pad"].any()
    np.testing.assert_array_equal(tr["observation.state"][0, :, 0].numpy(), [0, 0])  # s_0 itself is edge-padded
    # h = 3, r = 1, gamma = 0.9 -> R = 1 + 0.9 + 0.81 = 2.71 (issue 14's TD target with Q' = 0)
    with EpisodeStore(reward_store.parent / "ones.zarr", "a") as st:
        st.add_episode(
            {
                "observation.state": np.zeros((6, 1), np.float32),
                "action": np.zeros((6, 1), np.float32),
                "reward": np.ones(6, np.float32),
            }
        )
    ones = SequenceDataset(reward_store.parent / "ones.zarr", n_obs_steps=1, horizon=3, step_fields=["reward", "done"])
    assert float(ones.get_transitions([0], gamma=0.9)["return"][0]) == pytest.approx(2.71, abs=1e-6)
    with pytest.raises(KeyError, match=r"transitions need \['reward', 'done'\]"):
        SequenceDataset(reward_store, n_obs_steps=2, horizon=4).get_transitions([0], 0.9)
    with pytest.raises(ValueError, match="gamma: expected a discount in"):
        ds.get_transitions([0], 1.5)


def test_normalizer_keyword_is_a_deprecated_alias_of_processors(tmp_path):
    """``SequenceDataset(normalizer=...)`` (before the processor chain) still works for one release, with a warning,
    and gives exactly the items of ``processors=Processors.for_keys(obs_keys, normalizer)``."""
    import warnings

    from policylink.data.recorder import EpisodeRecorder
    from policylink.data.stats import compute_stats

    store = EpisodeStore(tmp_path / "s.zarr", "w")
    rng = np.random.default_rng(0)
    rec = EpisodeRecorder(store)
    rec.start_episode()
    for _ in range(6):
        rec.add_step({"observation.state": rng.normal(size=3).astype(np.float32)}, rng.normal(size=2), 0.0, False)
    rec.end_episode(True)
    norm = Normalizer(compute_stats(store), {"observation.state": "mean_std", "action": "min_max"})
    with pytest.warns(DeprecationWarning, match="processors=Processors.for_keys"):
        old = SequenceDataset(store, n_obs_steps=2, horizon=4, normalizer=norm)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = SequenceDataset(
            store, n_obs_steps=2, horizon=4, processors=Processors.for_keys(["observation.state"], norm)
        )
    for i in range(len(new)):
        for key in ("observation.state", "action"):
            np.testing.assert_array_equal(old[i][key].numpy(), new[i][key].numpy())
    with pytest.raises(ValueError, match="normalizer: deprecated alias of processors; received both"):
        SequenceDataset(store, n_obs_steps=2, horizon=4, normalizer=norm, processors=new.processors)
