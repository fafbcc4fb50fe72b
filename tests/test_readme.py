"""The README's Python code blocks run as written and do what their comments say. Every ```python block of the
README is either an example (``<!-- example: NAME (an optional note) -->`` before it, ``<!-- end: NAME -->`` after
it), run by a test (here with ``_blocks("NAME")``; tests/real/test_readme_robot.py runs ``robot-driver``), or
marked ``<!-- not run: REASON -->``; an unmarked block fails
:func:`test_every_python_block_is_run_by_a_test_or_marked_not_run`. A block that needs what a long command makes
(a trained checkpoint, a recorded store) says so in its note, and its test makes a small one first."""

import re
import socket
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARKER = re.compile(r"<!-- (example|not run): ([^>]*?) -->")


def _blocks(name: str) -> list[str]:
    text = README.read_text()
    pattern = (
        rf"<!-- example: {re.escape(name)}(?: \([^)]*\))? -->\s*```python\n(.*?)```\s*<!-- end: {re.escape(name)} -->"
    )
    return re.findall(pattern, text, re.S)


def _run(code: str, namespace: dict | None = None) -> dict:
    namespace = {"__name__": "readme_example"} if namespace is None else namespace
    exec(compile(code, str(README), "exec"), namespace)
    return namespace


def test_every_python_block_is_run_by_a_test_or_marked_not_run():
    lines = README.read_text().splitlines()
    sources = "\n".join(path.read_text() for path in Path(__file__).parent.rglob("test_*.py"))
    tested = set(re.findall(r'_blocks\("([^"]+)"\)|example: ([\w-]+)', sources)) - {""}
    tested = {name for pair in tested for name in pair if name}
    problems, examples = [], 0
    for i, line in enumerate(lines):
        if not line.startswith("```python"):
            continue
        marker = MARKER.fullmatch(lines[i - 1].strip()) if i else None
        if marker is None:
            problems.append(f"README.md:{i + 1}: a python block without an example or not-run marker")
        elif marker.group(1) == "example":
            examples += 1
            name = marker.group(2).split(" (")[0]
            if name not in tested:
                problems.append(f"README.md:{i + 1}: example {name!r} is run by no test here")
        elif len(marker.group(2)) < 20:
            problems.append(f"README.md:{i + 1}: 'not run' needs its reason")
    assert problems == []
    assert examples == sum(len(_blocks(name)) for name in tested) >= 12  # each example has its end marker


def _byo_code() -> str:
    blocks = _blocks("byo")
    assert len(blocks) == 2, "README must hold the two 'byo' examples"
    return "\n".join(blocks)


def test_readme_byo_examples_run_and_succeed(capsys):
    namespace: dict = {"__name__": "readme_example"}
    exec(compile(_byo_code(), str(README), "exec"), namespace)
    assert namespace["info"]["is_success"] is True
    # seed 0 starts at x = 0.27392..., so 3 steps of 0.1 m (capped) reach |x| < 0.05
    assert namespace["t"] == 2
    assert "success: True" in capsys.readouterr().out


def test_readme_policy_type_example_registers_and_runs(capsys):
    from policylink.policies.registry import _TYPES, policy_type

    (block,) = _blocks("policy-type")
    namespace: dict = {"__name__": "readme_example"}
    try:
        exec(compile(_byo_code() + "\n" + block, str(README), "exec"), namespace)
        assert policy_type("mlp_flow").config_cls is namespace["MlpFlowConfig"]
        assert namespace["cfg"].type == "mlp_flow" and namespace["cfg"].hidden == 32
        policy = namespace["untrained"]
        assert policy.spec.chunk_size == 4 and policy.spec.action.dim == 1
        chunk = policy.predict_action_chunk()
        assert chunk.shape == (3, 4, 1) and chunk.dtype == np.float32 and np.isfinite(chunk).all()
        assert capsys.readouterr().out.splitlines()[-1] == "(3, 4, 1)"
    finally:
        _TYPES.pop("mlp_flow", None)


def test_readme_simulation_example_runs_an_expert_episode_under_perturbations():
    (block,) = _blocks("sim")
    namespace: dict = {"__name__": "readme_example"}
    exec(compile(block, str(README), "exec"), namespace)
    obs = namespace["obs"]
    assert obs["observation.images.top"].shape == (96, 96, 3) and obs["observation.state"].shape == (6,)
    assert namespace["terminated"] or namespace["truncated"]
    assert 0 < namespace["env"].unwrapped.elapsed_steps <= 150


