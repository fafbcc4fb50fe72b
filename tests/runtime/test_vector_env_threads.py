"""ThreadVectorEnv: the same batches as SyncVectorEnv (SAME_STEP autoreset), sub-envs living on their threads."""

from __future__ import annotations

import threading

import gymnasium as gym
import numpy as np
import pytest

from policylink.runtime.rollout import rollout
from policylink.runtime.vector_env import RegistryEnvFn, make_vector_env, plan_episodes


def _assert_same(a, b, path="") -> None:
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            _assert_same(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, tuple) or (isinstance(a, np.ndarray) and a.dtype == object):
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y, path)
    else:
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=path)
        assert np.asarray(a).dtype == np.asarray(b).dtype, path


def test_threads_match_sync_step_for_step_across_episode_ends():
    plans = plan_episodes(5, 3, 2)
    fn = RegistryEnvFn("push")
    sync, threads = (make_vector_env(fn, plans, max_episode_steps=7, threads=t) for t in (False, True))
    try:
        _assert_same(sync.reset(), threads.reset())
        rng = np.random.default_rng(0)
        ends = 0
        for _ in range(20):
            a = rng.uniform(-1, 1, sync.action_space.shape).astype(np.float32)
            s, t = sync.step(a), threads.step(a)
            for x, y in zip(s, t, strict=True):
                _assert_same(x, y)
            ends += int(s[3].sum())
            assert ("final_obs" in t[4]) == bool(s[3].any())
        assert ends == 4  # 20 steps of 7-step episodes in 2 slots: every slot finished twice, reset in the same step
        assert threads.observation_space == sync.observation_space
        assert threads.get_attr("name") == ("push", "push")
    finally:
        sync.close()
        threads.close()


class _ThreadTagged(gym.Env):
    """Records the thread of every call; raises in step when the action is negative."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self):
        self.threads = {threading.get_ident()}

    def reset(self, *, seed=None, options=None):
        self.threads.add(threading.get_ident())
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.threads.add(threading.get_ident())
        if action[0] < 0:
            raise ValueError("negative action")
        return np.asarray(action, np.float32), 1.0, False, False, {}


def test_each_sub_env_stays_on_one_thread_and_errors_reach_the_caller():
    vec = make_vector_env(_ThreadTagged, 3, threads=True)
    try:
        vec.reset(seed=0)
        obs, reward, *_ = vec.step(np.array([[0.5], [0.25], [0.125]], np.float32))
        np.testing.assert_array_equal(obs, [[0.5], [0.25], [0.125]])
        np.testing.assert_array_equal(reward, [1.0, 1.0, 1.0])
        tags = vec.get_attr("threads")
        assert tags[0] == {threading.get_ident()}  # sub-env 0 on the caller's thread, sub-env 1 on its own
        assert all(len(t) == 1 for t in tags[1:]) and len(set.union(*tags)) == 3
        with pytest.raises(ValueError, match="negative action"):
            vec.step(np.array([[0.5], [-0.5], [0.5]], np.float32))
        with pytest.raises(ValueError, match="negative action"):  # raised on the caller's own sub-env too
            vec.step(np.array([[-0.5], [0.5], [0.5]], np.float32))
        np.testing.assert_array_equal(vec.step(np.full((3, 1), 0.75, np.float32))[0], np.full((3, 1), 0.75))
    finally:
        vec.close()
    assert not any(t.is_alive() for t in vec._threads)


def test_rollout_with_threads_equals_sync():
    class TowardOrigin:  # a proportional action from the observation: the episodes depend on what the env returns
        inferences = stall_steps = np.zeros(2, np.int64)

        def reset(self, ids=None):
            pass

        def act(self, batch):
            return np.clip(-5.0 * np.asarray(batch["observation.state"])[:, :3], -1, 1).astype(np.float32)

    results = []
    for threads in (False, True):
        vec = make_vector_env(RegistryEnvFn("reach"), plan_episodes(3, 0, 2), max_episode_steps=6, threads=threads)
        try:
            results.append(rollout(vec, TowardOrigin(), 3))
        finally:
            vec.close()
    assert [r.to_dict() for r in results[0]] == [r.to_dict() for r in results[1]]
    assert [(r.index, r.seed, r.n_steps) for r in results[1]] == [(0, 0, 6), (1, 1, 6), (2, 2, 6)]


def test_a_failing_sub_env_constructor_raises_and_leaves_no_thread():
    calls = []

    def build():
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("no simulator")
        return _ThreadTagged()

    before = threading.active_count()
    with pytest.raises(RuntimeError, match="no simulator"):
        make_vector_env(build, 3, threads=True)
    assert len(calls) == 3
    assert threading.active_count() == before


def test_asynchronous_and_threads_together_are_refused():
    with pytest.raises(ValueError, match="asynchronous and threads"):
        make_vector_env(_ThreadTagged, 2, asynchronous=True, threads=True)
