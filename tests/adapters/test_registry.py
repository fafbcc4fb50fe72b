"""Registry: code registration, entry points, clear errors for unknown names."""

import pytest

from policylink.adapters import registry


def test_register_and_make_env_with_kwargs():
    registry.register_env("test-toy", lambda size=1: {"size": size}, overwrite=True)
    assert registry.make_env("test-toy", size=3) == {"size": 3}
    assert "test-toy" in registry.available_envs()
    with pytest.raises(ValueError, match="'test-toy': already registered"):
        registry.register_env("test-toy", dict)


def test_unknown_name_lists_what_exists():
    registry.register_policy("test-policy", dict, overwrite=True)
    with pytest.raises(registry.UnknownNameError, match=r"policy 'nope': unknown; available: \[.*'test-policy'"):
        registry.make_policy("nope")


def test_entry_points_are_loaded_lazily(monkeypatch):
    class FakeEP:
        name = "ep-env"

        def load(self):
            return lambda: "built from entry point"

    monkeypatch.setattr(
        registry, "_entry_points", lambda group: {"ep-env": FakeEP()} if group == registry.ENV_GROUP else {}
    )
    assert "ep-env" in registry.available_envs()
    assert registry.make_env("ep-env") == "built from entry point"
    registry._registries[registry.ENV_GROUP].pop("ep-env")


def test_non_callable_factory_rejected():
    with pytest.raises(TypeError, match="expected a callable, received int"):
        registry.register_env("bad", 3)