def test_readme_foreign_env_example_prints_success(capsys):
    (block,) = _blocks("foreign")
    exec(compile(block, str(README), "exec"), {"__name__": "readme_example"})
    assert capsys.readouterr().out.strip() == "True"


def test_readme_pointmap_example_back_projects_a_depth_image():
    (block,) = _blocks("pointmap")
    pm = _run(block)["pm"]
    assert pm.points.shape == (48, 64, 3) and pm.points.dtype == np.float32 and pm.valid.all()
    np.testing.assert_allclose(pm.points[:, :, 2], 0.2, atol=1e-6)  # a flat floor 0.8 m below a camera at 1 m
    np.testing.assert_allclose(pm.points[0, 0, :2], [-32 * 0.8 / 60, 24 * 0.8 / 60], atol=1e-6)  # image up = +y
    np.testing.assert_allclose(pm.points[24, 32], [0.0, 0.0, 0.2], atol=1e-6)  # the principal point


def test_readme_data_example_reads_a_recorded_store(tmp_path, monkeypatch):
    from policylink.runtime.record import RecordConfig, record

    monkeypatch.chdir(tmp_path)  # the block's relative path, as after the README's record command (2 episodes)
    record(RecordConfig(env="push", episodes=2, obs_mode="state+image", out="outputs/data/push.zarr"), progress=False)
    (block,) = _blocks("data")
    item = _run(block)["item"]
    assert tuple(item["observation.state"].shape) == (2, 6)
    assert tuple(item["observation.images.top"].shape) == (2, 3, 96, 96)
    assert tuple(item["action"].shape) == (16, 2) and tuple(item["action_is_pad"].shape) == (16,)
    assert item["task"] == "push the T-shaped block onto the green target"


def test_readme_checkpoint_example_loads_predicts_embeds_and_samples(tmp_path, monkeypatch):
    from policylink.cli.app import parse_config
    from policylink.runtime.record import RecordConfig, record
    from policylink.train.config import TrainConfig
    from policylink.train.imitation import train

    monkeypatch.chdir(tmp_path)  # no configs/ here: the shipped config resolves from the package
    record(RecordConfig(env="push", episodes=2, out="outputs/data/push_state.zarr"), progress=False)
    quick = ["--steps", "2", "--batch_size", "8", "--warmup_steps", "0", "--val_every", "0", "--progress", "false"]
    train(parse_config(TrainConfig, ["--config", "configs/train/diffusion_push_state.yaml", *quick]))
    (block,) = _blocks("checkpoint")
    ns = _run(block)
    assert ns["chunk"].shape == (2, 16, 2) and ns["chunk"].dtype == np.float32
    assert ns["latent"].shape[0] == 2 and ns["latent"].dtype == np.float32
    assert ns["guided"].shape == (2, 16, 2) and np.isfinite(ns["guided"]).all()


def test_readme_lerobot_spec_example_writes_policylink_json(tmp_path, monkeypatch):
    import json

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "outputs/lr/checkpoints/last/pretrained_model"
    folder.mkdir(parents=True)  # a LeRobot checkpoint folder (its own files do not matter here)
    (block,) = _blocks("lerobot-spec")
    _run(block)
    doc = json.loads((folder / "policylink.json").read_text())
    assert doc["control_frequency"] == 10.0 and doc["env_kwargs"] == {"obs_mode": "state+image", "image_size": 96}
    assert doc["action"]["names"] == ["dx", "dy", "dz"] and doc["action"]["control_mode"] == "ee_delta"


def test_readme_serving_client_builds_its_batch_from_the_served_spec():
    from policylink.adapters.policy import HistoryPolicy
    from policylink.adapters.schema import ActionSpec, FeatureSpec, PolicySpec
    from policylink.adapters.transport import PolicyServer

    class PushLike(HistoryPolicy):
        """Reads a state, a camera and the task (as an image policy with language does); remembers its input."""

        def __init__(self):
            features = {
                "observation.state": FeatureSpec("float32", (6,)),
                "observation.images.top": FeatureSpec("uint8", (32, 32, 3)),
                "task": FeatureSpec("string", ()),
            }
            action = ActionSpec(("dx", "dy"), "ee_delta", ("m", "m"), (-0.025, -0.025), (0.025, 0.025))
            super().__init__(PolicySpec(features, action, n_obs_steps=2, chunk_size=4, n_action_steps=4))

        def _predict(self, history, pad_mask, tasks):
            self.seen = {k: (v.shape, v.dtype) for k, v in history.items()}, list(tasks)
            return np.full((len(tasks), 4, 2), 0.01, np.float32)

    served = PushLike()
    server = PolicyServer(served, "tcp://127.0.0.1:0").start()
    try:
        (block,) = _blocks("serve-client")
        assert '"tcp://127.0.0.1:5555"' in block
        ns = _run(block.replace("tcp://127.0.0.1:5555", server.endpoint))
    finally:
        server.stop()
    assert ns["chunk"].shape == (2, 4, 2) and ns["chunk"].dtype == np.float32
    assert (ns["chunk"] == np.float32(0.01)).all()
    shapes, tasks = served.seen
    assert shapes == {
        "observation.state": ((2, 2, 6), np.float32),
        "observation.images.top": ((2, 2, 32, 32, 3), np.uint8),
    }
    assert tasks == ["push the T-shaped block onto the green target"] * 2


