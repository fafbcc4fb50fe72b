"""The one rollout loop: terminal-step metrics, planned seeds with SAME_STEP autoreset, videos that start at their
own episode's first frame, recording through the data recorder, subscribers, and ``policylink run``."""

import re

import numpy as np
import pytest

from policylink.adapters.env import EnvAdapter
from policylink.adapters.policy import HistoryPolicy
from policylink.adapters.registry import register_env, register_policy
from policylink.adapters.schema import ActionSpec, EnvSpec, FeatureSpec, IncompatibleSpecError, PolicySpec
from policylink.cli import run as run_cli
from policylink.data.buffer import EpisodeStore
from policylink.data.recorder import EpisodeRecorder
from policylink.evaluate import run as run_cmd
from policylink.policies import load_policy
from policylink.runtime import rollout as ro
from policylink.runtime.checks import limit_threads
from policylink.runtime.executors import ExecutorConfig, make_executor

STATE = "observation.state"
ACTION = ActionSpec(("u",), "ee_delta", ("m",), (-1.0,), (1.0,))


class Countdown(EnvAdapter):
    """state = (seed, t). Step t (1-based) gives reward t - 4 (so -3, -2, -1, ...); the episode terminates
    after ``3 + seed % 3`` steps, successfully when the seed is even. Frames encode (seed, t)."""

    env_spec = EnvSpec("countdown", {STATE: FeatureSpec("float32", (2,))}, ACTION, 10.0, 50)

    def __init__(self, render_mode="rgb_array"):
        self.render_mode = render_mode
        self._init_spaces()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.seed_, self.t = (-1 if seed is None else seed), 0
        return self._obs(), {"is_success": False}

    def step(self, action):
        self.t += 1
        end = self.t >= 3 + self.seed_ % 3
        ok = bool(end and self.seed_ % 2 == 0)
        return self._obs(), float(self.t - 4), end, False, {"is_success": ok}

    def render(self):
        frame = np.zeros((8, 8, 3), np.uint8)
        frame[..., 0], frame[..., 1] = self.seed_ % 256, self.t
        return frame

    def _obs(self):
        return {STATE: np.array([self.seed_, self.t], np.float32)}


class Zero(HistoryPolicy):
    """Chunks of zeros (4 steps)."""

    def __init__(self):
        super().__init__(PolicySpec({STATE: FeatureSpec("float32", (2,))}, ACTION, chunk_size=4, n_action_steps=2))

    def _predict(self, history, pad_mask, tasks):
        return np.zeros((history[STATE].shape[0], 4, 1), np.float32)


def test_metrics_stop_at_the_terminal_step():
    # rewards -3, -2, -1 ending at step 3, then padding that must not count
    n, total, best, ok = ro.episode_metrics([-3, -2, -1, 5, 7], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1])
    assert (n, total, best, ok) == (3, -6.0, -1.0, False)
    assert ro.episode_metrics([1, 2], [0, 0], [0, 1]) == (2, 3.0, 2.0, True)  # never done: every step counts
    with pytest.raises(ValueError, match="equal non-empty"):
        ro.episode_metrics([1], [0, 1], [0])


def _run(n_episodes, num_envs, seed=0, **kw):
    vec = ro.make_vector_env(Countdown, ro.plan_episodes(n_episodes, seed, num_envs), max_episode_steps=50)
    ex = make_executor(Zero(), ExecutorConfig())
    try:
        return ro.rollout(vec, ex, n_episodes, **kw)
    finally:
        vec.close()


def test_rollout_counts_each_episode_up_to_its_terminal_step():
    results = _run(5, num_envs=2, video_episodes=[0, 3])
    assert [r.index for r in results] == [0, 1, 2, 3, 4] and [r.seed for r in results] == [0, 1, 2, 3, 4]
    # seed s lasts 3 + s % 3 steps: rewards -3..(n-4); the slot keeps running other episodes afterwards
    assert [r.n_steps for r in results] == [3, 4, 5, 3, 4]
    assert [r.max_reward for r in results] == [-1.0, 0.0, 1.0, -1.0, 0.0]
    assert [r.sum_reward for r in results] == [-6.0, -6.0, -5.0, -6.0, -6.0]
    assert [r.success for r in results] == [True, False, True, False, True]
    assert [r.inferences for r in results] == [2, 2, 3, 2, 2]  # re-plan every 2 steps, fresh at each episode
    for r in results:
        if r.index in (0, 3):  # video: its own reset frame, one frame per step, the terminal state last
            seeds = [int(f[0, 0, 0]) for f in r.frames]
            ts = [int(f[0, 0, 1]) for f in r.frames]
            assert seeds == [r.seed] * (r.n_steps + 1) and ts == list(range(r.n_steps + 1))
        else:
            assert r.frames is None


