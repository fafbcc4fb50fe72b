"""``policylink robot``: serve a robot over ZeroMQ behind its safety layer -- a driver (``--driver``), a LeRobot
robot (``--driver lerobot:<type>``), or one of our simulated tasks run in real time as a robot (``--sim <task>``,
the sim-as-real robot, with observation/actuation latency and jitter).

    policylink robot --sim reach --bind tcp://127.0.0.1:5556
    policylink robot --sim push --observation-latency-ms 20 --actuation-latency-ms 10 --jitter-ms 5
    policylink robot --driver lerobot:so100_follower --driver-kwargs '{port: /dev/ttyACM0, id: arm}' \\
        --low -100 --high 100 --watchdog-ms 300
    policylink robot --driver mypackage.arm:MyArm --bind tcp://0.0.0.0:5556 --curve-keys keys/
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Sequence

from policylink.adapters import security
from policylink.adapters.rpc import BindError
from policylink.cli.app import ConfigError, parse_config
from policylink.real.robots import RobotConfig, build_robot, check_robot_reference, safety_config


def main(argv: Sequence[str]) -> int:
    """Run ``policylink robot``; returns the exit code (2 for a bad configuration, printed as one line)."""
    from policylink.real.server import RobotServer

    cfg = parse_config(RobotConfig, list(argv), prog="policylink robot")
    try:
        check_robot_reference(cfg)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    try:
        keys = security.load_server_keys(cfg.curve_keys) if cfg.curve_keys else None
        security.check_bind(cfg.bind, keys, cfg.insecure)
    except (security.EndpointError, security.InsecureBindError, security.KeyFileError) as e:
        print(f"policylink robot: {e}", file=sys.stderr)
        return 2
    robot = build_robot(cfg)
    robot.connect()
    try:
        server = RobotServer(
            robot, cfg.bind, safety=safety_config(cfg, robot), curve_keys=keys, insecure=cfg.insecure
        ).start()
    except BindError as e:
        robot.disconnect()
        print(f"policylink robot: {e}", file=sys.stderr)
        return 2
    what = f"sim-as-real {cfg.sim}" if cfg.sim else cfg.driver
    print(
        f"serving robot {what} on {server.endpoint} at {robot.env_spec.control_frequency:g} Hz"
        + (f" (CURVE, keys {cfg.curve_keys})" if keys else "")
        + f"; watchdog {cfg.watchdog_ms:g} ms ({cfg.on_timeout})",
        flush=True,
    )
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        done.wait(cfg.duration_s)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0
