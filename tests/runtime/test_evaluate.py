"""N x M evaluation: all outputs written in LeRobot's shape, one error for every incompatible cell, resume,
shared seeds, the CLI, and the same results on the local process pool and on Ray."""

import json
import sys

import numpy as np
import pytest

from policylink.adapters.env import EnvAdapter
from policylink.adapters.policy import HistoryPolicy
from policylink.adapters.registry import UnknownNameError, register_env, register_policy
from policylink.adapters.schema import ActionSpec, EnvSpec, FeatureSpec, IncompatibleSpecError, PolicySpec
from policylink.cli import eval as eval_cli
from policylink.evaluate import nxm as ev
from policylink.runtime.executors import ExecutorConfig, LatencyConfig

STATE = "observation.state"
ACTION = ActionSpec(("dx",), "ee_delta", ("m",), (-0.1,), (0.1,))


class Line(EnvAdapter):
    """A point on a line (m), x0 ~ U(-0.5, 0.5) from the seed; success (and termination) when |x| < 0.05 m.
    Frames are a solid colour: red = 40 * (seed % 6), green = 10 * step."""

    env_spec = EnvSpec("line", {STATE: FeatureSpec("float32", (1,))}, ACTION, 10.0, 12)

    def __init__(self, render_mode=None):
        self.render_mode = render_mode
        self._init_spaces()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.seed_, self.t = seed or 0, 0
        self.x = float(self.np_random.uniform(-0.5, 0.5))
        return self._obs(), {"is_success": False}

    def step(self, action):
        self.t += 1
        self.x += float(np.clip(action[0], -0.1, 0.1))
        ok = abs(self.x) < 0.05
        return self._obs(), -abs(self.x), ok, False, {"is_success": ok}

    def render(self):
        frame = np.zeros((16, 16, 3), np.uint8)
        frame[..., 0], frame[..., 1] = 40 * (self.seed_ % 6), min(10 * self.t, 255)
        return frame

    def _obs(self):
        return {STATE: np.array([self.x], np.float32)}


def _pspec(action=ACTION):
    return PolicySpec({STATE: FeatureSpec("float32", (1,))}, action, chunk_size=4, n_action_steps=2)


class Greedy(HistoryPolicy):
    """Steps toward 0 at 0.1 m/step, with N(0, 0.08) noise from numpy's global generator (seeded per shard)."""

    def __init__(self):
        super().__init__(_pspec())

    def _predict(self, history, pad_mask, tasks):
        x = history[STATE][:, -1, 0]
        step = np.clip(-x, -0.1, 0.1)[:, None] + np.random.normal(0, 0.08, (x.shape[0], 4))
        return np.clip(step, -0.1, 0.1)[..., None].astype(np.float32)


class Still(HistoryPolicy):
    """Never moves: succeeds only when the start is already within 5 cm."""

    def __init__(self):
        super().__init__(_pspec())

    def _predict(self, history, pad_mask, tasks):
        return np.zeros((history[STATE].shape[0], 4, 1), np.float32)


class TwoD(HistoryPolicy):
    """A 2-D action policy (incompatible with Line)."""

    def __init__(self):
        super().__init__(_pspec(ActionSpec(("a", "b"), "joint_position", ("rad", "rad"), (-1, -1), (1, 1))))

    def _predict(self, history, pad_mask, tasks):
        return np.zeros((history[STATE].shape[0], 4, 2), np.float32)


def _line():
    return Line(render_mode="rgb_array")


POLICIES = [("greedy", Greedy), ("still", Still)]
ENVS = [("line", _line), ("line2", _line)]


def _eval(tmp_path, **kw):
    args = dict(episodes=6, seed=3, workers=0, shard_episodes=3, videos=2, progress=False, out=tmp_path / "out")
    args.update(kw)
    return ev.evaluate(POLICIES, ENVS, **args)