def test_rollout_results_do_not_depend_on_the_number_of_envs():
    one = [r.to_dict() for r in _run(6, num_envs=1, seed=10)]
    three = [r.to_dict() for r in _run(6, num_envs=3, seed=10)]
    assert one == three


def test_rollout_records_episodes(tmp_path):
    rec = EpisodeRecorder(tmp_path / "store.zarr", env_spec=Countdown.env_spec)
    _run(3, num_envs=2, recorder=rec)
    rec.close()
    store = EpisodeStore(tmp_path / "store.zarr", "r")
    assert store.n_episodes == 3
    assert sorted(store.episode_lengths.tolist()) == [3, 4, 5]
    metas = store.all_meta()
    assert sorted((m.seed, m.success) for m in metas) == [(0, True), (1, False), (2, True)]
    first = store.get_episode([m.seed for m in metas].index(0))
    np.testing.assert_array_equal(first[STATE][:, 1], [0, 1, 2])  # o_t that each action answered


def test_a_recorder_without_meta_tags_its_episodes_policy_as_run_robot_records_them(tmp_path):
    """``run --robot --record`` opens its DeployRecorder without a meta; its episodes were tagged ``unknown``."""
    from policylink.real.deploy import DeployRecorder

    for i, subscriber in enumerate((ro.RecorderSubscriber, DeployRecorder)):
        rec = EpisodeRecorder(tmp_path / f"store{i}.zarr", env_spec=Countdown.env_spec)
        _run(2, num_envs=1, subscribers=[subscriber(rec)])
        rec.close()
        metas = EpisodeStore(tmp_path / f"store{i}.zarr", "r").all_meta()
        assert [(m.seed, m.source) for m in metas] == [(0, "policy"), (1, "policy")]


class Log(ro.EpisodeSubscriber):
    """Logs every hook call as a tuple."""

    def __init__(self):
        self.events = []

    def on_reset(self, slot, index, seed, info):
        self.events.append(("reset", slot, index, seed))

    def on_step(self, slot, obs, action, reward, done, info):
        self.events.append(("step", slot, int(obs[STATE][0]), int(obs[STATE][1]), reward, done, info["is_success"]))

    def on_episode_end(self, slot, result):
        self.events.append(("end", slot, result.index, result.n_steps))


def test_a_subscriber_sees_every_step_of_every_planned_episode_once():
    log = Log()
    results = _run(5, num_envs=2, seed=10, subscribers=[log])
    assert [r.seed for r in results] == [10, 11, 12, 13, 14]
    for r in results:
        slot = next(e[1] for e in log.events if e[0] == "reset" and e[2] == r.index)
        assert log.events.count(("reset", slot, r.index, r.seed)) == 1
        steps = [e for e in log.events if e[0] == "step" and e[2] == r.seed]
        # o_t of each step once, t = 0 .. n-1; reward t+1-4; done and success only on the last step
        assert [e[3] for e in steps] == list(range(r.n_steps)) == list(range(3 + r.seed % 3))
        assert [e[4] for e in steps] == [float(t - 3) for t in range(r.n_steps)]
        assert [e[5] for e in steps] == [False] * (r.n_steps - 1) + [True]
        assert [e[6] for e in steps] == [False] * (r.n_steps - 1) + [r.seed % 2 == 0]
        assert all(e[1] == slot for e in steps)
        assert log.events.count(("end", slot, r.index, r.n_steps)) == 1
        # hooks come in order for the episode: reset, its steps, end
        mine = [e for e in log.events if e[1] == slot]
        i = mine.index(("reset", slot, r.index, r.seed))
        assert mine[i + 1 : i + 1 + r.n_steps] == steps and mine[i + 1 + r.n_steps] == ("end", slot, r.index, r.n_steps)
    assert sum(e[0] == "step" for e in log.events) == sum(r.n_steps for r in results) == 4 + 5 + 3 + 4 + 5
    assert all(e[2] >= 0 for e in log.events if e[0] != "step")  # padding episodes are never reported


def test_video_subscriber_writes_each_filmed_episode(tmp_path):
    from policylink.data.video import decode_video

    video = ro.VideoSubscriber([1, 2], tmp_path / "videos", fps=10)
    results = _run(3, num_envs=2, subscribers=[video])
    assert sorted(video.paths) == [1, 2] and all(r.frames is None for r in results)
    frames, _ = decode_video(video.paths[2])
    assert video.paths[2].name == "episode_0002.mp4"
    assert frames.shape == (results[2].n_steps + 1, 8, 8, 3) == (6, 8, 8, 3)  # reset frame + 5 steps (terminal too)
    assert np.abs(frames[:, 4, 4, 1].astype(int) - np.arange(6)).max() <= 3  # green = t, lossy codec


