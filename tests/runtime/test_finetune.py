"""``policylink finetune``: help, one-line errors for bad input, critic + Q-VGM / filtered BC into an ordinary
checkpoint with its lineage, best-of-N reranking, and the recorder's true-termination flag."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch

from policylink.adapters.schema import ActionSpec, FeatureSpec, PolicySpec
from policylink.cli import app as cli
from policylink.data.buffer import EpisodeStore
from policylink.data.episode_meta import EpisodeMeta
from policylink.data.normalize import Normalizer
from policylink.data.stats import compute_stats
from policylink.policies import load_policy
from policylink.policies.checkpoint import save_checkpoint
from policylink.policies.common.unet1d import UNetConfig
from policylink.policies.processing import normalizer_modes, processors_for
from policylink.policies.registry import build_model, make_config
from policylink.train.qvgm import CriticCmdConfig, QVGMCmdConfig, finetune_policy, train_critic

STATE = "observation.state"
FEATURES = {STATE: FeatureSpec("float32", (3,))}


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _buffer(path, env="push", rewards=True):
    """4 synthetic 12-step episodes; episodes 1 and 3 succeed (reward 1 and termination on the last step)."""
    rng = np.random.default_rng(0)
    with EpisodeStore(path, "w") as s:
        for e in range(4):
            ok = rewards and e % 2 == 1
            reward = np.zeros(12, np.float32)
            reward[-1] = float(ok)
            s.add_episode(
                {
                    STATE: rng.uniform(-1, 1, (12, 3)).astype(np.float32),
                    "action": rng.uniform(-1, 1, (12, 2)).astype(np.float32),
                    "reward": reward,
                    "terminated": np.array([False] * 11 + [ok]),
                },
                EpisodeMeta(success=ok, source="policy"),
            )
        s.update_info(env=env)
    return path


def _checkpoint(path, buffer, kind="flow"):
    torch.manual_seed(0)
    cfg = make_config(kind, observation_keys=[STATE], chunk_size=4, n_action_steps=2,
                      unet=UNetConfig(down_dims=[16, 32], time_embed_dim=16))  # fmt: skip
    action = ActionSpec(names=("x", "y"), control_mode="ee_delta", units=("m", "m"), low=(-1.0, -1.0), high=(1.0, 1.0))
    spec = PolicySpec(FEATURES, action, n_obs_steps=2, chunk_size=4, n_action_steps=2)
    with EpisodeStore(buffer, "r") as s:
        normalizer = Normalizer(compute_stats(s), normalizer_modes(FEATURES, "min_max", "min_max"))
    model = build_model(cfg, FEATURES, 2)
    return save_checkpoint(path, model=model, processors=processors_for(cfg, FEATURES, normalizer), spec=spec,
                           train_config={"dataset": {"env": "push", "obs_mode": "state"}})  # fmt: skip


def test_help_lists_subcommands_and_documents_options(capsys):
    assert cli.main(["finetune", "--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("critic", "qvgm", "loop"))
    with pytest.raises(SystemExit) as e:
        cli.main(["finetune", "qvgm", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for option in ("--policy", "--buffer", "--critic", "--method", "--only_success", "--trust_radius", "--alpha",
                   "--bc_weight", "--last_steps", "--ascent_steps"):  # fmt: skip
        assert option in out
    assert cli.main(["finetune", "nope"]) == 2


def test_advantage_usage_names_the_awr_flag_that_train_takes(capsys):
    assert cli.main(["finetune", "advantage", "--help"]) == 0
    usage = capsys.readouterr().out
    assert "--objective.type awr" in usage and "--loss" not in usage  # --loss is a deprecated, hidden alias
    with pytest.raises(SystemExit) as e:
        cli.main(["finetune", "advantage", "train", "--help"])
    assert e.value.code == 0
    assert "--objective.type {imitation,advantage,awr," in capsys.readouterr().out


def test_bad_input_is_one_clear_line(tmp_path, capsys):
    buf = _buffer(tmp_path / "buf.zarr")
    diffusion = _checkpoint(tmp_path / "dp", buf, kind="diffusion")
    flow = _checkpoint(tmp_path / "flow", buf)
    cases = [
        (["--policy", str(diffusion), "--buffer", str(buf)], "expected a flow policy (velocity sampler)"),
        (["--policy", str(flow), "--buffer", str(_buffer(tmp_path / "nr.zarr", rewards=False))], "found none non-zero"),
        (["--policy", str(flow), "--buffer", str(_buffer(tmp_path / "r.zarr", env="reach"))], "found env 'reach'"),
    ]
    for args, message in cases:
        assert cli.main(["finetune", "qvgm", *args, "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert message in err[0] and err[0].startswith("policylink finetune: error:")


def test_critic_then_qvgm_gives_an_ordinary_checkpoint_with_lineage(tmp_path):
    buf = _buffer(tmp_path / "buf.zarr")
    base = _checkpoint(tmp_path / "base", buf)
    critic = train_critic(CriticCmdConfig(policy=str(base), buffer=str(buf), out=str(tmp_path / "critic"),
                                          steps=4, batch_size=8, hidden_dim=16))  # fmt: skip
    assert json.loads((critic / "critic.json").read_text())["horizon"] == 2  # the policy's n_action_steps
    assert sorted(f.name for f in critic.iterdir()) == [
        "critic.json",
        "critic.safetensors",
        "critic_metrics.csv",
        "critic_source.json",
    ]
    out = finetune_policy(QVGMCmdConfig(policy=str(base), buffer=str(buf), critic=str(critic),
                                        out=str(tmp_path / "ft"), steps=3, batch_size=8, round=1))  # fmt: skip
    lineage = json.loads((out / "lineage.json").read_text())
    assert lineage["base"] == str(base) and lineage["buffer"] == str(buf) and lineage["round"] == 1
    assert lineage["method"] == "qvgm" and lineage["critic"] == str(critic)
    assert not (out / "critic.safetensors").exists()
    policy = load_policy(out, device="cpu")  # no critic needed
    policy.update_observation({STATE: np.zeros((2, 3), np.float32)})
    assert policy.predict_action_chunk().shape == (2, 4, 2)
    rows = (out / "finetune_metrics.csv").read_text().splitlines()
    assert rows[0].split(",")[:3] == ["step", "loss", "vgm_loss"] and "keep_best_margin" in rows[0]
    pess = finetune_policy(QVGMCmdConfig(policy=str(base), buffer=str(buf), critic=str(critic), pessimism=1.0,
                                         bc_only_success=True, anchor="reference", out=str(tmp_path / "ft2"), steps=2,
                                         batch_size=8))  # fmt: skip
    saved = json.loads((pess / "config.json").read_text())["train"]["finetune"]
    assert saved["pessimism"] == 1.0 and saved["bc_only_success"] is True and saved["anchor"] == "reference"
    demos = _buffer(tmp_path / "demos.zarr", rewards=False)  # the BC store needs no rewards
    q = QVGMCmdConfig(policy=str(base), buffer=str(buf), critic=str(critic), bc_buffer=str(demos), steps=2,
                      batch_size=8, out=str(tmp_path / "ft3"))  # fmt: skip
    assert "bc_loss" in (finetune_policy(q) / "finetune_metrics.csv").read_text().splitlines()[0]
    with pytest.raises(FileNotFoundError, match="bc_buffer: expected an episode store, 'nowhere.zarr' not found"):
        finetune_policy(replace(q, bc_buffer="nowhere.zarr"))
    awr = finetune_policy(QVGMCmdConfig(policy=str(base), buffer=str(buf), critic=str(critic), method="awr",
                                        out=str(tmp_path / "awr"), steps=2, batch_size=8))  # fmt: skip
    assert json.loads((awr / "lineage.json").read_text())["critic"] == str(critic)
    assert "mean_weight" in (awr / "finetune_metrics.csv").read_text().splitlines()[0]
    with pytest.raises(ValueError, match="critic: expected the folder of policylink finetune critic .* method awr"):
        finetune_policy(QVGMCmdConfig(policy=str(base), buffer=str(buf), method="awr"))


def test_filtered_bc_trains_on_successful_episodes_only(tmp_path):
    buf = _buffer(tmp_path / "buf.zarr")
    base = _checkpoint(tmp_path / "base", buf)
    out = finetune_policy(QVGMCmdConfig(policy=str(base), buffer=str(buf), method="bc", only_success=True,
                                        out=str(tmp_path / "bc"), steps=2, batch_size=4))  # fmt: skip
    assert json.loads((out / "lineage.json").read_text())["method"] == "bc"
    with pytest.raises(ValueError, match="method: expected one of"):
        finetune_policy(QVGMCmdConfig(policy=str(base), buffer=str(buf), method="ppo"))


def test_best_of_n_picks_the_chunk_the_critic_prefers(tmp_path):
    from policylink.policies.checkpoint import load_components
    from policylink.policies.finetune.rerank import BestOfNPolicy

    class Prefer(torch.nn.Module):  # Q = first action's x: the best of N has the largest x
        def actor_q(self, s, a):
            return a[:, 0, 0]

    buf = _buffer(tmp_path / "buf.zarr")
    _, spec, model, processors = load_components(_checkpoint(tmp_path / "base", buf))
    obs = {STATE: np.zeros((3, 3), np.float32)}
    plain = load_policy(tmp_path / "base", device="cpu", seed=0)
    plain.update_observation(obs)
    one = BestOfNPolicy(model, processors, spec, critic=Prefer(), n=1, seed=0)
    many = BestOfNPolicy(model, processors, spec, critic=Prefer(), n=32, seed=0)
    for p in (one, many):
        p.update_observation(obs)
    a1, a32 = one.predict_action_chunk(), many.predict_action_chunk()
    assert a32.shape == (3, 4, 2)
    assert (a32[:, 0, 0] >= a1[:, 0, 0]).all() and a32[:, 0, 0].mean() > a1[:, 0, 0].mean()
    with pytest.raises(ValueError, match="rerank.n: expected >= 1"):
        BestOfNPolicy(model, processors, spec, critic=Prefer(), n=0)


def test_recorder_separates_terminations_from_time_limits(tmp_path):
    from policylink.runtime.record import RecordConfig, record

    path = tmp_path / "reach.zarr"
    record(RecordConfig(env="reach", episodes=1, out=str(path), seed=0), progress=False)  # the expert succeeds
    record(RecordConfig(env="reach", episodes=1, out=str(path), seed=1, max_steps=3), progress=False)  # time limit
    with EpisodeStore(path, "r") as s:
        ok, cut = s.get_episode(0), s.get_episode(1)
        assert s.episode_meta(0).success and not s.episode_meta(1).success
    assert ok["terminated"][-1] and not ok["terminated"][:-1].any() and ok["done"][-1]
    assert cut["terminated"].tolist() == [False, False, False] and cut["done"].tolist() == [False, False, True]


def test_missing_checkpoint_and_dataset_are_named(capsys):
    from policylink.cli.app import main

    assert main(["finetune", "critic", "--policy", "/nope", "--buffer", "/nope"]) == 2
    assert "checkpoint folder not found: '/nope'" in capsys.readouterr().err
    assert main(["finetune", "advantage", "label"]) == 2
    assert "dataset: expected an episode store path" in capsys.readouterr().err
    assert main(["finetune", "qvgm"]) == 2
    assert "policy: expected a checkpoint folder (--policy CKPT), received ''" in capsys.readouterr().err
    assert main(["finetune", "monitor"]) == 2
    assert "(--policy CKPT --buffer X.zarr)" in capsys.readouterr().err


def test_the_loop_buffer_starts_from_the_demos_when_given(tmp_path, monkeypatch):
    from policylink.train import loop as fl

    demos = _buffer(tmp_path / "demos.zarr")
    base = _checkpoint(tmp_path / "base", demos)
    seen = {}

    def record(cfg, path, buffer, seed, env_kwargs):  # the buffer as the first round finds it
        with EpisodeStore(buffer, "r") as s:
            seen["episodes"], seen["success"] = s.n_episodes, [m.success for m in s.all_meta()]
        return 0.5

    monkeypatch.setattr(fl, "_record", record)
    monkeypatch.setattr(fl, "_evaluate", lambda cfg, path, kw, critic=None: {"success": 0.25, "policy": path})
    monkeypatch.setattr(fl, "train_critic", lambda c: tmp_path / "critic")
    monkeypatch.setattr(fl, "finetune_policy", lambda q: tmp_path / q.method)
    cfg = fl.LoopConfig(policy=str(base), env="push", rounds=1, demos=str(demos), out=str(tmp_path / "l"))
    rows = fl.run_loop(replace(cfg, baselines=["awr", "bc"]))
    assert seen == {"episodes": 4, "success": [False, True, False, True]}  # the demos' four episodes, in order
    assert [r["method"] for r in rows] == ["base", "qvgm", "filtered_bc", "awr"] and rows[1]["buffer_success"] == 0.5
    assert rows[3]["policy"] == str(tmp_path / "awr")
    with pytest.raises(ValueError, match=r"baselines: expected a subset of \('rerank', 'bc', 'awr'\)"):
        fl.run_loop(replace(cfg, baselines=["ppo"]))
    with pytest.raises(FileNotFoundError, match="demos: expected an episode store .*'nowhere.zarr' not found"):
        fl.run_loop(replace(cfg, demos="nowhere.zarr", out=str(tmp_path / "l2")))
    assert not (tmp_path / "l2").exists()  # found before anything is written


def _files(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_out_never_replaces_an_input_nor_an_existing_file(tmp_path, capsys):
    buf = _buffer(tmp_path / "buf.zarr")
    base = _checkpoint(tmp_path / "base", buf)
    before, store_before, names = _files(base), _files(buf), {p.name for p in tmp_path.iterdir()}
    q = QVGMCmdConfig(policy=str(base), buffer=str(buf), method="bc", steps=1, batch_size=4)
    for out in (base, base / "sub", tmp_path):  # the policy itself, inside it, containing it
        with pytest.raises(ValueError, match=rf"^out: expected a folder other than policy '{base}' \(neither inside "
                                             rf"it nor containing it\), received '{out}'$"):  # fmt: skip
            finetune_policy(replace(q, out=str(out)))
    c = CriticCmdConfig(policy=str(base), buffer=str(buf), steps=1, batch_size=4)
    with pytest.raises(ValueError, match=rf"^out: expected a folder other than buffer '{buf}'"):
        train_critic(replace(c, out=str(buf)))
    afile = tmp_path / "afile"
    afile.write_text("mine")
    with pytest.raises(ValueError, match=rf"^out: expected a folder \(or a new path\), received an existing file "
                                         rf"'{afile}'$"):  # fmt: skip
        finetune_policy(replace(q, out=str(afile)))
    assert cli.main(["finetune", "critic", "--policy", str(base), "--buffer", str(buf), "--out", str(afile)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"policylink finetune: error: ValueError: out: expected a folder (or a new path), received an " \
                     f"existing file '{afile}'"  # fmt: skip
    assert afile.read_text() == "mine" and not (tmp_path / "afile.old").exists()
    assert _files(base) == before and _files(buf) == store_before  # the inputs are untouched
    assert {p.name for p in tmp_path.iterdir()} == names | {"afile"}  # nothing half-written


def test_counts_horizon_and_critic_pairing_are_checked_before_training(tmp_path, capsys):
    buf = _buffer(tmp_path / "buf.zarr")
    base = _checkpoint(tmp_path / "base", buf)  # chunk_size 4, action_dim 2
    names = {p.name for p in tmp_path.iterdir()}
    c = CriticCmdConfig(policy=str(base), buffer=str(buf), out=str(tmp_path / "critic"), steps=2, batch_size=4,
                        hidden_dim=8)  # fmt: skip
    for change, message in [
        ({"steps": 0}, "steps: expected an integer >= 1, received 0"),
        ({"steps": -5}, "steps: expected an integer >= 1, received -5"),
        ({"batch_size": 0}, "batch_size: expected an integer >= 1, received 0"),
        ({"horizon": 5}, r"horizon: expected <= 4 \(the policy's chunk_size\), received 5"),
        ({"expectile": 1.5}, r"critic.expectile: expected a value in \(0, 1\), received 1.5"),
    ]:
        with pytest.raises(ValueError, match=f"^{message}$"):
            train_critic(replace(c, **change))
    q = QVGMCmdConfig(policy=str(base), buffer=str(buf), out=str(tmp_path / "ft"), steps=1, batch_size=4)
    for change, message in [
        ({"steps": -1}, "steps: expected an integer >= 1, received -1"),
        ({"batch_size": 0}, "batch_size: expected an integer >= 1, received 0"),
        ({"anchor": "base"}, r"qvgm.anchor: expected one of \('current', 'reference'\), received 'base'"),
    ]:
        with pytest.raises(ValueError, match=f"^{message}$"):
            finetune_policy(replace(q, **change))
    assert {p.name for p in tmp_path.iterdir()} == names  # nothing written
    critic = train_critic(c)
    doc = json.loads((critic / "critic.json").read_text())
    assert (doc["state_dim"], doc["action_dim"], doc["horizon"]) == (6 + 3, 2, 2)  # latent + state; n_action_steps
    (critic / "critic.json").write_text(json.dumps({**doc, "action_dim": 3}))
    with pytest.raises(ValueError, match=rf"^critic: expected action_dim 2 \(the policy's\), received 3 in "
                                         rf"'{critic}' \(a critic of another env or policy\?\)$"):  # fmt: skip
        finetune_policy(replace(q, critic=str(critic)))
    (critic / "critic.json").write_text(json.dumps({**doc, "state_dim": 5}))
    with pytest.raises(ValueError, match=r"^critic: expected state_dim 9 \(the policy's\), received 5 in"):
        finetune_policy(replace(q, critic=str(critic)))
    (critic / "critic.json").write_text(json.dumps(doc))
    copy = tmp_path / "copy"
    shutil.copytree(base, copy)
    capsys.readouterr()
    assert finetune_policy(replace(q, policy=str(copy), critic=str(critic))).is_dir()  # a copy: a warning only
    assert capsys.readouterr().err.splitlines() == [
        f"warning: critic '{critic}' was trained with policy '{base}', not '{copy}'"
    ]


def test_the_loop_checks_every_option_and_the_demos_before_anything_runs(tmp_path):
    from policylink.policies.finetune.transitions import BufferError
    from policylink.train import loop as fl

    demos = _buffer(tmp_path / "demos.zarr")
    base = _checkpoint(tmp_path / "base", demos)
    reach, plain = _buffer(tmp_path / "reach.zarr", env="reach"), _buffer(tmp_path / "plain.zarr", rewards=False)
    out = tmp_path / "loop"
    cfg = fl.LoopConfig(policy=str(base), env="push", rounds=1, demos=str(demos), out=str(out))
    cases = [
        ({"qvgm": replace(cfg.qvgm, anchor="base")}, r"qvgm.anchor: expected one of .*, received 'base'"),
        ({"qvgm": replace(cfg.qvgm, steps=0)}, "qvgm.steps: expected an integer >= 1, received 0"),
        ({"critic": replace(cfg.critic, batch_size=0)}, "critic.batch_size: expected an integer >= 1, received 0"),
        (
            {"critic": replace(cfg.critic, horizon=9)},
            r"critic.horizon: expected <= 4 \(the policy's chunk_size\), received 9",
        ),
        (
            {"critic": replace(cfg.critic, out="mine")},
            r"critic.out: expected no value \(the loop sets it per round\), received 'mine'",
        ),
        ({"qvgm": replace(cfg.qvgm, method="bc")}, r"qvgm.method: expected no value .*received 'bc'"),
        ({"env": "reach"}, "env: expected the policy's env 'push', received 'reach'"),
        ({"out": str(base / "loop")}, rf"out: expected a folder other than policy '{base}' .*received '{base}/loop'"),
        (
            {"demos": str(reach)},
            rf"demos '{reach}': expected episodes of env 'push' \(the policy's\), found env 'reach'",
        ),
        ({"demos": str(plain)}, rf"demos '{plain}': expected rewards, found none non-zero in 48 steps \(no signal\)"),
    ]
    for change, message in cases:
        with pytest.raises((ValueError, BufferError), match=f"^{message}$"):
            fl.run_loop(replace(cfg, **change))
        assert not out.exists() and not (base / "loop").exists()  # refused before anything is recorded or written


def test_loop_help_describes_the_loop_and_hides_what_it_sets(capsys):
    with pytest.raises(SystemExit):
        cli.main(["finetune", "loop", "--help"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("Learn from experience without new demos: each round records the current policy's")
    options = {line.split()[0] for line in lines if line.startswith("  --")}
    assert {"--critic.steps", "--critic.horizon", "--qvgm.anchor", "--qvgm.steps", "--demos"} <= options
    hidden = {"--critic.policy", "--critic.buffer", "--critic.out", "--qvgm.policy", "--qvgm.critic", "--qvgm.out"}
    assert not hidden & options


def test_monitor_options_and_out_are_checked_before_training(tmp_path, capsys):
    from policylink.train.corrector import MonitorCmdConfig, train_and_calibrate

    for change, message in [
        ({"steps": -3}, "steps: expected an integer >= 1, received -3"),
        ({"batch_size": 0}, "batch_size: expected an integer >= 1, received 0"),
        ({"ewma": 0.0}, r"ewma: expected a value in \(0, 1\], received 0.0"),
    ]:
        with pytest.raises(ValueError, match=f"^{message}$"):
            MonitorCmdConfig(**change)
    assert cli.main(["finetune", "monitor", "--ewma", "0"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "policylink finetune: error: ewma: expected a value in (0, 1], received 0.0"
    ]
    buf = _buffer(tmp_path / "buf.zarr")
    base = _checkpoint(tmp_path / "base", buf)
    before, afile = _files(base), tmp_path / "afile"
    afile.write_text("mine")
    with pytest.raises(ValueError, match=rf"^out: expected a folder other than policy '{base}' .*received '{base}'$"):
        train_and_calibrate(MonitorCmdConfig(policy=str(base), buffer=str(buf), out=str(base)))
    file_message = rf"^out: expected a folder \(or a new path\), received an existing file '{afile}'$"
    with pytest.raises(ValueError, match=file_message):
        train_and_calibrate(MonitorCmdConfig(policy=str(base), buffer=str(buf), out=str(afile)))
    assert _files(base) == before and afile.read_text() == "mine"


def test_monitor_help_has_one_description_per_option(capsys):
    with pytest.raises(SystemExit):
        cli.main(["finetune", "monitor", "--help"])
    out = capsys.readouterr().out
    helps = dict(re.findall(r"\n  (--\w+) [^\n]*\n      ([^\n]*)", out))
    assert helps["--score"].startswith("deviation score and training loss: cosine (one minus the cosine of")
    assert len({helps[o] for o in ("--steps", "--batch_size", "--lr")}) == 3
    assert helps["--calibration_fraction"] != helps["--test_fraction"]
    assert "default: None" not in out and "--out str  (default: '')" in out
