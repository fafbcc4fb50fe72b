"""The base configuration of every registered policy: the fields shared by all of them (observation keys,
horizons, encoder, conditioning slot, EMA, normalisation), saved as ``config.yaml`` in every checkpoint and
parsed from training YAML files with draccus.

A policy folder subclasses :class:`PolicyConfig` and registers it by name with
:func:`policylink.policies.registry.register_policy_type`; the ``type`` key of ``policy: {type: ..., ...}``
selects the subclass (draccus choice types, as LeRobot's ``PreTrainedConfig.register_subclass``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import draccus

from policylink.adapters.capabilities import ConditioningSpec
from policylink.policies.common.encoder_config import EncoderConfig
from policylink.policies.temporal_config import SegaConfig

DEFAULT_POLICY_TYPE = "diffusion"
"""The type a ``policy:`` mapping without a ``type`` key gets (the type default of the original config)."""


@dataclass
class PolicyConfig(draccus.ChoiceRegistry):
    """Everything that defines a policy besides its PolicySpec and normaliser; abstract: instantiate a registered
    subclass (``make_config(name, ...)`` or the folder's dataclass).

    Attributes:
        observation_keys: observation features the policy reads (state vectors and/or camera images).
        n_obs_steps: observation horizon ``T`` (Diffusion Policy: 2).
        chunk_size: prediction horizon ``H`` (16).
        n_action_steps: action horizon executed before replanning (8).
        encoder: observation-encoder settings.
        conditioning: the extra conditioning slot (advantage labels, language vectors) with a learned null
            token; ``ConditioningSpec()`` (no labels, no vectors, the default) adds no parameter, so checkpoints
            written before the slot existed load unchanged.
        default_label: the conditioning label every row samples with until ``set_conditioning`` changes it
            (``-1`` = the null label; advantage-conditioned checkpoints: 1, "positive").
        cfg_scale: classifier-free guidance weight ``w`` at inference, ``out = (1 - w) out_u + w out_c`` (velocity
            for flow, noise for diffusion; 0 = unconditional, 1 = conditional, plain sampling) for rows with a
            label; ``--cfg_scale`` of ``eval`` / ``run`` / ``serve`` overrides the checkpoint's (see check_cfg_scale).
        ema_max_decay: EMA decay ceiling; the decay warms up as ``1 - (1 + step) ** -ema_power``.
        ema_power: EMA warm-up exponent (Diffusion Policy: 0.75).
        state_norm_mode: normaliser mode for state vectors (``min_max`` maps to ``[-1, 1]``).
        action_norm_mode: normaliser mode for actions.
        image_norm_mode: normaliser mode for camera images (already in ``[0, 1]``; the image encoder maps them
            to ``[-1, 1]``).
        mask_padded_actions: leave the padded steps past an episode's end out of the loss (they repeat the
            last action; wrong for delta actions when episodes end at success).
        memory: long-horizon memory of the observation encoder: ``"none"`` or ``"sega"`` (SeedPolicy's gated
            latent state, :mod:`policylink.policies.temporal`).
        sega: the SEGA size and training chain (used when ``memory == "sega"``).

    Class attributes:
        legacy_fields: top-level keys a subclass ignores when reading an older ``config.yaml`` (the original
            single config saved every head's section for every type).
    """

    legacy_fields: ClassVar[tuple[str, ...]] = ()

    observation_keys: list[str] = field(default_factory=lambda: ["observation.state"])
    n_obs_steps: int = 2
    chunk_size: int = 16
    n_action_steps: int = 8
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    conditioning: ConditioningSpec = field(default_factory=ConditioningSpec)
    default_label: int = -1
    cfg_scale: float = 1.0
    ema_max_decay: float = 0.9999
    ema_power: float = 0.75
    state_norm_mode: str = "min_max"
    action_norm_mode: str = "min_max"
    image_norm_mode: str = "identity"
    mask_padded_actions: bool = True
    memory: str = "none"
    sega: SegaConfig = field(default_factory=SegaConfig)

    def __post_init__(self) -> None:
        if type(self) is PolicyConfig:
            raise TypeError(
                "PolicyConfig: abstract; expected a registered subclass (policylink.policies.registry.make_config"
                "(name, ...) or the policy folder's config class)"
            )

    @property
    def type(self) -> str:
        """The registry name of this config's policy type (``"diffusion"``, ``"flow"``...)."""
        return PolicyConfig.get_choice_name(self.__class__)

    def validate(self) -> PolicyConfig:
        """Return self if consistent; raise ValueError naming the field, expected and received value.

        Subclasses extend this (call ``super().validate()``).
        """
        if not 1 <= self.n_action_steps <= self.chunk_size:
            raise ValueError(
                f"policy.n_action_steps: expected in [1, chunk_size={self.chunk_size}], received {self.n_action_steps}"
            )
        if self.n_obs_steps < 1:
            raise ValueError(f"policy.n_obs_steps: expected >= 1, received {self.n_obs_steps}")
        if not self.observation_keys:
            raise ValueError("policy.observation_keys: expected at least one key, received []")
        self.sega.validate(self.memory)
        c = self.conditioning
        if c.num_labels < 0 or c.token_dim < 0:
            raise ValueError(
                f"policy.conditioning: expected num_labels >= 0 and token_dim >= 0, received "
                f"num_labels={c.num_labels}, token_dim={c.token_dim}"
            )
        if not -1 <= self.default_label < max(c.num_labels, 0):
            raise ValueError(
                f"policy.default_label: expected -1 (null) or a trained label in [0, {c.num_labels}) "
                f"(policy.conditioning.num_labels={c.num_labels}), received {self.default_label}"
            )
        check_cfg_scale(self.cfg_scale, c.num_labels, "policy.cfg_scale")
        return self

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (YAML-ready), ``type`` first."""
        return {"type": self.type, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PolicyConfig:
        """Inverse of :meth:`to_dict`: the registered subclass named by ``d["type"]`` (default
        :data:`DEFAULT_POLICY_TYPE`); its :attr:`legacy_fields` are dropped, other unknown fields raise.

        Raises:
            ValueError: unknown ``type`` (lists the registered ones) or a bad / unknown field (named).
        """
        d = dict(d)
        name = d.pop("type", DEFAULT_POLICY_TYPE)
        sub = cls.get_choice_class(name)
        if cls is not PolicyConfig and not issubclass(sub, cls):
            raise ValueError(f"policy.type: expected a {cls.__name__}, received {name!r} ({sub.__name__})")
        for key in sub.legacy_fields:
            d.pop(key, None)
        try:
            return draccus.decode(sub, d)
        except Exception as e:  # draccus raises several types; re-raise with the config's name
            raise ValueError(f"policy config ({name}): {e}") from e

    # draccus choice-type hooks: every lookup goes through the policy registry, which imports a policy folder
    # (entry point group ``policylink.policies``) the first time its name is asked for.

    @classmethod
    def get_choice_class(cls, name: str) -> type[PolicyConfig]:
        """The config class registered as ``name``. Raises UnknownPolicyTypeError (a ValueError and KeyError)."""
        from policylink.policies.registry import policy_type

        return policy_type(name).config_cls

    @classmethod
    def get_known_choices(cls) -> dict[str, type[PolicyConfig]]:
        """Every registered policy type's config class by name (imports each policy folder's config)."""
        from policylink.policies.registry import known_policy_types

        return {name: t.config_cls for name, t in known_policy_types().items()}

    @classmethod
    def get_choice_name(cls, subcls: type) -> str:
        """The registry name of config class ``subcls``. Raises ValueError when it is not registered."""
        from policylink.policies.registry import policy_type_of

        return policy_type_of(subcls).name

    @classmethod
    def default_choice_name(cls) -> str | None:
        """:data:`DEFAULT_POLICY_TYPE` for the base class (a concrete subclass decodes as itself)."""
        return DEFAULT_POLICY_TYPE if cls is PolicyConfig else None


__all__ = ["DEFAULT_POLICY_TYPE", "PolicyConfig"]


def check_cfg_scale(w: Any, num_labels: int, name: str = "cfg_scale") -> float:
    """A classifier-free guidance weight ``w`` as a float: finite and ``>= 0`` (0 = unconditional, 1 = conditional,
    > 1 = guided toward the label; Ho & Salimans 2022), and exactly 1.0 for a policy without a label slot.

    Raises:
        ValueError: names ``name``, the expected and the received value (a non-number, NaN/inf, a negative
            weight, or ``w != 1`` with ``num_labels = 0``).
    """
    try:
        value = float(w)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a number >= 0, received {w!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(
            f"{name}: expected a finite weight >= 0 (0 = unconditional, 1 = conditional, > 1 = guided), received {w}"
        )
    if value != 1.0 and not num_labels:
        raise ValueError(
            f"{name}: expected 1.0 for a policy without a label slot (policy.conditioning.num_labels=0: it was not "
            f"trained with advantage conditioning), received {w}"
        )
    return value
