"""Policy references of an evaluation: labels (``label=ref``), the per-env checkpoint placeholder ``{env}``,
the env settings a checkpoint was trained with, checkpoint existence, and the warning when evaluation seeds
overlap the seeds that recorded a checkpoint's demonstrations.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from policylink.policies.loading import REMOTE_SCHEMES, kind_ref

ENV_PLACEHOLDER = "{env}"  # in a policy reference: one checkpoint per env, e.g. outputs/train/{env}/diffusion


def labelled(item: Any) -> tuple[str, Any]:
    """``(label, ref)`` of a policy/env reference: a ``(label, ref)`` pair, ``label=ref``, or a plain ref
    labelled by :func:`reference_label`."""
    if isinstance(item, tuple) and len(item) == 2:
        return str(item[0]), item[1]
    if callable(item):
        raise TypeError(
            f"policy/env reference: expected a string or a (label, callable) pair, received a bare "
            f"{type(item).__name__}"
        )
    text = str(item)
    label, eq, ref = text.partition("=")
    if eq and label and ref and not any(c in label for c in "/:\\{"):
        return label, ref
    return reference_label(text), text


def reference_label(ref: str) -> str:
    """A short, meaningful label for a reference: ``<run>`` for ``.../<run>/checkpoints/last``,
    ``<run>_<step>`` for ``.../<run>/checkpoints/<step>``, the folder name for another path (``{env}``
    removed: ``ckpt/{env}/flow`` -> ``flow``), the reference itself for names and addresses."""
    text = ref.replace(ENV_PLACEHOLDER, "") if ENV_PLACEHOLDER in ref else ref
    if kind_ref(text) is not None:  # kind:<run>/checkpoints/last/pretrained_model -> <run>
        text = kind_ref(text)[1].rstrip("/").removesuffix("/pretrained_model")
    if text.startswith(REMOTE_SCHEMES) or ("/" not in text and not Path(text).is_dir()):
        return (text.strip("_-.") or ref) if text != ref else ref
    path = Path(text.rstrip("/"))
    if path.parent.name == "checkpoints":
        run = path.parent.parent.name.strip("_-.") or path.parent.parent.name
        return run if path.name == "last" else f"{run}_{path.name}"
    return path.name.strip("_-.") or ref


def unique_labels(what: str, items: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``items`` unchanged when their labels are unique.

    Raises:
        ValueError: two items share a label (their cells would overwrite each other).
    """
    seen: dict[str, Any] = {}
    for label, ref in items:
        if label in seen:
            raise ValueError(
                f"{what}: expected unique labels, received label {label!r} for both {seen[label]!r} and {ref!r}; "
                f"name them with label=reference (e.g. --{what} a={seen[label]},b={ref})"
            )
        seen[label] = ref
    return items


def policy_ref_for(ref: Any, env: str) -> Any:
    """``ref`` with ``{env}`` replaced by the env's label (per-env checkpoints); other refs unchanged."""
    return ref.replace(ENV_PLACEHOLDER, env) if isinstance(ref, str) else ref


def checkpoint_env_kwargs_of(pols: list[tuple[str, Any]], env_labels: list[str]) -> dict[str, Any]:
    """``obs_mode`` (and ``image_size``) that every checkpoint among ``pols`` was trained with, when they all
    agree and it is not plain ``state``: an image checkpoint then evaluates without ``--env_kwargs``. Empty
    otherwise (a mix is left to the spec check, which names each mismatch)."""
    from policylink.policies.checkpoint import checkpoint_env_kwargs
    from policylink.policies.lerobot.loading import lerobot_env_kwargs

    found = []
    for _, ref in pols:
        if not isinstance(ref, str):
            continue
        for path in {policy_ref_for(ref, env) for env in env_labels}:
            folder = kind_ref(path)[1] if kind_ref(path) else path  # kind:folder (lerobot:PATH)
            kw = checkpoint_env_kwargs(folder) or lerobot_env_kwargs(folder)
            if kw is not None:
                found.append(kw)
    if not found or any(kw != found[0] for kw in found) or found[0]["obs_mode"] == "state":
        return {}
    print(f"env_kwargs from the checkpoints: {found[0]} (pass --env_kwargs to override)", file=sys.stderr)
    return dict(found[0])


def warn_recorded_seed_overlap(refs: Sequence[Any], seed: int, episodes: int) -> list[int]:
    """Warn (one line on stderr per checkpoint) when evaluation seeds ``seed .. seed + episodes - 1`` include seeds
    that the demonstrations of a checkpoint among ``refs`` were recorded with (its config names the
    training store; that store's ``meta/episode_seed``). Returns the overlapping seeds, sorted; other references,
    and stores that are gone, are skipped."""
    from policylink.data.buffer import EpisodeStore, StoreError
    from policylink.policies.checkpoint import CheckpointError, read_checkpoint_config

    wanted, overlap = set(range(seed, seed + episodes)), set()
    for ref in dict.fromkeys(r for r in refs if isinstance(r, str)):
        try:
            store_path = read_checkpoint_config(ref)["train"]["dataset"]["path"]
            with EpisodeStore(store_path, "r") as store:
                recorded = {m.seed for m in store.all_meta() if m.seed is not None}
        except (OSError, KeyError, TypeError, CheckpointError, StoreError):
            continue
        both = sorted(wanted & recorded)
        if both:
            overlap.update(both)
            print(
                f"warning: evaluation seeds {both[0]}..{both[-1]} ({len(both)} of {episodes}) were used to record the "
                f"demonstrations of {ref} ({store_path}); pass a --seed past them (e.g. 100000) for held-out results",
                file=sys.stderr,
            )
    return sorted(overlap)


