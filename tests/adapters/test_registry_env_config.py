"""Env kwargs configs: an env registered with a config dataclass has its kwargs checked by name and type before it
is built; the kwargs then reach the factory unchanged; an env without one keeps taking anything."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from policylink.adapters import registry
from policylink.adapters.env_config import describe_config, matches, with_env_config


@dataclass(frozen=True)
class Inner:
    """A nested config: given as a mapping of its fields."""

    speed: float = 1.0
    steps: tuple[int, int] = (1, 2)


@dataclass(frozen=True)
class ToyConfig:
    """The toy env's kwargs."""

    size: int | tuple[int, int] = 4
    mode: str = "state"
    inner: Inner | None = None
    free: Mapping[str, Any] | str | None = None
    flag: bool = False


def _toy(**kwargs):
    return kwargs


def test_an_unknown_key_names_the_env_the_key_the_accepted_keys_and_the_closest():
    registry.register_env("toy-cfg", _toy, overwrite=True, config=ToyConfig)
    with pytest.raises(registry.UnknownNameError) as e:
        registry.make_env("toy-cfg", sise=3)
    assert str(e.value) == (
        "'toy-cfg' env kwarg: expected one of ['size', 'mode', 'inner', 'free', 'flag'], received 'sise'; "
        "did you mean 'size'?"
    )
    assert isinstance(e.value, ValueError)
    with pytest.raises(ValueError, match=r"received 'zzz'$"):  # nothing close: no guess
        registry.make_env("toy-cfg", zzz=1)
    with pytest.raises(ValueError) as e:  # a nested config's keys are checked too, named under their field
        registry.make_env("toy-cfg", inner={"sped": 2.0})
    assert str(e.value) == (
        "'toy-cfg' env kwarg inner: expected one of ['speed', 'steps'], received 'sped'; did you mean 'speed'?"
    )


def test_a_wrong_type_names_the_field_the_expected_and_the_received():
    registry.register_env("toy-cfg", _toy, overwrite=True, config=ToyConfig)
    with pytest.raises(ValueError) as e:
        registry.make_env("toy-cfg", size="big")
    assert str(e.value) == "'toy-cfg' env kwarg size: expected int | tuple[int, int], received 'big' (str)"
    with pytest.raises(ValueError) as e:
        registry.make_env("toy-cfg", inner={"steps": [1, 2.5]})
    assert str(e.value) == "'toy-cfg' env kwarg inner.steps: expected tuple[int, int], received [1, 2.5] (list)"
    with pytest.raises(ValueError, match=r"^'toy-cfg' env kwarg flag: expected bool, received 1 \(int\)$"):
        registry.make_env("toy-cfg", flag=1)
    with pytest.raises(ValueError, match=r"kwarg inner: expected Inner \| None, received 3 \(int\)$"):
        registry.make_env("toy-cfg", inner=3)


def test_a_valid_mapping_reaches_the_factory_unchanged():
    registry.register_env("toy-cfg", _toy, overwrite=True, config=ToyConfig)
    inner = {"speed": 2, "steps": [3, 4]}  # an int is a valid float, a list a valid tuple (YAML has no tuples)
    free = {"anything": {"deep": [1]}, "base": "x"}  # Mapping[str, Any]: not checked key by key
    built = registry.make_env("toy-cfg", size=[64, 48], mode="image", inner=inner, free=free, flag=np.bool_(True))
    assert built == {"size": [64, 48], "mode": "image", "inner": inner, "free": free, "flag": np.bool_(True)}
    assert built["inner"] is inner and built["free"] is free  # the same objects, not converted
    assert registry.make_env("toy-cfg", inner=Inner(speed=3.0)) == {"inner": Inner(speed=3.0)}
    assert registry.make_env("toy-cfg") == {}


def test_an_env_without_a_config_is_unchanged():
    registry.register_env("toy-free", _toy, overwrite=True)
    assert registry.env_config("toy-free") is None
    assert registry.make_env("toy-free", sise="anything", x=[1]) == {"sise": "anything", "x": [1]}
    registry.register_env("toy-strict", lambda size=1: size, overwrite=True)
    with pytest.raises(ValueError, match=r"env kwargs for 'toy-strict': .*unexpected keyword argument 'sise'"):
        registry.make_env("toy-strict", sise=3)  # today's message from the factory's TypeError


def test_an_entry_point_factory_and_a_family_declare_their_config(monkeypatch):
    built = []

    @with_env_config(ToyConfig)
    def factory(**kwargs):
        built.append(kwargs)
        return kwargs

    class Family:
        tasks = ("a", "b")
        env_config = ToyConfig

        def __call__(self, task, **kwargs):
            built.append((task, kwargs))
            return task

    class FakeEP:
        name = "ep-cfg"

        def load(self):
            return factory

    monkeypatch.setattr(
        registry, "_entry_points", lambda group: {"ep-cfg": FakeEP()} if group == registry.ENV_GROUP else {}
    )
    registry.register_env_family("toyfam", Family(), overwrite=True)
    assert registry.env_config("ep-cfg") is ToyConfig
    assert registry.env_config("toyfam/a") is ToyConfig
    with pytest.raises(ValueError, match=r"^'ep-cfg' env kwarg: .*did you mean 'mode'\?$"):
        registry.make_env("ep-cfg", mdoe="state")
    with pytest.raises(ValueError, match=r"^'toyfam/b' env kwarg: .*did you mean 'mode'\?$"):
        registry.make_env("toyfam/b", mdoe="state")
    assert built == []  # checked before anything was built (an isolated env's server is never started)
    assert registry.make_env("toyfam/b", mode="image") == "b" and built == [("b", {"mode": "image"})]
    registry._registries[registry.ENV_GROUP].pop("ep-cfg")
    registry._registries[registry.FAMILY_GROUP].pop("toyfam")
    registry._registries[registry.ENV_GROUP].pop("toyfam/b", None)


def test_a_config_must_be_a_dataclass():
    with pytest.raises(TypeError, match="env config: expected a dataclass type, received <class 'dict'>"):
        registry.register_env("toy-bad", _toy, overwrite=True, config=dict)
    with pytest.raises(TypeError, match="expected a dataclass type"):
        with_env_config(ToyConfig())


def test_matches_numbers_as_env_kwargs_come():
    assert matches(3, float) and matches(np.float32(0.5), float) and matches(np.int64(3), int)
    assert not matches(True, int) and not matches(True, float) and not matches(2.0, int)
    assert matches((1, 2), tuple[int, ...]) and not matches((1, "a"), tuple[int, ...])
    assert matches(None, int | None) and not matches(None, int)


def test_describe_config_lists_each_field_with_its_type_and_default():
    assert describe_config(ToyConfig) == [
        "size: int | tuple[int, int] = 4",
        "mode: str = 'state'",
        "inner: Inner | None = None",
        "    (or a mapping of Inner keys: speed, steps)",
        "free: Mapping[str, Any] | str | None = None",
        "flag: bool = False",
    ]
