"""What a deployment on the sim-as-real robot reports and records: each recorded episode carries the quality tag of
who acted in it (never ``''``), and a lockstep run's status line reports no latency (there is none to measure)."""

from policylink.data.buffer import EpisodeStore
from policylink.evaluate.run import RunConfig
from policylink.real.deploy import DeployStats, open_deploy_recorder, open_robot, run_deployment
from policylink.runtime.operator import ScriptedOperator, TakeoverRule
from tests.real.test_deploy_takeover import HoldStill


def _deploy(tmp_path, rule):
    robot, _ = open_robot(RunConfig(robot="sim:reach", lockstep=True))
    if rule is not None:
        robot.teleop = ScriptedOperator(robot.robot.env, rule)
    store = str(tmp_path / "robot.zarr")
    stats = DeployStats()
    out = run_deployment(robot, HoldStill(robot.env_spec.action.dim), 1, seed=3, recorder=open_deploy_recorder(
        store, robot.env_spec), stats=stats)  # fmt: skip
    return out, stats, EpisodeStore(store, "r")


def test_a_policy_rollout_is_tagged_policy_and_a_takeover_policy_plus_human(tmp_path):
    out, stats, store = _deploy(tmp_path / "a", None)
    assert out.code == 0 and store.n_episodes == 1 and stats.human == 0
    assert store.episode_meta(0).quality == "policy" and store.episode_meta(0).source == "policy"
    out, stats, store = _deploy(tmp_path / "b", TakeoverRule(stall_steps=0, at_step=3, probability=1.0))
    assert out.code == 0 and stats.human > 0
    assert store.episode_meta(0).quality == "policy+human"


def test_a_lockstep_run_reports_no_latency(tmp_path):
    out, stats, _ = _deploy(tmp_path, None)
    assert stats.lockstep and stats.latencies_s and max(stats.latencies_s) == 0.0  # lockstep: no time passes
    line = stats.line(out.period_s)
    assert "| lockstep: latency not measured |" in line and "latency p50" not in line
    timed = DeployStats(latencies_s=[0.002, 0.004], periods_s=[0.1, 0.1], active_s=0.2, steps=2)
    assert timed.line(0.1).startswith("rate 10.00 Hz | late 0 (+0 slow first chunks) | latency p50 3.0 ms p99 4.0 ms")
