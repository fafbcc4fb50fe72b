"""Scripted experts for every policylink environment, behind one call: :func:`make_expert`.

Experts are found by the env's ``env_spec.name`` in :data:`EXPERT_FACTORIES` (``"module:function"`` strings,
imported only when used); ``<family>/*`` serves every task of an env family (``metaworld/push``).
Each factory is ``(env, quality="expert", seed=None) -> expert`` and the expert has
``reset(seed)`` and ``act(obs, env) -> float32 (A,)``; it may read the simulator's privileged state.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

QUALITIES = ("expert", "noisy", "poor")

EXPERT_FACTORIES: dict[str, str] = {
    "reach": "policylink.sim.mujoco.reach_expert:make_reach_expert",
    "push": "policylink.sim.mujoco.push_expert:make_push_expert",
    "pick_place": "policylink.sim.mujoco.pick_place_expert:make_pick_place_expert",
    "insert": "policylink.sim.mujoco.pick_place_expert:make_insert_expert",
    "multitask": "policylink.sim.mujoco.pick_place_expert:make_multitask_expert",
    "memory": "policylink.sim.mujoco.memory_expert:make_memory_expert",
    "genesis_reach": "policylink.sim.mujoco.reach_expert:make_reach_expert",  # same task on Genesis physics
    "genesis_pick_place": "policylink.sim.mujoco.pick_place_expert:make_pick_place_expert",
    "reacher": "policylink.sim.gym_experts:make_reacher_expert",
    "pusher": "policylink.sim.gym_experts:make_pusher_expert",
    "metaworld/*": "policylink.sim.isolated.metaworld:make_metaworld_expert",  # every task of the env family
    "aloha/*": "policylink.sim.isolated.aloha:make_aloha_expert",
}


def make_expert(env: Any, quality: str = "expert", seed: int | None = None) -> Any:
    """A scripted expert for ``env`` (dispatched by ``env.unwrapped.env_spec.name``).

    Args:
        env: an EnvAdapter (possibly wrapped by gymnasium wrappers).
        quality: ``"expert"`` (scripted, >= 95 % success), ``"noisy"`` or ``"poor"`` (clearly worse; for
            mixed-quality datasets).
        seed: seeds the expert's own noise (``expert.reset(seed)`` reseeds it).

    Returns:
        an object with ``reset(seed)`` and ``act(obs, env) -> float32 (A,)``.

    Raises:
        ValueError: ``quality`` is not one of :data:`QUALITIES`.
        KeyError: no expert is registered for the env's name (the message lists the known names).
        AttributeError: ``env`` has no ``env_spec`` (not an EnvAdapter).
    """
    if quality not in QUALITIES:
        raise ValueError(f"quality: expected one of {QUALITIES}, received {quality!r}")
    name = env.unwrapped.env_spec.name
    if name not in EXPERT_FACTORIES and "/" in name:
        name = name.split("/", 1)[0] + "/*"
    if name not in EXPERT_FACTORIES:
        raise KeyError(
            f"env name: expected one of {sorted(EXPERT_FACTORIES)} (envs with a scripted expert), received {name!r}"
        )
    module, func = EXPERT_FACTORIES[name].split(":")
    return getattr(import_module(module), func)(env, quality=quality, seed=seed)
