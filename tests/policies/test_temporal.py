"""SEGA memory (policies/temporal.py): gate 1 at reset, per-row state reset of exactly the reset env ids,
identical state for identical inputs, training chains (pre-start windows skipped, detached carry-over) equal to
stepping the policy window by window, and the dataset's chain windows."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest
import torch

from policylink.adapters.schema import ActionSpec, ControlMode, FeatureSpec, PolicySpec
from policylink.data.normalize import Normalizer
from policylink.data.sampler import OBS_PAD_KEY, SequenceSampler
from policylink.policies.processing import processors_for
from policylink.policies.registry import make_config, make_policy
from policylink.policies.temporal import SegaEncoder, SegaMemory
from policylink.policies.temporal_config import SegaConfig, chain_windows

STATE = "observation.state"
FEATURES = {STATE: FeatureSpec("float32", (5,))}
SEGA = SegaConfig(tokens=4, width=16, layers=2, heads=2, train_windows=3, detach_every=1)


def _policy(seed: int = 0):
    torch.manual_seed(seed)
    spec = PolicySpec(
        FEATURES,
        ActionSpec(names=("dx", "dy"), control_mode=ControlMode.EE_DELTA, units=("m", "m"), low=(-1, -1), high=(1, 1)),
        n_obs_steps=2,
        chunk_size=8,
        n_action_steps=4,
    )
    stats = {STATE: {"min": -np.ones(5), "max": np.ones(5)}, "action": {"min": -np.ones(2), "max": np.ones(2)}}
    norm = Normalizer(stats, {STATE: "min_max", "action": "min_max"})
    unet, sega = {"down_dims": [8, 16]}, asdict(SEGA)
    cfg = make_config("flow", n_obs_steps=2, chunk_size=8, n_action_steps=4, memory="sega", sega=sega, unet=unet)
    return make_policy("flow", spec=spec, processors=processors_for(cfg, FEATURES, norm), config=cfg, device="cpu")


def _obs(rows: np.ndarray) -> dict[str, np.ndarray]:
    return {STATE: np.asarray(rows, np.float32)}


def test_gate_is_one_at_reset_and_the_state_is_the_update():
    torch.manual_seed(0)
    mem = SegaMemory(SEGA).eval()
    tokens = torch.randn(3, 2, 16)
    with torch.no_grad():
        _, fresh, gate = mem(tokens)  # no state: every row starts (gate 1)
        assert torch.equal(gate, torch.ones(3, 4))
        reset = torch.tensor([True, False, True])
        _, new, gate = mem(tokens, fresh, reset)
    assert torch.equal(gate[reset], torch.ones(2, 4))
    assert ((gate[1] > 0) & (gate[1] < 1)).all()  # a carried row blends: sigmoid of the mean logits
    assert torch.allclose(new[reset], fresh[reset], atol=1e-6)  # reset rows: the update of the initial tokens
    assert not torch.allclose(new[1], fresh[1])


def test_reset_clears_exactly_the_reset_env_ids_and_equal_inputs_give_equal_states():
    policy, fresh = _policy(), _policy()
    rng = np.random.default_rng(0)
    a, b = rng.uniform(-1, 1, (3, 5)), rng.uniform(-1, 1, (3, 5))
    for step in (a, b):
        policy.update_observation(_obs(step))
        policy.predict_action_chunk()
    before = policy._memory.states.clone()
    policy.reset([1])
    assert policy._memory.started.tolist() == [True, False, True]
    c = rng.uniform(-1, 1, (3, 5))
    policy.update_observation(_obs(c))
    policy.predict_action_chunk()
    fresh.update_observation(_obs(c))  # a new policy seeing only c: row 1 must match it exactly
    fresh.predict_action_chunk()
    assert torch.equal(policy._memory.states[1], fresh._memory.states[1])
    for row in (0, 2):  # the others carried their state: not the fresh one, and moved on from `before`
        assert not torch.allclose(policy._memory.states[row], fresh._memory.states[row])
        assert not torch.allclose(policy._memory.states[row], before[row])
    twin = _policy()  # same weights, same inputs: bit-identical states
    for step in (a, b):
        twin.update_observation(_obs(step))
        twin.predict_action_chunk()
    assert torch.equal(twin._memory.states, before)
    policy.reset()
    assert policy._memory.states is None and policy._memory.started is None


def test_identical_rows_have_identical_states_and_a_replan_does_not_advance_the_state():
    policy = _policy()
    row = np.random.default_rng(1).uniform(-1, 1, 5)
    policy.update_observation(_obs(np.stack([row, row])))
    policy.predict_action_chunk()
    s = policy._memory.states.clone()
    # equal up to float32 rounding, not bit for bit: a GEMM may round rows 0 and 1 of one batch differently (MKL's
    # AVX2 kernels: 5.4e-7 apart on states of magnitude 2.6, about 2 ulp); a 0.01 change of one state entry
    # moves the state by 7e-3, far outside the tolerance
    torch.testing.assert_close(s[0], s[1], rtol=1e-5, atol=1e-5)
    policy.predict_action_chunk(env_ids=[0])  # same window: the cached latent, no second state update
    assert torch.equal(policy._memory.states, s)


def _encoder(detach_every: int) -> SegaEncoder:
    torch.manual_seed(0)
    cfg = SegaConfig(tokens=4, width=16, layers=2, heads=2, train_windows=3, detach_every=detach_every)
    return SegaEncoder(FEATURES, 2, make_config("flow").encoder, cfg).eval()


def test_a_training_chain_equals_stepping_the_windows_and_skips_pre_start_windows():
    enc = _encoder(1)
    x = torch.randn(2, 6, 5)  # 2 samples, chains of 3 windows of 2 steps
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, :2] = True  # sample 1: the first window lies before the episode start
    with torch.no_grad():
        chain = enc({STATE: x, OBS_PAD_KEY: pad})
        for b, first in ((0, 0), (1, 1)):  # stepping the real windows one by one from the reset state
            state = None
            for k in range(first, 3):
                out, state, _ = enc.memory(enc.tokens({STATE: x[b : b + 1, 2 * k : 2 * k + 2]}), state)
            assert torch.allclose(chain[b], out.flatten(1)[0], atol=1e-5)


@pytest.mark.parametrize("detach_every, reaches_first", [(1, False), (0, True)])
def test_sequential_window_training_with_detached_carry(detach_every, reaches_first):
    """Loss at the chain's last window; with detach_every=1 (SeedPolicy's carry-over) no gradient reaches the first
    window's input, nor the parts that only write the next state (last state block, final state norm: the state a
    window writes is never trained by that window's loss); back-propagation through the chain trains them all."""
    enc = _encoder(detach_every).train()
    x = torch.randn(2, 6, 5, requires_grad=True)
    loss = enc({STATE: x, OBS_PAD_KEY: torch.zeros(2, 6, dtype=torch.bool)}).square().mean()
    loss.backward()
    assert x.grad[:, 4:].abs().sum() > 0  # the last window always trains
    assert (x.grad[:, :2].abs().sum() > 0) == reaches_first
    trained = {n for n, p in enc.memory.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    writers = {n for n, _ in enc.memory.named_parameters() if n.startswith(("state_blocks.1.", "norm_state."))}
    assert writers and (writers <= trained) == reaches_first and (writers & trained == set()) != reaches_first
    assert {n for n, _ in enc.memory.named_parameters() if n.startswith("obs_blocks.")} <= trained


def test_dataset_chain_windows_and_the_config_kwargs():
    data = {STATE: np.arange(20, dtype=np.float32)[:, None].repeat(5, 1), "action": np.zeros((20, 2), np.float32)}
    s = SequenceSampler(data, [20], n_obs_steps=2, horizon=9, obs_keys=[STATE], chain_windows=3, chain_stride=4)
    item = s.sample(5)  # anchor t = 5: windows ending at -3, 1, 5
    assert item["step"] == 5
    assert item[STATE][:, 0].tolist() == [0, 0, 0, 1, 4, 5]
    assert item[OBS_PAD_KEY].tolist() == [True, True, False, False, False, False]
    cfg = make_config("diffusion", memory="sega", n_action_steps=8, sega=SEGA)
    assert chain_windows(cfg) == {"chain_windows": 3, "chain_stride": 8}
    assert chain_windows(make_config("diffusion")) == {}
    with pytest.raises(ValueError, match="policy.memory"):
        make_config("diffusion", memory="lstm").validate()
    with pytest.raises(ValueError, match="policy.sega.width"):
        make_config("diffusion", memory="sega", sega=SegaConfig(width=10, heads=4)).validate()
