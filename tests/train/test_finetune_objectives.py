"""Every objective the product trains is registered (the fine-tune jobs' too) with its config, its loss and the
modules it trains; a fine-tune command builds its loss by name (an unknown name is one error naming the option);
the registry builds the same loss, weights included, as constructing it directly; a plug-in objective of
``finetune qvgm`` is picked by ``--method``; ``finetune critic`` keeps its flags while inheriting CriticConfig."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from policylink.adapters.registry import UnknownNameError
from policylink.cli.app import ConfigError, flag_paths, parse_config
from policylink.policies.corrector.monitor import LatentMonitor, MonitorConfig
from policylink.policies.critics import ChunkCritic, CriticConfig, IQLLoss
from policylink.policies.finetune.advantage import ValueConfig, ValueModel
from policylink.policies.finetune.h2o import DiscriminatorConfig, DynamicsDiscriminators
from policylink.train.config import TrainConfig
from policylink.train.objectives import (
    ObjectiveConfig,
    available_objectives,
    objective_class,
    objective_loss,
    register_objective,
    unregister_objective,
)
from policylink.train.qvgm import CriticCmdConfig, QVGMCmdConfig

TRAINS = {
    "imitation": ("policy",),
    "advantage": ("policy",),
    "awr": ("policy",),
    "prefix_conditioned": ("policy",),
    "qvgm": ("policy",),
    "critic_awr": ("policy",),
    "iql": ("critic",),
    "value": ("value",),
    "monitor": ("monitor",),
    "h2o_discriminators": ("discriminators",),
}


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_every_objective_is_registered_with_what_it_trains():
    assert available_objectives() == sorted(TRAINS)
    assert {name: objective_class(name).trains for name in TRAINS} == TRAINS
    assert available_objectives("train") == ["advantage", "awr", "imitation", "prefix_conditioned"]
    assert available_objectives("finetune qvgm") == ["critic_awr", "imitation", "qvgm"]
    assert available_objectives("finetune critic") == ["iql"]
    assert available_objectives("finetune h2o") == ["h2o_discriminators", "iql"]
    assert available_objectives("finetune monitor") == ["monitor"]
    assert available_objectives("finetune advantage label") == ["value"]
    assert objective_class("qvgm").requires == ("critic", "flow") and objective_class("critic_awr").requires == (
        "critic",
    )
    # a fine-tune config is its job's existing config (same fields), plus the objective's declarations
    q = objective_class("qvgm")(alpha=0.5)
    assert q.type == "qvgm" and q.to_dict()["alpha"] == 0.5 and q.to_dict()["type"] == "qvgm"
    names = {f.name for f in dataclasses.fields(objective_class("iql"))}
    assert names == {f.name for f in dataclasses.fields(CriticConfig)}


def test_fine_tune_objectives_are_not_choices_of_policylink_train():
    with pytest.raises(ConfigError, match=r"objective.type: expected one of \['advantage', 'awr', 'imitation', "
                       r"'prefix_conditioned'\], received 'qvgm'"):  # fmt: skip
        parse_config(TrainConfig, ["--objective.type", "qvgm"])
    with pytest.raises(UnknownNameError, match=r"^loss: expected one of \['advantage', 'awr', 'imitation', "
                       r"'prefix_conditioned'\], received 'iql' \(objective 'iql' is built by finetune critic / "
                       r"finetune h2o\)$"):  # fmt: skip
        with pytest.warns(DeprecationWarning):
            from policylink.train.objectives import resolve_objective

            resolve_objective(TrainConfig(loss="iql"))


def test_an_unknown_objective_for_finetune_is_one_error_naming_the_option(capsys):
    with pytest.raises(UnknownNameError, match=r"^method: expected one of \['awr', 'bc', 'critic_awr', 'imitation', "
                       r"'qvgm'\], received 'qvgn'; did you mean 'qvgm'\?$"):  # fmt: skip
        QVGMCmdConfig(method="qvgn").validate()
    with pytest.raises(UnknownNameError, match=r"^qvgm.method: expected one of"):
        QVGMCmdConfig(method="ppo").validate("qvgm.")
    from policylink.cli import app as cli

    assert cli.main(["finetune", "qvgm", "--method", "ppo", "--policy", "p", "--buffer", "b"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["policylink finetune: error: method: expected one of ['awr', 'bc', 'critic_awr', 'imitation', "
                   "'qvgm'], received 'ppo'"]  # fmt: skip
    with pytest.raises(UnknownNameError, match=r"^objective.type: expected one of \['iql'\], received 'iqm'"):
        objective_loss("iqm", None, {}, command="finetune critic")
    message = r"^discriminator: expected one of \['h2o_discriminators', 'iql'\], received 'qvgm' \(objective 'qvgm'"
    with pytest.raises(UnknownNameError, match=message):
        objective_loss("qvgm", None, {}, command="finetune h2o", field="discriminator")


def test_the_registry_builds_the_same_losses_as_direct_construction():
    opts = {"state_dim": 5, "action_dim": 2, "horizon": 3, "hidden_dim": 8, "n_layers": 1, "expectile": 0.7}
    torch.manual_seed(1)
    built = objective_loss("iql", None, opts, command="finetune critic")
    torch.manual_seed(1)
    direct = IQLLoss(ChunkCritic(CriticConfig(**opts)))
    assert isinstance(built, IQLLoss) and _same_weights(built.critic, direct.critic)
    b = 4
    batch = {"state": torch.randn(b, 5), "action": torch.randn(b, 3, 2), "return": torch.ones(b),
             "discount": torch.full((b,), 0.9), "terminal": torch.zeros(b, dtype=torch.bool),
             "next_state": torch.randn(b, 5)}  # fmt: skip
    assert torch.equal(built(batch)[0], direct(batch)[0])
    with pytest.raises(ValueError, match="critic.expectile"):
        objective_loss("iql", None, {**opts, "expectile": 1.5}, command="finetune critic")

    z = torch.randn(30, 6)
    torch.manual_seed(2)
    value = objective_loss("value", z, {"kind": "mse", "hidden": 8}, command="finetune advantage label")
    torch.manual_seed(2)
    model = ValueModel(6, ValueConfig(kind="mse", hidden=8))
    model.mean.copy_(z.mean(0))
    model.std.copy_(z.std(0).clamp_min(1e-6))
    assert _same_weights(value.model, model)
    r = torch.randn(30)
    assert torch.equal(value({"latent": z, "return": r})[0], model.loss(z, r))

    rng = np.random.default_rng(0)
    pairs = rng.normal(size=(40, 6)).astype(np.float32), rng.normal(size=(40, 3, 2)).astype(np.float32)
    pairs = (*pairs, rng.normal(size=(40, 6)).astype(np.float32))
    torch.manual_seed(3)
    mon = objective_loss("monitor", pairs, {"horizon": 3, "hidden_dim": 8}, command="finetune monitor").monitor
    torch.manual_seed(3)
    ref = LatentMonitor(6, 2, MonitorConfig(horizon=3, hidden_dim=8))
    ref.set_statistics(pairs[0], pairs[1].reshape(-1, 2), pairs[2])
    assert _same_weights(mon, ref) and mon.config == ref.config

    torch.manual_seed(4)
    disc = objective_loss("h2o_discriminators", None, {"state_dim": 3, "action_dim": 2, "hidden_dim": 8},
                          command="finetune h2o").disc  # fmt: skip
    torch.manual_seed(4)
    assert _same_weights(disc, DynamicsDiscriminators(DiscriminatorConfig(3, 2, hidden_dim=8)))


@dataclasses.dataclass
class _PluginConfig(ObjectiveConfig):
    """Test plug-in of finetune qvgm: a loss scale, and ``lr`` (a flag of finetune qvgm of the same name)."""

    commands = ("finetune qvgm",)
    scale: float = 1.0
    lr: float = 0.0


class _PluginLoss:
    def __init__(self, context, scale: float = 1.0, lr: float = 0.0):
        self.context, self.scale, self.lr = context, scale, lr


@pytest.fixture
def plugin():
    register_objective("scaled_bc", _PluginConfig, _PluginLoss)
    yield
    unregister_objective("scaled_bc")


def test_a_plugin_objective_of_finetune_qvgm_is_chosen_by_method(plugin):
    cfg = QVGMCmdConfig(method="scaled_bc", lr=3e-4)
    assert cfg.validate() is cfg and cfg.objective() == "scaled_bc"
    assert cfg.objective_options("scaled_bc") == {"lr": 3e-4}  # scale has no flag: its default
    loss = objective_loss("scaled_bc", "ctx", cfg.objective_options("scaled_bc"), command="finetune qvgm")
    assert isinstance(loss, _PluginLoss) and (loss.context, loss.scale, loss.lr) == ("ctx", 1.0, 3e-4)
    assert "scaled_bc" not in available_objectives("train")
    assert QVGMCmdConfig(method="awr", awr_beta=0.5).objective_options("critic_awr") == {
        "beta": 0.5,
        "max_weight": 20.0,
    }


def test_critic_command_inherits_the_critic_config_and_keeps_its_flags():
    assert issubclass(CriticCmdConfig, CriticConfig)
    assert set(flag_paths(CriticCmdConfig)) == {
        "policy", "buffer", "out", "horizon", "gamma", "expectile", "n_heads", "hidden_dim", "n_layers", "polyak",
        "lr", "steps", "batch_size", "seed", "torch_threads",
    }  # fmt: skip
    cfg = parse_config(CriticCmdConfig, ["--gamma", "0.9", "--n_layers", "2", "--horizon", "2"])
    assert cfg.critic_config(7, 2, 2) == CriticConfig(7, 2, 2, n_layers=2, gamma=0.9)
    assert CriticCmdConfig().critic_config(7, 2, 4) == CriticConfig(7, 2, 4)  # the same defaults
    with pytest.raises(ValueError, match=r"critic.gamma: expected a value in \(0, 1\], received 1.5"):
        CriticCmdConfig(gamma=1.5).validate()
    with pytest.raises(ConfigError, match="unknown flag --state_dim"):
        parse_config(CriticCmdConfig, ["--state_dim", "3"])
