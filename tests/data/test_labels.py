"""Advantage labels (data/labels.py): hand-computed rewards, n-step advantages (episode-end rule), progress,
binary labels (per-task threshold, forced positives, forced-negative failure window), storage next to the store."""

from __future__ import annotations

import numpy as np
import pytest

from policylink.data.buffer import EpisodeStore
from policylink.data.episode_meta import EpisodeMeta
from policylink.data.labels import (
    LabelConfig,
    LabelsError,
    binary_labels,
    discounted_returns,
    nstep_advantage,
    progress_advantage,
    progress_from_distance,
    read_labels,
    recap_rewards,
    write_labels,
)
from policylink.data.sampler import SequenceDataset

ENDS = np.array([4, 7, 10])  # episode lengths 4, 3, 3


def test_recap_rewards_minus_one_per_step_failure_penalty_normalised():
    r = recap_rewards(ENDS, success=[1, 0, 1], max_episode_steps=4, failure_penalty=4)
    expected = np.full(10, -1 / 8)
    expected[6] = -5 / 8  # the failed episode's last step: -(1 + C) / (T_max + C)
    np.testing.assert_allclose(r, expected, rtol=0, atol=1e-7)
    g = discounted_returns(r, ENDS)
    np.testing.assert_allclose(g[:7], [-4 / 8, -3 / 8, -2 / 8, -1 / 8, -7 / 8, -6 / 8, -5 / 8], atol=1e-7)
    # a failure that lasts T_max steps returns exactly -1, the bottom of [-1, 0]
    assert recap_rewards(np.array([4]), [0], 4).sum() == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="max_episode_steps"):
        recap_rewards(ENDS, [1, 1, 1], max_episode_steps=3)


def test_nstep_advantage_episode_end_rule():
    r = np.array([1, 1, 1, 1, 1, 1, 1, 0, 0, 0], float)
    v = np.array([0, 1, 2, 3, 10, 20, 30, 5, 5, 5], float)
    a = nstep_advantage(r, v, ENDS, n=2)
    # t=0: 1+1+V2-V0 = 4; t=2: t+2 reaches past the end -> V=0: 2-2 = 0; t=3: one valid step: 1-3 = -2
    np.testing.assert_array_equal(a, [4, 4, 0, -2, 22, -18, -29, 0, -5, -5])
    with pytest.raises(ValueError, match="expected shape"):
        nstep_advantage(r[:5], v, ENDS)


def test_progress_and_progress_advantage():
    ends = np.array([3, 6])
    p = progress_from_distance(np.array([2.0, 1.0, 0.0, 4.0, 4.0, 8.0]), ends)
    np.testing.assert_array_equal(p, [0.0, 0.5, 1.0, 0.0, 0.0, -1.0])
    np.testing.assert_array_equal(progress_advantage(p, ends, horizon=2), [1.0, 0.5, 0.0, -1.0, -1.0, 0.0])


def test_binary_labels_threshold_forced_positive_and_failure_window():
    a = np.array([4, 4, 0, -2, 22, -18, -29, 0, -5, -5], float)
    cfg = LabelConfig(positive_fraction=0.3, failure_window=2, positive_sources=("human",))
    labels, thr = binary_labels(
        a, ENDS, tasks=["a", "a", "b"], success=[1, 0, 1], sources=["expert", "policy", "human"], config=cfg
    )
    # task a: 70th percentile of [-29,-18,-2,0,4,4,22] = 4 -> rows 0, 1, 4; task b: -5 + 0.4 * 5 = -3 -> row 7;
    # episode 2 (human) forced positive; the failed episode's last 2 steps (rows 5, 6) forced negative
    assert thr == pytest.approx({"a": 4.0, "b": -3.0})
    np.testing.assert_array_equal(labels, [1, 1, 0, 0, 1, 0, 0, 1, 1, 1])
    assert labels.dtype == np.int8
    # forcing by quality; the failure window overrides a forced positive
    cfg = LabelConfig(failure_window=1, positive_qualities=("expert",), per_task=False)
    qualities = ["noisy", "expert", ""]
    labels, _ = binary_labels(a, ENDS, tasks=["a"] * 3, success=[1, 0, 1], qualities=qualities, config=cfg)
    np.testing.assert_array_equal(labels, [1, 1, 0, 0, 1, 1, 0, 0, 0, 0])
    with pytest.raises(ValueError, match="tasks: expected 3"):
        binary_labels(a, ENDS, tasks=["a"], success=[1, 0, 1])


def _store(path, lengths=(4, 3, 3)):
    rng = np.random.default_rng(0)
    with EpisodeStore(path, "w") as s:
        for i, n in enumerate(lengths):
            s.add_episode(
                {"observation.state": rng.normal(size=(n, 3)).astype(np.float32),
                 "action": rng.normal(size=(n, 2)).astype(np.float32)},
                EpisodeMeta(success=bool(i % 2 == 0), source="expert"),
            )  # fmt: skip
    return path


def test_labels_stored_next_to_the_store_which_older_readers_still_read(tmp_path):
    path = _store(tmp_path / "s.zarr")
    labels = np.array([1, 1, 0, 0, 1, 0, 0, 1, 1, 1], np.int8)
    adv = np.arange(10, dtype=np.float32)
    write_labels(path, labels, adv, {"source": "value", "thresholds": {"": 0.5}})
    got = read_labels(path)
    np.testing.assert_array_equal(got.label, labels)
    np.testing.assert_array_equal(got.advantage, adv)
    assert got.attrs["source"] == "value" and got.attrs["n_steps"] == 10
    store = EpisodeStore(path, "r")
    assert store.keys == ["action", "done", "observation.state", "reward"]  # features unchanged
    ds = SequenceDataset(store, n_obs_steps=2, horizon=4)
    assert len(ds) == 10  # one window per step, as before labelling
    with pytest.raises(LabelsError, match=r"label sets present: \['advantage'\]"):
        read_labels(path, "other")
    with pytest.raises(LabelsError, match=r"expected shape \(10,\)"):
        write_labels(path, labels[:5], adv[:5])
    with EpisodeStore(path, "a") as s:  # appending still works; the labels become stale
        s.add_episode({"observation.state": np.zeros((2, 3), np.float32), "action": np.zeros((2, 2), np.float32)})
    with pytest.raises(LabelsError, match="written for 10 steps.*holds 12"):
        read_labels(path)


def test_push_info_progress_is_progress_from_distance_of_its_states():
    from policylink.adapters.registry import make_env

    env = make_env("push", obs_mode="state")
    obs, info = env.reset(seed=3)
    states, progress = [obs["observation.state"]], [info["progress"]]
    for _ in range(6):
        obs, _, _, _, info = env.step(np.array([0.02, 0.02], np.float32))
        states.append(obs["observation.state"])
        progress.append(info["progress"])
    d = env.unwrapped.goal_distance(np.stack(states))
    np.testing.assert_allclose(progress, progress_from_distance(d, np.array([len(d)])), atol=1e-6)
    assert progress[0] == 0.0
    # at the goal pose the distance is 0
    assert env.unwrapped.goal_distance(np.array([[0.1, 0.1, 0.0, 0.06, 0.0, 1.0]]))[0] == pytest.approx(0.0)
    env.close()
