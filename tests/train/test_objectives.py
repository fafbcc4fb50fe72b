"""The objective registry: ``objective: {type: NAME, ...}`` from YAML and from flags, unknown names listed, the
deprecated flat spellings (``--loss``, ``--advantage.*``, ``TrainConfig(loss=)``) giving the same config, and a
plug-in objective registered, parsed and built with its options."""

from __future__ import annotations

import dataclasses

import pytest

from policylink.cli.app import ConfigError, parse_config
from policylink.train.advantage import AdvantageTrainConfig
from policylink.train.config import TrainConfig
from policylink.train.objectives import (
    AdvantageConfig,
    AWRConfig,
    ImitationConfig,
    ObjectiveConfig,
    PrefixConditionedConfig,
    available_objectives,
    make_objective,
    objective_config,
    register_objective,
    resolve_objective,
    unregister_objective,
)

BUILT_IN = ["advantage", "awr", "imitation", "prefix_conditioned"]


def test_the_section_comes_from_yaml_and_flags(tmp_path):
    assert TrainConfig().objective == ImitationConfig() and set(BUILT_IN) <= set(available_objectives())
    path = tmp_path / "awr.yaml"
    path.write_text("objective:\n  type: awr\n  beta: 0.5\nsteps: 7\n")
    cfg = parse_config(TrainConfig, ["--config", str(path)])
    assert cfg.objective == AWRConfig(beta=0.5) and cfg.objective.type == "awr" and cfg.steps == 7
    cfg = parse_config(TrainConfig, ["--config", str(path), "--objective.max_weight", "3"])  # a flag over the file
    assert cfg.objective == AWRConfig(beta=0.5, max_weight=3.0)
    cfg = parse_config(TrainConfig, ["--objective.type", "prefix_conditioned", "--objective.max_delay", "2"])
    assert cfg.objective == PrefixConditionedConfig(max_delay=2)
    assert cfg.objective.to_dict() == {"type": "prefix_conditioned", "max_delay": 2}


def test_an_unknown_type_or_option_is_one_error_naming_the_choices(tmp_path):
    with pytest.raises(ConfigError, match=r"objective.type: expected one of \['advantage', 'awr', 'imitation', "
                       r"'prefix_conditioned'.*\], received 'awrr'; did you mean 'awr'\?"):  # fmt: skip
        parse_config(TrainConfig, ["--objective.type", "awrr"])
    path = tmp_path / "bad.yaml"
    path.write_text("objective: {type: qvgm_magic}\n")
    with pytest.raises(ConfigError, match="objective.type: expected one of .*received 'qvgm_magic'"):
        parse_config(TrainConfig, ["--config", str(path)])
    with pytest.raises(ConfigError, match="label_dropout"):  # an option of another objective
        parse_config(TrainConfig, ["--objective.label_dropout", "0.1"])
    with pytest.raises(ValueError, match=r"objective.label_dropout: expected .*\[0, 1\].*received 1.5"):
        AdvantageConfig(label_dropout=1.5).validate()
    with pytest.raises(ValueError, match=r"objective.beta: expected .*> 0.*received 0"):
        AWRConfig(beta=0.0).validate()
    with pytest.raises(ValueError, match=r"loss: expected one of \[.*'imitation'.*\], received 'q_magic'"):
        resolve_objective(TrainConfig(loss="q_magic"))


def test_the_old_flat_flags_give_the_same_config(capsys):
    flat = ["--loss", "awr", "--advantage.awr_beta", "0.5", "--advantage.awr_max_weight", "4"]
    old = parse_config(AdvantageTrainConfig, [*flat, "--advantage.labels", "value"])
    err = capsys.readouterr().err
    assert "--loss is deprecated (kept for one release), use --objective.type" in err
    assert "--advantage.awr_beta is deprecated (kept for one release), use --objective.beta" in err
    nested = ["--objective.type", "awr", "--objective.beta", "0.5", "--objective.max_weight", "4"]
    new = parse_config(AdvantageTrainConfig, [*nested, "--objective.labels", "value"])
    assert old == new and new.objective == AWRConfig(labels="value", beta=0.5, max_weight=4.0)
    # finetune advantage train: the section defaults to advantage, so its options need no --objective.type
    old = parse_config(AdvantageTrainConfig, ["--advantage.label_dropout", "0.1"])
    assert old == parse_config(AdvantageTrainConfig, ["--objective.label_dropout", "0.1"])
    assert old.objective == AdvantageConfig(label_dropout=0.1)
    assert parse_config(TrainConfig, ["--loss", "advantage"]).objective == AdvantageConfig()
    with pytest.warns(DeprecationWarning, match="loss: deprecated, use objective.type"):  # the Python spelling
        resolved = resolve_objective(AdvantageTrainConfig(objective=AdvantageConfig(labels="value"), loss="awr"))
    assert resolved == AWRConfig(labels="value")  # the options both objectives have are kept


@dataclasses.dataclass
class _ScaleConfig(ObjectiveConfig):
    """Test objective: a loss scale."""

    scale: float = 1.0


class _ScaledLoss:
    def __init__(self, cfg, scale: float = 1.0):
        self.cfg, self.scale = cfg, scale


@pytest.fixture
def scaled():
    register_objective("scaled", _ScaleConfig, _ScaledLoss)
    yield
    unregister_objective("scaled")


def test_a_registered_objective_parses_and_builds_with_its_options(scaled):
    cfg = parse_config(TrainConfig, ["--objective.type", "scaled", "--objective.scale", "2.5"])
    loss = make_objective(cfg)
    assert isinstance(loss, _ScaledLoss) and loss.scale == 2.5 and loss.cfg is cfg
    assert objective_config("scaled", scale=3.0) == _ScaleConfig(3.0)
    register_objective("scaled", _ScaleConfig, _ScaledLoss)  # the same entry again: no error
    with pytest.raises(ValueError, match="objective 'scaled': already registered"):
        register_objective("scaled", ImitationConfig, _ScaledLoss)
    with pytest.raises(TypeError, match="expected an ObjectiveConfig dataclass subclass"):
        register_objective("plain", dict, _ScaledLoss)
    bad = dataclasses.make_dataclass("NoTrains", [], bases=(ObjectiveConfig,), namespace={"trains": ()})
    with pytest.raises(TypeError, match=r"expected NoTrains.trains a non-empty tuple of names, received \(\)"):
        register_objective("no_trains", bad, _ScaledLoss)
    unregister_objective("scaled")
    assert "scaled" not in available_objectives() and "scaled" not in ObjectiveConfig.get_known_choices()
