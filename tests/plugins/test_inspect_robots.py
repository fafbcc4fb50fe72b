"""policylink as an inspect-robots plugin, against the real inspect-robots 0.60.0: every embodiment passes
``check_embodiment``; ``inspect_robots.eval`` and the ``inspect-robots run`` CLI run policylink policies (a checkpoint
folder, a served policy) on policylink embodiments; the eval log holds the same episodes ``policylink``'s own
rollout loop gives for the same seeds (actions, lengths, successes); bad input is one clear error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("inspect_robots")

from inspect_robots import eval as ir_eval  # noqa: E402
from inspect_robots.conformance import check_embodiment  # noqa: E402
from inspect_robots.errors import CompatibilityError, ConfigError  # noqa: E402
from inspect_robots.registry import registered, resolve  # noqa: E402
from inspect_robots.rollout import derive_seed  # noqa: E402
from inspect_robots.scene import Scene  # noqa: E402
from inspect_robots.types import Action  # noqa: E402

from policylink.adapters.registry import make_env  # noqa: E402
from policylink.adapters.schema import ActionError, ObservationError, PolicySpec  # noqa: E402
from policylink.plugins.inspect_robots.embodiment import MUJOCO_TASKS  # noqa: E402

STATE = "observation.state"
INSPECT_ROBOTS = str(Path(sys.executable).with_name("inspect-robots"))


@pytest.fixture(scope="module")
def flow_checkpoint(tmp_path_factory):
    """An untrained tiny flow checkpoint for ``reach`` (2 observation steps, chunks of 8, 3 executed), on disk."""
    import torch

    from policylink.data.normalize import Normalizer
    from policylink.policies.common.unet1d import UNetConfig
    from policylink.policies.processing import processors_for
    from policylink.policies.registry import make_config, make_policy

    env_spec = make_env("reach").env_spec
    cfg = make_config(
        "flow",
        observation_keys=[STATE],
        chunk_size=8,
        n_action_steps=3,
        n_obs_steps=2,
        unet=UNetConfig(down_dims=[16, 32], time_embed_dim=16),
    )
    spec = PolicySpec({STATE: env_spec.observation_features[STATE]}, env_spec.action, 2, 8, 3, 10.0)
    stats = {
        STATE: {"min": np.full(6, -0.3), "max": np.full(6, 0.3)},
        "action": {"min": env_spec.action.low_array, "max": env_spec.action.high_array},
    }
    torch.manual_seed(0)
    norm = Normalizer(stats, {STATE: "min_max", "action": "min_max"})
    chain = processors_for(cfg, spec.observation_features, norm)
    policy = make_policy("flow", spec=spec, processors=chain, config=cfg, device="cpu", seed=0)
    return policy.save(tmp_path_factory.mktemp("ir") / "flow")


def policylink_episodes(ref, env: str, seeds: list[int]) -> tuple[list, list[list[np.ndarray]]]:
    """``(results, actions per episode)`` of ``ref`` on ``env`` with these reset seeds through policylink's own rollout
    loop (one env, receding horizon, the policy's noise seeded 0 as the plugin loads it)."""
    from policylink.policies import load_policy
    from policylink.runtime.executors import make_executor
    from policylink.runtime.rollout import EpisodeSubscriber, RegistryEnvFn, make_vector_env, rollout

    class Actions(EpisodeSubscriber):
        def __init__(self):
            self.by_episode, self.current = [], []

        def on_step(self, slot, obs, action, reward, done, info):
            self.current.append(np.array(action))

        def on_episode_end(self, slot, result):
            self.by_episode.append(self.current)
            self.current = []

    policy = load_policy(ref, device="cpu", seed=0)
    vec = make_vector_env(RegistryEnvFn(env), [list(enumerate(seeds))])
    executor, actions = make_executor(policy), Actions()
    try:
        results = rollout(vec, executor, len(seeds), subscribers=[actions])
    finally:
        vec.close()
    return results, actions.by_episode


def read_log(log_dir: Path) -> dict:
    (path,) = log_dir.glob("*.json")
    return json.loads(path.read_text())


def action_sidecars(log_dir: Path, log: dict) -> dict[str, np.ndarray]:
    """scene id -> executed actions ``(T, A)`` from inspect-robots' per-trial action side-cars."""
    out = {}
    for sample in log["samples"]:
        (meta,) = sample["trial_metadata"]
        rows = [json.loads(line) for line in (log_dir / meta["actions"]).read_text().splitlines()]
        out[sample["scene_id"]] = np.array([r["action"] for r in rows if "action" in r])
    return out


# ------------------------------------------------------------------------------------------------- registration


def test_entry_points_register_policy_embodiments_and_tasks():
    embodiments = {f"policylink/{t}" for t in MUJOCO_TASKS} | {
        "policylink",
        "policylink/genesis_reach",
        "policylink/genesis_pick_place",
        "policylink/sim_robot",
        "policylink/robot",
    }
    assert embodiments <= set(registered("embodiment"))
    assert "policylink" in registered("policy")
    assert {f"policylink/{t}" for t in MUJOCO_TASKS} <= set(registered("task"))
    out = subprocess.run([INSPECT_ROBOTS, "list"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "failed to load" not in out.stderr, out.stderr
    assert "  - policylink/pick_place" in out.stdout and "  - policylink\n" in out.stdout


def test_listing_the_plugins_imports_no_heavy_stack():
    """``inspect-robots list`` loads every entry point: our modules import neither torch nor a simulator."""
    code = (
        "import sys; import policylink.plugins.inspect_robots.policy, policylink.plugins.inspect_robots.embodiment, "
        "policylink.plugins.inspect_robots.tasks; "
        "print(sorted({'torch', 'mujoco', 'genesis', 'zarr'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("task", MUJOCO_TASKS)
def test_every_mujoco_task_is_a_conformant_embodiment(task):
    emb = resolve("embodiment", f"policylink/{task}")
    try:
        report = check_embodiment(emb.info)
        assert report.ok and report.issues == (), report.summary()  # not even a warning
        spec = make_env(task).env_spec
        box = emb.info.action_space
        assert box.shape == (spec.action.dim,)
        np.testing.assert_array_equal(box.low, np.array(spec.action.low, np.float64))
        np.testing.assert_array_equal(box.high, np.array(spec.action.high, np.float64))
        assert box.semantics.control_mode == "eef_delta_pos" and box.semantics.dim_labels == spec.action.names
        assert box.semantics.gripper == ("continuous" if spec.action.gripper_index is not None else "none")
        (field,) = emb.info.observation_space.state.fields
        assert (field.key, field.shape, field.dtype) == (STATE, spec.observation_features[STATE].shape, "float32")
        assert emb.info.control_hz == 10.0 and emb.info.supported_target_kinds == {f"policylink/{task}"}
        assert {"seedable", "resettable", "privileged_success"} <= emb.info.capabilities
        for name, unit in zip(spec.action.names, spec.action.units):
            assert f"{name} [" in emb.info.docs and unit in emb.info.docs
        obs = emb.reset(Scene(id="s", instruction=spec.tasks[0]), seed=7)
        env_obs, _ = make_env(task).reset(seed=7, options={"task": spec.tasks[0]} if len(spec.tasks) > 1 else None)
        np.testing.assert_array_equal(obs.state[STATE], env_obs[STATE])  # same seed, same scene
        assert obs.instruction == spec.tasks[0]
    finally:
        emb.close()


def test_image_observations_map_to_cameras():
    emb = resolve("embodiment", "policylink", env="pick_place", obs_mode="image+proprio", image_size=24)
    try:
        assert check_embodiment(emb.info).ok
        (cam,) = emb.info.observation_space.cameras
        assert (cam.name, cam.height, cam.width, cam.channels) == ("front", 24, 24, 3)
        assert emb.info.observation_space.state.fields[0].shape == (4,)  # ee xyz, gripper opening
        obs = emb.reset(Scene(id="s", instruction=make_env("pick_place").env_spec.tasks[0]), seed=1)
        assert obs.images["front"].shape == (24, 24, 3) and obs.images["front"].dtype == np.uint8
        step = emb.step(Action(data=np.array([0.0, 0.0, 0.0, 1.0])))
        assert step.observation.state[STATE].shape == (4,) and step.info["is_success"] is False
        assert abs(step.info["progress"]) < 0.01  # closing the gripper in place: no progress toward the goal
    finally:
        emb.close()


@pytest.mark.genesis
def test_genesis_embodiment_is_conformant_and_runs_reach_scenes():
    pytest.importorskip("genesis")
    emb = resolve("embodiment", "policylink/genesis_reach")
    try:
        assert check_embodiment(emb.info).ok and emb.info.name == "policylink/genesis_reach"
        assert emb.info.supported_target_kinds == {"policylink/reach"}  # the reach task's scenes run on Genesis
        mujoco_obs, _ = make_env("reach").reset(seed=3)
        obs = emb.reset(Scene(id="s", instruction=make_env("reach").env_spec.tasks[0]), seed=3)
        np.testing.assert_allclose(obs.state[STATE], mujoco_obs[STATE], atol=1e-6)  # same seed, same start
        assert emb.step(Action(data=np.zeros(3))).observation.state[STATE].shape == (6,)
    finally:
        emb.close()


def test_sim_robot_is_a_self_paced_conformant_embodiment_and_runs_a_trial(tmp_path, reach_p):
    emb = resolve("embodiment", "policylink/sim_robot", task="reach", time_scale=4.0)
    try:
        assert check_embodiment(emb.info).ok
        assert "self_paced" in emb.info.capabilities and emb.info.supported_target_kinds == {"policylink/reach"}
        from policylink.plugins.inspect_robots.policy import PolicylinkPolicy

        task = resolve("task", "policylink/reach", num_scenes=2)
        (log,) = ir_eval(task, PolicylinkPolicy(reach_p(), "reach_p"), emb, log_dir=str(tmp_path))
    finally:
        emb.close()
    assert log.status == "success" and log.results.total_trials == 2 and log.eval.embodiment == "policylink/sim_robot"
    for sample in log.samples:  # real time on a shared machine: late steps may cost steps; the episodes still end
        assert sample.termination_reasons[0] in ("success", "truncated")
        assert sample.trial_metadata[0]["policylink"]["n_steps"] == sample.epochs[0]["episode_length"] > 0


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"seed": "x"}, "-P seed: expected an integer in [0, inf), received 'x'"),  # -P values arrive as text
        ({"n_action_steps": "abc"}, "-P n_action_steps: expected an integer in [1, inf), received 'abc'"),
        ({"threads": -1}, "-P threads: expected an integer in [0, inf), received -1"),
        ({"ensemble_m": "x"}, "-P ensemble_m: expected a number, received 'x'"),
    ],
)
def test_a_bad_numeric_policy_parameter_is_named_before_any_load(params, message):
    with pytest.raises(ConfigError) as e:
        resolve("policy", "policylink", policy="never/loaded", **params)
    assert str(e.value) == message


