"""Configs by composition: ``base:`` files (one or a list) merge under a config; errors name the file; every shipped
train config is its base plus a few lines; the CLI and the demo read the composed config."""

from pathlib import Path

import pytest

from policylink.cli.app import ConfigError, parse_config
from policylink.configs import CONFIG_ROOT, ConfigFileError, composed_file, load_config, merge
from policylink.train.config import TrainConfig


def test_merge_is_recursive_for_mappings_and_replaces_everything_else():
    base = {"policy": {"type": "flow", "unet": {"down_dims": [64, 128], "kernel_size": 5}}, "steps": 10, "tags": [1]}
    over = {"policy": {"unet": {"down_dims": [32]}}, "tags": [2, 3], "lr": None}
    assert merge(base, over) == {
        "policy": {"type": "flow", "unet": {"down_dims": [32], "kernel_size": 5}},
        "steps": 10,
        "tags": [2, 3],
        "lr": None,
    }
    assert base["policy"]["unet"]["down_dims"] == [64, 128]  # inputs untouched


def test_bases_chain_and_lists_merge_in_order(tmp_path):
    (tmp_path / "a.yaml").write_text("steps: 1\nlr: 0.1\npolicy: {type: flow, chunk_size: 8}\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\nsteps: 2\n")
    (tmp_path / "c.yaml").write_text("lr: 0.3\npolicy: {chunk_size: 16}\n")
    (tmp_path / "d.yaml").write_text("base: [b.yaml, c.yaml]\nsteps: 4\n")
    assert load_config(tmp_path / "d.yaml") == {"steps": 4, "lr": 0.3, "policy": {"type": "flow", "chunk_size": 16}}
    (tmp_path / "out").mkdir()
    out = composed_file(tmp_path / "d.yaml", tmp_path / "out")
    assert out.parent.name == "out" and "base" not in out.read_text()
    assert composed_file(tmp_path / "a.yaml", tmp_path) == tmp_path / "a.yaml"  # no base: the file itself


@pytest.mark.parametrize(
    "files, message",
    [
        ({"x.yaml": "base: nowhere.yaml\n"}, r"nowhere.yaml \(base of .*x.yaml\): cannot read it"),
        ({"x.yaml": "base: y.yaml\n", "y.yaml": "base: x.yaml\n"}, r"base files form a cycle: .*x.yaml -> .*y.yaml"),
        ({"x.yaml": "base: y.yaml\n", "y.yaml": "a: [1\n"}, r"y.yaml:2:1: invalid YAML"),
        (
            {"x.yaml": "base: y.yaml\n", "y.yaml": "- 1\n"},
            r"y.yaml: expected a YAML mapping of options, received a list",
        ),
        ({"x.yaml": "base: 3\n"}, r"x.yaml: base: expected a file name or a list of them, received 3"),
    ],
)
def test_bad_bases_name_the_file(tmp_path, files, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ConfigFileError, match=message):
        load_config(tmp_path / "x.yaml")
    with pytest.raises(ConfigError, match=message):  # the CLI reports it as one line
        parse_config(TrainConfig, ["--config", str(tmp_path / "x.yaml")], prog="policylink train")


def test_shipped_train_configs_are_their_bases_plus_a_few_lines():
    configs = sorted((CONFIG_ROOT / "train").glob("*.yaml"))
    assert len(configs) >= 20
    for path in configs:
        own = [line for line in path.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")]
        assert own[0].startswith("base: "), path.name
        doc = load_config(path)
        assert doc["policy"]["type"] == path.stem.split("_")[0] and doc["output_dir"] and doc["steps"] >= 1


def test_the_cli_reads_a_composed_config_with_overrides():
    cfg = parse_config(TrainConfig, ["--config", "diffusion_push_state_fast", "--steps", "7"], prog="policylink train")
    assert (cfg.steps, cfg.val_every, cfg.policy.type, cfg.policy.n_action_steps) == (7, 0, "diffusion", 1)
    assert cfg.policy.unet.down_dims == [64, 128] and cfg.dataset.env == "push" and cfg.lr == 0.001
    assert cfg.output_dir == "outputs/train/diffusion_push_state_fast" and cfg.torch_threads == 1
    assert Path(cfg.dataset.path).name == "push_state.zarr"


@pytest.mark.parametrize(
    "text, message",
    [
        ("- 1\n", r"received a list"),
        ("hello\n", r"received a str"),
        ("stepz: 5\n", r"x.yaml: unknown option 'stepz'; did you mean 'steps'\?"),
        (
            "policy:\n  type: flow\n  chunk_sizee: 3\n",
            r"unknown option 'policy.chunk_sizee'; did you mean 'policy.chunk_size'\?",
        ),
    ],
)
def test_a_config_file_that_is_no_mapping_of_options_is_one_line(tmp_path, text, message):
    (tmp_path / "x.yaml").write_text(text)
    with pytest.raises(ConfigError, match=message):
        parse_config(TrainConfig, ["--config", str(tmp_path / "x.yaml")], prog="policylink train")


def test_an_empty_config_file_sets_nothing(tmp_path):
    (tmp_path / "empty.yaml").write_text("# nothing yet\n")
    cfg = parse_config(TrainConfig, ["--config", str(tmp_path / "empty.yaml"), "--steps", "3"], prog="policylink train")
    assert cfg.steps == 3 and cfg.batch_size == TrainConfig().batch_size


def test_python_dash_m_of_a_command_reports_bad_input_in_one_line():
    """``torchrun -m policylink.cli.train`` runs the command module itself: same one-line errors as ``policylink``."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "policylink.cli.train", "--stepz", "5"], capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip() == "policylink train: error: unknown flag --stepz; did you mean --steps?"