def test_video_keeps_a_failure_and_captions_each_frame(tmp_path, monkeypatch):
    from policylink.data import video as video_module
    from policylink.data.video import decode_video

    class Wide(Countdown):  # 96 px wide: captioned (Countdown's 8 px frames are too small for text)
        def render(self):
            return np.repeat(np.repeat(super().render(), 12, axis=0), 12, axis=1)

    captions = {}
    burn = video_module.caption_frames

    def spy(frames, texts, colour):
        captions[texts[0].split(" |")[0]] = list(texts)
        return burn(frames, texts, colour)

    monkeypatch.setattr(video_module, "caption_frames", spy)
    video = ro.VideoSubscriber([0], tmp_path / "videos", fps=10, failures=1)
    vec = ro.make_vector_env(Wide, ro.plan_episodes(5, 0, 2), max_episode_steps=50)
    try:
        results = ro.rollout(vec, make_executor(Zero(), ExecutorConfig()), 5, subscribers=[video])
    finally:
        vec.close()
    assert [r.success for r in results] == [True, False, True, False, True]
    assert sorted(video.paths) == [0, 1]  # the planned film, and the first failure (episode 1; not episode 3)
    frames, _ = decode_video(video.paths[1])
    assert frames.shape == (results[1].n_steps + 1, 96 + 12, 96, 3) == (5, 108, 96, 3)  # + a 12 px caption strip
    assert np.abs(frames[:, 48, 48, 1].astype(int) - np.arange(5)).max() <= 3  # the frame itself is untouched
    strip = frames[:, 96:].astype(int)
    # the outcome only on the terminal frame: grey (60, 60, 60) "running" strips, then red (200, 50, 40), a failure
    assert (np.abs(strip[:-1, -2, 1] - [60, 60, 60]).max(axis=1) <= 30).all()
    assert np.abs(strip[-1, -2, 1] - [200, 50, 40]).max() <= 30
    assert (strip.max(axis=(1, 2, 3)) >= 200).all()  # white caption text on every frame
    assert captions["ep 1"] == [f"ep 1 | seed 1 | step {t}/4 | running" for t in range(4)] + [
        "ep 1 | seed 1 | step 4/4 | failure"
    ]
    assert captions["ep 0"][-2:] == ["ep 0 | seed 0 | step 2/3 | running", "ep 0 | seed 0 | step 3/3 | success"]
    assert ro.VideoSubscriber([0], tmp_path, fps=10).failures == 0
    with pytest.raises(ValueError, match="^failures: expected an int >= 0, received -1$"):
        ro.VideoSubscriber([0], tmp_path, fps=10, failures=-1)


def test_perturb_reaches_the_env_but_subscribers_see_the_clean_action():
    seen, sent = [], []

    class Spy(Countdown):
        def step(self, action):
            sent.append(float(action[0]))
            return super().step(action)

    class Actions(ro.EpisodeSubscriber):
        def on_step(self, slot, obs, action, reward, done, info):
            seen.append(float(action[0]))

    vec = ro.make_vector_env(Spy, ro.plan_episodes(1, 0, 1))
    try:
        ro.rollout(vec, make_executor(Zero(), ExecutorConfig()), 1, subscribers=[Actions()], perturb=lambda a: a + 0.5)
    finally:
        vec.close()
    assert seen == [0.0, 0.0, 0.0] and sent == [0.5, 0.5, 0.5]


def test_a_monitor_subscriber_can_truncate_the_executing_chunk():
    class TruncateEveryStep(ro.EpisodeSubscriber):
        def on_start(self, vec_env, source):
            self.executor = source

        def on_step(self, slot, obs, action, reward, done, info):
            self.executor.truncate([slot])

    plain = _run(3, num_envs=2)
    monitored = _run(3, num_envs=2, subscribers=[TruncateEveryStep()])
    assert [r.inferences for r in plain] == [2, 2, 3]  # a chunk every 2 steps
    assert [r.inferences for r in monitored] == [r.n_steps for r in monitored] == [3, 4, 5]  # a plan every step


def test_training_time_evaluation_runs_the_same_loop():
    pytest.importorskip("torch")
    from policylink.train.imitation import DatasetConfig, evaluate_success

    register_env("countdown_train", lambda obs_mode="state": Countdown(), overwrite=True)
    # seeds 0..3 on Countdown: the even ones succeed
    assert evaluate_success(Zero(), DatasetConfig(env="countdown_train"), episodes=4, seed=0) == 0.5
    assert evaluate_success(Zero(), DatasetConfig(env="countdown_train"), episodes=3, seed=1) == 1 / 3


