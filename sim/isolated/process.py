"""An env served from another interpreter (an isolated family's venv): start the server process, talk to it as an
:class:`~policylink.adapters.env_transport.RemoteEnv`, stop it at close or exit.

The process runs :mod:`policylink.sim.isolated.server` in its own process group (``start_new_session``), bound to
a ``unix://`` socket (:mod:`policylink.adapters.local_wire`: the wire without ZeroMQ's I/O threads) in a private
temporary folder; its stdout/stderr go to a log file there. It is stopped by
:meth:`EnvProcess.stop` (SIGTERM to the group, SIGKILL after a grace period), which :class:`IsolatedEnv.close`
and an ``atexit`` hook call; the server also exits by itself when its parent process is gone. A dead or stuck
process is an :class:`EnvProcessError` carrying the tail of its log, never a hang.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from policylink.adapters.env_transport import RemoteEnv
from policylink.adapters.protocol import RemoteError
from policylink.sim.isolated.server import BAD_INPUT, READY

SERVER_MODULE = "policylink.sim.isolated.server"


class EnvProcessError(RuntimeError):
    """The env process exited, never became ready, or stopped answering; the message has its exit status and the
    tail of its output."""


class EnvProcess:
    """One env server subprocess (see the module docstring).

    Args:
        python: the interpreter to run (a family venv's ``bin/python``; ``sys.executable`` in tests).
        factory: ``"module:function"`` building the EnvAdapter inside that interpreter.
        kwargs: the factory's keyword arguments (JSON-serialisable).
        env: extra environment variables for the process (``MUJOCO_GL``/``PYOPENGL_PLATFORM`` default to ``egl``).
        startup_timeout_s: seconds to wait for the ready line.

    Raises:
        ValueError: the factory refuses ``kwargs`` (its message, no output tail).
        EnvProcessError: the process exits, or prints no ready line within ``startup_timeout_s`` (it is killed).
    """

    def __init__(
        self,
        python: str,
        factory: str,
        kwargs: Mapping[str, Any],
        env: Mapping[str, str] | None = None,
        startup_timeout_s: float = 120.0,
    ):
        import json

        self.factory = factory
        self._dir = Path(tempfile.mkdtemp(prefix="policylink-env-"))
        self.log_path = self._dir / "server.log"
        bind = f"unix://{self._dir / 'env.sock'}"  # mkdtemp's folder is the owner's only (mode 0700)
        argv = [python, "-u", "-m", SERVER_MODULE, "--factory", factory, "--kwargs", json.dumps(dict(kwargs))]
        argv += ["--bind", bind, "--parent-pid", str(os.getpid())]
        child_env = {**os.environ, "MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl"}
        child_env.update({k: os.environ[k] for k in ("MUJOCO_GL", "PYOPENGL_PLATFORM") if k in os.environ})
        child_env.update(env or {})
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, env=child_env, start_new_session=True
        )
        atexit.register(self.stop)
        self.endpoint = self._wait_ready(startup_timeout_s)

    @property
    def pid(self) -> int:
        """The server's process id (also its process group id)."""
        return self.proc.pid

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self.proc.poll() is None

    def output_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines the process printed (stdout and stderr)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip().splitlines()[-lines:])

    def error(self, what: str) -> EnvProcessError:
        """An :class:`EnvProcessError` for ``what`` with the exit status and the output tail."""
        status = "running" if self.alive() else f"exited with status {self.proc.returncode}"
        tail = self.output_tail()
        output = f"\n--- its output ---\n{tail}" if tail else ""
        return EnvProcessError(f"env process {self.factory} (pid {self.pid}, {status}): {what}{output}")

    def check(self) -> None:
        """Raise :class:`EnvProcessError` when the process has exited."""
        if not self.alive():
            raise self.error("the env process is gone")

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace_s``; remove the temporary folder. Idempotent."""
        if self.alive():
            for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
        else:
            self.proc.poll()
        if not self._log.closed:
            self._log.close()
        atexit.unregister(self.stop)
        shutil.rmtree(self._dir, ignore_errors=True)

    def _wait_ready(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.log_path.read_text(errors="replace").splitlines():
                if line.startswith(READY + " "):
                    return line.split(" ", 1)[1].strip()
            if not self.alive():
                bad = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.startswith(BAD_INPUT)]
                if bad:  # the factory refused its kwargs: the user's input, not a crash
                    self.stop()
                    raise ValueError(f"env {self.factory}: {bad[-1][len(BAD_INPUT) :].strip()}")
                err = self.error("exited before serving")
                self.stop()
                raise err
            time.sleep(0.02)
        err = self.error(f"not ready within {timeout_s:g} s")
        self.stop()
        raise err


class IsolatedEnv(RemoteEnv):
    """A :class:`~policylink.adapters.env_transport.RemoteEnv` that owns its server process.

    ``reset``/``step`` first check that the process is alive; a dead process, or one that does not answer within
    ``timeout_s``, raises :class:`EnvProcessError` (with its output tail). ``last_info`` holds the latest
    reset/step info (an expert reading ``info["expert_action"]`` uses it). :meth:`close` stops the process.

    Args:
        process: the started :class:`EnvProcess` (stopped here if the handshake fails).
        timeout_s: per-request timeout, seconds.

    Raises:
        EnvProcessError: the handshake fails.
    """

    def __init__(self, process: EnvProcess, timeout_s: float = 60.0):
        self.process = process
        self.last_info: dict[str, Any] = {}
        try:
            super().__init__(process.endpoint, timeout_s=timeout_s, alive=process.alive)
        except Exception as e:
            err = process.error(f"no handshake at {process.endpoint}: {e}")
            process.stop()
            raise err from e

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict[str, Any], dict]:
        """As :meth:`RemoteEnv.reset`. Raises :class:`EnvProcessError` when the process died or hangs."""
        obs, info = self._call(super().reset, seed=seed, options=options)
        self.last_info = info
        return obs, info

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict]:
        """As :meth:`RemoteEnv.step`. Raises :class:`EnvProcessError` when the process died or hangs."""
        result = self._call(super().step, action)
        self.last_info = result[4]
        return result

    def close(self) -> None:
        """Close the connection and stop the process."""
        super().close()
        self.process.stop()

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self.process.check()
        try:
            return fn(*args, **kwargs)
        except (TimeoutError, ConnectionError) as e:  # ConnectionError: it ended while we waited (channel's alive)
            raise self.process.error(f"no reply: {e}") from e
        except RemoteError as e:
            if not self.process.alive():
                raise self.process.error(str(e)) from e
            raise


def start_isolated_env(
    python: str,
    factory: str,
    kwargs: Mapping[str, Any],
    *,
    timeout_s: float = 60.0,
    startup_timeout_s: float = 120.0,
    env: Mapping[str, str] | None = None,
) -> IsolatedEnv:
    """Start ``factory(**kwargs)`` under ``python`` and connect to it (see :class:`EnvProcess`, :class:`IsolatedEnv`).

    Raises:
        EnvProcessError: the process fails to start, serve or answer the handshake.
    """
    return IsolatedEnv(EnvProcess(python, factory, kwargs, env=env, startup_timeout_s=startup_timeout_s), timeout_s)


__all__: Sequence[str] = ["EnvProcess", "EnvProcessError", "IsolatedEnv", "start_isolated_env"]
