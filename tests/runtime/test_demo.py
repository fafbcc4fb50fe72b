"""The main job end to end at toy size: record -> train two policies -> N x M evaluation -> report."""

import json

import pytest

from policylink.cli import demo
from policylink.cli.demo import DemoConfig, run_demo, validate_demo


@pytest.mark.slow
def test_demo_end_to_end_tiny(tmp_path, capsys):
    cfg = DemoConfig(demos=[3, 3], steps=4, eval_episodes=2, workers=0, videos=1, out=str(tmp_path), device="cpu")
    summaries = run_demo(cfg)
    assert [(s["policy"], s["env"]) for s in summaries] == [
        ("diffusion", "push"),
        ("diffusion", "reach"),
        ("flow", "push"),
        ("flow", "reach"),
    ]
    assert all(s["n_episodes"] == 2 and s["pc_success"] in (0.0, 50.0, 100.0) for s in summaries)
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert len(results) == 4
    assert (tmp_path / "eval" / "report.html").stat().st_size > 1000
    assert (tmp_path / "eval" / "cells" / "flow__push" / "videos" / "episode_0000.mp4").stat().st_size > 0
    out = capsys.readouterr().out
    assert "| policy | push | reach |" in out
    assert demo.FAST_NOTE in out  # the fast configs' figures point to their range and to the full configs
    # a second run reuses data, checkpoints and evaluation cells
    again = run_demo(cfg)
    assert [s["pc_success"] for s in again] == [s["pc_success"] for s in summaries]
    assert "reusing the trained checkpoint" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            dict(envs=["pick_place"], demos=[5]),
            r"train_config: .*missing \['train/diffusion_pick_place_state_fast.yaml', "
            r"'train/flow_pick_place_state_fast.yaml'\] \(--train_config '\{policy\}_\{env\}_state_fast.yaml'",
        ),
        (
            dict(envs=["pick_place"]),
            r"demos: expected one count per env \(1: \['pick_place'\]\), received 2: \[200, 100\]",
        ),
        (dict(envs=["moon", "push"]), r"^envs: expected one of \[.*'push'.*\], received 'moon'$"),
        (dict(envs=["pushh"]), r"^envs: expected one of \[.*'push'.*\], received 'pushh'; did you mean 'push'\?$"),
        (
            dict(policies=["gan"]),
            r"^policies: expected one of \[.*'diffusion', 'flow'.*\], received 'gan'$",
        ),
        (
            dict(policies=["diffusion", "flwo"]),
            r"^policies: expected one of \[.*'diffusion', 'flow'.*\], received 'flwo'; did you mean 'flow'\?$",
        ),
        (dict(eval_episodes=0), r"demos, eval_episodes: expected counts >= 1, received \[200, 100\], 0"),
    ],
)
def test_every_setting_is_checked_before_any_work(tmp_path, fields, message):
    cfg = DemoConfig(out=str(tmp_path / "demo"), **fields)
    with pytest.raises(ValueError, match=message):
        run_demo(cfg)
    assert not (tmp_path / "demo").exists()  # nothing recorded
    validate_demo(DemoConfig(out=str(tmp_path / "demo")))  # the defaults are valid
