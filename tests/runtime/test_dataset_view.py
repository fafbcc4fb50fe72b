"""``policylink dataset view``: an episode's page, camera mp4 (one frame per step, captioned) and curves."""

from __future__ import annotations

import numpy as np
import pytest

from policylink.cli import dataset
from policylink.data.buffer import EpisodeStore
from policylink.data.episode_meta import EpisodeMeta
from policylink.data.video import decode_video


def _store(path):
    with EpisodeStore(path, "a") as s:
        s.update_info(fps=5.0, action={"names": ["dx", "dy"]}, features={"observation.state": {"names": ["x"]}})
        for e, t in enumerate((4, 7)):
            img = np.zeros((t, 64, 96, 3), np.uint8)
            img[..., 1] = 30 * np.arange(t)[:, None, None]  # green = 30 t
            s.add_episode(
                {
                    "observation.state": np.arange(t, dtype=np.float32)[:, None],
                    "observation.images.front": img,
                    "action": np.zeros((t, 2), np.float32),
                    "reward": np.linspace(0, 1, t, dtype=np.float32),
                },
                EpisodeMeta(task="push the block", success=e == 1, seed=40 + e, source="expert"),
            )
    return path


def test_view_writes_page_video_and_curves(tmp_path, capsys):
    store = _store(tmp_path / "s.zarr")
    assert dataset.main(["view", str(store), "--episode", "1"]) == 0
    out = tmp_path / "s.zarr.view" / "episode_0001"
    assert capsys.readouterr().out.strip() == f"wrote {out / 'index.html'}"
    frames, times = decode_video(out / "front.mp4")
    assert frames.shape == (7, 64 + 12, 96, 3)  # one frame per step + a 12 px caption strip
    assert np.abs(frames[:, 32, 48, 1].astype(int) - 30 * np.arange(7)).max() <= 6  # its own frames, in order
    np.testing.assert_allclose(times - times[0], np.arange(7) / 5.0, atol=1e-6)  # the store's 5 Hz
    import imageio.v3 as iio

    curves = iio.imread(out / "curves.png")
    assert curves.shape[0] > 3 * 100  # a panel each for action, observation.state, reward
    page = (out / "index.html").read_text()
    assert '<video src="front.mp4"' in page and 'src="curves.png"' in page
    assert '"steps": 7' in page and '"success": true' in page and '"seed": 41' in page and "push the block" in page


def test_view_out_html_is_the_page_with_assets_beside_it(tmp_path, capsys):
    store = _store(tmp_path / "s.zarr")
    page = tmp_path / "ep0.html"
    assert dataset.main(["view", str(store), "--out", str(page)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {page}"
    assert page.is_file() and (tmp_path / "ep0_files" / "front.mp4").is_file()
    text = page.read_text()
    assert '<video src="ep0_files/front.mp4"' in text and 'src="ep0_files/curves.png"' in text


def test_view_bad_episode_names_the_field(tmp_path):
    store = _store(tmp_path / "s.zarr")
    with pytest.raises(ValueError, match=rf"^episode: expected an index in \[0, 2\) for {store}, received 2$"):
        dataset.main(["view", str(store), "--episode", "2"])
    with pytest.raises(SystemExit):
        dataset.main(["view", "--help"])
