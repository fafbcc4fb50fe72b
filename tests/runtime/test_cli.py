"""The policylink command: subcommand listing, unknown commands, config parsing with YAML + overrides."""

import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from policylink.runtime import cli

EXPECTED = ["record", "train", "finetune", "eval", "serve", "robot", "run", "dataset", "bench"]


def test_help_lists_every_subcommand(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in EXPECTED:
        assert f"    {name}" in out


def test_console_script_help():
    out = subprocess.run(
        [sys.executable, "-m", "policylink.runtime.cli", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "record" in out and "eval" in out


def test_unknown_command(capsys):
    assert cli.main(["fly"]) == 2
    assert "unknown command 'fly'" in capsys.readouterr().err


@dataclass
class Opt:
    lr: float = 1e-3


@dataclass
class Cfg:
    env: str = "push"
    episodes: int = 5
    envs: list[str] = field(default_factory=lambda: ["reach"])
    opt: Opt = field(default_factory=Opt)


def test_parse_config_yaml_then_overrides(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("env: reach\nepisodes: 7\nopt:\n  lr: 0.5\n")
    cfg = cli.parse_config(Cfg, ["--config", str(cfg_file), "--episodes", "9", "--envs", "push,reach", "--opt.lr=0.25"])
    assert cfg == Cfg(env="reach", episodes=9, envs=["push", "reach"], opt=Opt(lr=0.25))
    assert cli.parse_config(Cfg, ["--envs=[a,b]"]).envs == ["a", "b"]


def test_parse_config_bad_value_names_field():
    with pytest.raises(cli.ConfigError, match="`episodes`: Couldn't parse 'many' into an int"):
        cli.parse_config(Cfg, ["--episodes", "many"])


def test_user_errors_are_one_line_and_bugs_keep_tracebacks(monkeypatch, capsys):
    import types

    mod = types.ModuleType("policylink_fake_cmd")

    def fail(argv):
        raise {"value": ValueError("episodes: expected >= 1, received -3"), "bug": ZeroDivisionError("oops")}[argv[0]]

    mod.main = fail
    monkeypatch.setitem(sys.modules, "policylink_fake_cmd", mod)
    monkeypatch.setitem(cli.COMMANDS, "fake", ("policylink_fake_cmd", "a test command"))
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    assert cli.main(["fake", "value"]) == 2
    err = capsys.readouterr().err
    assert "policylink fake: error: ValueError: episodes: expected >= 1, received -3" in err
    with pytest.raises(ZeroDivisionError):
        cli.main(["fake", "bug"])
    monkeypatch.setenv(cli.DEBUG_ENV, "1")
    with pytest.raises(ValueError):
        cli.main(["fake", "value"])


@dataclass
class Flags:
    obs_mode: str = "state"
    policies: list[str] = field(default_factory=list)
    demos: list[int] = field(default_factory=list)
    force: bool = False
    opt: Opt = field(default_factory=Opt)


def test_one_flag_rewriter_for_every_subcommand():
    argv = ["--obs-mode", "image", "--policies", "a=ckpt/{env}/x,b", "--demos=1,2", "--force", "--opt.lr", "2"]
    assert cli.normalise_flags(Flags, argv) == [
        "--obs_mode",
        "image",
        "--policies",
        '["a=ckpt/{env}/x", "b"]',
        "--demos=[1,2]",
        "--force=true",
        "--opt.lr",
        "2",
    ]
    assert cli.normalise_flags(Flags, ["--force", "false", "--demos", "[3]"]) == ["--force", "false", "--demos", "[3]"]
    cfg = cli.parse_config(Flags, [*argv[:6], "--force"])
    assert cfg == Flags(obs_mode="image", policies=["a=ckpt/{env}/x", "b"], demos=[1, 2], force=True)