def test_sim_robot_bad_timing_is_a_config_error_naming_the_parameter():
    with pytest.raises(ConfigError) as e:  # checked by RobotConfig (-E jitter_ms=-5), before any env is built
        resolve("embodiment", "policylink/sim_robot", task="reach", jitter_ms=-5)
    assert str(e.value) == "embodiment policylink/sim_robot task 'reach': jitter_ms: expected a value in [0, inf), " \
        "received -5"  # fmt: skip
    with pytest.raises(ConfigError) as e:  # -E values arrive as text: named, not a TypeError from a comparison
        resolve("embodiment", "policylink/sim_robot", task="reach", jitter_ms="x")
    assert str(e.value).endswith("jitter_ms: expected a value in [0, inf), received 'x'")


def test_a_served_robot_is_an_embodiment(tmp_path, reach_p):
    """``policylink robot --sim reach`` (here in-process, 4x real time) as embodiment ``policylink/robot``."""
    from policylink.plugins.inspect_robots.policy import PolicylinkPolicy
    from policylink.real.robots import RobotConfig, build_robot, safety_config
    from policylink.real.server import RobotServer

    cfg = RobotConfig(sim="reach", time_scale=4.0, bind="tcp://127.0.0.1:0")
    driver = build_robot(cfg)
    server = RobotServer(driver, cfg.bind, safety=safety_config(cfg, driver)).start()
    try:
        emb = resolve("embodiment", "policylink/robot", address=server.endpoint, hz=40.0)
        try:
            assert check_embodiment(emb.info).ok and not emb.info.is_simulated
            assert emb.info.capabilities == {"resettable", "self_paced"}
            task = resolve("task", "policylink/reach", num_scenes=2)
            (log,) = ir_eval(task, PolicylinkPolicy(reach_p(), "reach_p"), emb, log_dir=str(tmp_path))
        finally:
            emb.close()
    finally:
        server.stop()
    assert log.status == "success" and log.results.total_trials == 2
    assert all(s.termination_reasons[0] in ("success", "truncated") for s in log.samples)
    with pytest.raises(ConfigError, match=r"embodiment policylink/robot address 'tcp://127.0.0.1:9': .*hello"):
        resolve("embodiment", "policylink/robot", address="tcp://127.0.0.1:9", timeout_s=0.3)


