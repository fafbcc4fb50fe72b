"""``--device`` is checked when the command's config is parsed (cli.app.check_device), before any env, dataset or
checkpoint is opened: one line naming ``device``, the expected and the received value, exit code 2."""

import pytest
import torch

from policylink.cli import app
from policylink.cli.app import ConfigError, parse_config
from policylink.evaluate.run import RunConfig
from policylink.serve.server import ServeConfig


def test_a_device_past_the_last_gpu_or_unknown_is_a_config_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError) as e:
        parse_config(RunConfig, ["--device", "cuda:7"])
    assert str(e.value) == "device: expected cuda:0 .. cuda:0, received 'cuda:7'"
    assert parse_config(ServeConfig, ["--device", "cuda:0"]).device == "cuda:0"
    with pytest.raises(ConfigError) as e:
        parse_config(ServeConfig, ["--device", "gpu"])
    assert str(e.value) == "device: expected 'auto', 'cpu' or 'cuda[:N]', received 'gpu'"


def test_cuda_without_cuda_is_one_line_before_the_run_starts(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert parse_config(RunConfig, ["--device", "cpu"]).device == "cpu"
    # the checkpoint does not exist: the device is reported first, before anything looks for it
    assert app.main(["run", "--policy", "no/such/ckpt", "--env", "reach", "--device", "cuda"]) == 2
    assert capsys.readouterr().err == (
        "policylink run: error: device: 'cuda' requested but CUDA is not available here (use 'auto' or 'cpu')\n"
    )
