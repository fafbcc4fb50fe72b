"""The process an isolated env family runs in its own venv: build one env and serve it over the env transport.

``python -m policylink.sim.isolated.server --factory MODULE:FUNCTION --kwargs JSON --bind ENDPOINT
--parent-pid PID`` imports ``MODULE`` (and the contract, ``policylink.adapters``; nothing of ``policylink.sim``
but this package), calls ``FUNCTION(**kwargs)`` for an EnvAdapter, serves it with
:class:`~policylink.adapters.env_transport.EnvServer` at ``ENDPOINT`` and prints one line
``policylink-env-ready <endpoint>`` on stdout when it is bound. It exits when its parent process is gone (checked
every 0.5 s, so a killed host never leaves it behind), on SIGTERM, or on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence
from importlib import import_module
from typing import Any

READY = "policylink-env-ready"
BAD_INPUT = "policylink-env-bad-input"  # prefix of the one line a factory's refusal of its kwargs prints
"""First word of the line printed on stdout once the env is served."""


def load_factory(ref: str) -> Any:
    """The callable named ``"module:function"``.

    Raises:
        ValueError: ``ref`` is not ``module:function``. ImportError / AttributeError: no such module or function.
    """
    module, sep, func = ref.partition(":")
    if not sep or not module or not func:
        raise ValueError(f"factory: expected 'module:function', received {ref!r}")
    return getattr(import_module(module), func)


def serve(factory: str, kwargs: dict[str, Any], bind: str, parent_pid: int | None = None) -> None:
    """Build ``factory(**kwargs)`` and serve it at ``bind`` until SIGTERM, Ctrl-C or the parent's exit.

    A ``unix://`` bind (what :class:`~policylink.sim.isolated.process.EnvProcess` gives) runs every call on the one
    serving thread that reads the socket (no thread hand-off; an env that renders keeps its GL context there). Over
    ZeroMQ a state-only env runs inline on the serving loop after its first calls (``inline_below_s = inf``); an env
    that renders (``obs_mode`` other than ``"state"``, or a ``render_mode`` for videos) is called on the server's
    worker thread only (``inline_below_s = 0``): its GL context belongs to the thread that made it. A factory refusing
    ``kwargs`` (ValueError, LookupError, TypeError) prints one ``BAD_INPUT`` line with its message and
    exits with status 2.
    """
    from policylink.adapters.env_transport import EnvServer

    build = load_factory(factory)
    try:
        env = build(**kwargs)
    except (ValueError, LookupError, TypeError) as e:  # kwargs the factory refuses: one line for the host, exit 2
        print(f"{BAD_INPUT} {e}", flush=True)
        sys.exit(2)
    server = EnvServer(env, bind, name=f"policylink-isolated-{factory.rpartition(':')[2]}")
    # one client, calls in sequence: a state env runs every call inline on the serving loop once its verb has been
    # seen 8 times (no thread hand-off, which costs most on a loaded machine); a rendering env never does, so its
    # GL context stays on the worker thread that made it
    renders = getattr(env, "obs_mode", "state") != "state" or getattr(env, "render_mode", None) is not None
    server.inline_below_s = 0.0 if renders else float("inf")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server.start()
    print(f"{READY} {server.endpoint}", flush=True)
    try:
        while not stop.wait(0.5):
            if parent_pid is not None and os.getppid() != parent_pid:
                break  # the host died without stopping us (reparented)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        env.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and :func:`serve`. Returns 0 on a clean stop."""
    p = argparse.ArgumentParser(prog="python -m policylink.sim.isolated.server", description=__doc__.split("\n")[0])
    p.add_argument("--factory", required=True, help="MODULE:FUNCTION returning an EnvAdapter")
    p.add_argument("--kwargs", default="{}", help="JSON object of the factory's keyword arguments")
    p.add_argument("--bind", required=True, help="ZeroMQ endpoint, e.g. ipc:///tmp/x/env.sock")
    p.add_argument("--parent-pid", type=int, default=None, help="exit when this process is no longer our parent")
    args = p.parse_args(argv)
    kwargs = json.loads(args.kwargs)
    if not isinstance(kwargs, dict):
        p.error(f"--kwargs: expected a JSON object, received {args.kwargs!r}")
    serve(args.factory, kwargs, args.bind, args.parent_pid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
