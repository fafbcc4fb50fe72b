"""Deploy -> record on the gapped sim-as-real robot (issue 34 item 4): a simulated operator (the scripted expert)
takes over under a documented rule, every step is recorded with who acted, every episode keeps its reality gap;
the in-process robot runs in lockstep time so the test does not depend on the machine's load."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from policylink.adapters.registry import UnknownNameError
from policylink.data.buffer import EpisodeStore
from policylink.evaluate.run import RunConfig
from policylink.real.deploy import DeployStats, open_deploy_recorder, open_robot, run_deployment
from policylink.runtime.operator import ScriptedOperator, TakeoverRule


class HoldStill:
    """An action source that always commands zeros (an ``ee_delta`` robot holds): the episode stalls at once."""

    def __init__(self, dim):
        self.dim, self.inferences, self.stall_steps = dim, np.zeros(1, np.int64), np.zeros(1, np.int64)

    def act(self, obs):
        return np.zeros((1, self.dim), np.float32)

    def reset(self, env_ids=None):
        pass

    def close(self):
        pass


def _deploy(tmp_path, rule, episodes=2, gap="worn_gantry"):
    cfg = RunConfig(robot="sim:pick_place", env_kwargs={"gap": gap}, lockstep=True, teleop="expert", takeover=rule)
    robot, _ = open_robot(cfg)
    robot.teleop = ScriptedOperator(robot.robot.env, rule)
    store = str(tmp_path / "robot.zarr")
    rec = open_deploy_recorder(store, robot.env_spec)
    stats = DeployStats()
    out = run_deployment(robot, HoldStill(robot.env_spec.action.dim), episodes, seed=7, recorder=rec, stats=stats)
    return out, stats, EpisodeStore(store, "r")


def test_stall_takeover_tags_exactly_the_operator_steps_and_keeps_the_gap(tmp_path):
    rule = TakeoverRule(stall_steps=8, min_step=8, min_improvement=0.01)
    out, stats, store = _deploy(tmp_path, rule)
    assert out.code == 0 and len(out.results) == 2 and store.n_episodes == 2
    src = store.load(["deploy.source"])["deploy.source"]
    actions = store.load(["action"])["action"]
    for i in range(2):
        sl = store.episode_slice(i)
        s, a = src[sl], actions[sl]
        # the policy holds still: no progress, so the operator takes over at step 8 exactly and keeps control
        np.testing.assert_array_equal(s, np.r_[np.zeros(8), np.ones(len(s) - 8)].astype(np.int8))
        np.testing.assert_array_equal(a[:8], 0.0)  # the policy's zeros were executed
        assert np.abs(a[8:, :3]).max() > 0.005  # the expert moves the arm
        meta = store.episode_meta(i)
        assert meta.seed == 7 + i
        gap = json.loads(meta.gap)
        assert gap["name"] == "worn_gantry" and gap["dynamics"]["actuator_gain_scale"] == pytest.approx(0.3)
    assert stats.human == int(src.sum())
    assert store.info["step_sources"] == ["policy", "human"]
    # the expert finishes most takeovers on the worn gantry (19/20 from the start of an episode)
    assert sum(r.success for r in out.results) >= 1


def test_random_takeover_rule_and_no_takeover(tmp_path):
    # probability 1 at step 3 and no stall test: the takeover is at step 3 in every episode
    out, _, store = _deploy(tmp_path, TakeoverRule(stall_steps=0, at_step=3, probability=1.0), episodes=1)
    s = store.load(["deploy.source"])["deploy.source"]
    np.testing.assert_array_equal(s[:3], 0)
    assert s[3:].all()


def test_takeover_rule_and_teleop_refuse_bad_input():
    with pytest.raises(ValueError, match="takeover.probability"):
        TakeoverRule(probability=1.5)
    with pytest.raises(ValueError, match="takeover.stall_steps"):
        TakeoverRule(stall_steps=-1)
    with pytest.raises(ValueError, match="never fires"):
        TakeoverRule(stall_steps=0, at_step=None)
    with pytest.raises(ValueError, match="min_improvement"):
        TakeoverRule(min_improvement=float("nan"))
    with pytest.raises(UnknownNameError, match=r"takeover.quality: .*received 'expertt'; did you mean 'expert'\?"):
        TakeoverRule(quality="expertt")
    with pytest.raises(ValueError, match="hz: expected > 0, received 0"):
        RunConfig(policy="x", robot="sim:reach", hz=0.0)
    from policylink.real.deploy import deploy

    cfg = RunConfig(policy="x", robot="tcp://127.0.0.1:1", teleop="expert")
    with pytest.raises(ValueError, match="teleop: 'expert'.*sim:TASK"):
        deploy(cfg)
    with pytest.raises(ValueError, match="lockstep"):
        deploy(RunConfig(policy="x", robot="tcp://127.0.0.1:1", lockstep=True))
    with pytest.raises(UnknownNameError, match=r"teleop: .*received 'expertt'; did you mean 'expert'\?"):
        deploy(RunConfig(policy="x", robot="sim:pick_place", teleop="expertt"))
    with pytest.raises(
        ValueError, match=r"robot: expected tcp://.*received 'pick_place'; did you mean 'sim:pick_place'"
    ):
        open_robot(SimpleNamespace(robot="pick_place", env_kwargs={}, hz=None, lockstep=False))
    with pytest.raises(ValueError, match="robot: expected 'sim:TASK'"):
        open_robot(SimpleNamespace(robot="sim:", env_kwargs={}, hz=None, lockstep=False))
    with pytest.raises(ValueError, match="teleop: 'expert'.*MuJoCo tasks.*lacks"):
        ScriptedOperator(SimpleNamespace(unwrapped=object()))


def test_run_cli_parses_the_deploy_flags():
    from policylink.cli.app import parse_config

    cfg = parse_config(RunConfig, ["--robot", "sim:pick_place", "--teleop", "expert", "--lockstep", "true",
                                   "--takeover.stall_steps", "12", "--env_kwargs", "{gap: worn_gantry}"],
                       prog="policylink run")  # fmt: skip
    assert cfg.takeover.stall_steps == 12 and cfg.lockstep and cfg.env_kwargs == {"gap": "worn_gantry"}
    from policylink.cli.app import ConfigError

    with pytest.raises(ConfigError, match=r"takeover.probability: expected a value in \[0, 1\], received 2"):
        parse_config(RunConfig, ["--takeover.probability", "2"], prog="policylink run")
