"""Round-trip latency of policylink's ZeroMQ transport vs bare ZeroMQ, openpi's websocket and gRPC + pickle; and of
our XPolicyLab websocket endpoint vs a bare websocket echo of the same payload.

Each stack's server runs in its own process (a no-op policy returning a (B, 50, 14) float32 chunk); the client
runs here. Cases: (a) state (14,) + prompt, (b) two 224x224x3 uint8 images + state, (c) a batch of 8 of (b);
with ``--xpolicylab``: (d) state + prompt + two images as one XPolicyLab ``infer`` frame (Observation Format
v1.0), sent by a raw websocket client to ``xpolicylab`` (our ``XPolicyLabServer``; the reply, 50 per-step action
maps, is received as bytes, as the echo's is: the same client work for both) and to ``ws_echo`` (a websockets
server that sends every message back), and by our ``XPolicyLabRemotePolicy`` client (``xpl_client``: encoding the
observation and decoding the 50 action maps into ``(1, 50, 14)`` included).
``policylink_unix``: our server and client over a ``unix://`` socket file (adapters.local_wire: the same protocol,
no ZeroMQ I/O threads), what a policy server on the same machine can use.
Stacks are interleaved in blocks (shuffled per round) so load from other processes hits them alike.

    .venv/bin/python benchmarks/transport_latency.py [--rounds 20] [--block 50] [--out FILE.md] [--json FILE.json]
    .venv/bin/python benchmarks/transport_latency.py --xpolicylab [--rounds 20] [--block 50] [--json FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import pickle
import platform
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

STACKS = ("bare_zmq", "policylink", "openpi_ws", "grpc_pickle", "policylink_unix")
OURS = ("policylink", "policylink_unix")
"""Our stacks: the ZeroMQ wire over tcp, and the same protocol over a ``unix://`` socket file (adapters.local_wire,
for a policy server on the same machine)."""
CASES = ("a_state_prompt", "b_two_images", "c_batch8_images")
XPL_STACKS = ("ws_echo", "xpolicylab", "xpl_client")
XPL_CASES = ("d_xpl_state_prompt_two_images",)
CHUNK = (50, 14)
PROMPT = "pick up the red cube and place it in the bin"


# ---------------------------------------------------------------------------------------------- observations
def make_obs(case: str) -> dict:
    """One observation batch of ``case`` (batched ``(B, ...)``; ``task`` only in case a)."""
    rng = np.random.default_rng(0)
    b = 8 if case.startswith("c") else 1
    obs = {"observation.state": rng.standard_normal((b, 14)).astype(np.float32)}
    if case.startswith(("a", "d")):
        obs["task"] = [PROMPT] * b
    if not case.startswith("a"):
        for cam in ("cam_high", "cam_wrist"):
            obs[f"observation.images.{cam}"] = rng.integers(0, 256, (b, 224, 224, 3), dtype=np.uint8)
    return obs


def _spec(case: str):
    from policylink.adapters.schema import ActionSpec, FeatureSpec, PolicySpec

    feats = {"observation.state": FeatureSpec("float32", (14,))}
    if case.startswith(("a", "d")):
        feats["task"] = FeatureSpec("string", ())
    if not case.startswith("a"):
        for cam in ("cam_high", "cam_wrist"):
            feats[f"observation.images.{cam}"] = FeatureSpec("uint8", (224, 224, 3))
    names = tuple(f"j{i}" for i in range(14))
    action = ActionSpec(names, "joint_position", ("rad",) * 14, (-10.0,) * 14, (10.0,) * 14)
    return PolicySpec(feats, action, n_obs_steps=1, chunk_size=CHUNK[0], n_action_steps=CHUNK[0])


class NoopPolicy:
    """PolicyAdapter that keeps the latest batch by reference and returns zeros ``(B, 50, 14)``."""

    def __init__(self, spec):
        self.spec, self._b = spec, 1

    def reset(self, env_ids=None):
        pass

    def update_observation(self, obs):
        self._b = len(obs["observation.state"])

    def predict_action_chunk(self, env_ids=None):
        return np.zeros((self._b if env_ids is None else len(env_ids), *CHUNK), np.float32)


# ------------------------------------------------------------------------------------------------- servers
def serve(stack: str, port: int) -> None:
    """Run ``stack``'s server on 127.0.0.1:``port`` (and ``port + 1`` for policylink's image spec)."""
    if stack in OURS:
        from policylink.adapters.transport import PolicyServer

        if stack == "policylink_unix":
            os.makedirs(_unix_dir(port), mode=0o700, exist_ok=True)
            for name in ("a", "b"):
                Path(_unix_endpoint(port, name)[len("unix://") :]).unlink(missing_ok=True)
        endpoints = [_endpoint(stack, port, "a"), _endpoint(stack, port, "b")]
        servers = [PolicyServer(NoopPolicy(_spec(c)), e).start() for c, e in zip("ab", endpoints)]
        print("READY", flush=True)
        servers[0].serve_forever()
    elif stack == "bare_zmq":
        import zmq

        sock = zmq.Context().socket(zmq.ROUTER)
        sock.bind(f"tcp://127.0.0.1:{port}")
        replies = {b: np.zeros((b, *CHUNK), np.float32) for b in (1, 8)}
        print("READY", flush=True)
        while True:
            frames = sock.recv_multipart(copy=False)
            state = np.frombuffer(frames[1].buffer, np.float32)
            sock.send_multipart([frames[0], replies[state.size // 14]], copy=False)
    elif stack == "openpi_ws":
        import websockets.asyncio.server
        from openpi_client import msgpack_numpy

        async def handler(ws):
            packer = msgpack_numpy.Packer()
            await ws.send(packer.pack({}))
            async for message in ws:
                obs = msgpack_numpy.unpackb(message)
                b = len(obs["observation.state"])
                await ws.send(packer.pack({"actions": np.zeros((b, *CHUNK), np.float32)}))

        async def main():
            async with websockets.asyncio.server.serve(handler, "127.0.0.1", port, compression=None, max_size=None):
                print("READY", flush=True)
                await asyncio.Future()

        asyncio.run(main())
    elif stack in ("xpolicylab", "xpl_client"):
        from policylink.adapters.xpolicylab import XPolicyLabServer

        XPolicyLabServer(NoopPolicy(_spec("d")), "127.0.0.1", port).start()
        print("READY", flush=True)
        threading.Event().wait()
    elif stack == "ws_echo":
        import websockets.asyncio.server

        async def echo(ws):
            async for message in ws:
                await ws.send(message)

        async def main():
            async with websockets.asyncio.server.serve(echo, "127.0.0.1", port, compression=None, max_size=None):
                print("READY", flush=True)
                await asyncio.Future()

        asyncio.run(main())
    elif stack == "grpc_pickle":
        from concurrent import futures

        import grpc

        def infer(request, context):
            return {"actions": np.zeros((len(request["observation.state"]), *CHUNK), np.float32)}

        handler = grpc.method_handlers_generic_handler(
            "policy",
            {
                "Infer": grpc.unary_unary_rpc_method_handler(
                    infer, request_deserializer=pickle.loads, response_serializer=pickle.dumps
                )
            },
        )
        opts = [("grpc.max_receive_message_length", 2**28), ("grpc.max_send_message_length", 2**28)]
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=opts)
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        print("READY", flush=True)
        server.wait_for_termination()


# ------------------------------------------------------------------------------------------------- clients
def make_client(stack: str, port: int):
    """``call(case, obs) -> (B, 50, 14) actions`` for ``stack``."""
    if stack in OURS:
        from policylink.adapters.transport import RemotePolicy

        remotes = {c: RemotePolicy(_endpoint(stack, port, c), timeout_s=30) for c in "ab"}

        def call(case, obs):
            remote = remotes["a" if case.startswith("a") else "b"]
            remote.update_observation(obs)
            return remote.predict_action_chunk()

        return call
    if stack == "bare_zmq":
        import zmq

        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.connect(f"tcp://127.0.0.1:{port}")

        def call(case, obs):
            frames = [v for k, v in obs.items() if k != "task"]
            if "task" in obs:
                frames.append("\n".join(obs["task"]).encode())
            sock.send_multipart(frames, copy=False)
            reply = sock.recv_multipart(copy=False)
            return np.frombuffer(reply[0].buffer, np.float32).reshape(-1, *CHUNK)

        return call
    if stack == "openpi_ws":
        from openpi_client.websocket_client_policy import WebsocketClientPolicy

        client = WebsocketClientPolicy("127.0.0.1", port)
        return lambda case, obs: client.infer(obs)["actions"]
    if stack == "grpc_pickle":
        import grpc

        opts = [("grpc.max_receive_message_length", 2**28), ("grpc.max_send_message_length", 2**28)]
        channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=opts)
        grpc.channel_ready_future(channel).result(timeout=30)
        stub = channel.unary_unary("/policy/Infer", request_serializer=pickle.dumps, response_deserializer=pickle.loads)
        return lambda case, obs: stub(obs)["actions"]
    if stack in XPL_STACKS:
        return _xpolicylab_client(stack, port)
    raise ValueError(f"stack: expected one of {STACKS}, received {stack!r}")


def xpolicylab_frame(obs: dict) -> bytes:
    """The ``infer`` frame of one observation of case (d), encoded once: v1.0 keys as the server's key map reads
    them (``cam_high`` -> ``cam_head``, ``cam_wrist`` -> ``cam_wrist``, the state as ``arm_joint_state``)."""
    from policylink.adapters.xpolicylab import XPolicyLabServer
    from policylink.adapters.xpolicylab_wire import Frame, MessageType, encode_frame

    key_map = XPolicyLabServer(NoopPolicy(_spec("d")), port=0).key_map
    row = {k: v[0] for k, v in obs.items() if k != "task"}
    v1 = key_map.to_observation(row, obs["task"][0])
    return encode_frame(Frame(MessageType.INFER, "bench", "bench", payload={"observation": v1}))


def _xpolicylab_client(stack: str, port: int):
    """``call`` of the XPolicyLab stacks: a raw websocket sending the pre-encoded frame (echo: nothing decoded), or
    our ``XPolicyLabRemotePolicy`` (``xpl_client``)."""
    from policylink.adapters.ws import connect
    from policylink.adapters.xpolicylab_wire import decode

    if stack == "xpl_client":
        from policylink.adapters.xpolicylab import XPolicyLabRemotePolicy

        remote = XPolicyLabRemotePolicy(f"xpl://127.0.0.1:{port}", timeout_s=30)

        def call_client(case, obs):
            remote.update_observation(obs)
            return remote.predict_action_chunk()

        return call_client
    ws, frames = connect(f"ws://127.0.0.1:{port}", 30.0), {}

    def call(case, obs):
        """One round trip, the same client work for both stacks: send the frame, receive the reply's bytes."""
        data = frames.get(case)
        if data is None:  # first call: encode the frame and check the endpoint's answer once
            data = frames[case] = xpolicylab_frame(obs)
            ws.send(data)
            reply = ws.recv(timeout=30)
            if stack == "xpolicylab":
                steps = decode(reply)["payload"]["actions"]
                assert np.stack([s["arm_joint_state"] for s in steps]).shape == CHUNK, len(steps)
        ws.send(data)
        ws.recv(timeout=30)

    return call


