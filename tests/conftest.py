"""Fixtures shared by every test folder."""

from __future__ import annotations

import pytest


@pytest.fixture
def served():
    """Factory ``served(policy, timeout_s=60.0) -> RemotePolicy``: ``policy`` behind a
    :class:`~policylink.adapters.transport.PolicyServer` on a free loopback tcp port and a client to it; every
    client and server started this way is closed at teardown (also when the test fails)."""
    from policylink.adapters.transport import PolicyServer, RemotePolicy

    opened = []

    def start(policy, timeout_s: float = 60.0):
        server = PolicyServer(policy, "tcp://127.0.0.1:0").start()
        opened.append((server, None))
        remote = RemotePolicy(server.endpoint, timeout_s=timeout_s)
        opened[-1] = (server, remote)
        return remote

    yield start
    for server, remote in reversed(opened):
        try:
            if remote is not None:
                remote.close()
        finally:
            server.stop()


@pytest.fixture(scope="session")
def trained_reach_checkpoint(tmp_path_factory):
    """A small flow policy (5 Euler steps) trained on 60 scripted reach episodes for 150 steps (once per session,
    ~30 s): it succeeds on some reach episodes and fails on others (the deployment and inspect-robots tests)."""
    import torch

    from policylink.policies.common.unet1d import UNetConfig
    from policylink.policies.flow.config import FlowConfig
    from policylink.policies.registry import make_config
    from policylink.runtime.record import RecordConfig, record
    from policylink.train.imitation import DatasetConfig, TrainConfig, train

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("reach")
    record(RecordConfig(env="reach", expert="expert", episodes=60, out=str(out / "data.zarr")), progress=False)
    policy = make_config(
        "flow",
        n_obs_steps=1,
        chunk_size=8,
        n_action_steps=4,
        observation_keys=["observation.state"],
        flow=FlowConfig(num_steps=5),
        unet=UNetConfig(down_dims=[32, 64], time_embed_dim=32),
    )
    cfg = TrainConfig(
        policy=policy,
        dataset=DatasetConfig(path=str(out / "data.zarr"), env="reach", val_fraction=0.0),
        output_dir=str(out / "run"),
        steps=150,
        batch_size=64,
        lr=3e-3,
        warmup_steps=10,
        log_every=60,
        val_every=0,
        device="cpu",
        progress=False,
        torch_threads=1,
    )
    return train(cfg)


@pytest.fixture
def reach_p():
    """The class of a deterministic proportional controller for ``reach`` (60 % of the way to the target per step,
    capped at the action limits; chunks of 4): a policy whose every action is known, for transport and plugin tests."""
    import numpy as np

    from policylink.adapters.policy import HistoryPolicy
    from policylink.adapters.registry import make_env
    from policylink.adapters.schema import PolicySpec

    class ReachP(HistoryPolicy):
        def __init__(self):
            env_spec = make_env("reach").env_spec
            super().__init__(PolicySpec(env_spec.observation_features, env_spec.action, 1, 4, 4, 10.0))
            self._low, self._high = env_spec.action.low_array, env_spec.action.high_array

        def _predict(self, history, pad_mask, tasks):
            s = history["observation.state"][:, -1]  # (B, 6): ee xyz, target xyz (m)
            step = np.clip(0.6 * (s[:, 3:6] - s[:, 0:3]), self._low, self._high)
            return np.repeat(step[:, None, :], 4, axis=1).astype(np.float32)

    return ReachP