def require_policy_refs(pols: list[tuple[str, Any]], env_labels: Sequence[str], field: str = "policies") -> None:
    """Check policy references as :func:`~policylink.policies.load_policy` will resolve them, before anything
    heavy (torch, a simulator) is imported, so a typo costs no waiting: a checkpoint folder (``{env}`` filled in for
    each of ``env_labels``) or ``kind:folder`` must exist, a plain name must be registered; server addresses and
    callables are not checked here.

    Raises:
        UnknownNameError: plain names (no ``/``, no such folder) that are no registered policy, or the ``kind`` of a
            ``kind:folder`` reference that is none: one message naming ``field``, every unknown name, the registered
            names and the closest one.
        FileNotFoundError: every checkpoint folder that does not exist, in one message naming ``field``, so that a
            missing checkpoint is reported as missing, not as an incompatible cell; a training run's folder given
            for its checkpoint is named with ``did you mean '<folder>/checkpoints/last'?``.
    """
    from policylink.adapters.registry import UnknownNameError, available_policies, unknown_name_message

    names, missing, unknown = available_policies(), [], []
    for _, ref in pols:
        if not isinstance(ref, str) or ref.startswith(REMOTE_SCHEMES):
            continue
        for cell_ref in dict.fromkeys(policy_ref_for(ref, e) for e in env_labels or [""]):
            typed = kind_ref(cell_ref)
            folder = Path(typed[1] if typed else cell_ref).expanduser()
            if typed is not None and typed[0] not in names:
                unknown.append(typed[0])
            elif folder.is_dir():
                if typed is None and _is_run_folder(folder):
                    missing.append(f"{folder} (a training run: did you mean {folder / 'checkpoints' / 'last'}?)")
            elif typed or "/" in cell_ref or os.sep in cell_ref or folder.exists():
                missing.append(str(folder) + (" (a file)" if folder.exists() else ""))
            elif cell_ref not in names:
                unknown.append(cell_ref)
    if unknown:
        other = "a checkpoint folder, a tcp:// or xpl:// address"
        value = unknown[0] if len(unknown) == 1 else unknown
        raise UnknownNameError(unknown_name_message(field, value, names, other=other))
    if missing:
        raise FileNotFoundError(missing_checkpoints_message(field, missing, typed=any(kind_ref(r) for _, r in pols)))


def require_checkpoint_folder(ref: str, field: str = "checkpoint") -> None:
    """Raise FileNotFoundError naming ``field`` when checkpoint folder ``ref`` (or the folder of ``kind:folder``) is
    not a folder, or is a training run's folder (``did you mean '<ref>/checkpoints/last'?``); UnknownNameError when
    the ``kind`` is no registered policy. Imports nothing heavy."""
    typed = kind_ref(ref)
    if typed is not None:
        require_policy_refs([(ref, ref)], [], field=field)
    elif not Path(ref).expanduser().is_dir():
        raise FileNotFoundError(missing_checkpoints_message(field, [ref], typed=False))
    elif _is_run_folder(folder := Path(ref).expanduser()):
        hint = f"{ref} (a training run: did you mean {folder / 'checkpoints' / 'last'}?)"
        raise FileNotFoundError(missing_checkpoints_message(field, [hint], typed=False))


def _is_run_folder(folder: Path) -> bool:
    """True for the output folder of ``policylink train`` given where its checkpoint is meant: no ``config.json``
    of its own, a ``checkpoints/last`` folder inside."""
    return not (folder / "config.json").exists() and (folder / "checkpoints" / "last").is_dir()


def missing_checkpoints_message(field: str, folders: Sequence[str], typed: bool) -> str:
    """``"<field>: checkpoint folder not found: a, b (<where checkpoints come from>)"``; ``typed``: LeRobot's hint."""
    hint = (
        "a LeRobot checkpoint is the pretrained_model folder LeRobot saves"
        if typed
        else "policylink train writes <output_dir>/checkpoints/last"
    )
    return f"{field}: checkpoint folder not found: {', '.join(folders)} ({hint})"


def with_gap(env_kwargs: dict[str, Any], gap: str | None) -> dict[str, Any]:
    """``env_kwargs`` with ``gap`` (a reality-gap preset name or YAML path, :mod:`policylink.sim.mujoco.gap`) as
    its ``gap`` entry: ``--gap NAME`` is ``env_kwargs: {gap: NAME}``. None leaves ``env_kwargs`` as it is.

    Raises:
        ValueError: ``env_kwargs`` already names a different gap (the message names both).
    """
    if gap is None:
        return env_kwargs
    if env_kwargs.get("gap", gap) != gap:
        raise ValueError(
            f"gap: expected one reality gap, received --gap {gap!r} and env_kwargs gap {env_kwargs['gap']!r} "
            "(give it once)"
        )
    return {**env_kwargs, "gap": gap}
