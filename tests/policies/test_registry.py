"""The policy-type registry: a third policy, defined and registered in this test without touching any shared
file, is parsed, built, saved, loaded, run as a PolicyAdapter and trained through the normal train path; and no
shared code dispatches on type names."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from policylink.adapters import registry as adapter_registry
from policylink.adapters.capabilities import capabilities_of
from policylink.adapters.policy import PolicyAdapter
from policylink.data.buffer import EpisodeStore
from policylink.data.normalize import Normalizer
from policylink.policies import load_policy
from policylink.policies.common.samplers import FlowEulerSampler
from policylink.policies.config import PolicyConfig
from policylink.policies.model import GenerativeChunkModel
from policylink.policies.processing import processors_for
from policylink.policies.registry import make_config, make_policy, policy_type, register_policy_type

STATE = "observation.state"
NAME = "test_mlp_flow"


@dataclass
class MlpFlowConfig(PolicyConfig):
    """A third policy type: an MLP velocity field over the flattened chunk."""

    hidden: int = 32
    num_steps: int = 4


class MlpVelocity(nn.Module):
    def __init__(self, size: int, cond_dim: int, hidden: int):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(size + 1 + cond_dim, hidden), nn.Tanh(), nn.Linear(hidden, size))

    def forward(self, x, t, cond):
        b = x.shape[0]
        return self.body(torch.cat([x.reshape(b, -1), t.reshape(b, 1).to(x.dtype), cond], 1)).reshape(x.shape)


class MlpFlowModel(GenerativeChunkModel):
    def __init__(self, cfg: MlpFlowConfig, features, action_dim: int):
        super().__init__(cfg, features, action_dim)
        self.net = MlpVelocity(self.horizon * self.action_dim, self.latent_dim, cfg.hidden)
        self.sampler = FlowEulerSampler(self.net, cfg.num_steps)

    def draw_noise(self, batch_size, generator=None, device="cpu"):
        noise = torch.randn(batch_size, self.horizon, self.action_dim, generator=generator)
        return {"noise": noise.to(device), "t": torch.rand(batch_size, generator=generator).to(device)}

    def loss_terms(self, cond, actions, noise):
        eps, t = noise["noise"], noise["t"]
        x_t = t[:, None, None] * actions + (1 - t[:, None, None]) * eps
        return self.sampler.denoise(x_t, t, cond), actions - eps


@pytest.fixture(autouse=True)
def third_policy():
    return register_policy_type(NAME, MlpFlowConfig, MlpFlowModel, overwrite=True)


def _spec_and_normalizer(kit, cfg):
    stats = {STATE: {"min": np.zeros(3), "max": np.ones(3)}, "action": {"min": -np.ones(2), "max": np.ones(2)}}
    return kit.make_spec(cfg, kit.FEATURES), Normalizer(stats, {STATE: "min_max", "action": "min_max"})


def test_third_policy_parses_builds_saves_loads_and_runs(kit, tmp_path):
    cfg = make_config(NAME, hidden=16, chunk_size=8, n_action_steps=4)
    assert type(cfg) is MlpFlowConfig and cfg.type == NAME and policy_type(NAME).model_cls() is MlpFlowModel
    assert PolicyConfig.from_dict({"type": NAME, "hidden": 16, "chunk_size": 8, "n_action_steps": 4}) == cfg
    spec, norm = _spec_and_normalizer(kit, cfg)
    policy = make_policy(
        NAME, spec=spec, processors=processors_for(cfg, kit.FEATURES, norm), config=cfg, device="cpu", seed=4
    )
    assert isinstance(policy, PolicyAdapter)
    assert capabilities_of(policy) == ["conditionable", "embedder", "guided_sampler", "prefix"]  # velocity sampler
    path = policy.save(tmp_path / "ckpt")
    doc = json.loads((path / "config.json").read_text())
    assert doc["policy"]["type"] == NAME and doc["policy"]["hidden"] == 16
    loaded = load_policy(path, device="cpu", seed=4)
    via_adapters = adapter_registry.make_policy(NAME, checkpoint=path, device="cpu", seed=4)
    obs = {STATE: np.random.default_rng(0).uniform(0, 1, (3, 3)).astype(np.float32)}
    chunks = []
    for p in (policy, loaded, via_adapters):
        p.update_observation(obs)
        chunks.append(p.predict_action_chunk())
    assert chunks[0].shape == (3, 8, 2) and type(loaded.model) is MlpFlowModel
    np.testing.assert_array_equal(chunks[0], chunks[1])
    np.testing.assert_array_equal(chunks[0], chunks[2])


def test_third_policy_from_the_command_line():
    from policylink.cli.app import parse_config
    from policylink.train.imitation import TrainConfig

    cfg = parse_config(TrainConfig, ["--policy.type", NAME, "--policy.hidden", "8", "--policy.chunk_size", "4"])
    assert type(cfg.policy) is MlpFlowConfig and (cfg.policy.hidden, cfg.policy.chunk_size) == (8, 4)


@pytest.mark.slow
def test_third_policy_trains_through_the_train_path(tmp_path):
    from policylink.adapters.registry import make_env
    from policylink.train.imitation import DatasetConfig, TrainConfig, train

    env_spec = make_env("reach", obs_mode="state").env_spec
    d, a = env_spec.observation_features[STATE].shape[0], env_spec.action.dim
    rng = np.random.default_rng(0)
    store = tmp_path / "reach.zarr"
    with EpisodeStore(store, "w") as s:
        for length in (12, 14, 16):
            state = np.cumsum(rng.normal(0, 0.1, (length, d)), 0).astype(np.float32)
            s.add_episode({STATE: state, "action": np.tanh(state[:, :a]).astype(np.float32)})
    cfg = TrainConfig(
        policy=make_config(NAME, hidden=16, chunk_size=8, n_action_steps=4),
        dataset=DatasetConfig(path=str(store), env="reach", val_fraction=0.0),
        output_dir=str(tmp_path / "run"),
        steps=3,
        batch_size=4,
        log_every=1,
        device="cpu",
        progress=False,
        torch_threads=1,
    )
    ckpt = train(cfg)
    policy = load_policy(ckpt, device="cpu")
    assert type(policy.model) is MlpFlowModel and policy.config.type == NAME
    policy.update_observation({STATE: np.zeros((2, d), np.float32)})
    assert policy.predict_action_chunk().shape == (2, 8, a)


def test_unknown_type_and_no_dispatch_on_type_names():
    with pytest.raises(ValueError, match=r"policy.type: expected one of \[.*'diffusion', 'flow'.*\], received 'gan'$"):
        make_config("gan")
    with pytest.raises(KeyError, match=r"received 'difusion'; did you mean 'diffusion'\?$"):  # the closest type
        make_config("difusion")
    root = Path(__file__).resolve().parents[2]
    # a comparison with a type name, or a config's type compared with a string literal
    pattern = re.compile(r"""(==|!=)\s*["'](flow|diffusion)["']|(cfg|config)\.type\s*(==|!=|in)\s*[("'\[]""")
    offenders = [
        f"{path.relative_to(root)}:{i}"
        for part in ("policies", "runtime", "adapters")
        for path in (root / part).rglob("*.py")
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []
