"""The extra conditioning slot of a model (:class:`~policylink.adapters.capabilities.ConditioningSpec`): discrete
labels (advantage labels: ALTER in N0-VTLA, RECAP in pi*0.6) and continuous vectors (language embeddings), each
embedded to the observation latent's width and added into the global FiLM conditioning, with a learned null
embedding for "no conditioning" (label dropout in training, classifier-free guidance at inference).
"""

from __future__ import annotations

import torch
from torch import nn

from policylink.adapters.capabilities import ConditioningSpec, Guidance

NULL_LABEL = -1
"""The label value that stands for "no label" (the learned null embedding)."""


class ConditioningEmbedding(nn.Module):
    """Label / vector embeddings of width ``dim``, summed into one ``(B, dim)`` conditioning offset.

    Parameters exist only for the parts the spec enables (``num_labels > 0``: an ``nn.Embedding`` of
    ``num_labels + 1`` rows, the last being the null label; ``token_dim > 0``: a linear projection and a null
    vector), so a disabled slot adds nothing to the state dict. Every parameter starts at zero: a slot added to
    a trained network changes nothing until it is trained (the adaLN-zero idea, Peebles & Xie 2023).
    With ``spec.null = False`` "no conditioning" is the zero vector instead of a learned one.

    Args:
        spec: which slots exist.
        dim: ``D``, the width of the conditioning vector the offset is added to.
    """

    def __init__(self, spec: ConditioningSpec, dim: int):
        super().__init__()
        self.spec = spec
        self.dim = int(dim)
        self.labels = nn.Embedding(spec.num_labels + 1, dim) if spec.num_labels else None
        self.tokens = nn.Linear(spec.token_dim, dim) if spec.token_dim else None
        self.null_token = nn.Parameter(torch.zeros(dim)) if spec.token_dim and spec.null else None
        for p in self.parameters():
            nn.init.zeros_(p)

    @property
    def enabled(self) -> bool:
        """True when the spec has a label or a vector slot."""
        return self.labels is not None or self.tokens is not None

    def forward(
        self, batch_size: int, labels: torch.Tensor | None = None, tokens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The conditioning offset float32 ``(B, D)``.

        Args:
            batch_size: ``B``.
            labels: int ``(B,)`` in ``[0, num_labels)`` or :data:`NULL_LABEL`; None = all null.
            tokens: float ``(B, token_dim)``; rows that are all NaN, or None for all rows, take the null vector.

        Raises:
            ValueError: a slot is given that the spec does not have, a label out of range, or a wrong shape.
        """
        device = next(self.parameters()).device if self.enabled else None
        out = torch.zeros(batch_size, self.dim, device=device)
        if not self.enabled:
            if labels is not None or tokens is not None:
                raise ValueError("conditioning: the policy has no conditioning slot (policy.conditioning is off)")
            return out
        if labels is not None:
            out = out + self._label_embedding(batch_size, labels.to(out.device))
        elif self.labels is not None:
            out = out + self._label_embedding(batch_size, torch.full((batch_size,), NULL_LABEL, device=out.device))
        if tokens is not None or self.tokens is not None:
            out = out + self._token_embedding(batch_size, tokens)
        return out

    def _label_embedding(self, batch_size: int, labels: torch.Tensor) -> torch.Tensor:
        n = self.spec.num_labels
        if self.labels is None:
            raise ValueError("conditioning.labels: the policy has no label slot (policy.conditioning.num_labels=0)")
        if labels.shape != (batch_size,):
            raise ValueError(f"conditioning.labels: expected shape ({batch_size},), received {tuple(labels.shape)}")
        labels = labels.long()
        if bool(((labels < NULL_LABEL) | (labels >= n)).any()):
            raise ValueError(f"conditioning.labels: expected values in [-1, {n}), received {labels.tolist()}")
        emb = self.labels(torch.where(labels == NULL_LABEL, torch.full_like(labels, n), labels))
        if not self.spec.null:
            emb = emb * (labels != NULL_LABEL)[:, None].to(emb.dtype)
        return emb

    def _token_embedding(self, batch_size: int, tokens: torch.Tensor | None) -> torch.Tensor:
        if self.tokens is None:
            raise ValueError("conditioning.tokens: the policy has no vector slot (policy.conditioning.token_dim=0)")
        d = self.spec.token_dim
        device = self.tokens.weight.device
        if tokens is None:
            tokens = torch.full((batch_size, d), float("nan"), device=device)
        if tuple(tokens.shape) != (batch_size, d):
            raise ValueError(f"conditioning.tokens: expected shape ({batch_size}, {d}), received {tuple(tokens.shape)}")
        tokens = tokens.to(device, torch.float32)
        null = torch.isnan(tokens).all(dim=1, keepdim=True)
        emb = self.tokens(torch.nan_to_num(tokens))
        fill = self.null_token if self.null_token is not None else torch.zeros_like(emb[0])
        return torch.where(null, fill.expand_as(emb), emb)


def drop_labels(labels: torch.Tensor, p: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Label dropout for classifier-free guidance: each label becomes :data:`NULL_LABEL` with probability ``p``.

    Args:
        labels: int ``(B,)``. p: drop probability in ``[0, 1]`` (ALTER / RECAP: 0.1).
        generator: the random stream (keep training draws a function of ``(seed, step)``).

    Raises:
        ValueError: ``p`` outside ``[0, 1]``.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"label dropout p: expected a value in [0, 1], received {p}")
    drop = torch.rand(labels.shape, generator=generator).to(labels.device) < p
    return torch.where(drop, torch.full_like(labels, NULL_LABEL), labels)


def classifier_free_guidance(uncond: torch.Tensor, scale: float, then: Guidance | None = None) -> Guidance:
    """Classifier-free guidance (Ho & Salimans 2022) as a sampler hook: ``out' = (1 - w) out_u + w out_c``, i.e.
    ``out_u + w (out_c - out_u)`` written so that ``w = 0`` returns the unconditional prediction and ``w = 1``
    the conditional one exactly. ``out_c`` is the step's prediction under the sampler's ``cond`` (with the label);
    ``out_u = sampler.denoise(x_t, t, uncond)`` re-runs the network with the null label. It applies to any
    prediction (flow velocity; diffusion noise, the epsilon analogue; clean sample).

    Args:
        uncond: the unconditional conditioning ``(B, D)`` (latent + null label), detached.
        scale: ``w``. then: a further hook applied to the guided output (e.g. RTC's); its ``autograd`` carries over.

    Returns:
        a :class:`~policylink.adapters.capabilities.Guidance`.
    """
    w = float(scale)

    def fn(x_t: torch.Tensor, t: torch.Tensor, out: torch.Tensor, cond, sampler) -> torch.Tensor:
        if w != 1.0:
            out_u = sampler.denoise(x_t, t, uncond)
            out = out_u if w == 0.0 else (1.0 - w) * out_u + w * out
        return out if then is None else then(x_t, t, out, cond, sampler)

    return Guidance(fn, autograd=bool(then is not None and then.autograd))


__all__ = ["NULL_LABEL", "ConditioningEmbedding", "classifier_free_guidance", "drop_labels"]
