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


def test_unknown_names_name_the_field_the_choices_and_the_closest():
    choices = ["diffusion", "flow", "act"]
    assert registry.closest_name("diffuson", choices) == "diffusion"
    assert registry.closest_name("flwo", choices) == "flow"
    assert registry.closest_name("gan", choices) is None  # nothing close: no guess
    assert (
        registry.unknown_name_message("policy.type", "diffuson", choices)
        == "policy.type: expected one of ['diffusion', 'flow', 'act'], received 'diffuson'; did you mean 'diffusion'?"
    )
    assert (
        registry.unknown_name_message("policy", "gan", choices, other="a checkpoint folder")
        == "policy: expected a checkpoint folder or one of ['diffusion', 'flow', 'act'], received 'gan'"
    )
    registry.register_env("test-push", dict, overwrite=True)
    registry.check_env_name("test-push")  # registered: nothing raised
    with pytest.raises(
        registry.UnknownNameError,
        match=r"^envs: expected one of \[.*\], received 'test-pushh'; did you mean 'test-push'\?$",
    ):
        registry.check_env_name("test-pushh", "envs")
    with pytest.raises(ValueError, match=r"did you mean 'test-push'\?$"):  # also a ValueError (a bad value)
        registry.make_env("test-pusj")
    registry.register_policy("test-policy", dict, overwrite=True)
    with pytest.raises(
        KeyError, match=r"^policy: expected one of \[.*'test-policy'.*\], received 'test-polcy'; did you mean"
    ):
        registry.check_policy_name("test-polcy")


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
