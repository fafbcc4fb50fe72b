"""``policylink eval`` of a policy served over ZMQ gives the same episodes as the same policy in-process."""

import numpy as np
import pytest

from policylink.adapters.policy import HistoryPolicy
from policylink.adapters.registry import make_env, register_policy
from policylink.adapters.schema import PolicySpec
from policylink.adapters.transport import PolicyServer
from policylink.runtime.evaluate import evaluate


class ReachP(HistoryPolicy):
    """Deterministic proportional controller for ``reach``: move 60 % of the way to the target, capped."""

    def __init__(self):
        env_spec = make_env("reach").env_spec
        super().__init__(PolicySpec(env_spec.observation_features, env_spec.action, 1, 4, 4, 10.0))
        self._low, self._high = env_spec.action.low_array, env_spec.action.high_array

    def _predict(self, history, pad_mask, tasks):
        s = history["observation.state"][:, -1]  # (B, 6): ee xyz, target xyz (m)
        step = np.clip(0.6 * (s[:, 3:6] - s[:, 0:3]), self._low, self._high)
        return np.repeat(step[:, None, :], 4, axis=1).astype(np.float32)


@pytest.mark.slow
def test_served_policy_matches_in_process(tmp_path):
    register_policy("reach_p_served_test", ReachP, overwrite=True)
    server = PolicyServer(ReachP(), "tcp://127.0.0.1:0").start()
    try:
        summaries = evaluate(
            [("local", "reach_p_served_test"), ("served", server.endpoint)],
            ["reach"],
            episodes=6,
            seed=100,
            workers=0,
            shard_episodes=6,
            videos=0,
            out=tmp_path,
            progress=False,
        )
        infer_calls = server.stats.snapshot()["infer"]["count"]
    finally:
        server.stop()
    assert infer_calls >= 6  # the served cell really went over the wire (one or more chunks per episode)
    local, served = summaries
    assert local["n_episodes"] == served["n_episodes"] == 6
    assert local["pc_success"] == served["pc_success"] == 100.0
    for key in ("avg_sum_reward", "avg_max_reward", "avg_steps"):
        assert local[key] == served[key], key
