"""The light install: `pip install policylink` is the contract + wire only (a robot computer's client), the
adapters import nothing heavy, and a command whose extra is missing says which extra in one line."""

import importlib.metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from policylink.adapters.policy import HistoryPolicy
from policylink.adapters.schema import ActionSpec, FeatureSpec, PolicySpec
from policylink.cli import app as cli
from policylink.cli import extras

ROOT = Path(__file__).resolve().parents[1]
CORE = {"numpy", "zmq", "msgpack", "gymnasium"}  # the distribution's required dependencies (import names)
CORE_TRANSITIVE = {"farama_notifications", "typing_extensions", "cloudpickle"}  # gymnasium's own
STATE = "observation.state"
SPEC = PolicySpec(
    {STATE: FeatureSpec("float32", (2,))},
    ActionSpec(("x", "y"), "joint_position", ("rad", "rad"), (-1.0, -1.0), (1.0, 1.0)),
    chunk_size=3,
)


class Double(HistoryPolicy):
    """Every action of the chunk is twice the latest state: ``(B, 3, 2)``."""

    def __init__(self):
        super().__init__(SPEC)

    def _predict(self, history, pad_mask, tasks):
        return np.repeat(2 * history[STATE][:, -1:], SPEC.chunk_size, axis=1).astype(np.float32)


