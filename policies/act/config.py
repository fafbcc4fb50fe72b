"""Configuration of ACT, the Action Chunking Transformer (registry name ``act``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from policylink.policies.config import PolicyConfig


@dataclass
class ACTConfig:
    """The CVAE transformer of ACT (Zhao et al. 2023, "Learning Fine-Grained Bimanual Manipulation with Low-Cost
    Hardware", arXiv 2304.13705, section 3.2 and figure 4). Defaults are a CPU-sized version of the paper's
    (which uses width 512, 4 encoder layers, 7 decoder layers, 4 CVAE-encoder layers, latent 32, beta 10).

    Attributes:
        dim_model: transformer width ``d`` (every token; divisible by ``n_heads``).
        n_heads: attention heads.
        dim_feedforward: hidden size of each layer's MLP.
        n_encoder_layers: layers of the transformer encoder over the observation tokens (and ``z``).
        n_decoder_layers: layers of the decoder whose ``chunk_size`` learned queries attend to the encoder output
            (LeRobot's ACT uses 1: the original code only ever used the first of its 7).
        n_vae_encoder_layers: layers of the CVAE encoder over ``[CLS, state, a_1 .. a_H]`` (training only).
        latent_dim: size of the style variable ``z`` (32).
        dropout: dropout inside every transformer layer (0.1).
        kl_weight: ``beta`` of the loss ``L1 + beta * KL`` (10).
        pre_norm: layer norm before attention / MLP (stabler for short, high-LR runs) instead of after it as in
            the paper's DETR-style layers.
    """

    dim_model: int = 128
    n_heads: int = 4
    dim_feedforward: int = 256
    n_encoder_layers: int = 2
    n_decoder_layers: int = 1
    n_vae_encoder_layers: int = 1
    latent_dim: int = 32
    dropout: float = 0.1
    kl_weight: float = 10.0
    pre_norm: bool = True


@dataclass
class ACTPolicyConfig(PolicyConfig):
    """ACT: shared fields (:class:`~policylink.policies.config.PolicyConfig`) and :class:`ACTConfig` under ``act``.

    ACT reads one observation step (``n_obs_steps = 1``) and normalises states and actions to zero mean and unit
    variance (``mean_std``), as LeRobot's ACT does. It has no conditioning slot (``conditioning`` must stay off).
    """

    n_obs_steps: int = 1
    state_norm_mode: str = "mean_std"
    action_norm_mode: str = "mean_std"
    act: ACTConfig = field(default_factory=ACTConfig)

    def validate(self) -> ACTPolicyConfig:
        """The shared checks plus the transformer's sizes, ``kl_weight``, ``dropout`` and the conditioning slot.

        Raises:
            ValueError: names the field, the expected and the received value.
        """
        super().validate()
        a = self.act
        for name in ("dim_model", "n_heads", "dim_feedforward", "n_encoder_layers", "n_decoder_layers", "latent_dim"):
            if getattr(a, name) < 1:
                raise ValueError(f"policy.act.{name}: expected >= 1, received {getattr(a, name)}")
        if a.n_vae_encoder_layers < 1:
            raise ValueError(f"policy.act.n_vae_encoder_layers: expected >= 1, received {a.n_vae_encoder_layers}")
        if a.dim_model % a.n_heads or a.dim_model % 2:
            raise ValueError(
                f"policy.act.dim_model: expected an even multiple of n_heads={a.n_heads}, received {a.dim_model}"
            )
        if not 0.0 <= a.dropout < 1.0:
            raise ValueError(f"policy.act.dropout: expected a value in [0, 1), received {a.dropout}")
        if not a.kl_weight >= 0.0:
            raise ValueError(f"policy.act.kl_weight: expected >= 0, received {a.kl_weight}")
        if self.conditioning.num_labels or self.conditioning.token_dim:
            raise ValueError(
                f"policy.conditioning: expected none for act (no label/vector slot), received {self.conditioning}"
            )
        if self.memory != "none":
            raise ValueError(
                f"policy.memory: expected 'none' for act (SEGA is for diffusion and flow), received {self.memory!r}"
            )
        return self


__all__ = ["ACTConfig", "ACTPolicyConfig"]
