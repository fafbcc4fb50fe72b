"""Every command's ``--help``: a top-level command is described by its line of ``policylink --help``, and every
option has a help text of its own (no option without one; no two options of a command sharing one text)."""

from __future__ import annotations

import re

import pytest

from policylink.cli import app as cli
from policylink.cli.commands import COMMANDS

CONFIG_COMMANDS = [
    ["demo"],
    ["record"],
    ["train"],
    ["eval"],
    ["serve"],
    ["robot"],
    ["run"],
    ["keys", "generate"],
    ["finetune", "critic"],
    ["finetune", "qvgm"],
    ["finetune", "h2o"],
    ["finetune", "monitor"],
    ["finetune", "loop"],
    ["finetune", "advantage", "label"],
    ["finetune", "advantage", "train"],
    ["dataset", "info"],
    ["dataset", "stats"],
    ["dataset", "export-lerobot"],
    ["dataset", "import-lerobot"],
    ["dataset", "merge"],
    ["dataset", "view"],
    ["dataset", "advantage-report"],
]

SHARED = {  # option groups whose one text is meant for all of them (the detector's paired parameters)
    "executor.corrective.detector.persistence_m",
    "executor.corrective.detector.window",
    "executor.corrective.detector.mad_window",
    "executor.corrective.detector.mad_k",
    "executor.corrective.detector.mad_floor",
}


def _help(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([*argv, "--help"])
    assert e.value.code in (0, None)
    return capsys.readouterr().out


@pytest.mark.parametrize("argv", CONFIG_COMMANDS, ids=" ".join)
def test_every_option_has_its_own_help_text(argv, capsys):
    out = _help(argv, capsys)
    lines = out.splitlines()
    if len(argv) == 1:
        assert lines[2] == COMMANDS[argv[0]][1], lines[:3]  # the line 'policylink --help' shows
    assert not lines[2].startswith("Options of"), lines[2]
    texts: dict[str, str] = {}
    for i, line in enumerate(lines):
        m = re.match(r"^  --(\S+) ", line)
        if not m or m.group(1) == "config":
            continue
        text = []
        for follow in lines[i + 1 :]:
            if not follow.startswith("      "):
                break
            text.append(follow.strip())
        assert text, f"{' '.join(argv)} --{m.group(1)}: no help text"
        texts[m.group(1)] = " ".join(text)
    seen: dict[tuple[str, str], str] = {}  # (section, text) -> option: a section's fields differ from each other
    for name, text in texts.items():
        key = (name.rpartition(".")[0], text)
        if name in SHARED:
            continue
        assert key not in seen, f"{' '.join(argv)}: --{name} and --{seen.get(key)} share the help text {text!r}"
        seen[key] = name


def test_a_subcommand_help_exits_zero_with_the_usage(capsys):
    from policylink.cli import envs

    assert envs.main(["install", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: policylink envs install NAME [--force]")
