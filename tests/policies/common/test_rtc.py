"""RTC's correction as an autograd guidance hook: known values, and the exact vector-Jacobian product through a
nonlinear network (not the identity-Jacobian shortcut)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from policylink.policies.common.rtc import guidance_scale, rtc_guidance, rtc_weights
from policylink.policies.common.samplers import FlowEulerSampler


class TanhVelocity(nn.Module):
    """float64 v(x) = tanh(x W + cond U): d a_hat / d x = I + (1 - t) diag(1 - v^2) W^T, far from I."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = nn.Parameter(torch.randn(6, 6, generator=g, dtype=torch.float64))
        self.u = nn.Parameter(torch.randn(2, 6, generator=g, dtype=torch.float64))

    def forward(self, x, t, cond):
        return torch.tanh(x.reshape(x.shape[0], -1) @ self.w + cond @ self.u).reshape(x.shape)


def test_rtc_known_values_with_an_identity_jacobian():
    assert guidance_scale(0.0, 5.0) == 5.0
    assert guidance_scale(0.5, 5.0) == pytest.approx(2.0)  # r^2 = 0.5, (1 - t) / (t r^2) = 2
    c = np.array([2 / 3, 1 / 3])  # c_i = (H - s - i) / (H - s - d + 1) for i = 1, 2 (H = 4, d = s = 1)
    np.testing.assert_allclose(rtc_weights(4, 1, 1), [1.0, *(c * np.expm1(c) / (np.e - 1)), 0.0], rtol=1e-12)
    hook = rtc_guidance(torch.ones(1, 3, 1), torch.tensor([1.0, 0.5, 0.0]), max_guidance=5.0)
    assert hook.autograd
    x, v = torch.zeros(1, 3, 1, requires_grad=True), torch.zeros(1, 3, 1)  # v does not depend on x
    out = hook(x, torch.tensor([0.5]), v, None, FlowEulerSampler(None))  # a_hat = 0: v' = 2 * W * (1 - 0)
    np.testing.assert_allclose(out[0, :, 0].detach().numpy(), [2.0, 1.0, 0.0])
    with pytest.raises(ValueError, match="max_guidance: expected > 0, received 0"):
        rtc_guidance(torch.ones(1, 3, 1), torch.ones(3), max_guidance=0)


def test_rtc_correction_is_the_vjp_through_the_clean_estimate():
    sampler = FlowEulerSampler(TanhVelocity(), num_steps=4)
    g = torch.Generator().manual_seed(1)
    cond = torch.randn(2, 2, generator=g, dtype=torch.float64)
    x = torch.randn(2, 3, 2, generator=g, dtype=torch.float64)
    target = torch.randn(2, 3, 2, generator=g, dtype=torch.float64)
    w = torch.tensor([[1.0, 0.4, 0.0], [1.0, 1.0, 0.2]], dtype=torch.float64)
    t = torch.tensor([0.25, 0.5])
    hook = rtc_guidance(target, w, max_guidance=5.0)
    with torch.enable_grad():
        xg = x.clone().requires_grad_(True)
        got = hook(xg, t, sampler.denoise(xg, t, cond), cond, sampler)

    def a_hat(z):
        return sampler.clean_estimate(z, t, sampler.denoise(z, t, cond))

    with torch.no_grad():
        v = sampler.denoise(x, t, cond)
        err = w[..., None] * (target - a_hat(x))
    _, vjp = torch.autograd.functional.vjp(a_hat, x, err)
    scale = torch.tensor([min(5.0, 0.75 / (0.25 * 0.5625 / 0.625)), 2.0], dtype=torch.float64)  # t = 0.25, 0.5
    torch.testing.assert_close(got, v + scale[:, None, None] * vjp)
    shortcut = v + scale[:, None, None] * err  # the identity-Jacobian approximation of the old hook
    assert float((got - shortcut).abs().max()) > 0.05
