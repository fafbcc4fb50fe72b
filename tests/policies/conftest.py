"""Shared fixtures of the policy tests: a tiny spec, a synthetic 2-episode store and its normaliser."""

from __future__ import annotations

import numpy as np
import pytest

from policylink.adapters.schema import ActionSpec, FeatureSpec, PolicySpec
from policylink.data.buffer import EpisodeStore
from policylink.data.normalize import Normalizer
from policylink.data.stats import compute_stats
from policylink.policies.common.encoders import EncoderConfig
from policylink.policies.common.unet1d import UNetConfig
from policylink.policies.config import PolicyConfig
from policylink.policies.processing import normalizer_modes, processors_for
from policylink.policies.registry import make_config

STATE = "observation.state"
IMAGE = "observation.images.front"
ACTION_LOW, ACTION_HIGH = (2.0, -1.0), (6.0, 1.0)


def tiny_config(kind: str, keys=(STATE,), **kw) -> PolicyConfig:
    """A small, fast config: U-Net [32, 64], small conv vision, chunk 8, 2 obs steps."""
    fields = dict(
        observation_keys=list(keys),
        chunk_size=8,
        n_action_steps=4,
        unet=UNetConfig(down_dims=[32, 64], time_embed_dim=32),
        encoder=EncoderConfig(vision_backbone="small_conv", num_keypoints=8),
    )
    return make_config(kind, **{**fields, **kw})


def make_spec(cfg: PolicyConfig, features) -> PolicySpec:
    action = ActionSpec(
        names=("x", "y"), control_mode="ee_delta", units=("m", "m"), low=(-10.0, -10.0), high=(10.0, 10.0)
    )
    return PolicySpec(
        {k: features[k] for k in cfg.observation_keys},
        action,
        n_obs_steps=cfg.n_obs_steps,
        chunk_size=cfg.chunk_size,
        n_action_steps=cfg.n_action_steps,
        control_frequency=10.0,
    )


def chain(cfg: PolicyConfig, normalizer: Normalizer):
    """The processor chain of ``cfg`` over :data:`FEATURES` with ``normalizer`` (what a policy is built with)."""
    return processors_for(cfg, FEATURES, normalizer)


FEATURES = {STATE: FeatureSpec("float32", (3,)), IMAGE: FeatureSpec("uint8", (24, 24, 3), unit="rgb")}


def episode(length: int, phase: float, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A smooth synthetic episode: state = (cos, sin, progress), action in [2, 6] x [-1, 1]."""
    s = np.linspace(0.0, 1.0, length, dtype=np.float32)
    state = np.stack([np.cos(3 * s + phase), np.sin(3 * s + phase), s], 1).astype(np.float32)
    action = np.stack([4.0 + 2.0 * np.sin(4 * s + phase), np.cos(4 * s + phase)], 1).astype(np.float32)
    image = rng.integers(0, 256, (length, 24, 24, 3), dtype=np.uint8)
    return {STATE: state, IMAGE: image, "action": action}


@pytest.fixture
def store_path(tmp_path):
    """A 2-episode store (30 and 26 steps) with state, a 24x24 camera and 2-D actions."""
    rng = np.random.default_rng(0)
    path = tmp_path / "demo.zarr"
    with EpisodeStore(path, "w") as store:
        store.add_episode(episode(30, 0.0, rng))
        store.add_episode(episode(26, 1.5, rng))
    return path


@pytest.fixture
def normalizer(store_path):
    """min_max normaliser of the store (state, action; identity for the camera)."""
    with EpisodeStore(store_path, "r") as store:
        stats = compute_stats(store)
    return Normalizer(stats, normalizer_modes(FEATURES, "min_max", "min_max"))


@pytest.fixture
def kit():
    """The helpers of this module as one namespace (pytest's importlib mode cannot import conftest)."""
    import types

    return types.SimpleNamespace(
        FEATURES=FEATURES,
        STATE=STATE,
        IMAGE=IMAGE,
        tiny_config=tiny_config,
        make_spec=make_spec,
        episode=episode,
        chain=chain,
    )


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """One intra-op thread: the CI machine has 2 shared cores, where OpenMP spinning slows tiny nets a lot."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
