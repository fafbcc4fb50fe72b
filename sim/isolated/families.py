"""Isolated env families: a benchmark whose pins clash with ours, installed in a venv of its own
(:mod:`.venvs`) and served from there (:mod:`.process`).

A family is an :class:`IsolatedFamily` declared as an entry point of group ``policylink.env_families``
(``metaworld = "policylink.sim.isolated.metaworld:METAWORLD"``); ``adapters.registry`` resolves
``<family>/<task>`` to ``family(task, **kwargs)``, which starts the family's env server in its venv and returns an
:class:`~.process.IsolatedEnv`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policylink.sim.isolated.process import IsolatedEnv, start_isolated_env
from policylink.sim.isolated.venvs import family_python


@dataclass(frozen=True)
class IsolatedFamily:
    """One benchmark family served from its own venv.

    Attributes:
        name: the family name, the prefix of its env names (``metaworld`` -> ``metaworld/push``).
        requirements: pip requirement specifiers of the benchmark, installed with
            :data:`~policylink.sim.isolated.venvs.SERVER_REQUIREMENTS`.
        factory: ``"module:function"`` run inside the venv: ``function(task=..., **kwargs) -> EnvAdapter``; the
            module imports the contract and the benchmark only (never torch or our MuJoCo tasks).
        tasks: the task names (``<name>/<task>`` are env names).
        check: Python statement run in the venv after installing, to prove the benchmark imports.
        startup_timeout_s: seconds an env process may take to import and build the env.
        request_timeout_s: seconds a reset/step may take before the env counts as hung.
        env_config: the dataclass of the tasks' keyword arguments (:mod:`policylink.adapters.env_config`), checked
            by ``make_env`` in this process before the env server starts; None: unchecked (the venv factory's own
            errors).
    """

    name: str
    requirements: tuple[str, ...]
    factory: str
    tasks: tuple[str, ...]
    check: str = "pass"
    startup_timeout_s: float = 120.0
    request_timeout_s: float = 60.0
    env_config: type | None = None

    def __call__(self, task: str, **kwargs: Any) -> IsolatedEnv:
        """Start ``task``'s env server in the installed venv and return the connected env.

        Args:
            task: one of :attr:`tasks`.
            **kwargs: the venv factory's keyword arguments (JSON-serialisable: ``obs_mode``, ``image_size``...).

        Raises:
            ValueError: ``task`` is not one of :attr:`tasks`.
            EnvNotInstalledError: the family's venv is not installed (names the install command).
            EnvProcessError: the env process fails to start or to answer.
        """
        if task not in self.tasks:
            raise ValueError(f"{self.name} task: expected one of {list(self.tasks)}, received {task!r}")
        kw = {k: list(v) if isinstance(v, tuple) else v for k, v in kwargs.items()}
        return start_isolated_env(
            family_python(self.name),
            self.factory,
            {"task": task, **kw},
            timeout_s=self.request_timeout_s,
            startup_timeout_s=self.startup_timeout_s,
        )
