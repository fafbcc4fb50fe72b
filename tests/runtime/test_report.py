"""Report pieces: Wilson intervals (known values), the N x M markdown table, CSV/JSON tables, mp4 videos and
the HTML report with its plots."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from policylink.data.video import write_video
from policylink.evaluate import report


def test_wilson_interval_known_values():
    # 5/10: p = 0.5, z^2/n = 0.38415; center 0.5, half = 1.96 sqrt(0.025 + 0.0096) / 1.38415 = 0.26340
    assert report.wilson_interval(5, 10) == pytest.approx((0.23659, 0.76341), abs=1e-5)
    assert report.wilson_interval(0, 10) == pytest.approx((0.0, 0.27753), abs=1e-5)
    assert report.wilson_interval(10, 10) == pytest.approx((0.72247, 1.0), abs=1e-5)
    # 81/263: center (0.307985 + 0.007303) / 1.014606 = 0.310749, half 1.96 * 0.028710 / 1.014606 = 0.055462
    assert report.wilson_interval(81, 263) == pytest.approx((0.25529, 0.36621), abs=1e-4)
    assert report.wilson_interval(0, 0) == (0.0, 1.0)
    assert report.wilson_interval(0, 6)[0] == 0.0 and report.wilson_interval(10, 10)[1] == 1.0  # exact, no round-off
    with pytest.raises(ValueError, match=r"successes: expected an integer in \[0, n=3\], received 4"):
        report.wilson_interval(4, 3)


def test_seed_interval_known_values():
    # 40, 50, 60: mean 50, s = 10, half = 4.303 * 10 / sqrt(3) = 24.844
    assert report.seed_interval([40.0, 50.0, 60.0]) == pytest.approx((50.0, 24.844), abs=1e-3)
    assert report.seed_interval([30.0]) == (30.0, 0.0)
    with pytest.raises(ValueError, match="values: expected at least one"):
        report.seed_interval([])


def _summary(policy, env, k, n):
    lo, hi = report.wilson_interval(k, n)
    return {
        "policy": policy,
        "env": env,
        "n_success": k,
        "n_episodes": n,
        "pc_success": 100.0 * k / n,
        "ci95_low": 100 * lo,
        "ci95_high": 100 * hi,
        "avg_sum_reward": -1.5,
        "avg_max_reward": 0.25,
        "avg_steps": 10.0,
        "avg_stall_steps": 0.0,
        "eval_s": 2.0,
        "video_paths": [],
    }


def test_tables(tmp_path):
    rows = [_summary("dp", "push", 5, 10), _summary("dp", "reach", 10, 10), _summary("flow", "push", 0, 10)]
    md = report.markdown_table(rows)
    assert "| policy | push | reach |" in md
    assert "| dp | 50.0% [23.7, 76.3] (n=10) | 100.0% [72.2, 100.0] (n=10) |" in md
    assert "| flow | 0.0% [0.0, 27.8] (n=10) | - |" in md
    paths = report.write_tables(tmp_path, rows)
    assert json.loads(paths["json"].read_text())[1]["pc_success"] == 100.0
    with paths["csv"].open() as f:
        table = list(csv.DictReader(f))
    assert [r["policy"] for r in table] == ["dp", "dp", "flow"] and table[0]["n_success"] == "5"


def test_video_round_trip(tmp_path):
    frames = [np.full((15, 20, 3), (10 * i, 200, 50), np.uint8) for i in range(8)]
    path = write_video(tmp_path / "v" / "ep.mp4", frames, fps=10)
    import imageio.v3 as iio

    back = iio.imread(path, plugin="pyav")
    assert back.shape == (8, 16, 20, 3)  # odd height padded to even for yuv420p
    assert abs(int(back[0, 7, 10, 1]) - 200) <= 6 and abs(int(back[7, 7, 10, 0]) - 70) <= 8
    with pytest.raises(ValueError, match="at least one frame"):
        write_video(tmp_path / "x.mp4", [], fps=10)


def test_report_html_and_plots(tmp_path):
    rows = [_summary("dp", "push", 5, 10), _summary("flow", "push", 0, 6)]  # 0 %: exact bound
    rows[0]["video_paths"] = ["cells/dp__push/videos/episode_0000.mp4"]
    page = report.write_report(tmp_path, rows, config={"episodes": 10, "seed": 0})
    text = page.read_text()
    assert '<video src="cells/dp__push/videos/episode_0000.mp4"' in text
    assert "success_heatmap.png" in text and "&quot;episodes&quot;: 10" in text and "gymnasium" in text
    import imageio.v3 as iio

    heat = iio.imread(tmp_path / "success_heatmap.png")
    assert heat.ndim == 3 and heat.shape[0] > 50
    assert (tmp_path / "success_bars.png").stat().st_size > 1000


def test_bar_plot_has_headroom_and_the_legend_beside_the_bars(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    seen = {}
    real_savefig = Figure.savefig

    def spy(fig, path, *a, **k):
        if Path(path).name == "success_bars.png":
            fig.canvas.draw()
            ax = fig.axes[0]
            legend = ax.get_legend().get_window_extent()
            bars = [p.get_window_extent() for p in ax.patches]
            seen.update(ylim=ax.get_ylim(), legend=legend, axes=ax.get_window_extent(), bars=bars)
        return real_savefig(fig, path, *a, **k)

    monkeypatch.setattr(Figure, "savefig", spy)
    report.write_plots(tmp_path, [_summary("dp", "push", 10, 10), _summary("flow", "push", 9, 10)])
    assert seen["ylim"] == (0.0, report.BAR_YMAX) and report.BAR_YMAX > 100
    assert seen["legend"].x0 >= seen["axes"].x1  # right of the plot area: over no bar
    assert not any(seen["legend"].overlaps(b) for b in seen["bars"]) and len(seen["bars"]) == 2
