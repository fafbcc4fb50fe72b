"""``policylink record`` end to end on a tiny EnvAdapter with a scripted expert (known trajectories)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from policylink.adapters import registry
from policylink.adapters.env import EnvAdapter
from policylink.adapters.schema import ActionSpec, EnvSpec, FeatureSpec
from policylink.cli.record import main as record_main
from policylink.data.buffer import EpisodeStore
from policylink.data.episode_meta import EpisodeMeta
from policylink.data.recorder import EpisodeRecorder
from policylink.runtime import record as record_cli
from policylink.runtime.record import record_episode


class PointEnv(EnvAdapter):
    """x in [-1, 1]; action moves x by a (clipped to 0.25); success when |x| < 0.05; 8 steps max."""

    def __init__(self, obs_mode: str = "state", image_size: int = 4):
        feats = {}
        if "state" in obs_mode:
            feats["observation.state"] = FeatureSpec("float32", (1,))
        if "image" in obs_mode:
            feats["observation.images.top"] = FeatureSpec("uint8", (image_size, image_size, 3))
        act = ActionSpec(("dx",), "ee_delta", ("m",), (-0.25,), (0.25,))
        self.env_spec = EnvSpec("point", feats, act, control_frequency=10.0, max_episode_steps=8)
        self._init_spaces()
        self.image_size = image_size

    def _obs(self):
        out = {}
        if "observation.state" in self.env_spec.observation_features:
            out["observation.state"] = np.array([self.x], np.float32)
        if "observation.images.top" in self.env_spec.observation_features:
            img = np.zeros((self.image_size, self.image_size, 3), np.uint8)
            img[..., 0] = int(round(127.5 * (self.x + 1)))  # red encodes x
            out["observation.images.top"] = img
        return out

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = float(self.np_random.uniform(-1, 1))
        return self._obs(), {"is_success": False}

    def step(self, action):
        self.x = float(np.clip(self.x + np.clip(action[0], -0.25, 0.25), -1, 1))
        ok = abs(self.x) < 0.05
        return self._obs(), float(ok), ok, False, {"is_success": ok}


class PointExpert:
    """Moves to 0; 'poor' moves away from 0 by 0.25 per step."""

    def __init__(self, env, quality="expert", seed=None):
        self.sign = -1.0 if quality == "expert" else 1.0

    def reset(self, seed=None):
        pass

    def act(self, obs, env):
        if self.sign > 0:
            return np.array([0.25 if env.x >= 0 else -0.25], np.float32)
        return np.array([-env.x], np.float32)


@pytest.fixture
def point_env(monkeypatch):
    registry.register_env("point_test", PointEnv, overwrite=True)
    fake = types.ModuleType("policylink.sim.experts")
    fake.make_expert = PointExpert
    monkeypatch.setitem(sys.modules, "policylink.sim.experts", fake)
    yield


def test_record_episode_pairs_obs_with_action(tmp_path):
    env = PointEnv()
    with EpisodeRecorder(tmp_path / "p.zarr", env_spec=env.env_spec) as rec:
        idx, success, n = record_episode(
            env, lambda o: np.array([-0.1], np.float32), rec, seed=5, meta=EpisodeMeta(source="policy", quality="const")
        )
    ep = EpisodeStore(tmp_path / "p.zarr").get_episode(idx)
    x = ep["observation.state"][:, 0]
    np.testing.assert_allclose(np.diff(x), -0.1, atol=1e-6)  # o_{t+1} = o_t + a_t
    assert len(x) == n
    meta = EpisodeStore(tmp_path / "p.zarr").episode_meta(idx)
    assert meta.seed == 5 and meta.source == "policy" and meta.success == success


def test_record_episode_exception_discards(tmp_path):
    env = PointEnv()

    def bad_policy(obs):
        if obs["observation.state"][0] < 2:
            raise RuntimeError("policy crashed")

    with EpisodeRecorder(tmp_path / "p.zarr") as rec:
        with pytest.raises(RuntimeError, match="policy crashed"):
            record_episode(env, bad_policy, rec, seed=0)
        assert not rec.is_recording()
    assert EpisodeStore(tmp_path / "p.zarr").n_episodes == 0


def test_cli_records_expert_with_seeds_and_summary(tmp_path, point_env, capsys):
    out = tmp_path / "rec.zarr"
    rc = record_main(
        [
            "--env",
            "point_test",
            "--expert",
            "expert",
            "--episodes",
            "4",
            "--out",
            str(out),
            "--seed",
            "10",
            "--obs-mode",
            "state+image",
        ]
    )
    assert rc == 0
    s = EpisodeStore(out)
    assert s.n_episodes == 4
    assert s.info["fps"] == 10.0 and s.info["env"] == "point" and s.info["action"]["names"] == ["dx"]
    assert [m.seed for m in s.all_meta()] == [10, 11, 12, 13]
    assert all(m.success and m.source == "expert" and m.quality == "expert" for m in s.all_meta())
    # the expert moves 0.25 per step (clipped) and lands on 0: ceil(|x0| / 0.25) steps
    x0 = [s.get_episode(i)["observation.state"][0, 0] for i in range(4)]
    lengths = [int(np.ceil(abs(x) / 0.25 - 1e-6)) for x in x0]
    np.testing.assert_array_equal(s.episode_lengths, lengths)
    img = s.get_episode(0)["observation.images.top"]
    assert img.shape[1:] == (96, 96, 3) and img[0, 0, 0, 0] == int(round(127.5 * (x0[0] + 1)))
    text = capsys.readouterr().out
    assert f"recorded 4 episodes, {sum(lengths)} frames, success rate 1.00 (4/4)" in text
    # appending more with a poor expert: success rate 0, the store grows
    cfg = record_cli.RecordConfig(
        env="point_test", expert="poor", episodes=2, out=str(out), seed=0, obs_mode="state+image"
    )
    summary = record_cli.record(cfg, progress=False)
    assert summary.success_rate == 0.0 and summary.frames == 16  # 2 x 8 steps (max_episode_steps)
    assert EpisodeStore(out).n_episodes == 6


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--episodes", "0", "episodes: expected an int >= 1, received 0"),
        ("--max_steps", "0", "max_steps: expected an int >= 1 (or omit it for the env's limit), received 0"),
        ("--max-steps", "-1", "max_steps: expected an int >= 1 (or omit it for the env's limit), received -1"),
        ("--expert", "great", "expert: expected one of ['expert', 'noisy', 'poor'], received 'great'"),
        (
            "--expert",
            "expertt",
            "expert: expected one of ['expert', 'noisy', 'poor'], received 'expertt'; did you mean 'expert'?",
        ),
        (
            "--obs-mode",
            "depth",
            "obs_mode: expected one of ['state', 'image', 'state+image', 'image+proprio', 'pointmap+proprio', "
            "'image+pointmap+proprio'], received 'depth'",
        ),
        (
            "--obs-mode",
            "state_image",
            "obs_mode: expected one of ['state', 'image', 'state+image', 'image+proprio', 'pointmap+proprio', "
            "'image+pointmap+proprio'], received 'state_image'; did you mean 'state+image'?",
        ),
        ("--dart_noise", "1.5", "dart_noise: expected a value in [0, 1], received 1.5"),
        (
            "--perturbation",
            "{push: 0.03}",
            "'point_test' env kwarg perturbation: unknown key(s) ['push']: expected keys among ('action_noise_std', "
            "'action_delay_steps', 'displacement', 'displacement_steps', 'force', 'force_probability', "
            "'force_duration_steps'), received {'push': 0.03}",
        ),
        (
            "--perturbation",
            "{force: -1}",
            "'point_test' env kwarg perturbation.force: expected a magnitude >= 0 N, received -1",
        ),
    ],
)
def test_cli_rejects_bad_values(tmp_path, point_env, flag, value, message):
    out = tmp_path / "x.zarr"
    with pytest.raises(ValueError) as e:
        record_main(["--env", "point_test", "--out", str(out), flag, value])
    assert str(e.value) == message
    assert not out.exists()  # nothing created


def test_a_bad_perturbation_of_a_mujoco_task_is_one_line_before_any_work(tmp_path, monkeypatch, capsys):
    from policylink.cli.app import DEBUG_ENV, run_main

    monkeypatch.delenv(DEBUG_ENV, raising=False)
    out = tmp_path / "x.zarr"
    for value, message in [
        ("{force: -1}", "perturbation.force: expected a magnitude >= 0 N, received -1"),
        (
            "{forc: 1}",
            "perturbation: expected one of ['action_noise_std', 'action_delay_steps', 'displacement', "
            "'displacement_steps', 'force', 'force_probability', 'force_duration_steps'], received 'forc'; "
            "did you mean 'force'?",
        ),  # fmt: skip
    ]:
        argv = ["--env", "push", "--out", str(out), "--perturbation", value]
        assert run_main("record", record_main, argv) == 2
        assert capsys.readouterr().err == f"policylink record: error: 'push' env kwarg {message}\n"
    assert not out.exists()


def test_cli_names_the_closest_env_before_any_work(tmp_path, point_env):
    out = tmp_path / "x.zarr"
    with pytest.raises(registry.UnknownNameError) as e:
        record_main(["--env", "point_tset", "--out", str(out)])
    expected = f"env: expected one of {registry.available_envs()}, received 'point_tset'; did you mean 'point_test'?"
    assert str(e.value) == expected
    assert not out.exists()


def test_record_episode_rejects_zero_max_steps(tmp_path):
    with EpisodeRecorder(tmp_path / "p.zarr") as rec:
        with pytest.raises(ValueError, match="max_steps: expected an int >= 1 or None"):
            record_episode(PointEnv(), lambda o: np.zeros(1, np.float32), rec, seed=0, max_steps=0)
        idx, _, n = record_episode(PointEnv(), lambda o: np.zeros(1, np.float32), rec, seed=0, max_steps=3)
    assert n == 3 and EpisodeStore(tmp_path / "p.zarr").episode_lengths.tolist() == [3]


def test_rerun_continues_seeds(tmp_path, point_env, capsys):
    out = str(tmp_path / "r.zarr")
    args = ["--env", "point_test", "--episodes", "3", "--out", out]
    assert record_main(args) == 0
    assert record_main(args) == 0
    assert [m.seed for m in EpisodeStore(out).all_meta()] == [0, 1, 2, 3, 4, 5]
    err = capsys.readouterr().err
    assert f"record: {out} already holds seeds up to 2; continuing from seed 3" in err
    assert record_main([*args, "--seed", "4"]) == 0  # explicit repeats are kept, loudly
    assert [m.seed for m in EpisodeStore(out).all_meta()] == [0, 1, 2, 3, 4, 5, 4, 5, 6]
    err = capsys.readouterr().err
    assert f"WARNING: record: {out} already holds 2 of seeds 4..6 (first 4)" in err


def test_ctrl_c_keeps_complete_episodes(tmp_path, point_env, capsys, monkeypatch):
    seeds = []
    act = PointExpert.act

    def act_then_interrupt(self, obs, env):
        if len(seeds) == 3:  # Ctrl-C inside the third episode (seed 2)
            raise KeyboardInterrupt
        return act(self, obs, env)

    def reset(self, seed=None):
        seeds.append(seed)

    monkeypatch.setattr(PointExpert, "act", act_then_interrupt)
    monkeypatch.setattr(PointExpert, "reset", reset)
    out = tmp_path / "c.zarr"
    rc = record_main(["--env", "point_test", "--episodes", "5", "--out", str(out)])
    assert rc == 130
    assert capsys.readouterr().err.strip().endswith(f"interrupted: kept 2 complete episodes in {out}")
    s = EpisodeStore(out)
    assert s.n_episodes == 2 and [m.seed for m in s.all_meta()] == [0, 1]
    with EpisodeStore(out, "a"):  # the lock was released
        pass


def test_record_episode_executes_perturbed_but_records_clean_action(tmp_path):
    env = PointEnv()
    with EpisodeRecorder(tmp_path / "p.zarr", env_spec=env.env_spec) as rec:
        idx, _, n = record_episode(
            env, lambda o: np.array([-0.1], np.float32), rec, seed=5, execute=lambda a: a + np.float32(0.05)
        )
    ep = EpisodeStore(tmp_path / "p.zarr").get_episode(idx)
    np.testing.assert_array_equal(ep["action"][:, 0], np.full(n, -0.1, np.float32))  # the label
    np.testing.assert_allclose(np.diff(ep["observation.state"][:, 0]), -0.05, atol=1e-6)  # what was executed


def test_dart_noise_labels_clean_expert_actions(tmp_path, point_env):
    out = tmp_path / "dart.zarr"
    cfg = record_cli.RecordConfig(env="point_test", episodes=20, out=str(out), seed=0, dart_noise=0.4)
    record_cli.record(cfg, progress=False)
    store = EpisodeStore(out)
    assert store.n_episodes == 20 and store.episode_meta(0).quality == "expert+dart0.4"
    residuals = []
    for i in range(20):
        ep = store.get_episode(i)
        x, a = ep["observation.state"][:, 0], ep["action"][:, 0]
        np.testing.assert_allclose(a, -x, atol=1e-6)  # labels: the clean expert action -x at every state
        inside = np.abs(a[:-1]) < 0.1  # steps where neither the label nor most noisy actions were clipped
        residuals.append((x[1:] - (x[:-1] + a[:-1]))[inside])
    r = np.concatenate(residuals)
    # executed = label + N(0, 0.4 x half range 0.25 = 0.1): the states show that noise, the labels do not
    assert len(r) > 10 and 0.06 < r.std() < 0.14


def test_perturbed_recording_shows_the_displacement_and_the_expert_recovers(tmp_path):
    out = tmp_path / "pert.zarr"
    pert = {"displacement": 0.05, "displacement_steps": [5, 5]}
    cfg = record_cli.RecordConfig(env="push", episodes=3, out=str(out), seed=0, perturbation=pert)
    summary = record_cli.record(cfg, progress=False)
    store = EpisodeStore(out)
    assert summary.successes == 3 and store.episode_meta(0).quality == "expert+perturbed"
    for i in range(3):
        block = store.get_episode(i)["observation.state"][:, 2:4]  # frame t is the observation before step t
        jumps = np.linalg.norm(np.diff(block, axis=0), axis=1)
        assert jumps[5] == pytest.approx(0.05, abs=0.005)  # the 5 cm displacement at step 5, recorded
    off = record_cli.RecordConfig(env="push", episodes=1, out=str(tmp_path / "off.zarr"), perturbation={"force": 0.0})
    record_cli.record(off, progress=False)
    assert EpisodeStore(tmp_path / "off.zarr").episode_meta(0).quality == "expert"  # switched off: not tagged