# ------------------------------------------------------------------------------------------------ end to end


def test_eval_of_a_checkpoint_logs_the_actions_policylink_run_executes(flow_checkpoint, tmp_path):
    """A flow checkpoint with a 2-step observation window: inspect-robots' log holds, per trial, exactly the actions
    and episode length of policylink's own rollout loop with the same reset seeds and noise seed."""
    policy = resolve("policy", "policylink", policy=str(flow_checkpoint), device="cpu")
    task = resolve("task", "policylink/reach", num_scenes=3, seed=500)
    (log,) = ir_eval(task, policy, "policylink/reach", log_dir=str(tmp_path), seed=11)
    assert log.status == "success" and log.results.total_trials == 3 and log.results.errored_trials == 0
    assert log.eval.policy_config["executor"] == "receding_horizon" and log.eval.policy_config["n_action_steps"] == 3
    assert log.eval.policy_config["n_obs_steps"] == 2 and log.eval.policy == f"policylink:{flow_checkpoint}"
    seeds = [derive_seed(11, 500 + i, 0) for i in range(3)]
    assert [s.trial_metadata[0]["policylink"]["seed"] for s in log.samples] == seeds
    results, actions = policylink_episodes(str(flow_checkpoint), "reach", seeds)
    logged = action_sidecars(tmp_path, read_log(tmp_path))
    for i, (sample, result) in enumerate(zip(log.samples, results)):
        assert sample.epochs[0]["episode_length"] == result.n_steps == len(actions[i])
        assert sample.epochs[0]["success_at_end"] == float(result.success)
        assert sample.trial_metadata[0]["policylink"]["inferences"] == result.inferences
        np.testing.assert_allclose(logged[sample.scene_id], np.stack(actions[i]), rtol=0, atol=1e-7)
    assert log.stats.mean_inference_latency_s is not None and log.stats.mean_inference_latency_s > 0