def test_run_command(capsys):
    register_env("countdown_run", Countdown, overwrite=True)
    register_policy("zero_run", Zero, overwrite=True)
    assert (
        run_cli.main(
            ["--policy", "zero_run", "--env", "countdown_run", "--episodes", "3", "--num_envs", "2", "--seed", "0"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "episode 2 seed 2: success=True steps=5" in out and "success: 2/3 (66.7%)" in out


def test_run_record_tags_perturbed_rollouts(tmp_path, capsys):
    from policylink.data.buffer import EpisodeStore

    register_env("countdown_pert", lambda perturbation=None: Countdown(), overwrite=True)
    register_policy("zero_run", Zero, overwrite=True)
    base = ["--policy", "zero_run", "--env", "countdown_pert", "--episodes", "2", "--seed", "0"]
    run_cli.main([*base, "--record", str(tmp_path / "clean.zarr")])
    run_cli.main([*base, "--record", str(tmp_path / "p.zarr"), "--env_kwargs", "{perturbation: {displacement: 0.03}}"])
    assert [m.quality for m in EpisodeStore(tmp_path / "clean.zarr").all_meta()] == ["", ""]
    assert [m.quality for m in EpisodeStore(tmp_path / "p.zarr").all_meta()] == ["perturbed", "perturbed"]
    assert {m.source for m in EpisodeStore(tmp_path / "p.zarr").all_meta()} == {"policy"}


class TwoD(Zero):
    """Zero chunks of a 2-D action (incompatible with Countdown's 1-D action)."""

    def __init__(self):
        HistoryPolicy.__init__(
            self,
            PolicySpec(
                {STATE: FeatureSpec("float32", (2,))},
                ActionSpec(("a", "b"), "ee_delta", ("m", "m"), (-1, -1), (1, 1)),
                chunk_size=4,
                n_action_steps=2,
            ),
        )


RUN = ["--policy", "zero_run", "--env", "countdown_run"]


def test_run_rejects_bad_counts_and_executor_settings_by_field():
    register_env("countdown_run", Countdown, overwrite=True)
    register_policy("zero_run", Zero, overwrite=True)
    with pytest.raises(ValueError, match=r"^episodes: expected an integer >= 1, received -1$"):
        run_cli.main([*RUN, "--episodes", "-1"])
    with pytest.raises(ValueError, match=r"^seed: expected an integer >= 0, received -1$"):  # was gym's traceback
        run_cli.main([*RUN, "--seed", "-1"])
    with pytest.raises(ValueError, match=r"^num_envs: expected an integer >= 1, received 0$"):
        run_cli.main([*RUN, "--num_envs", "0"])
    with pytest.raises(
        ValueError,
        match=r"^executor.kind: expected one of \['receding_horizon', 'temporal_ensemble', 'async', 'corrective'\], "
        r"received 'fastest'$",
    ):
        run_cli.main([*RUN, "--executor.kind", "fastest"])
    with pytest.raises(ValueError, match=r"^executor.n_action_steps: expected >= 1 \(or None\), received 0$"):
        run_cli.main([*RUN, "--executor.n_action_steps", "0"])


def test_run_checks_the_pair_and_the_executor_before_running(monkeypatch):
    register_env("countdown_run", Countdown, overwrite=True)
    register_policy("zero_run", Zero, overwrite=True)
    register_policy("twod_run", TwoD, overwrite=True)

    def never(*a, **k):
        raise AssertionError("episodes started before the check")

    monkeypatch.setattr(run_cmd, "make_vector_env", never)
    with pytest.raises(IncompatibleSpecError) as err:
        run_cli.main([*RUN, "--executor.n_action_steps", "99"])
    assert str(err.value).endswith(
        "- zero_run x countdown_run: executor.n_action_steps: expected <= the policy's chunk_size (4), received 99"
    )
    with pytest.raises(IncompatibleSpecError, match=r"twod_run x countdown_run: action dimension: expected 2"):
        run_cli.main(["--policy", "twod_run", "--env", "countdown_run"])


def test_policy_references_that_cannot_load_say_why(tmp_path):
    missing = str(tmp_path / "nonexistent" / "checkpoints" / "last")
    with pytest.raises(FileNotFoundError, match=f"^checkpoint folder not found: {re.escape(missing)} "):
        load_policy(missing)
    with pytest.raises(ValueError, match=r"^policy 'diffusion' needs a checkpoint: pass the checkpoint folder"):
        load_policy("diffusion")
    with pytest.raises(KeyError, match="no_such_policy"):
        load_policy("no_such_policy")


def test_limit_threads_caps_torch():
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    try:
        limit_threads(1)
        assert torch.get_num_threads() == 1
        limit_threads(0)  # 0 leaves torch's setting alone
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
