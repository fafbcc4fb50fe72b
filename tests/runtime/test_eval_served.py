"""``policylink eval`` of a policy served over ZMQ gives the same episodes as the same policy in-process."""

import numpy as np
import pytest

from policylink.adapters.registry import register_policy
from policylink.adapters.schema import PolicySpec
from policylink.adapters.transport import PolicyServer
from policylink.evaluate.nxm import evaluate


@pytest.mark.slow
def test_served_policy_matches_in_process(tmp_path, reach_p):
    register_policy("reach_p_served_test", reach_p, overwrite=True)
    server = PolicyServer(reach_p(), "tcp://127.0.0.1:0").start()
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


def _tiny_flow_policy():
    """An untrained tiny flow ChunkPolicy (U-Net [16, 32]); the same weights and noise seed on every call."""
    import torch

    from policylink.adapters.schema import ActionSpec, FeatureSpec
    from policylink.data.normalize import Normalizer
    from policylink.policies.common.unet1d import UNetConfig
    from policylink.policies.processing import processors_for
    from policylink.policies.registry import make_config, make_policy

    state = "observation.state"
    cfg = make_config(
        "flow",
        observation_keys=[state],
        chunk_size=8,
        n_action_steps=3,
        n_obs_steps=1,
        unet=UNetConfig(down_dims=[16, 32], time_embed_dim=16),
    )
    spec = PolicySpec(
        {state: FeatureSpec("float32", (3,))},
        ActionSpec(("x", "y"), "ee_delta", ("m", "m"), (-10, -10), (10, 10)),
        n_obs_steps=1,
        chunk_size=8,
        n_action_steps=3,
        control_frequency=10.0,
    )
    stats = {state: {"min": np.zeros(3), "max": np.ones(3)}, "action": {"min": -np.ones(2), "max": np.ones(2)}}
    torch.manual_seed(0)
    norm = Normalizer(stats, {state: "min_max", "action": "min_max"})
    chain = processors_for(cfg, spec.observation_features, norm)
    return make_policy("flow", spec=spec, processors=chain, config=cfg, device="cpu", seed=0)


def test_rtc_prefix_over_the_wire_matches_in_process_for_a_flow_policy():
    """The same untrained flow policy, seed and prefix give the same chunk served over ZMQ as in-process."""
    from policylink.adapters.capabilities import ChunkPrefix, Embedder, PrefixConditioned
    from policylink.adapters.transport import RemotePolicy

    local, served = _tiny_flow_policy(), _tiny_flow_policy()
    assert isinstance(local, PrefixConditioned) and isinstance(local, Embedder)
    obs = {"observation.state": np.random.default_rng(0).uniform(0, 1, (3, 3)).astype(np.float32)}
    committed = np.random.default_rng(1).uniform(-1, 1, (2, 8, 2)).astype(np.float32)
    weights = np.tile(np.linspace(1, 0, 8, dtype=np.float32), (2, 1))
    prefix = ChunkPrefix(committed, weights, max_guidance=5.0)
    server = PolicyServer(served, "tcp://127.0.0.1:0").start()
    try:
        remote = RemotePolicy(server.endpoint, timeout_s=60)
        assert isinstance(remote, PrefixConditioned) and isinstance(remote, Embedder)
        assert remote.latent_dim == local.latent_dim
        local.update_observation(obs)
        remote.update_observation(obs)
        expected = local.predict_action_chunk_with_prefix(prefix, [2, 0])
        got = remote.predict_action_chunk_with_prefix(prefix, [2, 0])
        assert got.shape == (2, 8, 2) and got.dtype == np.float32
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(remote.predict_action_chunk(), local.predict_action_chunk())
        np.testing.assert_array_equal(remote.embed(None, [1]), local.embed(None, [1]))
        remote.close()
    finally:
        server.stop()