def test_cli_run_of_a_served_policy_matches_policylink_run(tmp_path, reach_p):
    """``inspect-robots run`` (the unmodified CLI, default guardrails on) drives a policy served over our ZeroMQ
    protocol on ``policylink/reach``: per scene the same success and episode length as policylink's rollout."""
    from policylink.adapters.transport import PolicyServer

    server = PolicyServer(reach_p(), "tcp://127.0.0.1:0").start()
    try:
        env = {**os.environ, "INSPECT_ROBOTS_CONFIG": str(tmp_path / "none.ini")}
        cmd = [INSPECT_ROBOTS, "run", "--task", "policylink/reach", "-T", "num_scenes=4", "-T", "seed=100"]
        cmd += ["--policy", "policylink", "-P", f"policy={server.endpoint}", "--embodiment", "policylink/reach"]
        cmd += ["--no-prompt", "--log-dir", str(tmp_path / "logs"), "--seed", "3", "--no-live-log"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "guardrails: clamp + delta-limit" in done.stdout
        seeds = [derive_seed(3, 100 + i, 0) for i in range(4)]
        results, _ = policylink_episodes(server.endpoint, "reach", seeds)
    finally:
        server.stop()
    log = read_log(tmp_path / "logs")
    assert log["status"] == "success" and log["results"]["total_trials"] == 4
    assert log["results"]["metrics"]["success_at_end"] == 1.0 == np.mean([r.success for r in results])
    for sample, result in zip(log["samples"], results):
        assert sample["epochs"][0]["episode_length"] == result.n_steps
        assert sample["termination_reasons"] == ["success"]
        assert sample["trial_metadata"][0]["policylink"]["seed"] == result.seed


@pytest.mark.slow
def test_cli_run_of_a_trained_checkpoint_matches_policylink_run_trial_by_trial(trained_reach_checkpoint, tmp_path):
    """``inspect-robots run`` of a trained checkpoint folder: per scene the success, episode length and executed
    actions (clipped by inspect-robots' default guardrails to the limits, as the env clips them) of policylink's own
    rollout with the same seeds; the log's success rate is policylink's."""
    env = {**os.environ, "INSPECT_ROBOTS_CONFIG": str(tmp_path / "none.ini")}
    cmd = [INSPECT_ROBOTS, "run", "--task", "policylink/reach", "-T", "num_scenes=6", "--policy", "policylink"]
    cmd += ["-P", f"policy={trained_reach_checkpoint}", "-P", "device=cpu", "--embodiment", "policylink/reach"]
    cmd += ["--no-prompt", "--log-dir", str(tmp_path / "logs"), "--no-live-log"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    log = read_log(tmp_path / "logs")
    seeds = [derive_seed(0, 100_000 + i, 0) for i in range(6)]
    results, actions = policylink_episodes(str(trained_reach_checkpoint), "reach", seeds)
    spec = make_env("reach").env_spec.action
    logged = action_sidecars(tmp_path / "logs", log)
    assert log["results"]["total_trials"] == 6 and log["results"]["errored_trials"] == 0
    for sample, result, acts in zip(log["samples"], results, actions):
        assert sample["trial_metadata"][0]["policylink"]["seed"] == result.seed
        assert sample["epochs"][0] == {"success_at_end": float(result.success), "episode_length": result.n_steps}
        clipped = np.clip(np.stack(acts), spec.low_array, spec.high_array)
        np.testing.assert_allclose(logged[sample["scene_id"]], clipped, rtol=0, atol=1e-7)
    rate = np.mean([r.success for r in results])
    assert log["results"]["metrics"]["success_at_end"] == pytest.approx(rate) and rate >= 1 / 6


def test_an_inspect_robots_policy_runs_on_a_policylink_embodiment(tmp_path):
    """The other direction: a policy of inspect-robots itself (its builtin ``random``, 2-D ``eef_delta_pos``) on
    ``policylink/push``; its 0.1 deltas are clamped to push's 0.025 m limits by the default guardrails."""
    from inspect_robots.approver import ClampApprover

    emb = resolve("embodiment", "policylink/push")
    try:
        task = resolve("task", "policylink/push", num_scenes=1)
        (log,) = ir_eval(task, "random", emb, log_dir=str(tmp_path), approver=ClampApprover(emb.info.action_space))
    finally:
        emb.close()
    assert log.status == "success" and log.results.total_trials == 1
    assert log.samples[0].epochs[0]["episode_length"] == 150  # random pushes do not solve push: the full horizon
    acts = next(iter(action_sidecars(tmp_path, read_log(tmp_path)).values()))
    assert acts.shape == (150, 2) and np.abs(acts).max() == pytest.approx(0.025)


class _XplReachModel:
    """A saturated P-controller toward the target as an XPolicyLab model: ``arm_joint_state`` in = state (6,),
    4 steps of the same ee delta out."""

    def reset(self):
        pass

    def infer(self, obs):
        s = obs["state"]["arm_joint_state"]
        delta = np.clip(0.9 * (s[3:6] - s[0:3]), -0.02, 0.02).astype(np.float32)
        return [{"arm_joint_state": delta} for _ in range(4)]


def test_eval_of_an_xpolicylab_served_policy(tmp_path):
    """``-P policy=xpl://...`` (an XPolicyLab model server, here the protocol's reference server) with ``-P env=reach``
    for its spec: inspect-robots evaluates it on ``policylink/reach`` behind our receding-horizon executor."""
    pytest.importorskip("msgpack_numpy")
    pytest.importorskip("websockets")
    from tests.adapters.xpolicylab_reference import ReferenceServer

    with ReferenceServer(_XplReachModel()) as ref:
        url = f"xpl://127.0.0.1:{ref.port}?chunk_size=4&n_action_steps=2"
        policy = resolve("policy", "policylink", policy=url, env="reach")
        task = resolve("task", "policylink/reach", num_scenes=2)
        (log,) = ir_eval(task, policy, "policylink/reach", log_dir=str(tmp_path))
        policy.close()
        infers = sum(r["message_type"] == "infer" for r in ref.requests)
    assert log.status == "success" and log.results.metrics["success_at_end"] == 1.0
    steps = [s.epochs[0]["episode_length"] for s in log.samples]
    assert infers == sum(-(-n // 2) for n in steps)  # one chunk per 2 executed actions
    assert [s.trial_metadata[0]["policylink"]["inferences"] for s in log.samples] == [-(-n // 2) for n in steps]
    with pytest.raises(ConfigError, match=r"policylink policy env 'rech'.*did you mean 'reach'"):
        resolve("policy", "policylink", policy=url, env="rech")


# -------------------------------------------------------------------------------------------------- bad input


def test_bad_names_and_kwargs_are_one_error_naming_the_field(flow_checkpoint):
    with pytest.raises(ConfigError, match=r"environment 'pushh': unknown; .*did you mean 'push'\?"):
        resolve("embodiment", "policylink", env="pushh")
    with pytest.raises(ConfigError, match=r"env: expected a registered policylink env \(-E env=NAME\)"):
        resolve("embodiment", "policylink")
    with pytest.raises(ConfigError, match=r"policylink env 'reach': 'reach' env kwarg: expected one of .*'colour'"):
        resolve("embodiment", "policylink/reach", colour="red")
    with pytest.raises(ConfigError, match=r"obs_mode: expected one of"):
        resolve("embodiment", "policylink/reach", obs_mode="pixels")
    with pytest.raises(ConfigError, match=r"action.control_mode: expected one of .* received 'joint_torque'"):
        resolve("embodiment", "policylink", env="reacher")
    with pytest.raises(ConfigError, match=r"policy: expected a policylink policy reference"):
        resolve("policy", "policylink")
    with pytest.raises(ConfigError, match=r"policy 'no/such/ckpt': checkpoint folder not found"):
        resolve("policy", "policylink", policy="no/such/ckpt")
    with pytest.raises(ConfigError, match=r"policy 'diffuson'.*did you mean 'diffusion'\?"):
        resolve("policy", "policylink", policy="diffuson")
    with pytest.raises(ConfigError, match=r"executor.kind: expected one of .* received 'ensemble'"):
        resolve("policy", "policylink", policy=str(flow_checkpoint), executor="ensemble")
    with pytest.raises(ConfigError, match=r"n_action_steps"):
        resolve("policy", "policylink", policy=str(flow_checkpoint), n_action_steps=9)  # chunk_size is 8
    with pytest.raises(ConfigError, match=r"num_scenes: expected an integer >= 1, received 0"):
        resolve("task", "policylink/reach", num_scenes=0)
    with pytest.raises(TypeError):  # inspect-robots' CLI turns this into 'invalid arguments for policy ...'
        resolve("policy", "policylink", policy=str(flow_checkpoint), checkpoint="x")


def test_cli_reports_bad_input_in_one_line(tmp_path):
    env = {**os.environ, "INSPECT_ROBOTS_CONFIG": str(tmp_path / "none.ini")}
    base = [INSPECT_ROBOTS, "run", "--task", "policylink/reach", "--no-prompt", "--log-dir", str(tmp_path)]
    done = subprocess.run(
        [*base, "--policy", "policylink", "-P", "policy=nope/ckpt", "--embodiment", "policylink/reach"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "policy 'nope/ckpt': checkpoint folder not found: nope/ckpt" in done.stderr


def test_mismatched_scenes_observations_and_actions_are_named(flow_checkpoint, tmp_path):
    from inspect_robots.types import Observation

    emb = resolve("embodiment", "policylink/push")
    try:
        with pytest.raises(ConfigError, match=r"scene.instruction: expected one of the instructions env 'push'"):
            emb.reset(Scene(id="s", instruction="stack the blocks"), seed=0)
        emb.reset(Scene(id="s", instruction=make_env("push").env_spec.tasks[0]), seed=0)
        with pytest.raises(ActionError, match=r"action.data: expected shape \(2,\) \['dx', 'dy'\], received \(3,\)"):
            emb.step(Action(data=np.zeros(3)))
    finally:
        emb.close()
    policy = resolve("policy", "policylink", policy=str(flow_checkpoint), device="cpu")
    with pytest.raises(CompatibilityError, match=r"scene_target\] scene 'seed-100000' target kind 'policylink/push'"):
        ir_eval("policylink/push", policy, "policylink/reach", log_dir=str(tmp_path))  # push scenes on reach
    with pytest.raises(CompatibilityError, match=r"state\['observation.state'\]: expected shape \(6,\) \(policy\), "
                       r"received \(10,\) \(embodiment\)"):  # fmt: skip
        ir_eval("policylink/pick_place", policy, "policylink/pick_place", log_dir=str(tmp_path))
    policy.reset(Scene(id="s", instruction="x"))
    with pytest.raises(ObservationError, match=r"state\['observation.state'\]: missing; the observation has state "
                       r"keys \['eef_pos'\]"):  # fmt: skip
        policy.act(Observation(state={"eef_pos": np.zeros(3)}))


def test_an_action_size_that_does_not_fit_is_one_error_naming_both_sizes(flow_checkpoint, tmp_path):
    ref = str(flow_checkpoint)  # reach: 3-D actions; push takes 2-D ones
    both = "expected 2 ({}: ['dx', 'dy']), received 3 (policy: ['dx', 'dy', 'dz'])"
    with pytest.raises(ConfigError) as e:  # the embodiment's env is known (-P env=push): refused at construction
        resolve("policy", "policylink", policy=ref, device="cpu", env="push")
    assert str(e.value) == f"policy {ref!r}: action size: " + both.format("env 'push'")
    policy = resolve("policy", "policylink", policy=ref, device="cpu")
    with pytest.raises(CompatibilityError) as e:  # otherwise when the evaluation binds it, before any step
        ir_eval("policylink/push", policy, "policylink/push", log_dir=str(tmp_path))
    bound = (
        f"policy 'policylink:{ref}' on embodiment 'policylink/push': action size: "
        f"{both.format(repr('policylink/push').join(('embodiment ', '')))} (not checked at load: -P env=push was not "
        "given)"
    )
    assert str(e.value) == bound
    env = {**os.environ, "INSPECT_ROBOTS_CONFIG": str(tmp_path / "none.ini")}
    done = subprocess.run(  # inspect-robots run ends on that one line (its CompatibilityErrors keep a traceback)
        [INSPECT_ROBOTS, "run", "--task", "policylink/push", "--no-prompt", "--log-dir", str(tmp_path), "--policy",
         "policylink", "-P", f"policy={ref}", "-P", "device=cpu", "--embodiment", "policylink/push"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert (done.returncode, done.stderr) == (1, bound + "\n")
    done = subprocess.run(
        [INSPECT_ROBOTS, "run", "--task", "policylink/push", "--no-prompt", "--log-dir", str(tmp_path), "--policy",
         "policylink", "-P", f"policy={ref}", "-P", "device=cpu", "-P", "env=push", "--embodiment", "policylink/push"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert f"policy {ref!r}: action size: " + both.format("env 'push'") in done.stderr


def test_readme_example_runs(flow_checkpoint, tmp_path, monkeypatch):
    import re

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    pattern = r"<!-- example: inspect-robots \([^)]*\) -->\s*```python\n(.*?)```\s*<!-- end: inspect-robots -->"
    (code,) = re.findall(pattern, readme, re.S)
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "readme_example", "checkpoint": str(flow_checkpoint)}
    exec(compile(code, "README.md", "exec"), namespace)
    log = namespace["log"]
    assert log.status == "success" and log.results.total_trials == 3
    assert set(log.results.metrics) == {"success_at_end", "episode_length"}
    assert len(list((tmp_path / "outputs" / "inspect-logs").glob("*.json"))) == 1
