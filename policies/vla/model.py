"""The small VLA's network: context tokens (vision per camera, robot state, language) and a transformer
flow-matching action expert attending to them (the pi0 / SmolVLA layout, Black et al. 2024; Shukor et al. 2025,
at CPU scale). Flow matching in the standard convention of DESIGN section 4 (``x_t = t a + (1 - t) eps``, target
``a - eps``, Euler from ``t = 0``), through the shared :class:`~policylink.policies.common.samplers.FlowEulerSampler`,
so RTC, Q-VGM, advantage conditioning and the corrector apply unchanged.

The observation latent ``(B, N * d)`` is the ``N`` context tokens flattened (what the policy caches per row and
``embed`` returns); the conditioning slot's offset (advantage labels) is added to it like for every ChunkModel.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

import torch
from torch import nn

from policylink.adapters.schema import TASK_KEY, FeatureSpec
from policylink.policies.common.encoders import camera_encoders, module_name
from policylink.policies.common.unet1d import SinusoidalTimeEmbedding
from policylink.policies.flow.model import FlowModel
from policylink.policies.model import policy_features
from policylink.policies.vla.config import VLAPolicyConfig
from policylink.policies.vla.language import augment_words, check_instruction, make_language_encoder


class ContextEncoder(nn.Module):
    """Observation windows + instructions -> ``N`` context tokens of width ``d``, flattened to ``(B, N * d)``.

    Tokens: per observation step, one per camera (shared :class:`ImageEncoder` -> spatial-softmax keypoints ->
    linear) and one per state vector (linear), or one per configured slice of it (``cfg.state_tokens``); then
    the ``L`` language tokens (linear over the cached encoder features; left out with
    ``cfg.language.context_tokens`` false); last, one instruction summary token: a per-token MLP max-pooled over
    the instruction's tokens (a learned constant without language). Each slot adds a
    learned position/type embedding. With ``cfg.language.film`` every observation token ``o_i`` becomes
    ``o_i (1 + gamma_i) + beta_i``, ``(gamma_i, beta_i)`` a linear map of the summary token (FiLM, Perez et al.
    2018; RT-1 conditions its image encoder on the instruction this way, Brohan et al. 2022), so the instruction
    can gate which object token the action expert reads in one step instead of through two attention hops.
    In training mode, ``cfg.language.word_dropout`` / ``word_insertion`` drop words of each instruction and
    insert vocabulary words into it before encoding.

    Args:
        features: the policy's observation features (images ``(H, W, 3)`` and vectors ``(D,)``).
        cfg: the VLA config (``encoder``, ``language``, ``expert.dim``, ``n_obs_steps``).

    Forward: ``obs[key]`` float32 ``(B, T, 3, H, W)`` in ``[0, 1]`` / ``(B, T, D)`` normalised, and
    ``obs["task"]`` a list of ``B`` str (unless the language encoder is ``none``).

    Raises:
        ValueError: a text or non-vector feature among ``features``, or ``cfg.state_tokens`` that do not fit the
        vector features (:func:`state_slices`). KeyError: a feature (e.g. a camera) is
        missing from ``obs``. InstructionError: a missing or unencodable instruction.
    """

    def __init__(self, features: Mapping[str, FeatureSpec], cfg: VLAPolicyConfig):
        super().__init__()
        d, t = cfg.expert.dim, cfg.n_obs_steps
        self.image_keys = sorted(k for k, f in features.items() if f.is_image)
        self.vector_keys = sorted(k for k, f in features.items() if not f.is_image)
        for key in self.vector_keys:
            f = features[key]
            if f.is_string or len(f.shape) != 1:
                raise ValueError(f"{key}: expected an image (H, W, 3) or a vector (D,) feature, received {f.shape}")
        enc = cfg.encoder
        self.shared = enc.share_vision_encoder
        self.cameras = camera_encoders(self.image_keys, features, enc)
        self.image_proj = nn.Linear(2 * enc.num_keypoints, d) if self.image_keys else None
        self.state_slices = state_slices(self.vector_keys, features, cfg.state_tokens)
        self.state_proj = nn.ModuleDict(
            {
                module_name(k): nn.ModuleList(nn.Linear(n, d) for n in sizes)
                if len(sizes) > 1
                else nn.Linear(sizes[0], d)
                for k, sizes in self.state_slices.items()
            }
        )
        self.language = make_language_encoder(cfg.language)
        lang = self.language
        num_lang = lang.num_tokens if cfg.language.context_tokens else 0  # language tokens in the context
        self.language_proj = nn.Linear(lang.feature_dim, d) if num_lang else None
        # keyword detector: per-token MLP, max over the instruction's tokens (position-invariant, so a colour or
        # side word counts wherever the phrasing puts it); the last context token, added to every action token
        self.keywords = (
            nn.Sequential(nn.Linear(lang.feature_dim, d), nn.GELU(), nn.Linear(d, d)) if lang.num_tokens else None
        )
        self.no_language = nn.Parameter(torch.zeros(1, 1, d)) if not lang.num_tokens else None
        num_state = sum(len(sizes) for sizes in self.state_slices.values())
        self.num_tokens = t * (len(self.image_keys) + num_state) + num_lang + 1
        self.position = nn.Parameter(torch.randn(self.num_tokens, d) * 0.02)
        self.film = None
        if cfg.language.film and lang.num_tokens:  # zero-initialised: starts as the identity
            self.film = nn.Linear(d, 2 * (self.num_tokens - num_lang - 1) * d)
            nn.init.zeros_(self.film.weight)
            nn.init.zeros_(self.film.bias)
        self.word_dropout = float(cfg.language.word_dropout)
        self.word_insertion = float(cfg.language.word_insertion)
        self.max_tokens = int(cfg.language.max_tokens)
        self.augment_variants = int(cfg.language.augment_variants)
        self.dim = d
        self.out_dim = self.num_tokens * d

    def forward(self, obs: Mapping[str, object]) -> torch.Tensor:
        parts: list[torch.Tensor] = []
        for key in self.image_keys + self.vector_keys:
            if key not in obs:
                reads = self.image_keys + self.vector_keys
                raise KeyError(f"{key}: missing from the observation (the VLA reads {reads}); received {sorted(obs)}")
            x = obs[key]
            b, t = x.shape[:2]
            if key in self.image_keys:
                cam = self.cameras["shared" if self.shared else module_name(key)]
                parts.append(self.image_proj(cam(x.flatten(0, 1)).reshape(b, t, -1)))
            else:
                parts.append(self._state_tokens(key, x))
        n_obs = sum(p.shape[1] for p in parts)
        if self.keywords is not None:
            texts = obs.get(TASK_KEY)
            augment = self.training and (self.word_dropout or self.word_insertion)
            if augment and texts is not None and not isinstance(texts, str):
                texts = self._augment([check_instruction(t) for t in texts])
            lang = torch.from_numpy(self.language(texts)).to(self.position.device)
            if self.language_proj is not None:
                parts.append(self.language_proj(lang))
            words = self.keywords(lang)
            if self.language.pad_flag:  # padding rows never win the max
                words = words.masked_fill(lang[..., -1:] > 0.5, float("-inf"))
            parts.append(words.amax(dim=1, keepdim=True))
        else:
            parts.append(self.no_language.expand(parts[0].shape[0], 1, -1))
        tokens = torch.cat(parts, dim=1) + self.position
        if self.film is not None:  # per observation token: scale and shift from the instruction summary
            gamma, beta = self.film(tokens[:, -1]).reshape(-1, n_obs, 2, self.dim).unbind(2)
            tokens = torch.cat([tokens[:, :n_obs] * (1 + gamma) + beta, tokens[:, n_obs:]], dim=1)
        return tokens.flatten(1)

    def _augment(self, texts: list[str]) -> list[str]:
        """Training-time word dropout / insertion (``cfg.language.word_*``): each instruction becomes one of its
        ``augment_variants`` variants, drawn uniformly; variant ``v`` of a text is the same string every time
        (its own seeded draws), so the language cache stays bounded (``augment_variants`` entries per text)."""
        vocabulary = self.language.vocabulary() if self.word_insertion else ()
        picks = torch.randint(self.augment_variants, (len(texts),)).tolist()
        out = []
        for text, v in zip(texts, picks):  # a vocabulary word is one token: the text stays within max_tokens
            budget = self.max_tokens - self.language.token_count(text) if self.word_insertion else 0
            g = torch.Generator().manual_seed(zlib.crc32(text.encode()) * self.augment_variants + v)
            out.append(augment_words(text, self.word_dropout, self.word_insertion, vocabulary, budget, g))
        return out

    def _state_tokens(self, key: str, x: torch.Tensor) -> torch.Tensor:
        """``x (B, T, D)`` -> ``(B, T * G, d)``: one token per configured slice (``G`` slices) and step."""
        proj, sizes = self.state_proj[module_name(key)], self.state_slices[key]
        if len(sizes) == 1:
            return proj(x)
        tokens = torch.stack([p(part) for p, part in zip(proj, torch.split(x, sizes, dim=-1))], dim=2)
        return tokens.flatten(1, 2)


def state_slices(
    vector_keys: list[str], features: Mapping[str, FeatureSpec], state_tokens: Mapping[str, list[int]]
) -> dict[str, list[int]]:
    """Per vector key the slice sizes of its context tokens: ``state_tokens[key]`` or the whole vector.

    Raises:
        ValueError: a ``state_tokens`` key that is not a vector observation key of the policy, or sizes whose
            sum differs from the key's dimension (names ``policy.state_tokens``, expected and received).
    """
    unknown = sorted(set(state_tokens) - set(vector_keys))
    if unknown:
        raise ValueError(
            f"policy.state_tokens: expected keys among the vector observation keys {vector_keys}, received {unknown}"
        )
    out = {}
    for key in vector_keys:
        dim = features[key].shape[0]
        sizes = list(state_tokens.get(key, [dim]))
        if sum(sizes) != dim:
            raise ValueError(
                f"policy.state_tokens[{key!r}]: expected slice sizes adding up to the feature's dimension {dim}, "
                f"received {sizes} (sum {sum(sizes)})"
            )
        out[key] = sizes
    return out


class ActionExpert(nn.Module):
    """Transformer velocity field: ``(x_t (B, H, A), timestep (B,), cond (B, N * d)) -> (B, H, A)``.

    ``H`` noisy action tokens (linear + position + sinusoidal time embedding through an MLP + the last context
    token, the instruction summary) are appended to the ``N`` context tokens; pre-LayerNorm transformer blocks
    with full attention; the action tokens are read out by a linear layer.
    """

    def __init__(self, action_dim: int, horizon: int, num_context: int, cfg: VLAPolicyConfig):
        super().__init__()
        ex = cfg.expert
        d = ex.dim
        self.num_context, self.dim = num_context, d
        self.action_in = nn.Linear(action_dim, d)
        self.action_position = nn.Parameter(torch.randn(horizon, d) * 0.02)
        self.time = nn.Sequential(
            SinusoidalTimeEmbedding(d + d % 2), nn.Linear(d + d % 2, d), nn.GELU(), nn.Linear(d, d)
        )
        layer = nn.TransformerEncoderLayer(
            d, ex.heads, ex.ff_mult * d, ex.dropout, activation="gelu", batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, ex.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.action_out = nn.Linear(d, action_dim)

    def forward(self, x_t: torch.Tensor, timestep: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        b, h, _ = x_t.shape
        context = cond.reshape(b, self.num_context, self.dim)
        summary = context[:, -1:]  # the instruction summary token conditions every action token directly
        actions = self.action_in(x_t) + self.action_position[:h] + self.time(timestep)[:, None, :] + summary
        out = self.blocks(torch.cat([context, actions], dim=1))
        return self.action_out(self.norm(out[:, self.num_context :]))


class VLAModel(FlowModel):
    """The VLA as a :class:`~policylink.policies.model.ChunkModel`: :class:`ContextEncoder` as the observation
    encoder, :class:`ActionExpert` as the velocity network, the flow policy's noise draws, loss and sampler.

    Its policy adapter is :class:`~policylink.policies.vla.policy.VLAPolicy` (registered with the type, see
    :func:`~policylink.policies.policy.policy_for_model`), which passes each row's instruction to the encoder.

    Raises:
        ValueError: inconsistent config, or an observation key not in ``features``.
    """

    def __init__(self, cfg: VLAPolicyConfig, features: Mapping[str, FeatureSpec], action_dim: int):
        encoder = ContextEncoder(policy_features(cfg.validate(), features), cfg)

        def expert(model: FlowModel) -> ActionExpert:
            return ActionExpert(model.action_dim, model.horizon, model.encoder.num_tokens, cfg)

        super().__init__(cfg, features, action_dim, encoder=encoder, net=expert)

    @property
    def language(self):
        """The :class:`~policylink.policies.vla.language.LanguageEncoder` (cached per instruction)."""
        return self.encoder.language


__all__ = ["ActionExpert", "ContextEncoder", "VLAModel"]