def test_readme_env_server_example_resets_and_steps_a_remote_env():
    with socket.socket() as s:  # a free port for the block's fixed address
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (block,) = _blocks("serve-env")
    assert '"tcp://127.0.0.1:5556"' in block
    ns = _run(block.replace("tcp://127.0.0.1:5556", f"tcp://127.0.0.1:{port}"))
    assert ns["obs"]["observation.state"].shape == (6,) and ns["info"]["is_success"] is False
    assert ns["env"].env_spec.name == "reach"


def test_readme_executor_loop_runs_the_byo_policy_on_four_envs():
    namespace = _run(_byo_code())
    successes = []

    class Counted(namespace["PointEnv"]):
        def step(self, action):
            out = super().step(action)
            successes.append(out[2])
            return out

    namespace["PointEnv"] = Counted
    (block,) = _blocks("executor")
    ns = _run(block, namespace)
    ns["vec_env"].close()
    assert ns["action"].shape == (4, 1) and ns["action"].dtype == np.float32
    assert len(successes) == 400  # 100 steps of 4 envs
    # from |x0| <= 1 m at 0.1 m per step every episode succeeds within 10 steps: >= 4 x 100 // 11 episodes
    assert sum(successes) >= 36


def test_readme_demo_figures_carry_their_intervals_and_name_the_full_configs():
    """Each measured demo rate (50 episodes) stands with its 95% Wilson interval, the figures are the committed ones
    of benchmarks/results/learning.md, and the full-config command (the 99%) parses and names existing configs."""
    import shlex

    import yaml

    from policylink.cli import demo
    from policylink.cli.app import parse_config
    from policylink.configs import CONFIG_ROOT
    from policylink.evaluate.report import wilson_interval

    (section,) = re.findall(r"<!-- section: demo-results -->(.*?)<!-- end: demo-results -->", README.read_text(), re.S)
    figures = re.findall(r"(\d+)% \[([\d.]+), ([\d.]+)\]", section)
    assert len(figures) == 7  # 2 runs x (DP push, flow push) + DP reach + flow reach + the new user's flow push
    for pct, low, high in figures:
        k = int(pct) * 50 // 100
        assert k * 100 == int(pct) * 50  # a rate of 50 episodes
        lo, hi = wilson_interval(k, 50)
        assert (low, high) == (f"{100 * lo:.1f}", f"{100 * hi:.1f}"), pct
    committed = (ROOT / "benchmarks/results/learning.md").read_text()
    assert "**74% / 100%** and **66% / 98%**" in committed  # the demo row of the summary
    assert {"74", "100", "66", "98"} <= {pct for pct, _, _ in figures}
    assert "| diffusion | push | state | 10000 steps x 64, 13.3 min | **99%** |" in committed
    assert "99%" in section and demo.FULL_COMMAND in section
    (args,) = re.findall(r'DEMO_ARGS="([^"]+)"', demo.FULL_COMMAND)
    cfg = parse_config(demo.DemoConfig, shlex.split(args))
    demo.validate_demo(cfg)  # the full train configs exist for every (policy, env)
    assert cfg.out != demo.DemoConfig().out and cfg.eval_episodes == 100
    steps = {f.name: yaml.safe_load(f.read_text())["steps"] for f in (CONFIG_ROOT / "train").glob("*_state*.yaml")}
    assert steps["diffusion_push_state.yaml"] == steps["flow_push_state.yaml"] == 10_000
    assert steps["diffusion_push_state_fast.yaml"] == steps["flow_push_state_fast.yaml"] == 2_000
    assert steps["diffusion_reach_state_fast.yaml"] == steps["flow_reach_state_fast.yaml"] == 1_000
