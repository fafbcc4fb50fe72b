"""``policylink robot``: configuration errors are one line and exit 2; the driver reference forms."""

import pytest

from policylink.cli import robot as robot_cli
from policylink.real.robots import RobotConfig, build_robot, safety_config


def test_non_loopback_bind_without_keys_is_refused(capsys):
    assert robot_cli.main(["--sim", "reach", "--bind", "tcp://0.0.0.0:5999"]) == 2
    assert "insecure" in capsys.readouterr().err


def test_sim_and_driver_are_exclusive_and_driver_needs_a_factory():
    with pytest.raises(ValueError, match="exactly one"):
        build_robot(RobotConfig())
    with pytest.raises(ValueError, match="module:factory"):
        build_robot(RobotConfig(driver="somearm"))


def test_a_driver_module_or_factory_that_is_not_there_is_named(tmp_path, monkeypatch):
    """A typo in ``--driver`` names the reference (it printed 'pip install nosuch' as if a package were missing);
    a module the driver itself imports that is missing stays a ModuleNotFoundError (the CLI's install hint)."""
    with pytest.raises(ValueError) as err:
        build_robot(RobotConfig(driver="nosuch.arm:Arm"))
    assert str(err.value) == (
        "--driver: expected 'module:factory' with an importable module, received 'nosuch.arm:Arm' "
        "(no module named 'nosuch')"
    )
    with pytest.raises(ValueError) as err:
        build_robot(RobotConfig(driver="policylink.real.robots:NoArm"))
    assert str(err.value) == (
        "--driver: expected 'module:factory' naming a callable of module 'policylink.real.robots', received "
        "'policylink.real.robots:NoArm' (policylink.real.robots.NoArm is missing)"
    )
    (tmp_path / "needs_dep_arm.py").write_text("import not_installed_dep_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="not_installed_dep_xyz"):
        build_robot(RobotConfig(driver="needs_dep_arm:Arm"))


def test_safety_config_from_the_options():
    from policylink.adapters.registry import make_env
    from policylink.real.sim_robot import SimRobot

    sim = SimRobot(make_env("reach", obs_mode="state"), realtime=False)
    cfg = safety_config(RobotConfig(watchdog_ms=250, max_step=0.01, on_timeout="stop"), sim)
    assert (cfg.watchdog_s, cfg.max_step, cfg.on_timeout, cfg.control_mode) == (0.25, 0.01, "stop", "ee_delta")
    assert cfg.low == pytest.approx((-0.02,) * 3) and cfg.high == pytest.approx((0.02,) * 3)
    sim.disconnect()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            [],
            "--sim / --driver: expected exactly one (--sim TASK, or --driver lerobot:<type> or module:factory), "
            "received sim=None driver=None",
        ),  # fmt: skip
        (["--driver", "arm"], "--driver: expected 'lerobot:<type>' or 'module:factory', received 'arm'"),
        (["--jitter-ms", "-5"], "jitter_ms: expected a value in [0, inf), received -5.0"),
        (["--observation-latency-ms", "nan"], "observation_latency_ms: expected a value in [0, inf), received nan"),
        (["--actuation_latency_ms", "inf"], "actuation_latency_ms: expected a value in [0, inf), received inf"),
        (["--watchdog-ms", "-1"], "watchdog_ms: expected a value in [0, inf), received -1.0"),
        (["--time-scale", "0"], "time_scale: expected a value in (0, inf), received 0.0"),
        (["--max-step", "-1"], "max_step: expected a value in (0, inf), received -1.0"),
        (["--seed", "-1"], "seed: expected an integer in [0, inf), received -1"),
        (["--on-timeout", "halt"], "on_timeout: expected one of ('hold', 'stop'), received 'halt'"),
    ],
)
def test_a_bad_option_is_one_line_naming_the_flag_in_its_own_unit(flags, message, monkeypatch, capsys):
    """The flag's own name and unit (``jitter_ms``, -5.0 ms; it named ``jitter_s`` and -0.005 after the
    conversion), before any robot is built."""
    from policylink.cli.app import DEBUG_ENV, run_main

    monkeypatch.delenv(DEBUG_ENV, raising=False)
    argv = flags if not flags or flags[0] == "--driver" else ["--sim", "reach", *flags]
    assert run_main("robot", robot_cli.main, argv) == 2
    assert capsys.readouterr().err == f"policylink robot: error: {message}\n"
