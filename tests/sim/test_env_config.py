"""Every simulated env declares its kwargs as a config dataclass (MuJoCo tasks, Genesis tasks, gymnasium envs,
MetaWorld's isolated tasks; the sim-as-real robot builds its task through the same check): a typo is a ValueError
naming the env, the key and the closest accepted one, before anything is built; a valid mapping builds the env
with exactly those values."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from policylink.adapters import registry
from policylink.adapters.env_config import describe_config, field_types
from policylink.sim.genesis.tasks import GenesisTaskConfig, GenesisTaskEnv
from policylink.sim.gym import PusherConfig, ReacherConfig
from policylink.sim.isolated import metaworld, metaworld_env
from policylink.sim.mujoco.base import MujocoTaskEnv
from policylink.sim.mujoco.gap import load_gap
from policylink.sim.mujoco.perturbations import PerturbationConfig
from policylink.sim.mujoco.randomization import RandomizationConfig
from policylink.sim.mujoco.task_config import MujocoTaskConfig

MUJOCO_TASKS = ("reach", "push", "pick_place", "insert", "memory", "multitask")


def _params(fn, drop=()):
    return [p for p in inspect.signature(fn).parameters if p not in ("self", *drop) and not p.startswith("*")]


def _fields(config):
    return [f.name for f in dataclasses.fields(config)]


def test_each_env_registers_a_config_that_matches_its_constructor():
    for name in MUJOCO_TASKS:
        assert registry.env_config(name) is MujocoTaskConfig
    assert sorted(_fields(MujocoTaskConfig)) == sorted(_params(MujocoTaskEnv.__init__))
    for name in ("genesis_reach", "genesis_pick_place"):
        assert registry.env_config(name) is GenesisTaskConfig
    assert sorted(_fields(GenesisTaskConfig)) == sorted(_params(GenesisTaskEnv.__init__))
    assert registry.env_config("reacher") is ReacherConfig and registry.env_config("pusher") is PusherConfig
    assert registry.env_config("metaworld/push") is metaworld.MetaWorldConfig
    adapter = _params(metaworld_env.MetaWorldAdapter.__init__, drop=("raw_env", "task", "expert"))
    assert sorted(_fields(metaworld.MetaWorldConfig)) == sorted(adapter)
    expert_default = inspect.signature(metaworld_env.make_metaworld_env).parameters["expert_actions"].default
    assert metaworld.MetaWorldConfig().expert_actions is expert_default is False
    # the defaults are the constructor's (what `policylink envs kwargs NAME` shows)
    defaults = {k: p.default for k, p in inspect.signature(MujocoTaskEnv.__init__).parameters.items() if k != "self"}
    assert dataclasses.asdict(MujocoTaskConfig()) == defaults


def test_a_typo_in_a_mujoco_task_kwarg_is_named_with_the_closest_key():
    with pytest.raises(ValueError) as e:
        registry.make_env("reach", gapp="worn_gantry")
    assert str(e.value) == (
        "'reach' env kwarg: expected one of ['obs_mode', 'image_size', 'cameras', 'render_quality', 'perturbation', "
        "'render_mode', 'randomization', 'render_size', 'camera_pose_shift', 'gap'], received 'gapp'; "
        "did you mean 'gap'?"
    )
    with pytest.raises(ValueError, match=r"^'push' env kwarg perturbation: .*received 'displacment'; did you mean"):
        registry.make_env("push", perturbation={"displacment": 0.03})
    with pytest.raises(ValueError, match=r"'insert' env kwarg camera_pose_shift: .*did you mean 'yaw_deg'\?$"):
        registry.make_env("insert", camera_pose_shift={"yaw": 20.0})


def test_a_gap_on_an_env_without_gap_support_is_named_with_the_keys_it_takes():
    with pytest.raises(ValueError) as e:
        registry.make_env("reacher", gap="worn_gantry")
    assert str(e.value).startswith("'reacher' env kwarg: expected one of ['obs_mode', 'image_size', 'render_mode', ")
    assert str(e.value).endswith("'reward_dist_weight', 'reward_control_weight'], received 'gap'")
    with pytest.raises(ValueError, match=r"^'genesis_reach' env kwarg: expected one of \[.*'scene'\], received 'gap'$"):
        registry.make_env("genesis_reach", gap="worn_gantry")  # Genesis is imported only when a scene is built


def test_metaworld_kwargs_are_checked_on_the_host_before_its_env_server_starts():
    # no venv is needed: the check comes before the env process would start (or report the venv missing)
    with pytest.raises(ValueError, match=r"^'metaworld/push' env kwarg: .*received 'camera'; did you mean 'cameras'"):
        registry.make_env("metaworld/push", camera=["corner2"])
    with pytest.raises(ValueError, match=r"^'metaworld/push' env kwarg image_size: expected int, received '32'"):
        registry.make_env("metaworld/push", image_size="32")
    with pytest.raises(ValueError, match=r"^'metaworld/push' env kwarg: expected one of \[.*\], received 'gap'$"):
        registry.make_env("metaworld/push", gap="worn_gantry")  # no reality gap for MetaWorld: named, not a TypeError


def test_a_wrong_type_is_named_with_the_expected_and_received():
    cases = [
        ({"image_size": "big"}, "image_size: expected int | tuple[int, int], received 'big' (str)"),
        ({"render_size": 25.6}, "render_size: expected int, received 25.6 (float)"),
        ({"cameras": "front"}, "cameras: expected tuple[str, ...] | None, received 'front' (str)"),
        ({"perturbation": 0.03}, "perturbation: expected PerturbationConfig | None, received 0.03 (float)"),
        ({"perturbation": {"force": "strong"}}, "perturbation.force: expected float, received 'strong' (str)"),
        ({"perturbation": {"action_delay_steps": 1.5}}, "perturbation.action_delay_steps: expected int, received 1.5"),
        ({"gap": 3}, "gap: expected RealityGap | Mapping[str, Any] | str | Path | None, received 3 (int)"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError) as e:
            registry.make_env("push", **kwargs)
        assert str(e.value).startswith(f"'push' env kwarg {message}"), str(e.value)


def test_a_valid_mapping_builds_the_env_with_exactly_those_values():
    env = registry.make_env(
        "push",
        obs_mode="state",
        perturbation={"displacement": 0.03, "force": 2, "displacement_steps": [5, 9]},
        randomization={"color": 0.0, "light": 0.1},
        camera_pose_shift={"yaw_deg": 20},
        gap={"base": "worn_gantry", "randomize": 0.5},  # the gap's own mapping (with `base`) is the gap's to check
        cameras=["top"],
    )
    assert env.perturbation == PerturbationConfig(displacement=0.03, force=2.0, displacement_steps=(5, 9))
    assert env.randomization == RandomizationConfig(color=0.0, light=0.1)
    assert env.camera_pose_shift.yaw_deg == 20.0 and env.cameras == ("top",)
    assert env.reality_gap.dynamics == load_gap("worn_gantry").dynamics and env.reality_gap.randomize == 0.5
    env.close()


def test_the_sim_as_real_robot_checks_its_task_kwargs():
    from policylink.real.robots import RobotConfig, build_robot

    with pytest.raises(ValueError, match=r"^'reach' env kwarg: .*received 'obs_mod'; did you mean 'obs_mode'\?$"):
        build_robot(RobotConfig(sim="reach", sim_kwargs={"obs_mod": "state"}))
    with pytest.raises(ValueError, match=r"^'reacher' env kwarg: .*received 'gap'$"):
        build_robot(RobotConfig(sim="reacher", gap="worn_gantry"))


def test_the_configs_describe_their_accepted_kwargs():
    lines = describe_config(MujocoTaskConfig)
    assert lines[0] == "obs_mode: str = 'state'"
    assert "perturbation: PerturbationConfig | None = None" in lines
    assert f"    (or a mapping of PerturbationConfig keys: {', '.join(field_types(PerturbationConfig))})" in lines
    assert lines[-1] == "gap: RealityGap | Mapping[str, Any] | str | Path | None = None"


def test_envs_kwargs_command_prints_what_an_env_takes(capsys):
    from policylink.cli.envs import main

    assert main(["kwargs", "metaworld/push"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "metaworld/push kwargs (policylink.sim.isolated.metaworld.MetaWorldConfig):",
        "  obs_mode: str = 'state'",
        "  image_size: int = 96",
        "  cameras: tuple[str, ...] = ('corner2',)",
        "  expert_actions: bool = False",
        "  max_episode_steps: int | None = None",
        "  render_mode: str | None = None",
    ]
    registry.register_env("toy-unchecked", dict, overwrite=True)
    assert main(["kwargs", "toy-unchecked"]) == 0
    assert "declares no kwargs config" in capsys.readouterr().out
    assert main(["kwargs"]) == 2
    with pytest.raises(registry.UnknownNameError, match="did you mean 'push'"):
        main(["kwargs", "pushh"])


def test_a_refused_value_is_one_line_naming_env_field_expected_and_received(monkeypatch, capsys):
    """Values the kwargs' own dataclasses or the env constructor refuse (not only wrong types) name the env and the
    field path the user wrote, and the CLI prints them as its one line (no exception name, no traceback hint)."""
    from policylink.cli.app import DEBUG_ENV, run_main

    presets = "['lab_robot', 'moved_camera', 'noisy_sensors', 'worn_gantry', 'worn_gantry_delayed']"
    groups = "['name', 'description', 'seed', 'randomize', 'dynamics', 'sensing', 'timing', 'base']"
    cases = [
        ({"gap": "nosuchpreset"}, f"gap: expected a YAML file path or one of {presets}, received 'nosuchpreset'"),
        ({"gap": {"nosuch": 1}}, f"gap: expected one of {groups}, received 'nosuch'"),
        ({"gap": {"base": "worn_gantri"}}, "gap.base: expected a YAML file path or one of "),
        ({"gap": {"dynamics": {"mass": 2}}}, "gap.dynamics: expected one of ['friction_scale', 'mass_scale', "),
        (
            {"gap": {"dynamics": {"mass_scale": -1}}},
            "gap.dynamics.mass_scale: expected a factor in [0.01, 100], or a [low, high] range of them, received -1",
        ),
        ({"randomization": {"color": 7}}, "randomization.color: expected a value in [0, 1], received 7"),
        ({"perturbation": {"force": -1}}, "perturbation.force: expected a magnitude >= 0 N, received -1"),
        ({"camera_pose_shift": {"pitch_deg": 95}}, "camera_pose_shift.pitch_deg: expected a value in [-89, 89], "),
        ({"render_quality": "ultra"}, "render_quality: expected one of ('fast', 'pretty'), received 'ultra'"),
        ({"cameras": ["wrist"]}, "cameras: expected names from ['top', 'front'], received 'wrist'"),
    ]
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    for kwargs, message in cases:
        with pytest.raises(ValueError) as e:
            registry.make_env("push", **kwargs)
        assert str(e.value).startswith(f"'push' env kwarg {message}"), str(e.value)
        assert run_main("eval", lambda argv, kw=kwargs: registry.make_env("push", **kw), []) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"policylink eval: error: 'push' env kwarg {message}") and err.count("\n") == 1, err
    with pytest.raises(registry.UnknownNameError, match=r"received 'worn_gantri'; did you mean 'worn_gantry'\?$"):
        registry.make_env("push", gap={"base": "worn_gantri"})
