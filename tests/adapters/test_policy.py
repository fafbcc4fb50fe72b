"""HistoryPolicy: per-episode windows with pad masks, partial resets, output validation."""

import numpy as np
import pytest

from policylink.adapters.policy import HistoryPolicy, PolicyAdapter
from policylink.adapters.schema import ActionError, ActionSpec, FeatureSpec, ObservationError, PolicySpec

SPEC = PolicySpec(
    observation_features={
        "observation.state": FeatureSpec("float32", (2,)),
        "task": FeatureSpec("string", ()),
    },
    action=ActionSpec(names=("a",), control_mode="joint_position", units=("rad",), low=(-10.0,), high=(10.0,)),
    n_obs_steps=3,
    chunk_size=4,
    n_action_steps=2,
    control_frequency=10.0,
)


class EchoPolicy(HistoryPolicy):
    """Chunk value = newest state's first entry + 0.1 * number of padded slots."""

    def _predict(self, history, pad_mask, tasks):
        self.last = (history["observation.state"].copy(), pad_mask.copy(), tasks)
        v = history["observation.state"][:, -1, 0] + 0.1 * pad_mask.sum(axis=1)
        return np.repeat(v[:, None, None], 4, axis=1).astype(np.float32)


def obs(values, tasks=None):
    s = np.array([[v, -v] for v in values], dtype=np.float32)
    return {"observation.state": s, "task": tasks or ["t"] * len(values)}


def test_is_a_policy_adapter():
    assert isinstance(EchoPolicy(SPEC), PolicyAdapter)


def test_first_observation_fills_window_and_mask_marks_padding():
    p = EchoPolicy(SPEC)
    p.update_observation(obs([1.0, 2.0]))
    chunk = p.predict_action_chunk()
    assert chunk.shape == (2, 4, 1) and chunk.dtype == np.float32
    hist, mask, tasks = p.last
    np.testing.assert_array_equal(hist[:, :, 0], [[1, 1, 1], [2, 2, 2]])
    np.testing.assert_array_equal(mask, [[True, True, False], [True, True, False]])
    np.testing.assert_allclose(chunk[:, 0, 0], [1.2, 2.2])
    assert tasks == ["t", "t"]


def test_window_shifts_and_partial_reset_touches_only_that_episode():
    p = EchoPolicy(SPEC)
    p.update_observation(obs([1.0, 10.0]))
    p.update_observation(obs([2.0, 20.0]))
    p.update_observation(obs([3.0, 30.0]))
    p.predict_action_chunk()
    np.testing.assert_array_equal(p.last[0][:, :, 0], [[1, 2, 3], [10, 20, 30]])
    assert not p.last[1].any()
    p.reset([1])
    p.update_observation(obs([4.0, 99.0]))
    p.predict_action_chunk()
    np.testing.assert_array_equal(p.last[0][:, :, 0], [[2, 3, 4], [99, 99, 99]])
    np.testing.assert_array_equal(p.last[1], [[False, False, False], [True, True, False]])


def test_batch_size_change_needs_reset_and_bad_ids_raise():
    p = EchoPolicy(SPEC)
    p.update_observation(obs([1.0, 2.0]))
    with pytest.raises(ObservationError, match="batch size: expected 2 .*received 3"):
        p.update_observation(obs([1.0, 2.0, 3.0]))
    with pytest.raises(IndexError, match=r"env_ids: expected indices in \[0, 2\), received \[5\]"):
        p.reset([5])
    p.reset()
    p.update_observation(obs([1.0, 2.0, 3.0]))
    assert p.batch_size == 3


def test_invalid_observation_and_output_are_reported():
    p = EchoPolicy(SPEC)
    with pytest.raises(ObservationError, match="observation.state: expected dtype float32, received float64"):
        p.update_observation({"observation.state": np.zeros((1, 2)), "task": ["t"]})

    class Bad(EchoPolicy):
        def _predict(self, history, pad_mask, tasks):
            return np.zeros((1, 3, 1), np.float32)

    b = Bad(SPEC)
    b.update_observation(obs([0.0]))
    with pytest.raises(ActionError, match=r"expected shape \(1, 4, 1\), received \(1, 3, 1\)"):
        b.predict_action_chunk()
    with pytest.raises(RuntimeError, match="no observation yet"):
        EchoPolicy(SPEC).predict_action_chunk()


def test_nan_observation_and_bad_task_list_are_observation_errors():
    p = EchoPolicy(SPEC)
    bad = obs([1.0, 2.0])
    bad["observation.state"][1, 0] = np.nan
    with pytest.raises(ObservationError, match="observation.state: expected finite values, received 1 NaN/inf"):
        p.update_observation(bad)
    with pytest.raises(ObservationError, match="same leading dim for every feature.*'task': 3"):
        p.update_observation(obs([1.0, 2.0], tasks=["a", "b", "c"]))
    # a policy that does not read the task still refuses a mis-sized task list instead of mis-assigning it
    no_task = EchoPolicy(PolicySpec({"observation.state": FeatureSpec("float32", (2,))}, SPEC.action, 3, 4, 2))
    with pytest.raises(ObservationError, match="task: expected a list of 2 str .*received a bare str"):
        no_task.update_observation({"observation.state": obs([1.0, 2.0])["observation.state"], "task": "ab"})
    with pytest.raises(ObservationError, match="task: expected a list of str"):
        p.update_observation({"observation.state": obs([1.0])["observation.state"], "task": "push it"})
