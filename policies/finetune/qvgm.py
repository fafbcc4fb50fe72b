"""Q-guided value-gradient matching (Q-VGM, arXiv 2606.08015; DESIGN section 4) for flow policies: per batch,
roll the current policy (no grad) to an intermediate ``(x_t, t)`` on its last ``M`` Euler steps, take the clean
estimate ``a_hat``, climb the critic from ``a_hat`` by normalised gradient steps inside a trust region keeping
the best iterate (``a_hat`` included), and regress the velocity onto ``v_tgt = sg(v) + alpha (a* - a_hat) /
(1 - t)`` plus ``lambda_bc`` times flow matching on the data. No likelihoods, no backpropagation through the
chain, no critic at inference.

Scaling: with the ``1 / (1 - t)`` factor the clean estimate ``x_t + (1 - t) v_tgt`` moves by exactly ``alpha (a*
- a_hat)`` at every ``t`` (the issue's form; DESIGN's ``sg(v) + alpha (a* - a_hat)`` moves it by ``alpha (1 - t)
(a* - a_hat)``, which vanishes at the clean end where the critic's gradient is most meaningful).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from policylink.adapters.config_checks import require_choice, require_counts, require_non_negative, require_positive
from policylink.policies.critics import ChunkCritic, critic_state
from policylink.policies.model import ChunkModel

ANCHORS = ("current", "reference")
TARGETS = ("residual", "flow_matching")


@dataclass(frozen=True)
class QVGMConfig:
    """Q-VGM settings (normalised action units).

    Attributes:
        last_steps: ``M``: intermediate times drawn among the last ``M`` of the sampler's ``K`` steps (paper: 5
            of 10).
        ascent_steps: normalised Q-gradient steps from ``a_hat``.
        step_size: length of one step, RMS per action entry.
        trust_radius: max RMS distance of an iterate from ``a_hat``.
        alpha: fraction of ``a* - a_hat`` the clean estimate is moved by.
        bc_weight: ``lambda_bc``, weight of the flow-matching loss on the buffer's actions.
        candidates: ``N`` extra chunks sampled from the frozen reference policy (no grad) per state that also
            enter the keep-best comparison (0: the paper's ascent only). A candidate that beats every ascent iterate
            under the critic becomes ``a*``, so the target stays on the reference's support and is stationary:
            Q-VGM then distils best-of-N reranking of the reference into the velocity field (our extension, for a
            critic whose off-data gradient is unreliable; sampling them from the current policy instead compounds
            the critic's selection error step after step: on push its Q at the policy's own chunks rose from 0.16 to
            0.83 in 200 steps, above every value in the data, and success fell to 0%). Measured on push it lost
            from the reference too (benchmarks/results/qvgm.md, round 2): off by default.
        anchor: ``current`` (the paper: the trust region is centred on the current policy's clean estimate) or
            ``reference``: centred on the frozen reference's clean estimate at the same ``(x_t, t)``, so the total
            displacement from the base policy stays within ``trust_radius`` however many steps run (on push the
            ``current`` form's critic value at its own chunks kept climbing, 0.35 -> 0.86 in 600 steps, and
            success fell from 43% at 200 steps to 17% at 600).
        pessimism: ``k`` of the ascent objective ``mean_e Q_e - k std_e Q_e`` over the critic's heads (0: the
            paper's mean; see :meth:`~policylink.policies.critics.ChunkCritic.actor_q`).
        target: how ``a*`` trains the velocity field: ``residual`` (the paper: ``v_tgt = sg(v) + alpha (a* -
            a_hat) / (1 - t)`` at the rollout's own ``(x_t, t)``) or ``flow_matching`` (plain flow matching from
            fresh noise at a uniform ``t`` onto ``a*``: with ``candidates`` this distils best-of-N reranking into
            the whole velocity field, so the policy can move to another mode, which a late residual cannot; our
            extension).
    """

    last_steps: int = 5
    ascent_steps: int = 10
    step_size: float = 0.05
    trust_radius: float = 0.25
    alpha: float = 1.0
    bc_weight: float = 1.0
    pessimism: float = 0.0
    candidates: int = 0
    anchor: str = "current"
    target: str = "residual"

    def validate(self, num_steps: int | None = None) -> QVGMConfig:
        """Return self if consistent (``last_steps <= num_steps`` when given). Raises ValueError naming the field."""
        if self.last_steps < 1 or (num_steps is not None and self.last_steps > num_steps):
            raise ValueError(f"qvgm.last_steps: expected in [1, {num_steps}], received {self.last_steps}")
        require_counts(self, "qvgm.", ascent_steps=0, candidates=0)
        require_positive(self, "step_size", "trust_radius", "alpha", prefix="qvgm.")
        require_non_negative(self, "bc_weight", "pessimism", prefix="qvgm.")
        require_choice(self, "qvgm.", anchor=ANCHORS, target=TARGETS)
        return self


@dataclass
class AscentResult:
    """Keep-best ascent output: ``a_star`` like the start ``(B, ...)``; ``q_start``, ``q_best`` ``(B,)``;
    ``start_won`` bool ``(B,)`` (no iterate beat the start); ``candidate_won`` bool ``(B,)`` (a policy sample
    beat every iterate, :meth:`with_candidates`)."""

    a_star: torch.Tensor
    q_start: torch.Tensor
    q_best: torch.Tensor
    start_won: torch.Tensor
    candidate_won: torch.Tensor | None = None

    def with_candidates(self, chunks: torch.Tensor, q: torch.Tensor) -> AscentResult:
        """Keep-best over this result and ``N`` candidate chunks ``(B, N, ...)`` with critic values ``(B, N)``:
        per row the candidate with the highest value replaces ``a_star`` when it is strictly better."""
        q_c, idx = q.max(1)
        best_c = chunks[torch.arange(chunks.shape[0], device=chunks.device), idx]
        won = q_c > self.q_best
        view = (-1,) + (1,) * (self.a_star.dim() - 1)
        a_star = torch.where(won.view(view), best_c.to(self.a_star.dtype), self.a_star)
        q_best = torch.where(won, q_c, self.q_best)
        return AscentResult(a_star, self.q_start, q_best, ~(q_best > self.q_start), won)


def keep_best_ascent(
    q_fn: Callable[[torch.Tensor], torch.Tensor],
    start: torch.Tensor,
    steps: int,
    step_size: float,
    trust_radius: float,
    center: torch.Tensor | None = None,
) -> AscentResult:
    """Iterative normalised gradient ascent on ``q_fn`` (``(B, ...) -> (B,)``) from ``start`` ``(B, ...)``:
    ``a <- P(a + step_size sqrt(n) g / ||g||)`` with ``P`` the projection onto ``||a - c|| <= trust_radius
    sqrt(n)`` (``n`` entries per sample, so both are RMS per entry; ``c`` = ``center`` like ``start``, default
    the start itself), keeping per sample the iterate with the highest ``q_fn`` (the start included, so ``q_best
    >= q_start``, even when the start lies outside the region). Gradients flow only to the iterates; the result
    is detached.
    """
    start = start.detach()
    center = start if center is None else center.detach()
    b = start.shape[0]
    scale = float(start[0].numel()) ** 0.5
    a = start.clone()
    with torch.no_grad():
        q_start = q_fn(start)
    best, q_best = start.clone(), q_start.clone()
    view = (b,) + (1,) * (start.dim() - 1)
    for _ in range(int(steps)):
        with torch.enable_grad():
            x = a.detach().requires_grad_(True)
            (g,) = torch.autograd.grad(q_fn(x).sum(), x)
        with torch.no_grad():
            norm = g.reshape(b, -1).norm(dim=1).clamp_min(1e-12).reshape(view)
            a = a + step_size * scale * g / norm
            d = a - center
            dn = d.reshape(b, -1).norm(dim=1).reshape(view)
            a = center + d * (trust_radius * scale / dn.clamp_min(1e-12)).clamp(max=1.0)
            q = q_fn(a)
            better = q > q_best
            best[better] = a[better]
            q_best = torch.where(better, q, q_best)
    return AscentResult(best, q_start, q_best, ~(q_best > q_start))


class QVGMLoss:
    """The Q-VGM objective as a :class:`~policylink.train.losses.Loss` (draws + ``(model, batch, step)``).

    Args:
        cfg: :class:`QVGMConfig`.
        critic: a trained :class:`ChunkCritic` (frozen here; its ``horizon`` is the executed chunk it scores).
        reference: the frozen base model whose encoder gives the critic's latents (the one the critic was
            trained with); never updated.

    The batch is the trainer's (``obs``, ``action``, ``valid``; :func:`policylink.train.losses.training_batch`
    with the default ``BatchFields()``) plus ``noise`` from :meth:`draw`, and optionally ``bc``: a second batch
    of the same form and size whose windows the flow-matching term uses instead (e.g. successful episodes only,
    while the velocity-matching term covers every state of the buffer).
    """

    metrics: ClassVar[tuple[str, ...]] = (
        "vgm_loss",
        "bc_loss",
        "keep_best_margin",
        "start_won",
        "q_start",
        "q_best",
        "candidate_won",
    )

    def __init__(self, cfg: QVGMConfig, critic: ChunkCritic, reference: ChunkModel):
        self.cfg = cfg.validate(reference.sampler.num_steps)
        self.critic = critic.eval().requires_grad_(False)
        self.reference = reference.eval().requires_grad_(False)

    def draw(
        self, model: ChunkModel, batch_size: int, generator: torch.Generator, device: torch.device | str = "cpu"
    ) -> dict[str, torch.Tensor]:
        """BC noise ``{"noise", "t"}`` (``model.draw_noise``), ``rollout`` ``(B, H, A)`` initial noise and
        ``index`` int64 ``(B,)`` of the intermediate Euler step, uniform in ``[K - M, K)``, with
        ``candidates = N`` the candidates' initial noise ``(B * N, H, A)``, and with ``target = "flow_matching"`` a
        second flow-matching draw ``target_noise`` ``(B, H, A)``, ``target_t`` ``(B,)`` for the ``a*`` term."""
        out = model.draw_noise(batch_size, generator, device)
        k = model.sampler.num_steps
        out["rollout"] = torch.randn(batch_size, model.horizon, model.action_dim, generator=generator).to(device)
        out["index"] = torch.randint(k - self.cfg.last_steps, k, (batch_size,), generator=generator).to(device)
        if self.cfg.candidates:
            shape = (batch_size * self.cfg.candidates, model.horizon, model.action_dim)
            out["candidates"] = torch.randn(shape, generator=generator).to(device)
        if self.cfg.target == TARGETS[1]:  # flow_matching
            fm = model.draw_noise(batch_size, generator, device)
            out["target_noise"], out["target_t"] = fm["noise"], fm["t"]
        return out

    def targets(self, model: ChunkModel, obs: Mapping[str, torch.Tensor], cond: torch.Tensor, noise: Mapping):
        """``(x_t, t, v_tgt, AscentResult)`` for a batch (no gradient to ``model``)."""
        c = self.cfg
        with torch.no_grad():
            _, xs, times, _ = model.sampler.sample(cond, noise["rollout"], return_trajectory=True)
            rows = torch.arange(cond.shape[0], device=cond.device)
            x_t, t = xs[noise["index"], rows], times[noise["index"]]
            v = model.sampler.denoise(x_t, t, cond)
            a_hat = model.sampler.clean_estimate(x_t, t, v)
            latent = self.reference.embed(obs)
            s = critic_state(latent, obs)
            center = None
            if c.anchor == "reference":
                ref = self.reference.sampler
                center = ref.clean_estimate(x_t, t, ref.denoise(x_t, t, self.reference.condition(latent)))
        res = keep_best_ascent(
            lambda a: self.critic.actor_q(s, a, c.pessimism), a_hat, c.ascent_steps, c.step_size, c.trust_radius, center
        )
        if c.candidates:
            with torch.no_grad():
                n = c.candidates
                ref_cond = self.reference.condition(latent).repeat_interleave(n, 0)
                chunks = self.reference.generate(ref_cond, noise["candidates"])
                q = self.critic.actor_q(s.repeat_interleave(n, 0), chunks, c.pessimism).view(-1, n)
            res = res.with_candidates(chunks.view(-1, n, *chunks.shape[1:]), q)
        v_tgt = v + c.alpha * (res.a_star - a_hat) / (1.0 - t)[:, None, None]
        return x_t, t, v_tgt, res

    def __call__(self, model: ChunkModel, batch: Mapping[str, Any], step: int) -> tuple[torch.Tensor, dict]:
        """``||v_theta(x_t, t) - v_tgt||^2 + lambda_bc * flow matching`` (with ``target = "flow_matching"`` the
        first term is flow matching onto ``a*``); metrics: both terms, the mean keep-best margin ``Q(a*) -
        Q(a_hat)``, the fraction where the start won, the mean ``Q(a_hat)`` and ``Q(a*)``."""
        obs, noise = batch["obs"], batch["noise"]
        cond = model.condition(model.embed(obs))
        x_t, t, v_tgt, res = self.targets(model, obs, cond.detach(), noise)
        if self.cfg.target == TARGETS[1]:  # flow_matching
            vgm = model.loss(cond, res.a_star, {"noise": noise["target_noise"], "t": noise["target_t"]})
        else:
            vgm = (model.sampler.denoise(x_t, t, cond) - v_tgt).square().mean()
        data = batch.get("bc") or batch
        bc_cond = cond if data is batch else model.condition(model.embed(data["obs"]))
        bc = model.loss(bc_cond, data["action"], noise, data.get("valid"))
        metrics = {
            "vgm_loss": vgm.item(),
            "bc_loss": bc.item(),
            "keep_best_margin": float((res.q_best - res.q_start).mean()),
            "start_won": float(res.start_won.float().mean()),
            "q_start": float(res.q_start.mean()),
            "q_best": float(res.q_best.mean()),
            "candidate_won": float(res.candidate_won.float().mean()) if res.candidate_won is not None else 0.0,
        }
        return vgm + self.cfg.bc_weight * bc, metrics


__all__ = ["ANCHORS", "TARGETS", "AscentResult", "QVGMConfig", "QVGMLoss", "keep_best_ascent"]
