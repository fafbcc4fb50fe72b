"""The ``policylink`` subcommands: name -> (module implementing ``main(argv) -> int``, one-line help). Modules are
imported only when their command runs."""

from __future__ import annotations

COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("policylink.cli.demo", "the main job: record demos, train two policies, evaluate N x M, report"),
    "record": (
        "policylink.cli.record",
        "record scripted-expert episodes into a zarr episode store (a policy's: run --record)",
    ),
    "train": (
        "policylink.cli.train",
        "train a policy on an episode store (imitation, or another objective: --objective.type)",
    ),
    "finetune": (
        "policylink.cli.finetune",
        "offline improvement from rollouts: critic, Q-VGM, advantage, H2O, learning loop, monitor",
    ),
    "eval": ("policylink.cli.eval", "evaluate N policies on M environments; tables, plots, videos"),
    "serve": ("policylink.cli.serve", "serve a policy over ZeroMQ, openpi or XPolicyLab websockets"),
    "robot": (
        "policylink.cli.robot",
        "serve a robot (or a simulated task as a robot) over ZeroMQ, behind its safety layer",
    ),
    "run": (
        "policylink.cli.run",
        "run one policy on one environment (or a robot: --robot) and print the episode results",
    ),
    "dataset": (
        "policylink.cli.dataset",
        "dataset tools: info, stats, export-lerobot, import-lerobot, merge, view, advantage-report",
    ),
    "bench": ("policylink.cli.bench", "run a benchmark from benchmarks/ and write its results"),
    "keys": ("policylink.cli.keys", "CURVE key pairs for authenticated, encrypted serving"),
    "envs": (
        "policylink.cli.envs",
        "isolated benchmark environments (MetaWorld, ALOHA): install, list; an env's kwargs (envs kwargs ENV)",
    ),
}
