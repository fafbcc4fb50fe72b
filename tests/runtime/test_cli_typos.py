"""A mistyped command, subcommand or choice is one stderr line naming the field, the choices and the closest one
(``adapters.registry.unknown_name_message``), exit code 2."""

from policylink.cli import app
from policylink.cli import envs as envs_cli


def test_unknown_envs_action_names_the_closest_one(capsys):
    assert envs_cli.main(["lst"]) == 2
    first = capsys.readouterr().err.splitlines()[0]
    expected = "action: expected one of ['install', 'list', 'kwargs'], received 'lst'; did you mean 'list'?"
    assert first == f"policylink envs: {expected}"


def test_unknown_top_level_command_names_the_closest_one(capsys):
    assert app.main(["servee"]) == 2
    assert capsys.readouterr().err == "policylink: unknown command 'servee'; did you mean 'serve'?\n"
