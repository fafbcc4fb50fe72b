"""The main job end to end at toy size: record -> train two policies -> N x M evaluation -> report."""

import json

import pytest

from policylink.runtime.demo import DemoConfig, run_demo


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
    # a second run reuses data, checkpoints and evaluation cells
    again = run_demo(cfg)
    assert [s["pc_success"] for s in again] == [s["pc_success"] for s in summaries]
    assert "reusing the trained checkpoint" in capsys.readouterr().out
