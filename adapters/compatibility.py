"""Compatibility of a policy with an environment: every mismatch between a :class:`PolicySpec` and an
:class:`EnvSpec` (missing camera, shape, dtype, action dimension, control mode, rotation, gripper, units,
control frequency), reported together before any episode starts.
"""

from __future__ import annotations

import math

from policylink.adapters.schema import IMAGE_PREFIX, EnvSpec, IncompatibleSpecError, PolicySpec


def check_compatible(policy_spec: PolicySpec, env_spec: EnvSpec, *, frequency_rtol: float = 1e-3) -> None:
    """Raise one :class:`IncompatibleSpecError` listing every reason ``policy_spec`` cannot run on ``env_spec``.

    Checked: each required observation feature is provided (same dtype and shape; missing cameras are
    named), action dimension, control mode, rotation convention, gripper index, per-dimension units, control
    frequency (relative tolerance ``frequency_rtol``), and that a policy needing ``task`` gets one.
    """
    problems = compatibility_problems(policy_spec, env_spec, frequency_rtol=frequency_rtol)
    if problems:
        raise IncompatibleSpecError(problems)


def compatibility_problems(policy_spec: PolicySpec, env_spec: EnvSpec, *, frequency_rtol: float = 1e-3) -> list[str]:
    """Same checks as :func:`check_compatible`, returned as a list of messages (empty when compatible)."""
    problems: list[str] = []
    env_feats = env_spec.observation_features
    for key, feat in policy_spec.observation_features.items():
        if key not in env_feats:
            kind = "camera" if key.startswith(IMAGE_PREFIX) else "feature"
            problems.append(
                f"{key}: policy requires this {kind} ({feat.dtype} {feat.shape}); env "
                f"{env_spec.name!r} provides {sorted(env_feats)}"
            )
            continue
        have = env_feats[key]
        if have.shape != feat.shape:
            problems.append(f"{key}: expected shape {feat.shape} (policy), received {have.shape} (env)")
        if have.dtype != feat.dtype:
            problems.append(f"{key}: expected dtype {feat.dtype} (policy), received {have.dtype} (env)")
    pa, ea = policy_spec.action, env_spec.action
    if pa.dim != ea.dim:
        problems.append(f"action dimension: expected {pa.dim} (policy), received {ea.dim} (env)")
    if pa.control_mode != ea.control_mode:
        problems.append(
            f"action control_mode: expected {pa.control_mode.value} (policy), received {ea.control_mode.value} (env)"
        )
    if pa.rotation != ea.rotation:
        problems.append(f"action rotation: expected {pa.rotation.value} (policy), received {ea.rotation.value} (env)")
    if pa.gripper_index != ea.gripper_index:
        problems.append(
            f"action gripper_index: expected {pa.gripper_index} (policy), received {ea.gripper_index} (env)"
        )
    if pa.dim == ea.dim and pa.units != ea.units:
        problems.append(f"action units: expected {list(pa.units)} (policy), received {list(ea.units)} (env)")
    if not math.isclose(policy_spec.control_frequency, env_spec.control_frequency, rel_tol=frequency_rtol):
        problems.append(
            f"control_frequency: expected {policy_spec.control_frequency} Hz (policy), "
            f"received {env_spec.control_frequency} Hz (env)"
        )
    return problems