def test_adapters_import_only_the_core_dependencies():
    code = textwrap.dedent(
        """
        import importlib, pkgutil, sys
        import policylink.adapters as a
        for m in pkgutil.iter_modules(a.__path__):
            importlib.import_module("policylink.adapters." + m.name)
        tops = {n.split(".")[0] for n in sys.modules}
        files = {t for t in tops if getattr(sys.modules.get(t), "__file__", None)}  # not cython_runtime & co
        print(sorted(t for t in files if t not in sys.stdlib_module_names and not t.startswith("_")))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    third_party = set(eval(out.stdout)) - {"policylink"}
    assert third_party <= CORE | CORE_TRANSITIVE, sorted(third_party - CORE - CORE_TRANSITIVE)
    assert CORE <= third_party  # all four are used (else drop one from the required dependencies)


def test_every_command_names_its_extras():
    graph = extras.extras_graph()
    assert set(extras.COMMAND_EXTRAS) == set(cli.COMMANDS)
    assert {e for names in extras.COMMAND_EXTRAS.values() for e in names} <= set(graph)
    heavy = {"torch", "torchvision", "diffusers", "mujoco", "zarr", "opencv-python-headless", "draccus", "ray"}
    assert heavy <= extras.closure(graph, "all")
    assert {"torch", "torchvision", "zarr", "draccus"} <= extras.closure(graph, "train")
    assert "torch" not in extras.closure(graph, "sim") | extras.closure(graph, "data")
    torch_pin = [r for r in importlib.metadata.requires("policylink") if r.startswith("torch")]
    assert torch_pin == ['torch==2.14.1; extra == "train"', 'torchvision==0.29.1; extra == "train"']


def test_import_names_map_to_their_distributions():
    found = importlib.metadata.packages_distributions()
    for module, dist in extras._DISTRIBUTION_OF_MODULE.items():
        if module in found:
            assert dist.lower() in [d.lower() for d in found[module]], (module, found[module])


@pytest.mark.parametrize(
    ("command", "module", "line"),
    [
        ("train", "torch", "needs the 'train' extra (module 'torch' is not installed): pip install 'policylink[train]"),
        (
            "eval",
            "mujoco",
            "needs the extras 'sim', 'train' (module 'mujoco' is not installed): pip install 'policylink[sim,train]'",
        ),
        ("keys", "yaml", "needs the 'cli' extra (module 'yaml' is not installed): pip install 'policylink[cli]'"),
        ("run", "ray", "needs the 'ray' extra (module 'ray' is not installed): pip install 'policylink[ray]'"),
        ("dataset", "cv2", "needs the 'data' extra (module 'cv2' is not installed): pip install 'policylink[data]'"),
        ("dataset", "lerobot", "needs the Python package 'lerobot' (not installed): make lerobot"),
    ],
)
def test_install_hint_names_the_extra(command, module, line):
    assert extras.install_hint(command, module).startswith(f"policylink {command}: {line}")


@pytest.mark.parametrize("lazy", [False, True])
def test_cli_prints_the_hint_instead_of_a_traceback(tmp_path, monkeypatch, capsys, lazy):
    body = "def main(argv):\n    import torch\n" if lazy else "import torch\n\ndef main(argv):\n    return 0\n"
    (tmp_path / "needs_torch.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ModuleNotFoundError(name="torch")
    monkeypatch.setitem(cli.COMMANDS, "train", ("needs_torch", "test double"))
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    assert cli.main(["train"]) == 2
    err = capsys.readouterr().err
    assert err == extras.install_hint("train", "torch") + "\n"


def test_cli_keeps_the_traceback_of_a_missing_module_of_ours(tmp_path, monkeypatch):
    (tmp_path / "broken_cmd.py").write_text("import policylink.runtime.no_such_module\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.COMMANDS, "train", ("broken_cmd", "test double"))
    with pytest.raises(ModuleNotFoundError, match="no_such_module"):
        cli.main(["train"])


@pytest.mark.slow
def test_fresh_venv_with_the_light_install_calls_a_server(tmp_path):
    """`pip install .` alone (non-editable) in a new venv: RemotePolicy works, torch is absent, `policylink
    train` names the extra. The server runs here, in the full environment, on loopback."""
    from policylink.adapters.transport import PolicyServer

    src = _copy_checkout(tmp_path / "src")
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
    pip = subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "install", "-q", str(src)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stderr[-3000:]

    server = PolicyServer(Double(), "tcp://127.0.0.1:0").start()
    client = textwrap.dedent(
        f"""
        import importlib.util, numpy as np
        from policylink.adapters.transport import RemotePolicy
        with RemotePolicy({server.endpoint!r}, timeout_s=20) as remote:
            remote.reset()
            remote.update_observation({{"observation.state": np.array([[0.25, -0.5]], np.float32)}})
            chunk = remote.predict_action_chunk()
        print(chunk.dtype, chunk.shape, chunk[0].tolist())
        print([importlib.util.find_spec(m) is None for m in ("torch", "mujoco", "zarr", "cv2", "draccus")])
        """
    )
    try:
        run = subprocess.run(
            [str(venv / "bin/python"), "-I", "-c", client], capture_output=True, text=True, env=env, cwd=tmp_path
        )
    finally:
        server.stop()
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines() == [
        "float32 (1, 3, 2) [[0.5, -1.0], [0.5, -1.0], [0.5, -1.0]]",
        "[True, True, True, True, True]",
    ]
    cmd = [str(venv / "bin/policylink"), "train"]
    train = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert (train.returncode, train.stdout) == (2, "")
    assert train.stderr.splitlines() == [train.stderr.strip()]  # one line, no traceback
    assert "pip install 'policylink[train]'" in train.stderr


def _copy_checkout(src: Path) -> Path:
    """The checkout's files (tracked and untracked, not ignored) copied to ``src``: building in the checkout would
    write build/ and *.egg-info there."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    for rel in filter(None, files.split("\0")):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_bytes((ROOT / rel).read_bytes())
    return src


def test_the_wheel_carries_assets_and_configs_and_names_resolve_from_the_install(tmp_path):
    """`pip wheel .` builds without setuptools' "absent from the packages configuration" warnings; the wheel holds the
    MJCF assets and the shipped YAML configs; installed (not editable), `--config configs/train/...`, the demo's
    train configs and the MJCF files resolve inside the installed package, from a directory without configs/."""
    import zipfile

    src = _copy_checkout(tmp_path / "src")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "whl"), "."],
        capture_output=True, text=True, cwd=src, timeout=600,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    assert "absent from the `packages` configuration" not in build.stdout + build.stderr
    (wheel,) = (tmp_path / "whl").glob("policylink-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {p.relative_to(ROOT).as_posix() for p in (ROOT / "configs").rglob("*") if p.suffix in (".yaml", ".json")}
    assets = {p.relative_to(ROOT).as_posix() for p in (ROOT / "sim").rglob("assets/*.xml")}
    gaps = {p.relative_to(ROOT).as_posix() for p in (ROOT / "sim").rglob("gaps/*.yaml")}  # reality-gap presets
    assert len(shipped) > 20 and len(assets) == 10 and len(gaps) >= 5
    assert {f"policylink/{name}" for name in shipped | assets | gaps} <= names

    target = tmp_path / "site"
    install = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)]
    subprocess.run(install, check=True, capture_output=True, timeout=600)
    probe = textwrap.dedent(
        """
        from policylink import configs
        from policylink.cli.app import parse_config
        from policylink.cli.demo import CONFIG_DIR, DemoConfig, validate_demo
        from policylink.train.config import TrainConfig
        from policylink.sim.mujoco.base import asset_path

        cfg = parse_config(TrainConfig, ["--config", "configs/train/diffusion_push_state.yaml"])
        by_name = parse_config(TrainConfig, ["--config", "flow_push_state_fast"])
        validate_demo(DemoConfig())  # every train config template of the demo is found
        print(configs.__file__, CONFIG_DIR, asset_path("push.xml"), sep="\\n")
        print(cfg.steps, cfg.policy.type, by_name.steps, by_name.policy.type)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(target)}  # ahead of the editable install of this checkout
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    *paths, values = run.stdout.splitlines()
    assert [Path(p).is_relative_to(target / "policylink") for p in paths] == [True, True, True], paths
    assert Path(paths[2]).is_file()
    assert values == "10000 diffusion 2000 flow"
