"""The one trainer: config errors name the field, one step is zero/backward/clip/step/schedule/EMA/hook, and a run
resumed from :meth:`Optimization.state` continues exactly as an uninterrupted one."""

import math

import pytest
import torch

from policylink.train.trainer import OptimConfig, Optimization, cosine_with_warmup, fit


def _problem(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 1)
    x = torch.randn(64, 3, generator=torch.Generator().manual_seed(7))
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]]) + 0.3

    def step_loss(step):
        i = torch.arange(step % 4 * 16, step % 4 * 16 + 16)
        return ((model(x[i]) - y[i]) ** 2).mean(), {"batch": float(step % 4)}

    return model, step_loss


@pytest.mark.parametrize(
    "fields, name",
    [
        ({"optimizer": "sgd"}, "optimizer"),
        ({"schedule": "linear"}, "schedule"),
        ({"lr": -1.0}, "lr"),
        ({"lr": math.nan}, "lr"),
        ({"weight_decay": -0.1}, "weight_decay"),
        ({"grad_clip": -1.0}, "grad_clip"),
        ({"schedule": "cosine"}, "total_steps"),
    ],
)
def test_bad_settings_name_the_field(fields, name):
    with pytest.raises(ValueError, match=rf"^{name}: expected"):
        OptimConfig(**fields)


def test_one_step_equals_the_hand_written_adam_step_with_clipping():
    model, step_loss = _problem()
    ref, ref_loss = _problem()
    run = Optimization(model, OptimConfig("adam", lr=0.1, grad_clip=0.5))
    norm = run.step(step_loss(0)[0])

    opt = torch.optim.Adam(ref.parameters(), lr=0.1)
    ref_loss(0)[0].backward()
    expected_norm = torch.cat([p.grad.flatten() for p in ref.parameters()]).norm()
    torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
    opt.step()
    assert norm == pytest.approx(float(expected_norm), rel=1e-6) and norm > 0.5  # measured before clipping
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q)
    assert math.isnan(Optimization(model, OptimConfig("adam", lr=0.1)).step(step_loss(1)[0]))  # not measured


def test_schedule_ema_and_after_step_hook():
    model, step_loss = _problem()
    calls = []
    config = OptimConfig(
        "adamw", lr=1e-2, schedule="cosine", warmup_steps=2, total_steps=6, ema_max_decay=0.9, measure_grad_norm=True
    )
    run = Optimization(model, config, after_step=lambda: calls.append(1))
    f = cosine_with_warmup(2, 6)
    lrs = []
    for done in fit(step_loss, run, 6):
        lrs.append(run.scheduler.get_last_lr()[0])
        assert done.metrics == {"batch": float((done.step - 1) % 4)} and done.grad_norm > 0
    assert lrs == pytest.approx([1e-2 * f(s) for s in range(1, 7)])
    assert len(calls) == 6 and run.ema.step == 6
    assert not torch.equal(run.ema.model.weight, model.weight)  # the average lags the trained weights


def test_a_resumed_run_continues_exactly():
    config = OptimConfig("adamw", lr=5e-2, weight_decay=1e-3, grad_clip=1.0, schedule="cosine", warmup_steps=3,
                         total_steps=12, ema_max_decay=0.99)  # fmt: skip
    model, step_loss = _problem()
    run = Optimization(model, config)
    straight = [float(d.loss) for d in fit(step_loss, run, 12)]

    model, step_loss = _problem()
    first = Optimization(model, config)
    losses = [float(d.loss) for d in fit(step_loss, first, 5)]
    saved = {"model": {k: v.clone() for k, v in model.state_dict().items()}, **first.state()}
    model, step_loss = _problem(seed=1)  # other weights: everything must come from the saved state
    model.load_state_dict(saved["model"])
    second = Optimization(model, config)
    second.load(saved)
    losses += [float(d.loss) for d in fit(step_loss, second, 12, start=5)]
    assert losses == straight
    torch.testing.assert_close(second.ema.model.weight, run.ema.model.weight, rtol=0, atol=0)
