"""H2O (Niu et al. 2022): the dynamics ratio from two discriminators orders simulated transitions by how well
their dynamics match the real ones; the weighted critic ignores zero-weight transitions; the command writes a
labelled union store with takeover steps positive, and refuses bad input naming the field."""

import json

import numpy as np
import pytest
import torch

from policylink.data.buffer import EpisodeStore
from policylink.data.episode_meta import EpisodeMeta
from policylink.data.labels import read_labels
from policylink.policies.critics import ChunkCritic, CriticConfig, IQLLoss
from policylink.train.h2o import H2OCommand, run_h2o, train_discriminators


def _toy(n, gain_right, seed):
    """1-D state in [-1, 1], action in [-1, 1]; s' = s + 0.1 a on the left half, s + gain_right * a on the right."""
    g = torch.Generator().manual_seed(seed)
    s = torch.rand(n, 1, generator=g) * 2 - 1
    a = torch.rand(n, 1, generator=g) * 2 - 1
    gain = torch.where(s < 0, 0.1, gain_right)
    s2 = s + gain * a + 0.01 * torch.randn(n, 1, generator=g)
    return {"state": s * 3, "action": a * 3, "next_state": s2 * 3}  # roughly unit scale


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny MLPs: more threads only spin on a shared 2-core machine
    yield
    torch.set_num_threads(n)


def test_dynamics_weights_are_ordered_by_the_known_gap(one_thread):
    torch.manual_seed(0)
    real = _toy(4000, 0.1, 0)  # the real dynamics everywhere
    sim = _toy(4000, 0.4, 1)  # the simulator is right on the left half, 4x too strong on the right
    cmd = H2OCommand(disc_steps=400, batch_size=128, discriminator={"noise_std": 0.02, "hidden_dim": 32, "lr": 3e-3})
    disc = train_discriminators(sim, real, cmd)
    test = _toy(2000, 0.4, 2)
    w = disc.weights(test["state"], test["action"], test["next_state"])
    left, right = test["state"][:, 0] < 0, test["state"][:, 0] > 0
    big_action = test["action"][:, 0].abs() > 1.5  # where the two gains give clearly different next states
    assert w[left].mean() > 0.6
    assert w[right & big_action].mean() < 0.25
    assert w[left].mean() > 3 * w[right & big_action].mean()
    assert float(w.min()) >= 0 and float(w.max()) <= 1  # clipped to [weight_min, weight_max]


def test_zero_weight_transitions_do_not_train_the_critic():
    critic = ChunkCritic(CriticConfig(3, 2, 1, hidden_dim=16, n_layers=1))
    b = 8
    batch = {"state": torch.randn(b, 3), "action": torch.randn(b, 1, 2), "return": torch.ones(b),
             "discount": torch.full((b,), 0.9), "terminal": torch.zeros(b, dtype=torch.bool),
             "next_state": torch.randn(b, 3)}  # fmt: skip
    with torch.no_grad():
        loss_v, loss_q, _ = IQLLoss(critic).losses({**batch, "weight": torch.zeros(b)})
        assert float(loss_v) == 0.0 and float(loss_q) == 0.0
        half = torch.cat([torch.ones(4), torch.zeros(4)])
        lv, lq, _ = IQLLoss(critic).losses({**batch, "weight": half})
        lv4, lq4, _ = IQLLoss(critic).losses({k: v[:4] for k, v in batch.items()})
    assert float(lq) == pytest.approx(float(lq4) / 2, rel=1e-5)  # mean over 8 of 4 weighted terms
    assert float(lv) == pytest.approx(float(lv4) / 2, rel=1e-5)


def _store(path, episodes, gain, human_from=None, gap=""):
    rng = np.random.default_rng(len(str(path)))
    with EpisodeStore(path, "w") as st:
        for e in range(episodes):
            t = 12
            s = np.zeros((t, 3), np.float32)
            a = rng.uniform(-1, 1, (t, 2)).astype(np.float32)
            for k in range(1, t):
                s[k, :2] = s[k - 1, :2] + gain * a[k - 1]
            r = np.zeros(t, np.float32)
            r[-1] = float(e % 2 == 0)
            data = {"observation.state": s, "action": a, "reward": r}
            if human_from is not None:
                data["deploy.source"] = (np.arange(t) >= human_from).astype(np.int8)
            st.add_episode(data, EpisodeMeta(task="t", seed=e, source="policy", success=bool(e % 2 == 0), gap=gap))
    return str(path)


def test_h2o_command_writes_a_labelled_union_with_takeovers_positive(tmp_path, one_thread):
    sim = _store(tmp_path / "sim.zarr", 6, 0.1)
    real = _store(tmp_path / "real.zarr", 4, 0.05, human_from=7, gap='{"name": "worn_gantry"}')
    cmd = H2OCommand(sim=[sim], real=[real], out=str(tmp_path / "h2o"), disc_steps=20, critic_steps=20,
                     batch_size=32, hidden_dim=16)  # fmt: skip
    summary = run_h2o(cmd)
    union = EpisodeStore(tmp_path / "h2o" / "train.zarr", "r")
    assert union.n_episodes == 10 and union.n_steps == 120
    assert "deploy.source" not in union.keys  # only the shared features
    assert json.loads(union.episode_meta(6).gap) == {"name": "worn_gantry"} and union.episode_meta(0).gap == ""
    labels = read_labels(tmp_path / "h2o" / "train.zarr", "advantage")
    human = np.zeros(120, bool)
    for e in range(6, 10):
        human[e * 12 + 7 : e * 12 + 12] = True
    assert labels.label[human].all()  # every takeover step positive (RECAP's rule for interventions)
    assert summary["human_steps"] == 20 and summary["sim_transitions"] == 72 and summary["real_transitions"] == 48
    assert 0 <= summary["sim_weight_mean"] <= 1
    for name in ("discriminators/discriminators.safetensors", "critic/critic.safetensors", "h2o.json"):
        assert (tmp_path / "h2o" / name).exists()


def test_h2o_command_refuses_bad_input(tmp_path):
    from policylink.cli.finetune_h2o import main

    with pytest.raises(ValueError, match="sim: expected at least one episode store"):
        main(["h2o", "--real", "r.zarr", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="real: no episode store at 'missing.zarr'"):
        main(["h2o", "--sim", _store(tmp_path / "s.zarr", 1, 0.1), "--real", "missing.zarr", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="disc_steps: expected >= 1"):
        H2OCommand(disc_steps=0)
    from policylink.policies.finetune.h2o import DiscriminatorConfig

    with pytest.raises(ValueError, match="weight_min/weight_max"):
        DiscriminatorConfig(3, 2, weight_min=2.0, weight_max=1.0)
