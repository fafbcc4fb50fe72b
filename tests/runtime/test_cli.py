"""The policylink command: subcommand listing, unknown commands, config parsing with YAML + overrides."""

import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from policylink.cli import app as cli
from policylink.cli import help as cli_help

EXPECTED = ["record", "train", "finetune", "eval", "serve", "robot", "run", "dataset", "bench"]


def test_help_lists_every_subcommand(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in EXPECTED:
        assert f"    {name}" in out


def test_console_script_help():
    out = subprocess.run(
        [sys.executable, "-m", "policylink.cli.app", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "record" in out and "eval" in out


def test_unknown_command(capsys):
    assert cli.main(["fly"]) == 2
    assert "unknown command 'fly'" in capsys.readouterr().err
    assert cli.main(["trian"]) == 2  # one line, with the closest command
    assert capsys.readouterr().err == "policylink: unknown command 'trian'; did you mean 'train'?\n"


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


@dataclass
class MapCfg:
    env_kwargs: dict = field(default_factory=dict)
    perturbation: dict | None = None


def test_mapping_options_take_yaml_mappings_and_name_the_flag_otherwise():
    cfg = cli.parse_config(MapCfg, ["--env_kwargs", "{a: {b: 0.5}}", "--perturbation=null"])
    assert cfg == MapCfg(env_kwargs={"a": {"b": 0.5}}, perturbation=None)
    expected = "expected a YAML mapping such as '{key: 0.5}', received"
    for argv, message in [
        (
            ["--env_kwargs", "{a: 1"],
            f"--env_kwargs: {expected} '{{a: 1' (expected ',' or '}}', but got '<stream end>')",
        ),
        (["--env_kwargs", "0.03"], f"--env_kwargs: {expected} '0.03'"),
        (["--env_kwargs=null"], f"--env_kwargs: {expected} 'null'"),  # not optional
        (["--perturbation", "[1, 2]"], f"--perturbation: {expected} '[1, 2]'"),
        (  # YAML reads 'image_size:-3' (no space after the colon) as one key with no value
            ["--env_kwargs", "{image_size:-3}"],
            "--env_kwargs: expected 'key: value' with a space after the colon (YAML), received '{image_size:-3}' "
            "(read as the key 'image_size:-3' with no value; write 'image_size: -3')",
        ),
        (
            ["--env_kwargs", "{gap: {dynamics: {mass_scale:2}}}"],
            "--env_kwargs: expected 'key: value' with a space after the colon (YAML), received "
            "'{gap: {dynamics: {mass_scale:2}}}' (read as the key 'mass_scale:2' with no value; write 'mass_scale: 2')",
        ),
    ]:
        with pytest.raises(cli.ConfigError) as e:
            cli.parse_config(MapCfg, argv)
        assert str(e.value) == message


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


@dataclass
class Documented:
    """``policylink toy``: a config with documented fields.

    Attributes:
        episodes: episodes per cell, one line.
        envs: environment names; a long help text that
            continues on the next line.
        lr, warmup: optimiser settings (``warmup`` in steps).
        opt: the optimiser section.
        force: replace what is there.
    """

    episodes: int = 50
    envs: list[str] = field(default_factory=lambda: ["push", "reach"])
    lr: float = 1e-4
    warmup: int = 10
    force: bool = False
    opt: Opt = field(default_factory=Opt)


def test_help_shows_each_flag_with_its_default_and_docstring(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.parse_config(Documented, ["--episodes", "3", "--help"], prog="policylink toy")
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.splitlines()[:3] == [
        "usage: policylink toy [--config FILE.yaml] [--OPTION VALUE ...]",
        "",
        "policylink toy: a config with documented fields.",
    ]
    assert "  --episodes int  (default: 50)\n      episodes per cell, one line.\n" in out
    assert "  --envs list[str]  (default: push,reach)\n      environment names; a long help text that continues" in out
    assert "  --warmup int  (default: 10)\n      optimiser settings (warmup in steps).\n" in out
    assert "  --force {true,false}  (default: false)\n" in out
    assert "  --opt.lr float  (default: 0.001)\n" in out
    assert "--config_path" not in out and "``" not in out


def test_train_help_lists_policy_types_once_with_the_default_types_fields():
    from policylink.train.imitation import TrainConfig

    text = cli_help.format_help(TrainConfig, "policylink train")
    assert text.count("--policy.type {") == 1 and "(default: diffusion)" in text
    assert "  --policy.diffusion.num_inference_steps int  (default: 10)\n      DDIM steps at inference" in text
    assert "--policy.flow.num_steps" not in text  # only the default type's own fields
    assert "policy.flow.num_steps" in cli.flag_paths(TrainConfig)  # ...but every type's fields are valid flags


@pytest.mark.parametrize("how", ["flag", "config"])
def test_train_help_lists_the_fields_of_the_type_a_flag_or_the_config_names(how, tmp_path, capsys):
    from policylink.train.imitation import TrainConfig

    (tmp_path / "vla.yaml").write_text("policy:\n  type: vla\nsteps: 3\n")
    argv = ["--policy.type", "vla", "--help"] if how == "flag" else ["--config", str(tmp_path / "vla.yaml"), "--help"]
    with pytest.raises(SystemExit):
        cli.parse_config(TrainConfig, argv, prog="policylink train")
    out = capsys.readouterr().out
    assert "  --policy.type {" in out and "(default: vla)" in out
    assert "  --policy.state_tokens dict[str, list[int]]  (default: {})\n      vector key -> sizes" in out
    assert "  --policy.language.film {true,false}  (default: false)" in out
    assert "--policy.unet." not in out and "--policy.diffusion." not in out  # not the default type's fields


def test_wrong_flag_is_one_line_with_the_closest_valid_flag(monkeypatch, capsys):
    import types

    mod = types.ModuleType("policylink_toy_cmd")
    mod.main = lambda argv: cli.parse_config(Documented, argv, prog="policylink toy") and 0
    monkeypatch.setitem(sys.modules, "policylink_toy_cmd", mod)
    monkeypatch.setitem(cli.COMMANDS, "toy", ("policylink_toy_cmd", "a test command"))
    assert cli.main(["toy", "--epsiodes", "3"]) == 2
    captured = capsys.readouterr()
    assert captured.err == "policylink toy: error: unknown flag --epsiodes; did you mean --episodes?\n"
    assert captured.out == ""
    with pytest.raises(cli.ConfigError, match=r"^unknown flag --opt.rl; did you mean --opt.lr\?$"):
        cli.parse_config(Documented, ["--opt.rl=2"])
    with pytest.raises(cli.ConfigError, match=r"^unknown flag --zzz; see --help for the 7 options$"):
        cli.parse_config(Documented, ["--zzz", "1"])
    # every spelling of a valid flag still parses
    cfg = cli.parse_config(Documented, ["--opt.lr", "2", "--force", "--envs", "a,b", "--warmup=3"])
    assert cfg == Documented(opt=Opt(lr=2.0), force=True, envs=["a", "b"], warmup=3)


def test_bad_yaml_names_file_line_and_column(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("episodes: 3\nopt:\n  lr: 0.1\n   warmup: 2\n")
    with pytest.raises(cli.ConfigError, match=rf"^{bad}:4:10: invalid YAML: mapping values are not allowed here$"):
        cli.parse_config(Documented, ["--config", str(bad)])
    with pytest.raises(cli.ConfigError, match=r"--config .*missing.yaml: cannot read it \(No such file"):
        cli.parse_config(Documented, ["--config", str(tmp_path / "missing.yaml")])


def test_subcommands_share_one_dispatcher(capsys):
    from policylink.cli import dataset, finetune

    assert dataset.main(["inf"]) == 2
    assert capsys.readouterr().err == "policylink dataset: unknown subcommand 'inf'; did you mean 'info'?\n"
    assert finetune.main(["zzz"]) == 2
    assert "expected one of critic, qvgm" in capsys.readouterr().err
    assert finetune.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: policylink finetune <subcommand>") and "  monitor " in out


@pytest.mark.parametrize("args", [["train", "--help"], ["eval", "--help"], ["dataset", "--help"]])
def test_help_into_a_closed_pipe_ends_quietly(args):
    """``policylink train --help | head``: the reader leaves before the help is written; the command then exits
    with the shell's SIGPIPE code and prints nothing, not an error."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "policylink.cli.app", *args], stdout=write_end, stderr=subprocess.PIPE, text=True
        )
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (cli.SIGPIPE_EXIT, "")
    assert cli.SIGPIPE_EXIT == 141


def test_a_broken_pipe_other_than_stdout_stays_an_error(monkeypatch, capsys):
    import types

    mod = types.ModuleType("policylink_pipe_cmd")

    def fail(argv):
        raise BrokenPipeError(32, "Broken pipe")  # e.g. a subprocess's stdin, while our stdout is fine

    mod.main = fail
    monkeypatch.setitem(sys.modules, "policylink_pipe_cmd", mod)
    monkeypatch.setitem(cli.COMMANDS, "pipe", ("policylink_pipe_cmd", "a test command"))
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    assert cli.main(["pipe"]) == 2
    assert "policylink pipe: error: BrokenPipeError: [Errno 32] Broken pipe" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "field", "bad", "close"),
    [
        (["train", "--policy.type", "diffuson"], "policy.type", "diffuson", "diffusion"),
        (["train", "--dataset.path", "{store}", "--dataset.env", "pushh"], "dataset.env", "pushh", "push"),
        (["eval", "--policies", "diffuson", "--envs", "push"], "policies", "diffuson", "diffusion"),
        (["eval", "--policies", "flow", "--envs", "push,reahc"], "envs", "reahc", "reach"),
        (["run", "--policy", "flwo", "--env", "push"], "policy", "flwo", "flow"),
        (["run", "--policy", "flow", "--env", "pushh"], "env", "pushh", "push"),
        (["record", "--env", "pick_plase", "--out", "{store}"], "env", "pick_plase", "pick_place"),
        (["record", "--env", "push", "--expert", "noisey", "--out", "{store}"], "expert", "noisey", "noisy"),
        (["serve", "--policy", "diffuson"], "policy", "diffuson", "diffusion"),
        (["demo", "--envs", "pushh,reach"], "envs", "pushh", "push"),
        (["demo", "--policies", "diffusion,flwo"], "policies", "flwo", "flow"),
    ],
)
def test_a_bad_name_is_one_line_naming_field_value_choices_and_the_closest(
    tmp_path, monkeypatch, capsys, argv, field, bad, close
):
    """No usage dump, no traceback hint: one stderr line, exit code 2, before anything is written."""
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "demos.zarr").mkdir()
    argv = [a.replace("{store}", str(tmp_path / "demos.zarr")) for a in argv]
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"policylink {argv[0]}: error: {field}: expected ")
    assert f"'{close}'" in lines[0].split(", received ")[0]  # the valid choices are listed
    assert lines[0].endswith(f"received '{bad}'; did you mean '{close}'?")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demos.zarr"]  # nothing recorded, trained or written


def test_config_names_resolve_to_the_shipped_configs_from_any_directory(tmp_path, monkeypatch):
    from policylink.configs import CONFIG_ROOT
    from policylink.train.config import TrainConfig

    monkeypatch.chdir(tmp_path)  # no configs/ here
    for name in ("configs/train/flow_push_state.yaml", "train/flow_push_state.yaml", "flow_push_state"):
        assert cli.resolve_config_path(name) == str(CONFIG_ROOT / "train" / "flow_push_state.yaml")
        cfg = cli.parse_config(TrainConfig, ["--config", name, "--steps", "7"])
        assert (cfg.policy.type, cfg.steps, cfg.dataset.path) == ("flow", 7, "outputs/data/push_state.zarr")
    (tmp_path / "flow_push_state.yaml").write_text("steps: 3\n")  # a file of the user's own wins
    assert cli.parse_config(TrainConfig, ["--config", "flow_push_state.yaml"]).steps == 3
    with pytest.raises(cli.ConfigError) as e:
        cli.parse_config(TrainConfig, ["--config", "configs/train/diffusion_push_stat.yaml"])
    assert str(e.value) == (
        "--config configs/train/diffusion_push_stat.yaml: cannot read it (No such file or directory); "
        "did you mean 'configs/train/diffusion_push_state.yaml'?"
    )


@dataclass
class Texts:
    template: str = "x"
    record: str | None = "y"


def test_text_values_stay_text_where_yaml_would_read_something_else():
    """draccus reads every value as YAML: ``{policy}_{env}.yaml`` was a broken flow mapping (a traceback), ``true`` a
    bool; a str field now gets the text as typed, and ``null`` still means None for an optional one."""
    for value in ("{policy}_{env}_state.yaml", "true", "123", "a: b", "it's", "[x, y]", "push", "tcp://127.0.0.1:5555"):
        assert cli.parse_config(Texts, ["--template", value]).template == value
        assert cli.parse_config(Texts, [f"--template={value}"]).template == value
    assert cli.parse_config(Texts, ["--record", "null"]).record is None
