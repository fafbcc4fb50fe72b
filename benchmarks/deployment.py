"""Deployment timing on the sim-as-real robot: three processes on loopback (policy server, robot server, this
process running the deployment loop), synchronous vs asynchronous(+RTC) chunk execution at 0/50/100/200 ms of
injected inference latency; plus the pacing of 1,000 periods at 100 Hz with 2 ms of work.

    python benchmarks/deployment.py --checkpoint outputs/deployment/flow_reach/checkpoints/last --seeds 20

Writes a markdown table to ``--out`` (default ``benchmarks/results/deployment.md``) and, with ``--jsonl``, appends
one JSON line per cell and per pacing run. Each invocation starts its own servers on free loopback ports, so
several invocations (e.g. one per latency) can run side by side.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from policylink.evaluate.run import RunConfig
from policylink.real.deploy import Pacer, deploy
from policylink.runtime.executors import ExecutorConfig

MODES = {
    "sync": ("receding_horizon", False, "guidance"),
    "async": ("async", True, "guidance"),
    "async_plain": ("async", False, "guidance"),
    "async_inpaint": ("async", True, "inpaint"),
    "async_condition": ("async", True, "condition"),  # a policy trained with loss prefix_conditioned
}
"""Benchmark mode -> (executor kind, real-time chunking, its ``rtc_method``)."""
LABELS = {
    "sync": "sync",
    "async": "async+RTC",
    "async_plain": "async (no RTC)",
    "async_inpaint": "async+inpaint",
    "async_condition": "async+condition",
}


def pacing(periods: int = 1000, hz: float = 100.0, work_s: float = 0.002, catch_up: bool = False) -> dict[str, float]:
    """Run ``periods`` periods of ``work_s`` busy work paced by :class:`Pacer`; total time and wake-up errors."""
    pacer = Pacer(1.0 / hz, catch_up=catch_up)
    errors = []
    t0 = pacer.t0
    for _ in range(periods):
        end = time.monotonic() + work_s
        while time.monotonic() < end:
            pass
        errors.append(pacer.wait())
    total = time.monotonic() - t0
    e = np.abs(np.asarray(errors)) * 1e3
    nominal = periods / hz
    return {
        "total_s": total,
        "error_pct": 100.0 * (total - nominal) / nominal,
        "overruns": pacer.overruns,
        "wake_p50_ms": float(np.percentile(e, 50)),
        "wake_p99_ms": float(np.percentile(e, 99)),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args: list[str], log: Path) -> subprocess.Popen:
    """Start ``policylink <args>`` with its output in ``log`` (never an unread pipe that could fill and block
    the server); return once it prints ``serving``."""
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"), "OMP_NUM_THREADS": "1"}
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "policylink.cli.app", *args], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    while "serving" not in log.read_text():
        if proc.poll() is not None:
            raise RuntimeError(f"{args[0]} did not start; see {log}")
        time.sleep(0.2)
    return proc


def inference_ms(policy_addr: str, robot_addr: str, n: int = 20) -> dict[str, float]:
    """p50 of ``n`` served inferences on a real observation, without and with an RTC prefix, ms."""
    from policylink.adapters.capabilities import ChunkPrefix, PrefixConditioned
    from policylink.adapters.transport import RemotePolicy
    from policylink.real.server import RemoteRobot

    robot = RemoteRobot(robot_addr)
    obs, _ = robot.reset(seed=0)
    robot.disconnect()
    policy = RemotePolicy(policy_addr, timeout_s=60)
    batch = {k: (np.asarray(v)[None] if not isinstance(v, str) else [v]) for k, v in obs.items()}
    policy.reset()
    policy.update_observation(batch)
    out = {}
    spec = policy.spec
    prefix = ChunkPrefix(
        np.zeros((1, spec.chunk_size, spec.action.dim), np.float32), np.ones((1, spec.chunk_size), np.float32), 5.0
    )
    calls = {"plain": lambda: policy.predict_action_chunk()}
    if isinstance(policy, PrefixConditioned):
        calls["rtc"] = lambda: policy.predict_action_chunk_with_prefix(prefix)
    for name, call in calls.items():
        call()
        times = []
        for _ in range(n):
            t = time.perf_counter()
            call()
            times.append(time.perf_counter() - t)
        out[name] = 1e3 * float(np.median(times))
    return out


def run_cell(args, policy_addr: str, robot_addr: str, latency: float, mode: str) -> dict:
    """One grid cell: ``args.seeds`` episodes of ``mode`` at ``latency`` ms of injected latency; its figures."""
    cfg = RunConfig(
        policy=policy_addr,
        robot=robot_addr,
        episodes=args.seeds,
        seed=args.first_seed,
        executor=ExecutorConfig(
            kind=MODES[mode][0],
            n_action_steps=args.n_action_steps,
            rtc=MODES[mode][1],
            rtc_max_guidance=args.rtc_guidance,
            rtc_method=MODES[mode][2],
        ),
        inject_latency_ms=latency,
        threads=1,
    )
    t = time.monotonic()
    out = deploy(cfg)
    s = out.stats.summary(out.period_s)
    return {
        "task": args.task,
        "tag": args.tag,
        "checkpoint": args.checkpoint,
        "n_action_steps": args.n_action_steps,
        "rtc_guidance": args.rtc_guidance,
        "watchdog_ms": args.watchdog_ms,
        "latency_ms": latency,
        "mode": LABELS[mode],
        "success": sum(r.success for r in out.results) / max(len(out.results), 1),
        "episodes": len(out.results),
        "late_pct": 100.0 * s["late"] / max(s["steps"], 1),
        "wall_s": time.monotonic() - t,
        "startup_late": out.stats.startup_late,
        "load1": os.getloadavg()[0],
        "safety": out.stats.safety,
        **s,
    }


def run_grid(args) -> tuple[dict[str, float], list[dict]]:
    """Start the policy and robot servers, measure the served inference, run every (latency, mode) cell."""
    policy_addr, robot_addr = f"tcp://127.0.0.1:{_free_port()}", f"tcp://127.0.0.1:{_free_port()}"
    logs = Path(args.out).with_suffix("")
    server = _start(
        ["serve", "--checkpoint", args.checkpoint, "--bind", policy_addr, "--device", "cpu"], Path(f"{logs}.serve.log")
    )
    robot = _start(
        ["robot", "--sim", args.task, "--bind", robot_addr, "--watchdog_ms", str(args.watchdog_ms)],
        Path(f"{logs}.robot.log"),
    )
    rows = []
    try:
        base = inference_ms(policy_addr, robot_addr)
        print(f"inference p50 ms: {base}", flush=True)
        for latency in [float(x) for x in args.latencies.split(",") if x]:
            for mode in args.modes.split(","):
                row = run_cell(args, policy_addr, robot_addr, latency, mode)
                rows.append(row)
                print(row, flush=True)
                if args.jsonl:
                    with open(args.jsonl, "a") as f:
                        f.write(json.dumps({**row, "inference_p50_ms": base}, default=str) + "\n")
    finally:
        for p in (server, robot):
            p.send_signal(signal.SIGTERM)
        for p in (server, robot):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:  # a starved server: never leave it running
                p.kill()
                p.wait()
    return base, rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default=None, help="required unless --latencies is empty (pacing only)")
    ap.add_argument("--task", default="reach")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--first_seed", type=int, default=100000)
    ap.add_argument("--latencies", default="0,50,100,200", help="comma list, ms; empty: pacing only")
    ap.add_argument("--modes", default="sync,async", help=f"comma list of {sorted(MODES)}")
    ap.add_argument("--n_action_steps", type=int, default=8)
    ap.add_argument("--rtc_guidance", type=float, default=5.0, help="RTC's guidance clip beta (paper: 5)")
    ap.add_argument(
        "--watchdog_ms", type=float, default=500.0, help="the robot server's watchdog (its default 500; 0 = off)"
    )
    ap.add_argument("--pacing", type=int, default=1, help="repeats of the 100 Hz pacing measurement (0: none)")
    ap.add_argument("--tag", default="", help="a label stored with each --jsonl row (run name)")
    ap.add_argument("--jsonl", default=None, help="append one JSON line per cell (and per pacing run) here")
    ap.add_argument("--out", default="benchmarks/results/deployment.md")
    args = ap.parse_args()
    load0 = os.getloadavg()
    pace = {}
    for i in range(args.pacing):
        for mode in ("skip", "catch up"):
            pace[f"{mode} #{i + 1}" if args.pacing > 1 else mode] = p = pacing(catch_up=mode == "catch up")
            if args.jsonl:
                with open(args.jsonl, "a") as f:
                    f.write(json.dumps({"pacing": mode, "repeat": i + 1, "load1": os.getloadavg()[0], **p}) + "\n")
    print(f"pacing: {pace}", flush=True)
    base, rows = {}, []
    if args.latencies:
        if args.checkpoint is None:
            ap.error("--checkpoint is required when --latencies is not empty")
        base, rows = run_grid(args)
    write(Path(args.out), args, pace, base, rows, load0, os.getloadavg())
    return 0


def write(path: Path, args, pace, base, rows, load0, load1) -> None:
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    lines = [
        "# Deployment timing on the sim-as-real robot",
        "",
        f"Date: {datetime.date.today()}. Machine: {os.cpu_count()} CPU cores ({cpu}), {platform.platform()}; "
        f"shared with other jobs: load average {load0[0]:.1f} at the start, {load1[0]:.1f} at the end.",
        "",
        "Command:",
        "",
        "```",
        "python " + " ".join(sys.argv),
        "```",
        "",
        "## Pacing: 1,000 periods at 100 Hz with 2 ms of busy work (absolute deadlines)",
        "",
        "Overruns: `skip` moves to the next deadline after now (the robot loop); `catch up` keeps every deadline.",
        "",
        "| overruns | total (s) | error vs 10 s | overruns | wake-up error p50 (ms) | p99 (ms) |",
        "|---|---|---|---|---|---|",
        *(
            f"| {m} | {p['total_s']:.4f} | {p['error_pct']:+.3f} % | {p['overruns']} | {p['wake_p50_ms']:.3f} | "
            f"{p['wake_p99_ms']:.3f} |"
            for m, p in pace.items()
        ),
        "",
        f"## `{args.task}` at 10 Hz: policy server + robot server + this process on loopback",
        "",
        f"Checkpoint `{args.checkpoint}`; {args.seeds} seeds from {args.first_seed}; chunks executed "
        f"{args.n_action_steps} actions per inference (sync: receding horizon; async: background inference, RTC beta "
        f"{args.rtc_guidance:g}). "
        f"Served inference p50 without injected latency: {', '.join(f'{k} {v:.0f} ms' for k, v in base.items())}. "
        "Injected latency: each inference takes at least that long (client side, around the remote call). Each "
        "episode's first step waits for a blocking first chunk while the robot stands still, then executes it from "
        "its first action: it is left out of the rate, period and late-drop columns; first chunks slower than a "
        "period are counted under 'slow first chunks'.",
        "",
        "| injected (ms) | execution | success | rate (Hz) | rate error | p99 period error (ms) | late drops | "
        "slow first chunks | act latency p50 / p99 (ms) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['latency_ms']:.0f} | {r['mode']} | {100 * r['success']:.0f} % ({r['episodes']}) | "
            f"{r['rate_hz']:.2f} | {100 * r['rate_error']:+.1f} % | {r['period_p99_error_ms']:.1f} | "
            f"{r['late']} ({r['late_pct']:.1f} %) | {r['startup_late']}/{r['episodes']} | "
            f"{r['latency_p50_ms']:.1f} / {r['latency_p99_ms']:.1f} |"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    raise SystemExit(main())