def _unix_dir(port: int) -> str:
    return os.path.join(tempfile.gettempdir(), f"policylink-bench-{port}")


def _unix_endpoint(port: int, name: str) -> str:
    return f"unix://{_unix_dir(port)}/{name}.sock"


def _endpoint(stack: str, port: int, case: str) -> str:
    """Our server's endpoint for the state spec (``case`` "a") or the image spec ("b")."""
    if stack == "policylink_unix":
        return _unix_endpoint(port, case)
    return f"tcp://127.0.0.1:{port + (case == 'b')}"


def _free_port_pair() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue


def run(
    rounds: int, block: int, stacks: tuple[str, ...], cases: tuple[str, ...] = CASES
) -> dict[tuple[str, str], np.ndarray]:
    """Latencies in seconds per ``(stack, case)``; the first round is warm-up and discarded."""
    procs, clients = [], {}
    try:
        for stack in stacks:
            port = _free_port_pair()
            p = subprocess.Popen(
                [sys.executable, __file__, "--serve", stack, "--port", str(port)], stdout=subprocess.PIPE, text=True
            )
            procs.append(p)
            if p.stdout.readline().strip() != "READY":
                raise RuntimeError(f"{stack} server did not start")
            clients[stack] = make_client(stack, port)
        observations = {case: make_obs(case) for case in cases}
        lat = {(s, c): [] for s in stacks for c in cases}
        rng = random.Random(0)
        for r in range(rounds + 1):
            for case in cases:
                order = list(stacks)
                rng.shuffle(order)
                for stack in order:
                    call, obs = clients[stack], observations[case]
                    for _ in range(block):
                        t0 = time.perf_counter()
                        actions = call(case, obs)
                        dt = time.perf_counter() - t0
                        if r:
                            lat[(stack, case)].append(dt)
                    if actions is not None:  # the echo returns the payload, not actions
                        assert actions.shape == (len(obs["observation.state"]), *CHUNK), (stack, case, actions.shape)
            print(f"round {r}/{rounds}", file=sys.stderr, flush=True)
        return {k: np.asarray(v) for k, v in lat.items()}
    finally:
        for p in procs:
            p.kill()
            p.wait()