def test_evaluate_writes_every_output(tmp_path):
    summaries = _eval(tmp_path)
    out = tmp_path / "out"
    assert [(s["policy"], s["env"]) for s in summaries] == [
        ("greedy", "line"),
        ("greedy", "line2"),
        ("still", "line"),
        ("still", "line2"),
    ]
    info = json.loads((out / "cells" / "greedy__line" / "eval_info.json").read_text())
    assert set(info) >= {"per_episode", "per_task", "per_group", "overall"}
    for key in ("pc_success", "avg_sum_reward", "avg_max_reward", "n_episodes", "eval_s", "video_paths"):
        assert key in info["overall"]
    assert info["overall"]["n_episodes"] == 6 and info["per_group"]["line"]["n_episodes"] == 6
    assert [e["seed"] for e in info["per_episode"]] == [3, 4, 5, 6, 7, 8]
    assert len(info["per_task"][0]["metrics"]["successes"]) == 6
    # the same seeds in both envs and for both policies: identical starts, so "still" matches across envs
    still = [json.loads((out / "cells" / f"still__{e}" / "eval_info.json").read_text()) for e in ("line", "line2")]
    assert still[0]["per_episode"] == still[1]["per_episode"]
    for e in info["per_episode"]:  # the greedy policy moves <= 0.1 m/step from |x0| <= 0.5: needs >= 1 step
        assert 1 <= e["n_steps"] <= 12 and e["max_reward"] <= 0.0
    assert summaries[0]["pc_success"] > summaries[2]["pc_success"]
    for name in ("results.json", "results.csv", "results.md", "report.html", "success_heatmap.png", "success_bars.png"):
        assert (out / name).stat().st_size > 0, name
    md = (out / "results.md").read_text()
    assert "| policy | line | line2 |" in md and "(n=6)" in md
    assert len((out / "results.csv").read_text().strip().splitlines()) == 5
    html = (out / "report.html").read_text()
    assert html.count("<video") == 8 and "numpy" in html
    import imageio.v3 as iio

    assert info["overall"]["video_paths"] == [
        "cells/greedy__line/videos/episode_0000.mp4",
        "cells/greedy__line/videos/episode_0001.mp4",
    ]
    for i, rel in enumerate(info["overall"]["video_paths"]):
        frames = iio.imread(out / rel, plugin="pyav")
        seed = 3 + i
        assert abs(int(frames[0, 8, 8, 0]) - 40 * (seed % 6)) <= 8  # its own episode's reset frame
        assert int(frames[0, 8, 8, 1]) <= 8  # step 0


def test_incompatible_cells_are_listed_before_anything_runs(tmp_path):
    with pytest.raises(IncompatibleSpecError) as err:
        ev.evaluate(
            [("greedy", Greedy), ("twod", TwoD)], ENVS, episodes=2, workers=0, progress=False, out=tmp_path / "out"
        )
    msg = str(err.value)
    assert "twod x line: action dimension: expected 2 (policy), received 1 (env)" in msg
    assert "twod x line2: action dimension" in msg and "greedy x" not in msg
    assert not (tmp_path / "out").exists()


def test_resume_skips_done_cells_and_rejects_other_configs(tmp_path, monkeypatch):
    first = _eval(tmp_path)

    def boom(task):
        raise AssertionError("a finished shard ran again")

    monkeypatch.setattr(ev, "run_shard", boom)
    again = _eval(tmp_path)
    assert [s["pc_success"] for s in again] == [s["pc_success"] for s in first]
    with pytest.raises(ValueError, match=r"different \['seed'\]"):
        _eval(tmp_path, seed=4)


