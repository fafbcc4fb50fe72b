"""EMA: Diffusion Policy's warm-up decay (the same as diffusers' EMAModel), in-place averaging, resume state."""

from __future__ import annotations

import pytest
import torch

from policylink.policies.common.ema import EMA


def test_ema_warmup_decay_and_average():
    lin = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        lin.weight.fill_(0.0)
    ema = EMA(lin, max_decay=0.9999, power=0.75)
    assert ema.decay() == 0.0
    with torch.no_grad():
        lin.weight.fill_(1.0)
    ema.update(lin)  # decay 0 -> copies 1.0
    assert float(ema.model.weight) == 1.0
    assert ema.decay() == pytest.approx(1 - 2**-0.75)  # 0.4054
    with torch.no_grad():
        lin.weight.fill_(0.0)
    ema.update(lin)
    assert float(ema.model.weight) == pytest.approx(1 - 2**-0.75)  # 0.4054 * 1.0 + 0.5946 * 0.0


@pytest.mark.parametrize(("max_decay", "power"), [(0.9999, 0.75), (0.5, 0.75), (0.99, 2 / 3)])
def test_diffusers_decay_is_diffusion_policys_formula(max_decay, power):
    """The k-th update (0-based) uses min(max_decay, 1 - (1 + k) ** -power), also after the cap bites."""
    lin = torch.nn.Linear(2, 1)
    ema = EMA(lin, max_decay=max_decay, power=power)
    ref = [p.detach().clone() for p in ema.model.parameters()]
    g = torch.Generator().manual_seed(0)
    for k in range(12):
        d = min(max_decay, 1.0 - (1.0 + k) ** -power)
        assert ema.decay() == pytest.approx(d, abs=1e-12) and ema.step == k
        with torch.no_grad():
            for p in lin.parameters():
                p.copy_(torch.randn(p.shape, generator=g))
        ema.update(lin)
        ref = [d * r + (1 - d) * p.detach() for r, p in zip(ref, lin.parameters())]
        for got, want in zip(ema.model.parameters(), ref):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    if max_decay == 0.5:  # 1 - 13 ** -0.75 = 0.85 > 0.5: capped
        assert ema.decay() == 0.5


def test_resume_state_round_trip_and_buffers_copied():
    net = torch.nn.BatchNorm1d(2)  # one buffer-carrying module: running stats are copied, not averaged
    ema = EMA(net)
    with torch.no_grad():
        net.running_mean.fill_(3.0)
        net.weight.fill_(2.0)
    for _ in range(3):
        ema.update(net)
    torch.testing.assert_close(ema.model.running_mean, torch.full((2,), 3.0))
    state = ema.state_dict()
    assert state["step"] == 3
    other = EMA(torch.nn.BatchNorm1d(2))
    other.load_state_dict(state)
    assert other.step == 3 and other.decay() == pytest.approx(1 - 4**-0.75)
    torch.testing.assert_close(other.model.weight, ema.model.weight)
    with pytest.raises(ValueError, match=r"ema max_decay: expected a value in \[0, 1\), received 1.0"):
        EMA(net, max_decay=1.0)


@pytest.mark.parametrize("kind", ["diffusion", "flow"])
def test_the_averaged_model_samples_with_its_own_network(kind, kit):
    """The sampler holds a reference to the network: the EMA copy's sampler must run the averaged weights."""
    from policylink.policies.registry import build_model

    model = build_model(kit.tiny_config(kind), kit.FEATURES, 2)
    ema = EMA(model)
    assert ema.model.sampler.net is ema.model.net and ema.model.net is not model.net


def test_frozen_parameters_are_copied_not_averaged():
    net = torch.nn.Linear(2, 1)
    net.bias.requires_grad_(False)
    ema = EMA(net)
    ema.update(net)  # decay 0: a copy
    w0 = net.weight.detach().clone()
    with torch.no_grad():
        net.weight.fill_(1.0)
        net.bias.fill_(5.0)
    ema.update(net)  # decay 1 - 2**-0.75 = 0.4054 on the weight; the frozen bias is copied
    assert float(ema.model.bias) == 5.0
    d = 1 - 2**-0.75
    torch.testing.assert_close(ema.model.weight, d * w0 + (1 - d) * torch.ones_like(w0), rtol=1e-6, atol=1e-7)


def test_matches_diffusers_emamodel_over_many_steps():
    """Same decays and averages as diffusers' EMAModel (the library formula it replaces), to float32 rounding."""
    from diffusers.training_utils import EMAModel

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 3))
    ours = EMA(net, max_decay=0.99, power=0.75)
    ref_params = [p.detach().clone() for p in net.parameters()]
    ref = EMAModel(ref_params, decay=0.99, min_decay=0.0, update_after_step=0, use_ema_warmup=True, power=0.75)
    for _ in range(40):
        with torch.no_grad():
            for p in net.parameters():
                p.add_(torch.randn_like(p))
        ours.update(net)
        ref.step(net.parameters())
    for got, want in zip(ours.model.parameters(), ref.shadow_params):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