def python_cpu_us(case: str, n: int = 2000) -> float:
    """CPU time (process_time, microseconds) of policylink's per-round-trip Python work for ``case``, in one
    thread and without sockets: client encode, server decode + checks + policy + encode, client decode."""
    from policylink.adapters import protocol as p
    from policylink.adapters.transport import PolicyServer

    server = PolicyServer(NoopPolicy(_spec(case)), "tcp://127.0.0.1:0")  # never started: _run() only
    obs = make_obs(case)

    def once():
        frames = p.encode_message(1, "infer", {"updates": [dict(obs)], "env_ids": None}, p.PROTOCOL_VERSION)
        request = p.parse_message(frames, p.POLICY_REQUESTS, by_protocol=p.POLICY_REQUESTS_BY_PROTOCOL)
        t0 = time.perf_counter()
        reply, _ = server._run(request, t0, t0)
        return p.parse_message(reply, p.POLICY_REPLIES, allow_error=True, by_protocol=p.POLICY_REPLIES_BY_PROTOCOL)

    for _ in range(200):
        once()
    t0 = time.process_time()
    for _ in range(n):
        once()
    return (time.process_time() - t0) / n * 1e6


def round_ratios(lat: dict, case: str, other: str, block: int, ours: str = "policylink") -> np.ndarray:
    """Per round, ``ours``' p50 over ``other``'s p50 in ``case`` (their blocks of ``block`` round trips ran
    back to back in that round, so a ratio pairs measurements taken under the same load)."""
    ours, theirs = (lat[(s, case)].reshape(-1, block) for s in (ours, other))
    return np.median(ours, axis=1) / np.median(theirs, axis=1)


