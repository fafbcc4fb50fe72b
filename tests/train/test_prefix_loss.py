"""Training-time action conditioning (loss ``prefix_conditioned``) and its inference side (``rtc_method:
condition``): the drawn prefix is clean in the noisy chunk and left out of the loss, and a conditioned sample keeps
the committed actions exactly."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from policylink.adapters.capabilities import ChunkPrefix
from policylink.policies.common.rtc import condition_noise, inpaint_weights
from policylink.train.losses import available_losses
from policylink.train.prefix import PrefixConditionedLoss, prefix_mask


def _cfg(policy_type="flow", chunk_size=6, mask_padded=False):
    return SimpleNamespace(
        policy=SimpleNamespace(type=policy_type, chunk_size=chunk_size, mask_padded_actions=mask_padded)
    )


class CapturingModel:
    """Stands in for a flow model: records what the loss hands to ``model(obs, actions, noise, valid)``."""

    def draw_noise(self, batch_size, generator=None, device="cpu"):
        return {
            "noise": torch.randn(batch_size, 6, 2, generator=generator),
            "t": torch.rand(batch_size, generator=generator),
        }

    def __call__(self, obs, actions, noise, valid):
        self.seen = (actions, noise, valid)
        return torch.tensor(0.5)


def test_prefix_mask_marks_the_first_d_steps():
    mask = prefix_mask(torch.tensor([0, 2, 4]), 4)
    assert mask.tolist() == [[False] * 4, [True, True, False, False], [True] * 4]


def test_prefix_loss_gives_the_prefix_clean_and_leaves_it_out_of_the_loss():
    assert "prefix_conditioned" in available_losses()
    loss, model = PrefixConditionedLoss(_cfg(mask_padded=True), max_delay=3), CapturingModel()
    noise = loss.draw(model, 5, torch.Generator().manual_seed(0))
    assert noise["prefix"].dtype == torch.int64 and 0 <= int(noise["prefix"].min()) <= int(noise["prefix"].max()) <= 3
    noise["prefix"] = torch.tensor([0, 1, 2, 3, 3])
    actions = torch.arange(60, dtype=torch.float32).reshape(5, 6, 2)
    valid = torch.ones(5, 6, dtype=torch.bool)
    valid[4, 5] = False  # a padded step past the episode's end stays masked
    value, metrics = loss(model, {"obs": {}, "action": actions, "noise": noise, "valid": valid}, step=0)
    assert float(value) == 0.5 and metrics == {"prefix_steps": pytest.approx(1.8)}
    _, seen_noise, seen_valid = model.seen
    for b, d in enumerate([0, 1, 2, 3, 3]):
        torch.testing.assert_close(seen_noise["noise"][b, :d], actions[b, :d], rtol=0, atol=0)
        torch.testing.assert_close(seen_noise["noise"][b, d:], noise["noise"][b, d:], rtol=0, atol=0)
        expected = [False] * d + [True] * (6 - d) if b < 4 else [False] * 3 + [True, True, False]
        assert seen_valid[b].tolist() == expected
    assert "prefix" not in seen_noise and torch.equal(seen_noise["t"], noise["t"])


def test_prefix_loss_rejects_what_it_cannot_train():
    with pytest.raises(ValueError, match="policy.type 'flow', received 'diffusion'"):
        PrefixConditionedLoss(_cfg("diffusion"))
    with pytest.raises(ValueError, match="max_delay < chunk_size 6, received 6"):
        PrefixConditionedLoss(_cfg(), max_delay=6)


def test_condition_noise_is_all_or_nothing_per_step():
    eps, y = torch.zeros(1, 3, 1), torch.ones(1, 3, 1)
    torch.testing.assert_close(
        condition_noise(eps, y, torch.tensor([1.0, 0.0, 0.0])), torch.tensor([[[1.0], [0.0], [0.0]]])
    )
    with pytest.raises(ValueError, match="expected 0 or 1"):
        condition_noise(eps, y, torch.tensor([1.0, 0.5, 0.0]))


def test_conditioned_flow_sample_keeps_the_committed_prefix_exactly():
    from tests.runtime.test_executors import STATE, _tiny_flow_policy

    policy = _tiny_flow_policy()
    policy.update_observation({STATE: np.random.default_rng(0).uniform(0, 1, (2, 3)).astype(np.float32)})
    committed = np.random.default_rng(1).uniform(-0.8, 0.8, (2, 8, 2)).astype(np.float32)
    weights = np.tile(inpaint_weights(8, 3), (2, 1)).astype(np.float32)
    got = policy.predict_action_chunk_with_prefix(ChunkPrefix(committed, weights, method="condition"))
    np.testing.assert_allclose(got[:, :3], committed[:, :3], atol=1e-6)
    assert np.abs(got[:, 3:] - committed[:, 3:]).mean() > 0.05  # the rest is the network's own
