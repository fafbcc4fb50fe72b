"""The EnvAdapter contract: a ``gymnasium.Env`` that also carries an :class:`EnvSpec`, and a key-map wrapper
that turns a foreign gymnasium env into one.

``gymnasium.Env`` already uses the attribute ``spec`` (its registration record, read by gymnasium's own
wrappers and vector envs), so our contract lives in ``env_spec``. ``info["is_success"]`` (bool) is the
success signal on every step.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from policylink.adapters.schema import TASK_KEY, EnvSpec, FeatureSpec, SpecError

_TEXT_CHARSET = string.printable


def observation_space(features: Mapping[str, FeatureSpec]) -> gym.spaces.Dict:
    """A gymnasium ``Dict`` space for ``features``: Box per numeric feature, Text for strings.

    Images are ``Box(0, 255, (H, W, 3), uint8)``; other numeric features are unbounded Boxes of their dtype.
    """
    spaces: dict[str, gym.Space] = {}
    for key, f in features.items():
        if f.is_string:
            spaces[key] = gym.spaces.Text(max_length=1024, min_length=0, charset=_TEXT_CHARSET)
        elif f.is_image:
            spaces[key] = gym.spaces.Box(0, 255, f.shape, dtype=np.uint8)
        elif np.dtype(f.dtype).kind == "b":
            spaces[key] = gym.spaces.MultiBinary(list(f.shape))
        else:
            dt = np.dtype(f.dtype)
            bound = np.inf if dt.kind == "f" else np.iinfo(dt).max
            spaces[key] = gym.spaces.Box(-bound if dt.kind != "u" else 0, bound, f.shape, dtype=dt)
    return gym.spaces.Dict(spaces)


def action_space(env_spec: EnvSpec) -> gym.spaces.Box:
    """``Box(low, high, (A,), float32)`` from the spec's ActionSpec limits."""
    return gym.spaces.Box(env_spec.action.low_array, env_spec.action.high_array, dtype=np.float32)


class EnvAdapter(gym.Env):
    """Base class of policylink environments: a gymnasium env whose observations follow ``env_spec``.

    Subclasses set ``self.env_spec`` before calling ``super().__init__()`` (or call :meth:`_init_spaces`),
    and implement ``reset`` / ``step`` returning observations that are dicts with the spec's features
    (single env: arrays without batch dim; ``task`` a str) and ``info["is_success"]``.
    """

    env_spec: EnvSpec

    def _init_spaces(self) -> None:
        """Set ``observation_space`` / ``action_space`` from ``self.env_spec``."""
        self.observation_space = observation_space(self.env_spec.observation_features)
        self.action_space = action_space(self.env_spec)


@dataclass(frozen=True)
class ObsMap:
    """Where one of our observation features comes from in a foreign env.

    Attributes:
        source: the foreign observation's dict key; ``None`` for a plain (non-dict) observation; the
            special value ``"render"`` takes ``env.render()`` (rgb_array) as an image.
        indices: optional indices into the last axis of that source (e.g. the joint angles of a flat vector).
    """

    source: str | None = None
    indices: tuple[int, ...] | None = None


class GymEnvAdapter(EnvAdapter):
    """Wrap a foreign gymnasium env (e.g. ``Reacher-v5``) as an EnvAdapter through a declared key map.

    Args:
        env: the foreign env (created with ``render_mode="rgb_array"`` if a ``"render"`` source is mapped).
        env_spec: the EnvSpec the wrapped env provides (features must match what the map produces).
        obs_map: our feature key -> :class:`ObsMap`.
        success_fn: ``(raw_obs, info, env) -> bool``; default reads ``info["is_success"]`` or ``info["success"]``
            and is False when neither exists.
        action_fn: optional map from our action ``(A,)`` to the foreign action; default identity.
        task: instruction put in ``obs["task"]`` when the spec has a ``task`` feature.

    Raises:
        SpecError: at construction, if a spec feature has no map entry; at ``reset``/``step``, if a mapped
            observation does not match ``env_spec`` (shape, dtype) or a map index is out of range.
    """

    def __init__(
        self,
        env: gym.Env,
        env_spec: EnvSpec,
        obs_map: Mapping[str, ObsMap],
        success_fn: Callable[[Any, dict, gym.Env], bool] | None = None,
        action_fn: Callable[[np.ndarray], np.ndarray] | None = None,
        task: str | None = None,
    ):
        self.env = env
        self.env_spec = env_spec
        self.obs_map = dict(obs_map)
        missing = [k for k in env_spec.observation_features if k not in self.obs_map and k != TASK_KEY]
        if missing:
            raise SpecError([f"{k}: no ObsMap entry for this feature" for k in missing], "invalid key map")
        self.success_fn = success_fn
        self.action_fn = action_fn
        self.task = task if task is not None else (env_spec.tasks[0] if env_spec.tasks else "")
        self.render_mode = getattr(env, "render_mode", None)
        self.metadata = dict(getattr(env, "metadata", {}))
        self._init_spaces()

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Reset the foreign env and map its observation. Returns ``(obs, info)`` with ``info["is_success"]``."""
        super().reset(seed=seed)
        raw, info = self.env.reset(seed=seed, options=options)
        info = dict(info)
        info["is_success"] = False
        return self._map(raw), info

    def step(self, action: np.ndarray):
        """Step with our action ``(A,)`` float32; returns gymnasium's 5-tuple with ``info["is_success"]``."""
        a = np.asarray(action, dtype=np.float32)
        self.env_spec.action.validate(a)
        foreign = self.action_fn(a) if self.action_fn is not None else a
        raw, reward, terminated, truncated, info = self.env.step(foreign)
        info = dict(info)
        info["is_success"] = bool(self._success(raw, info))
        return self._map(raw), float(reward), bool(terminated), bool(truncated), info

    def render(self):
        """The foreign env's render (rgb_array HWC uint8 when created that way)."""
        return self.env.render()

    def close(self) -> None:
        """Close the foreign env."""
        self.env.close()

    def _success(self, raw: Any, info: dict) -> bool:
        if self.success_fn is not None:
            return self.success_fn(raw, info, self.env)
        return bool(info.get("is_success", info.get("success", False)))

    def _map(self, raw: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, m in self.obs_map.items():
            if m.source == "render":
                value = np.asarray(self.env.render())
            elif m.source is None:
                value = np.asarray(raw)
            else:
                value = np.asarray(raw[m.source])
            if m.indices is not None:
                if value.ndim == 0 or max(m.indices) >= value.shape[-1] or min(m.indices) < -value.shape[-1]:
                    raise SpecError(
                        [
                            f"{key}: indices {list(m.indices)} out of range for source {m.source!r} "
                            f"of shape {value.shape}"
                        ],
                        "invalid key map",
                    )
                value = value[..., list(m.indices)]
            feat = self.env_spec.observation_features.get(key)
            if feat is not None and not feat.is_string:
                value = value.astype(feat.dtype, copy=False)
            out[key] = value
        if TASK_KEY in self.env_spec.observation_features:
            out[TASK_KEY] = self.task
        problems = [p for k, f in self.env_spec.observation_features.items() for p in f.check(k, out.get(k))]
        if problems:
            raise SpecError(problems, "foreign observation does not match the declared EnvSpec")
        return out