def summary(
    lat: dict, stacks: tuple[str, ...], command: str, cpu_us: dict[str, float], load: tuple, block: int
) -> dict:
    """The run as plain data (the ``--json`` file): machine, command, and per case and stack the p50/p90/p99
    latency (ms), the ratios of ours to each other stack's p50 (pooled, and per round: median, p25, p75), and our
    Python CPU per round trip (us)."""
    cells = {}
    for case in CASES:
        cells[case] = {
            s: {f"p{q}_ms": round(float(np.percentile(lat[(s, case)], q)) * 1e3, 4) for q in (50, 90, 99)}
            for s in stacks
        }
        for mine in (o for o in OURS if o in stacks):
            key = "ours" if mine == "policylink" else "ours_unix"
            ours = cells[case][mine]["p50_ms"]
            cells[case][f"{key}_over"] = {s: round(ours / cells[case][s]["p50_ms"], 3) for s in stacks}
            cells[case][f"{key}_over_per_round"] = {
                s: {
                    f"p{q}": round(float(np.percentile(round_ratios(lat, case, s, block, mine), q)), 3)
                    for q in (25, 50, 75)
                }
                for s in stacks
                if s != mine
            }
        if "policylink" in stacks:
            cells[case]["ours_python_cpu_us"] = round(cpu_us[case], 1)
    return {
        "command": command,
        "date": str(datetime.date.today()),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "load_average_start_end": [round(x, 2) for x in load],
        "python": platform.python_version(),
        "round_trips_per_cell": len(next(iter(lat.values()))),
        "cases": cells,
    }