def test_changed_episode_count_extends_or_trims_cells(tmp_path, monkeypatch):
    fresh = {s["policy"] + s["env"]: s for s in _eval(tmp_path / "fresh", episodes=12)}
    _eval(tmp_path, episodes=6)
    ran = []
    real_run_shard = ev.run_shard
    monkeypatch.setattr(ev, "run_shard", lambda task: ran.append((task.cell, task.first)) or real_run_shard(task))
    grown = _eval(tmp_path, episodes=12)
    assert sorted(ran) == sorted(
        (c, f) for c in ("greedy__line", "greedy__line2", "still__line", "still__line2") for f in (6, 9)
    )
    info = json.loads((tmp_path / "out" / "cells" / "greedy__line" / "eval_info.json").read_text())
    assert [e["seed"] for e in info["per_episode"]] == list(range(3, 15))
    for s in grown:  # 6 reused + 6 new episodes give the results of 12 fresh ones
        assert (s["pc_success"], s["avg_sum_reward"]) == (
            fresh[s["policy"] + s["env"]]["pc_success"],
            fresh[s["policy"] + s["env"]]["avg_sum_reward"],
        )
    ran.clear()
    assert all(s["n_episodes"] == 3 for s in _eval(tmp_path, episodes=3)) and ran == []
    _eval(tmp_path, episodes=6, videos=4)  # episodes 2, 3 are now filmed: only the shards holding them run again
    assert sorted(f for _, f in ran) == [0, 0, 0, 0, 3, 3, 3, 3]
    info = json.loads((tmp_path / "out" / "cells" / "still__line" / "eval_info.json").read_text())
    filmed = [int(p[-8:-4]) for p in info["overall"]["video_paths"]]
    ok = {e["index"]: e["success"] for e in info["per_episode"]}
    # + per filming shard (0-2, 3-5) its first failure when its planned films (0-2; 3) all succeeded
    extra = [4 if not ok[4] else 5] if ok[3] and not (ok[4] and ok[5]) else []
    assert filmed == [0, 1, 2, 3, *extra]


def test_changed_seed_is_redone_on_request(tmp_path, monkeypatch):
    _eval(tmp_path, episodes=3)
    with pytest.raises(ValueError, match=r"different \['seed'\].*use another --out or --resume false"):
        _eval(tmp_path, episodes=3, seed=50)
    redone = _eval(tmp_path, episodes=3, seed=50, on_mismatch="redo")
    fresh = _eval(tmp_path / "fresh", episodes=3, seed=50)
    assert [s["avg_sum_reward"] for s in redone] == [s["avg_sum_reward"] for s in fresh]
    assert _eval(tmp_path, episodes=3, seed=3, resume=False)[0]["n_episodes"] == 3


