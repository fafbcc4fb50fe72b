"""The flow Euler and DDIM samplers: known trajectories, the one clean estimate, and guidance hooks that read
``cond`` and take gradients through the network (checked against finite differences)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from policylink.adapters.capabilities import DenoisingSampler, Guidance, Prediction
from policylink.policies.common.samplers import DDIMSampler, FlowEulerSampler

H, A = 4, 2


def constant_velocity(x, t, cond):
    """v = cond broadcast over the chunk: Euler from noise ends at noise + cond."""
    return cond[:, None, :].expand_as(x)


class TanhNet(nn.Module):
    """A float64 network nonlinear in ``x`` that also reads ``cond`` (B, 3): a Jacobian far from the identity."""

    def __init__(self, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = nn.Parameter(torch.randn(H * A, H * A, generator=g, dtype=torch.float64))
        self.u = nn.Parameter(torch.randn(3, H * A, generator=g, dtype=torch.float64))

    def forward(self, x, timestep, cond):
        b = x.shape[0]
        z = x.reshape(b, -1) @ self.w + cond @ self.u + 0.01 * timestep[:, None].to(x.dtype)
        return torch.tanh(z).reshape(x.shape)


def test_euler_trajectory_with_a_constant_velocity():
    sampler = FlowEulerSampler(constant_velocity, num_steps=4)
    assert isinstance(sampler, DenoisingSampler) and sampler.prediction == Prediction.VELOCITY
    noise, cond = torch.zeros(2, H, A), torch.tensor([[1.0, -2.0], [0.5, 0.0]])
    x, traj, times, outs = sampler.sample(cond, noise, return_trajectory=True)
    torch.testing.assert_close(x, cond[:, None, :].expand(2, H, A))
    torch.testing.assert_close(times, torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0]))
    assert traj.shape == (5, 2, H, A) and outs.shape == (4, 2, H, A)
    torch.testing.assert_close(traj[2], 0.5 * cond[:, None, :].expand(2, H, A))
    torch.testing.assert_close(traj[-1], x)
    torch.testing.assert_close(sampler.sample(cond, noise, num_steps=1), x)  # one step of dt = 1 lands too
    # the clean estimate x_t + (1 - t) v: 1 + 0.75 * 2 = 2.5
    a_hat = sampler.clean_estimate(torch.ones(1, H, A), torch.tensor([0.25]), torch.full((1, H, A), 2.0))
    torch.testing.assert_close(a_hat, torch.full((1, H, A), 2.5))


@pytest.mark.parametrize("prediction", ["epsilon", "sample"])
def test_ddim_clean_estimate_is_the_schedulers_x0(prediction):
    sampler = DDIMSampler(lambda x, k, c: torch.zeros_like(x), prediction_type=prediction, clip_sample=False)
    assert sampler.prediction == prediction and sampler.num_steps == 10
    g = torch.Generator().manual_seed(0)
    x, out = torch.randn(3, H, A, generator=g), torch.randn(3, H, A, generator=g)
    sampler._times(10)  # set the scheduler's timesteps
    k = sampler.scheduler.timesteps[3]  # DDPM step 60 -> t = 0.4
    t = torch.full((3,), 1.0 - int(k) / 100)
    assert int(k) == 60 and sampler.timestep(t).tolist() == [60, 60, 60]
    want = sampler.scheduler.step(out, k, x).pred_original_sample
    torch.testing.assert_close(sampler.clean_estimate(x, t, out), want)
    abar = float(sampler.scheduler.alphas_cumprod[60])
    if prediction == "epsilon":  # hand formula of DDIM eq. 12
        torch.testing.assert_close(want, (x - (1 - abar) ** 0.5 * out) / abar**0.5)


def test_ddim_trajectory_times_and_determinism():
    net = TanhNet().float()
    sampler = DDIMSampler(net, num_steps=5)
    cond, noise = torch.randn(2, 3), torch.randn(2, H, A)
    x, traj, times, outs = sampler.sample(cond, noise, return_trajectory=True)
    torch.testing.assert_close(times, torch.tensor([0.2, 0.4, 0.6, 0.8, 1.0, 1.0]))  # DDPM steps 80, 60 ... 0
    assert traj.shape == (6, 2, H, A) and outs.shape == (5, 2, H, A) and not x.requires_grad
    torch.testing.assert_close(traj[0], noise)
    torch.testing.assert_close(sampler.sample(cond, noise), x, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["flow", "ddim"])
def test_autograd_hook_reads_cond_and_matches_finite_differences(kind):
    net = TanhNet()
    sampler = FlowEulerSampler(net, 3) if kind == "flow" else DDIMSampler(net, num_steps=3, clip_sample=False)
    g = torch.Generator().manual_seed(1)
    cond = torch.randn(2, 3, generator=g, dtype=torch.float64)
    noise = torch.randn(2, H, A, generator=g, dtype=torch.float64)
    seen = []

    def target_of(c):  # the hook's objective is built from the conditioning it is handed
        return torch.cat([c, c, c[:, :2]], 1).reshape(2, H, A)

    def hook(x_t, t, out, c, smp):
        assert x_t.requires_grad and torch.is_grad_enabled() and c is cond and smp is sampler
        f = (smp.clean_estimate(x_t, t, out) * target_of(c)).sum()
        (grad,) = torch.autograd.grad(f, x_t, retain_graph=True)
        seen.append((x_t.detach().clone(), t.clone(), grad))
        return out + 0.1 * grad

    guided = sampler.sample(cond, noise, guidance=Guidance(hook, autograd=True))
    assert len(seen) == 3 and not guided.requires_grad
    assert not torch.allclose(guided, sampler.sample(cond, noise))  # the correction changed the chunk

    x0, t0, grad = seen[1]

    def objective(x):
        with torch.no_grad():
            return float((sampler.clean_estimate(x, t0, sampler.denoise(x, t0, cond)) * target_of(cond)).sum())

    h = 1e-6
    for idx in [(0, 0, 0), (0, 2, 1), (1, 3, 0), (1, 1, 1)]:
        e = torch.zeros_like(x0)
        e[idx] = h
        fd = (objective(x0 + e) - objective(x0 - e)) / (2 * h)
        assert float(grad[idx]) == pytest.approx(fd, rel=1e-6, abs=1e-8)
    assert float(grad.abs().min()) > 0.0
    identity_shortcut = target_of(cond)  # the gradient if d a_hat / d x_t were the identity
    assert float((grad - identity_shortcut).abs().max()) > 0.1


def test_plain_hook_runs_without_grad_and_sees_cond():
    calls = []

    def hook(x_t, t, out, cond, sampler):
        calls.append((x_t.requires_grad, torch.is_grad_enabled(), cond))
        return torch.zeros_like(out)

    sampler = FlowEulerSampler(constant_velocity, num_steps=2)
    cond, noise = torch.ones(1, A), torch.full((1, H, A), 3.0)
    out = sampler.sample(cond, noise, guidance=hook)
    torch.testing.assert_close(out, noise)  # zero velocity: the chunk stays where it started
    assert [c[:2] for c in calls] == [(False, False), (False, False)] and calls[0][2] is cond
    with pytest.raises(ValueError, match="num_steps: expected >= 1, received 0"):
        FlowEulerSampler(constant_velocity, num_steps=0)
    with pytest.raises(ValueError, match="prediction_type: expected 'epsilon' or 'sample', received 'v'"):
        DDIMSampler(constant_velocity, prediction_type="v")
    assert np.isclose(FlowEulerSampler(constant_velocity, 10, time_scale=100.0).time_scale, 100.0)