def report(lat: dict, stacks: tuple[str, ...], command: str, cpu_us: dict[str, float], load: tuple, block: int) -> str:
    """Markdown table of p50/p99 (ms), ratios vs bare ZeroMQ, openpi websocket and gRPC + pickle (pooled p50s, then
    the median [p25-p75] of the per-round ratios), the CPU time of policylink's Python work per round trip, and the
    same ratios for ``policylink_unix`` when it ran."""
    ms = {k: (np.percentile(v, 50) * 1e3, np.percentile(v, 99) * 1e3) for k, v in lat.items()}
    unix = "policylink_unix" in stacks and "bare_zmq" in stacks and "openpi_ws" in stacks
    lines = [
        f"Command: `{command}`",
        "",
        f"Machine: {_cpu_model()}, {os.cpu_count()} cores, load average {load[0]:.1f} at the start and "
        f"{load[1]:.1f} at the end; Python {platform.python_version()}; date {datetime.date.today()}; "
        f"{len(next(iter(lat.values())))} round trips per cell.",
        "",
        "| case | "
        + " | ".join(f"{s} p50 / p99 ms" for s in stacks)
        + " | ours/bare | ours/ws | ours/grpc | per round: ours/bare | ours/ws | ours: Python CPU per round trip |"
        + (" unix: ours/bare | ours/ws | per round: ours/bare | ours/ws |" if unix else ""),
        "|---" * (len(stacks) + 7 + 4 * unix) + "|",
    ]
    for case in CASES:
        cells = [f"{ms[(s, case)][0]:.3f} / {ms[(s, case)][1]:.3f}" for s in stacks]
        ours = ms[("policylink", case)][0] if "policylink" in stacks else None
        ratios = [
            f"{ours / ms[(s, case)][0]:.2f}" if s in stacks and ours is not None else "-"
            for s in ("bare_zmq", "openpi_ws", "grpc_pickle")
        ]
        per_round = [
            "{1:.2f} [{0:.2f}-{2:.2f}]".format(*np.percentile(round_ratios(lat, case, s, block), (25, 50, 75)))
            if ours is not None and s in stacks
            else "-"
            for s in ("bare_zmq", "openpi_ws")
        ]
        extra = []
        if unix:
            mine = ms[("policylink_unix", case)][0]
            extra = [f"{mine / ms[(s, case)][0]:.2f}" for s in ("bare_zmq", "openpi_ws")] + [
                "{1:.2f} [{0:.2f}-{2:.2f}]".format(
                    *np.percentile(round_ratios(lat, case, s, block, "policylink_unix"), (25, 50, 75))
                )
                for s in ("bare_zmq", "openpi_ws")
            ]
        row = [*cells, *ratios, *per_round, f"{cpu_us[case]:.0f} us", *extra]
        lines.append(f"| {case} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def server_cpu_us(stack: str, case: str, n: int = 2000) -> float:
    """CPU time (user + system, microseconds) that ``stack``'s server process spends per round trip of ``case``
    (``/proc/PID/stat``, n round trips after 100 warm-up ones): unlike wall time, hardly moved by other load."""
    port = _free_port_pair()
    p = subprocess.Popen(
        [sys.executable, __file__, "--serve", stack, "--port", str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        if p.stdout.readline().strip() != "READY":
            raise RuntimeError(f"{stack} server did not start")
        call, obs = make_client(stack, port), make_obs(case)
        for _ in range(100):
            call(case, obs)

        def cpu_ticks() -> int:
            fields = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return int(fields[11]) + int(fields[12])  # utime + stime

        start = cpu_ticks()
        for _ in range(n):
            call(case, obs)
        return (cpu_ticks() - start) / os.sysconf("SC_CLK_TCK") / n * 1e6
    finally:
        p.kill()
        p.wait()


def xpolicylab_main(args: argparse.Namespace, command: str) -> int:
    """Case (d): interleaved round trips of :data:`XPL_STACKS`; prints (and writes) p50/p90/p99 and the ratios of
    our endpoint to the echo (goal: p50 within 1.3x)."""
    load_start = os.getloadavg()[0]
    lat = run(args.rounds, args.block, XPL_STACKS, XPL_CASES)
    load = (load_start, os.getloadavg()[0])
    case = XPL_CASES[0]
    pct = {
        s: {f"p{q}_ms": round(float(np.percentile(lat[(s, case)], q)) * 1e3, 4) for q in (50, 90, 99)}
        for s in XPL_STACKS
    }
    echo = pct["ws_echo"]["p50_ms"]
    ratios = {s: round(pct[s]["p50_ms"] / echo, 3) for s in ("xpolicylab", "xpl_client")}
    frame_bytes = len(xpolicylab_frame(make_obs(case)))
    cpu = {s: round(server_cpu_us(s, case), 1) for s in ("ws_echo", "xpolicylab")}
    data = {
        "command": command,
        "date": str(datetime.date.today()),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "load_average_start_end": [round(x, 2) for x in load],
        "python": platform.python_version(),
        "round_trips_per_cell": len(lat[(XPL_STACKS[0], case)]),
        "request_bytes": frame_bytes,
        "case": case,
        "stacks": pct,
        "p50_over_ws_echo": ratios,
        "server_cpu_us_per_round_trip": cpu,
        "goal": "xpolicylab p50 <= 1.3 x ws_echo p50",
    }
    lines = [
        f"Command: `{command}`; {_cpu_model()}, {os.cpu_count()} cores, load {load[0]:.1f} -> {load[1]:.1f}; "
        f"request {frame_bytes} bytes; {data['round_trips_per_cell']} round trips per cell.",
        "",
        "| stack | p50 ms | p90 ms | p99 ms | p50 / ws_echo |",
        "|---|---|---|---|---|",
    ]
    for s in XPL_STACKS:
        ratio = f"{ratios[s]:.2f}" if s in ratios else "1"
        lines.append(f"| {s} | {pct[s]['p50_ms']:.3f} | {pct[s]['p90_ms']:.3f} | {pct[s]['p99_ms']:.3f} | {ratio} |")
    lines += ["", f"Server CPU per round trip: ws_echo {cpu['ws_echo']:.0f} us, xpolicylab {cpu['xpolicylab']:.0f} us."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
    return 0


def _cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    """Parse arguments; either serve one stack (child process) or run the whole comparison."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=20, help="interleaved rounds (plus one warm-up)")
    ap.add_argument("--block", type=int, default=50, help="round trips per stack, case and round")
    ap.add_argument("--stacks", default=",".join(STACKS), help="comma list of stacks")
    ap.add_argument("--out", default=None, help="write the markdown table here")
    ap.add_argument("--json", default=None, help="write the percentiles and ratios here, as JSON")
    ap.add_argument("--xpolicylab", action="store_true", help="case (d): our XPolicyLab endpoint vs a websocket echo")
    ap.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        serve(args.serve, args.port)
        return 0
    command = "python benchmarks/transport_latency.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.xpolicylab:
        return xpolicylab_main(args, command.strip())
    stacks = tuple(args.stacks.split(","))
    load_start = os.getloadavg()[0]
    lat = run(args.rounds, args.block, stacks)
    load = (load_start, os.getloadavg()[0])
    cpu_us = {case: python_cpu_us(case) for case in CASES} if "policylink" in stacks else dict.fromkeys(CASES, 0.0)
    text = report(lat, stacks, command.strip(), cpu_us, load, args.block)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    if args.json:
        data = summary(lat, stacks, command.strip(), cpu_us, load, args.block)
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