def test_process_pool_matches_inline_and_cli(tmp_path, capsys):
    inline = _eval(tmp_path / "a", workers=0, videos=0)
    pooled = _eval(tmp_path / "b", workers=2, videos=0)
    strip = [{k: v for k, v in s.items() if k != "eval_s"} for s in inline]
    assert strip == [{k: v for k, v in s.items() if k != "eval_s"} for s in pooled]
    register_env("line_cli", Line, overwrite=True)
    register_policy("greedy_cli", Greedy, overwrite=True)
    register_policy("still_cli", Still, overwrite=True)
    rc = eval_cli.main(
        [
            "--policies",
            "greedy_cli,still_cli",
            "--envs",
            "line_cli",
            "--episodes",
            "4",
            "--seed",
            "3",
            "--workers",
            "2",
            "--videos",
            "1",
            "--shard-episodes",
            "2",
            "--out",
            str(tmp_path / "cli"),
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "| greedy_cli |" in out and "(n=4)" in out
    assert (tmp_path / "cli" / "cells" / "still_cli__line_cli" / "videos" / "episode_0000.mp4").is_file()


def test_simulated_latency_stalls_synchronous_but_not_async_execution(tmp_path):
    lat = LatencyConfig("fixed", 2)
    common = dict(episodes=3, seed=3, workers=0, videos=0, progress=False)
    sync = ev.evaluate(
        [POLICIES[1]],
        [ENVS[0]],
        out=tmp_path / "s",
        **common,
        executor=ExecutorConfig(kind="receding_horizon", latency=lat),
    )[0]
    run = ev.evaluate(
        [POLICIES[1]], [ENVS[0]], out=tmp_path / "a", **common, executor=ExecutorConfig(kind="async", latency=lat)
    )[0]
    # "still" never succeeds from |x0| >= 5 cm, so episodes last 12 steps: the synchronous executor re-plans
    # every 2 steps (6 inferences x 2 stall steps); async waits only for each episode's first chunk (2 steps)
    info = json.loads((tmp_path / "s" / "cells" / "still__line" / "eval_info.json").read_text())
    long = [e for e in info["per_episode"] if e["n_steps"] == 12]
    assert long and all(e["stall_steps"] == 12 and e["inferences"] == 6 for e in long)
    info = json.loads((tmp_path / "a" / "cells" / "still__line" / "eval_info.json").read_text())
    assert all((e["stall_steps"], e["inferences"]) == (2, 5) for e in info["per_episode"])  # triggers at 2, 4, .., 10
    assert run["avg_stall_steps"] == 2.0 and sync["avg_stall_steps"] > 2.0


def test_env_placeholder_picks_one_policy_per_env(tmp_path):
    register_env("line_a", Line, overwrite=True)
    register_env("line_b", Line, overwrite=True)
    register_policy("greedy_line_a", Greedy, overwrite=True)
    register_policy("still_line_b", Still, overwrite=True)
    with pytest.raises(UnknownNameError) as err:  # every missing per-env policy, in one error, before any load
        ev.evaluate(
            ["greedy_{env}", "x=nope_{env}"], ["line_a", "line_b"], episodes=2, workers=0, progress=False, out=tmp_path
        )
    assert str(err.value).startswith("policies: expected a checkpoint folder, a tcp:// or xpl:// address or one of [")
    assert str(err.value).endswith("], received ['greedy_line_b', 'nope_line_a', 'nope_line_b']")
    with pytest.raises(UnknownNameError) as err:  # one unknown name: the closest registered one
        ev.evaluate(["greedy_{env}"], ["line_a", "line_b"], episodes=2, workers=0, progress=False, out=tmp_path)
    assert str(err.value).endswith("received 'greedy_line_b'; did you mean 'greedy_line_a'?")
    register_policy("greedy_line_b", Greedy, overwrite=True)
    rows = ev.evaluate(
        ["greedy_{env}"],
        ["line_a", "line_b"],
        episodes=3,
        seed=3,
        workers=0,
        videos=0,
        progress=False,
        out=tmp_path / "ok",
    )
    assert [(r["policy"], r["env"], r["n_episodes"]) for r in rows] == [
        ("greedy", "line_a", 3),
        ("greedy", "line_b", 3),
    ]


@pytest.mark.ray
@pytest.mark.slow
def test_ray_matches_local_pool(tmp_path):
    ray = pytest.importorskip("ray")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    local = _eval(tmp_path / "local", workers=2, videos=0)
    try:  # starts a loopback-only cluster here (tests/runtime/test_ray_cluster.py checks its addresses)
        remote = _eval(tmp_path / "ray", workers=2, videos=0, ray_address="local")
        assert [n["NodeManagerAddress"] for n in ray.nodes()] == ["127.0.0.1"]
    finally:
        ray.shutdown()
    strip = [{k: v for k, v in s.items() if k != "eval_s"} for s in local]
    assert strip == [{k: v for k, v in s.items() if k != "eval_s"} for s in remote]
    cell = ("out", "cells", "greedy__line", "eval_info.json")
    a, b = (json.loads(tmp_path.joinpath(where, *cell).read_text())["per_episode"] for where in ("local", "ray"))
    assert a == b


def test_labels_name_the_run_and_must_be_unique(tmp_path):
    assert ev.reference_label("/a/push_dp/checkpoints/last") == "push_dp"
    assert ev.reference_label("/a/push_dp/checkpoints/005000") == "push_dp_005000"
    assert ev.reference_label("outputs/ckpt/{env}/flow") == "flow"
    assert ev.reference_label("diffusion") == "diffusion"
    assert ev.reference_label("tcp://host:5555") == "tcp://host:5555"
    assert ev.labelled("mine=/a/run/checkpoints/last") == ("mine", "/a/run/checkpoints/last")
    with pytest.raises(ValueError) as err:  # both would be cell "run__line": one would never be evaluated
        ev.evaluate(["/x/run/checkpoints/last", "/y/run/checkpoints/last"], ENVS, progress=False, out=tmp_path)
    assert str(err.value) == (
        "policies: expected unique labels, received label 'run' for both '/x/run/checkpoints/last' and "
        "'/y/run/checkpoints/last'; name them with label=reference (e.g. --policies "
        "a=/x/run/checkpoints/last,b=/y/run/checkpoints/last)"
    )
    assert not (tmp_path / "cells").exists()


def test_cli_label_syntax_evaluates_every_policy(tmp_path, capsys):
    register_env("line_lbl", Line, overwrite=True)
    register_policy("greedy_lbl", Greedy, overwrite=True)
    register_policy("still_lbl", Still, overwrite=True)
    args = ["--envs", "line_lbl", "--episodes", "4", "--seed", "3", "--workers", "0", "--videos", "0"]
    assert eval_cli.main(["--policies", "g=greedy_lbl,s=still_lbl", *args, "--out", str(tmp_path)]) == 0
    cells = sorted(p.name for p in (tmp_path / "cells").iterdir())
    assert cells == ["g__line_lbl", "s__line_lbl"]
    table = capsys.readouterr().out
    assert "| g |" in table and "| s |" in table


def test_cli_rejects_bad_counts_and_executor_settings(tmp_path):
    register_env("line_lbl", Line, overwrite=True)
    register_policy("greedy_lbl", Greedy, overwrite=True)
    base = ["--policies", "greedy_lbl", "--envs", "line_lbl", "--out", str(tmp_path)]
    with pytest.raises(ValueError, match=r"^workers: expected an integer >= 0, received -2$"):
        eval_cli.main([*base, "--workers", "-2"])
    with pytest.raises(ValueError, match=r"^seed: expected an integer >= 0, received -1$"):  # was gym's traceback
        eval_cli.main([*base, "--seed", "-1"])
    for flag in ("episodes", "num_envs", "shard_episodes"):
        with pytest.raises(ValueError, match=rf"^{flag}: expected an integer >= 1, received 0$"):
            eval_cli.main([*base, f"--{flag}", "0"])
    with pytest.raises(ValueError, match=r"^executor.kind: expected one of .*received 'fastest'$"):
        eval_cli.main([*base, "--executor.kind", "fastest"])
    with pytest.raises(IncompatibleSpecError) as err:  # listed with the cells, before anything runs
        eval_cli.main([*base, "--workers", "0", "--executor.n_action_steps", "99"])
    assert "greedy_lbl x line_lbl: executor.n_action_steps: expected <= the policy's chunk_size (4), received 99" in (
        str(err.value)
    )
    assert not (tmp_path / "cells").exists()


def test_env_kwargs_default_to_the_checkpoints_observation_mode(tmp_path, capsys):
    import yaml

    from policylink.evaluate.refs import checkpoint_env_kwargs_of

    def ckpt(name, dataset):
        d = tmp_path / name
        d.mkdir()
        (d / "config.yaml").write_text(yaml.safe_dump({"policy": {}, "train": {"dataset": dataset}}))
        return str(d)

    image = ckpt("img_push", {"obs_mode": "image+proprio", "image_size": 64})
    image2 = ckpt("img2_push", {"obs_mode": "image+proprio", "image_size": 64})
    small = ckpt("small_push", {"obs_mode": "image+proprio", "image_size": 32})
    state = ckpt("state_push", {"obs_mode": "state", "image_size": 96})
    per_env = str(tmp_path / "img_{env}")
    assert checkpoint_env_kwargs_of([("a", image), ("b", image2)], ["push"]) == {
        "obs_mode": "image+proprio",
        "image_size": 64,
    }
    assert "env_kwargs from the checkpoints" in capsys.readouterr().err
    assert checkpoint_env_kwargs_of([("a", per_env)], ["push"]) == {"obs_mode": "image+proprio", "image_size": 64}
    assert checkpoint_env_kwargs_of([("a", image), ("b", small)], ["push"]) == {}  # they disagree: spec check names it
    assert checkpoint_env_kwargs_of([("a", state)], ["push"]) == {}  # the env default already
    assert checkpoint_env_kwargs_of([("a", "push_expert"), ("b", "tcp://127.0.0.1:5555")], ["push"]) == {}
    from policylink.evaluate.nxm import EvalConfig, _resolve

    cfg = EvalConfig(policies=[], envs=[], env_kwargs={"image_size": 48})  # given without obs_mode: it is kept
    _resolve(cfg, [("a", image)], ["push"])
    assert cfg.env_kwargs == {"obs_mode": "image+proprio", "image_size": 48}


def test_bad_device_is_one_clear_error():
    import torch

    from policylink.policies.checkpoint import resolve_device

    with pytest.raises(ValueError, match=r"device: expected 'auto', 'cpu' or 'cuda\[:N\]', received 'tpu'"):
        resolve_device("tpu")
    for parsed_by_torch in ("mps", "meta", "xpu:0"):  # torch.device() accepts them; the policies run on cpu/cuda
        expected = rf"device: expected 'auto', 'cpu' or 'cuda\[:N\]', received '{parsed_by_torch}'"
        with pytest.raises(ValueError, match=expected):
            resolve_device(parsed_by_torch)
    assert resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device: 'cuda' requested but CUDA is not available here"):
            resolve_device("cuda")


def test_missing_checkpoint_is_reported_as_missing(tmp_path):
    with pytest.raises(
        FileNotFoundError,
        match=r"checkpoint folder not found: .*/nope/line/checkpoints/last, "
        r".*/nope/line2/checkpoints/last \(policylink train writes",
    ):
        ev.evaluate(
            [str(tmp_path / "nope/{env}/checkpoints/last")],
            ENVS,
            episodes=1,
            workers=0,
            progress=False,
            out=tmp_path / "out",
        )
    with pytest.raises(FileNotFoundError, match=r"not found: .*/lr/pretrained_model \(a LeRobot checkpoint is the"):
        ev.evaluate([f"lerobot:{tmp_path}/lr/pretrained_model"], ENVS, episodes=1, workers=0, progress=False)


def test_seeds_that_recorded_the_demos_are_warned_about(tmp_path, capsys):
    from policylink.data.buffer import EpisodeStore
    from policylink.data.episode_meta import EpisodeMeta

    store = tmp_path / "demos.zarr"
    with EpisodeStore(str(store), "w") as s:
        for seed in (0, 1, 2, 7):
            s.add_episode(
                {STATE: np.zeros((3, 1), np.float32), "action": np.zeros((3, 1), np.float32)}, EpisodeMeta(seed=seed)
            )
    ckpt = tmp_path / "run" / "checkpoints" / "last"
    ckpt.mkdir(parents=True)
    (ckpt / "config.yaml").write_text(f"train:\n  dataset:\n    path: {store}\n")
    assert ev.warn_recorded_seed_overlap([str(ckpt), "greedy"], 1, 10) == [1, 2, 7]
    err = capsys.readouterr().err
    assert f"warning: evaluation seeds 1..7 (3 of 10) were used to record the demonstrations of {ckpt}" in err
    assert ev.warn_recorded_seed_overlap([str(ckpt)], 100_000, 50) == [] and capsys.readouterr().err == ""
    assert ev.EvalConfig().seed == 100_000


class EmbedGreedy(Greedy):
    """Greedy with a 2-wide observation latent (x, 0), so the corrective executor accepts it."""

    latent_dim = 2

    def embed(self, obs=None, env_ids=None):
        x = self.history[STATE][:, -1]
        return np.concatenate([x, np.zeros_like(x)], 1).astype(np.float32)


def test_a_monitor_of_another_policy_is_named_before_any_progress_bar(tmp_path, capsys):
    from policylink.policies.corrector.config import CorrectiveConfig
    from policylink.policies.corrector.monitor import LatentMonitor, MonitorConfig, save_monitor

    folder = save_monitor(tmp_path / "mon", LatentMonitor(2, 3, MonitorConfig(horizon=2, hidden_dim=8)))
    executor = ExecutorConfig(kind="corrective", corrective=CorrectiveConfig(monitor=str(folder)))
    with pytest.raises(IncompatibleSpecError) as err:
        ev.evaluate([("eg", EmbedGreedy)], [("line", _line)], episodes=2, workers=0, videos=0, progress=True,
                    executor=executor, out=tmp_path / "out")  # fmt: skip
    assert "eg x line: executor.corrective.monitor: expected action_dim 1 (the policy's), received 3 (a monitor of " \
           "another policy?)" in str(err.value)  # fmt: skip
    assert capsys.readouterr().err == "" and not (tmp_path / "out").exists()  # no bar started, nothing written


def test_saved_env_kwargs_do_not_depend_on_mapping_key_order():
    from policylink.evaluate.resume import result_settings

    a = ev.EvalConfig(env_kwargs={"perturbation": {"force": 2.0, "displacement": 0.03}, "image_size": 64})
    b = ev.EvalConfig(env_kwargs={"image_size": 64, "perturbation": {"displacement": 0.03, "force": 2.0}})
    assert result_settings(a) == result_settings(b)
    assert result_settings(a)["env_kwargs"] == {
        "perturbation": '{"displacement": 0.03, "force": 2.0}',
        "image_size": "64",
    }


def test_an_unreachable_policy_server_is_its_own_error_not_an_incompatible_cell(tmp_path):
    """``xpl://`` with nothing listening: the ConnectionError naming the address, not an IncompatibleSpecError."""
    import socket

    register_env("line_a", Line, overwrite=True)
    with socket.socket() as s:  # a loopback port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectionError, match=f"127.0.0.1:{port}") as err:
        ev.evaluate([f"xpl://127.0.0.1:{port}"], ["line_a"], episodes=1, workers=0, progress=False, out=tmp_path)
    assert not isinstance(err.value, IncompatibleSpecError)


def test_gap_given_twice_must_agree():
    """``--gap`` is ``env_kwargs: {gap: ...}``: the same preset twice is one gap; two different ones are refused."""
    assert ev.EvalConfig(gap="worn_gantry", env_kwargs={"gap": "worn_gantry"}).env_kwargs == {"gap": "worn_gantry"}
    with pytest.raises(ValueError, match=r"^gap: expected one reality gap, received --gap 'worn_gantry' and "
                                         r"env_kwargs gap 'noisy_sensors' \(give it once\)$"):  # fmt: skip
        ev.EvalConfig(gap="worn_gantry", env_kwargs={"gap": "noisy_sensors"})


def test_run_takes_gap_as_eval_does():
    from policylink.evaluate.run import RunConfig

    assert RunConfig(gap="noisy_sensors", env_kwargs={"image_size": 32}).env_kwargs == {
        "image_size": 32,
        "gap": "noisy_sensors",
    }
    assert RunConfig().env_kwargs == {}
    with pytest.raises(ValueError, match=r"^gap: expected one reality gap, received --gap 'a' and env_kwargs gap 'b'"):
        RunConfig(gap="a", env_kwargs={"gap": "b"})
