"""``policylink finetune``: offline improvement of a trained policy from recorded rollouts.

Each subcommand lives in its own module as ``main(argv) -> int`` and is imported only when run; helpers add
one line to :data:`SUBCOMMANDS`. Examples::

    policylink finetune critic --policy outputs/train/flow_push --buffer outputs/qvgm/push_buffer.zarr
    policylink finetune qvgm --policy outputs/train/flow_push --buffer outputs/qvgm/push_buffer.zarr
    policylink finetune loop --policy outputs/train/flow_push --env push --rounds 3 --episodes 50
    policylink finetune h2o --sim outputs/data/demos.zarr --real outputs/robot.zarr --out outputs/h2o
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

# name -> (module implementing main(argv) -> int, one-line help). Modules are imported lazily.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "critic": ("policylink.cli.finetune_qvgm", "train a chunk IQL critic on an episode store (reward, done)"),
    "qvgm": ("policylink.cli.finetune_qvgm", "Q-VGM: fine-tune a flow policy with a trained chunk critic"),
    "advantage": ("policylink.cli.finetune_advantage", "advantage labels + advantage-conditioned / AWR training"),
    "h2o": ("policylink.cli.finetune_h2o", "H2O critic on sim + robot episodes -> advantage labels"),
    "loop": ("policylink.cli.finetune_loop", "learn from experience: record, critic, Q-VGM, evaluate per round"),
    "monitor": ("policylink.cli.finetune_monitor", "train + calibrate the corrective-execution latent monitor"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``policylink finetune <subcommand>``. Returns the exit code (2 on a usage error)."""
    from policylink.cli.app import split_subcommand

    split = split_subcommand("policylink finetune", SUBCOMMANDS, sys.argv[1:] if argv is None else argv)
    if isinstance(split, int):
        return split
    name, rest = split
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return int(module.main([name, *rest]) or 0)
