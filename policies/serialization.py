"""The one way policylink writes and reads its artefacts (policy checkpoints, critics, monitors, training-resume
state, lineage): tensors in safetensors files, everything else in JSON. Nothing is ever pickled, so loading a
file cannot run code (``torch.load`` of a pickle can).

- :func:`save_tensors` / :func:`load_tensors`: a flat ``{name: tensor or array}`` map <-> one ``.safetensors`` file.
- :func:`save_json` / :func:`load_json`: plain data <-> one ``.json`` file.
- :func:`save_tree` / :func:`load_tree`: a nested state (an optimizer's ``state_dict()``, RNG states, ...) <->
  ``<stem>.safetensors`` (its tensors and arrays) + ``<stem>.json`` (the skeleton, each tensor replaced by a
  reference to its name), round-tripping exactly.
- :func:`refuse_legacy`: a file of the old pickle layout gets a :class:`LegacyFormatError` naming the file and
  what to do.

Every file is written under a temporary name and renamed into place, so a killed writer never leaves half a
file. The JSON helpers import no torch (a ``--help`` or a reference check reads JSON without it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

TENSOR_SUFFIX = ".safetensors"
JSON_SUFFIX = ".json"
TREE_FORMAT = "policylink.tree/1"
"""``format`` of a :func:`save_tree` skeleton (checked on load)."""

_TENSOR, _ARRAY, _TUPLE, _ITEMS = "__tensor__", "__ndarray__", "__tuple__", "__items__"
_MARKERS = (_TENSOR, _ARRAY, _TUPLE, _ITEMS)


class LegacyFormatError(FileNotFoundError):
    """A folder holds a file of the old pickle layout (``*.pt``) instead of its safetensors + JSON replacement."""


class SerializationError(ValueError):
    """A file that is not what it should be (unreadable JSON, a skeleton naming a tensor the file lacks, ...), or a
    value that cannot be saved without pickle."""


def save_tensors(path: str | Path, tensors: Mapping[str, Any]) -> Path:
    """Write ``tensors`` (``{name: torch.Tensor or np.ndarray}``, any shape and dtype safetensors knows) to the
    safetensors file ``path``; tensors are detached and copied to CPU, and entries sharing memory are written as
    separate copies. Returns ``path``.

    Raises:
        SerializationError: a value that is neither a tensor nor a numeric array (names the entry and its type).
    """
    import torch
    from safetensors.torch import save_file

    out, seen = {}, set()
    for name, value in tensors.items():
        if isinstance(value, np.ndarray) and value.dtype != object:
            value = torch.from_numpy(np.require(value, requirements="C"))  # keeps 0-d arrays 0-d
        if not isinstance(value, torch.Tensor):
            raise SerializationError(f"{path}: entry {name!r}: expected a tensor or array, received {type(value)}")
        t = value.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr() if t.numel() else None
        if ptr is not None and ptr in seen:
            t = t.clone()
        seen.add(ptr)
        out[str(name)] = t
    path = Path(path)
    tmp = _tmp_name(path)
    save_file(out, str(tmp))
    os.replace(tmp, path)
    return path


def load_tensors(path: str | Path, device: Any = "cpu") -> dict:
    """The ``{name: torch.Tensor}`` of safetensors file ``path``, on ``device``.

    Raises:
        FileNotFoundError: ``path`` does not exist (named).
        SerializationError: ``path`` is not a safetensors file.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        return load_file(str(path), device=str(device))
    except SafetensorError as e:
        raise SerializationError(f"{path}: not a readable safetensors file ({e})") from e


def save_json(path: str | Path, obj: Any) -> Path:
    """Write plain data ``obj`` (dicts with str keys, lists, str, int, float, bool, None) to ``path`` as indented
    JSON. Returns ``path``.

    Raises:
        SerializationError: ``obj`` holds something JSON cannot represent (names its type).
    """
    try:
        text = json.dumps(obj, indent=1)
    except (TypeError, ValueError) as e:
        raise SerializationError(f"{path}: cannot be written as JSON: {e}") from e
    path = Path(path)
    tmp = _tmp_name(path)
    tmp.write_text(text + "\n")
    os.replace(tmp, path)
    return path


def load_json(path: str | Path) -> Any:
    """The data of JSON file ``path``.

    Raises:
        FileNotFoundError: ``path`` does not exist (named). SerializationError: it is not valid JSON.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SerializationError(f"{path}: not valid JSON ({e})") from e


def save_tree(stem: str | Path, tree: Any) -> tuple[Path, Path]:
    """Write a nested state to ``<stem>.safetensors`` + ``<stem>.json``. Returns both paths.

    ``tree`` may nest dicts (str or int keys), lists and tuples of: torch tensors, numpy arrays and scalars, str,
    int, float, bool and None -- what ``optimizer.state_dict()``, LR schedulers, EMA, ``torch.get_rng_state()``
    and ``np.random.get_state()`` return. Each tensor or array is stored under its path in the tree (``a/b/0``);
    :func:`load_tree` rebuilds the same structure with the same types (tuples stay tuples, int keys stay ints,
    arrays stay numpy arrays, tensors keep their dtype and shape).

    Raises:
        SerializationError: a value of another type, or a dict key that is not str or int (names its path).
    """
    tensors: dict[str, Any] = {}
    skeleton = {"format": TREE_FORMAT, "tree": _encode(tree, "", tensors)}
    stem = Path(stem)
    tensor_file = save_tensors(stem.with_name(stem.name + TENSOR_SUFFIX), tensors)
    json_file = save_json(stem.with_name(stem.name + JSON_SUFFIX), skeleton)
    return tensor_file, json_file


def load_tree(stem: str | Path, device: Any = "cpu") -> Any:
    """Inverse of :func:`save_tree`: the nested state of ``<stem>.json`` + ``<stem>.safetensors``, tensors on
    ``device`` (numpy arrays on the host).

    Raises:
        FileNotFoundError: either file is missing (named).
        SerializationError: the skeleton is not a :data:`TREE_FORMAT` one, or names a tensor the file lacks.
    """
    stem = Path(stem)
    skeleton = load_json(stem.with_name(stem.name + JSON_SUFFIX))
    if not isinstance(skeleton, dict) or skeleton.get("format") != TREE_FORMAT:
        raise SerializationError(
            f"{stem.with_name(stem.name + JSON_SUFFIX)}: format: expected {TREE_FORMAT!r}, received "
            f"{skeleton.get('format') if isinstance(skeleton, dict) else type(skeleton).__name__!r}"
        )
    tensors = load_tensors(stem.with_name(stem.name + TENSOR_SUFFIX), device)
    return _decode(skeleton["tree"], tensors, stem)


def refuse_legacy(folder: str | Path, current: str, legacy: str, remedy: str) -> None:
    """Raise :class:`LegacyFormatError` when ``folder`` holds the old pickle file ``legacy`` but not ``current``,
    the file that replaced it; the message names the file, says why it is not read and gives ``remedy``. Returns
    quietly otherwise (the caller then reports a plainly missing file itself)."""
    folder = Path(folder)
    if (folder / legacy).is_file() and not (folder / current).is_file():
        raise LegacyFormatError(
            f"{folder / legacy}: an old-format pickle file, which policylink no longer reads (unpickling can run "
            f"code; every artefact is now safetensors + JSON, here {current}). {remedy}"
        )


def _tmp_name(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def _encode(value: Any, where: str, tensors: dict[str, Any]) -> Any:
    """The JSON skeleton of ``value``; tensors and arrays go into ``tensors`` under their tree path."""
    import torch

    if isinstance(value, (torch.Tensor, np.ndarray, np.generic)):  # before float: np.float64 is a float
        name = where or "."
        while name in tensors:
            name += "'"
        if isinstance(value, torch.Tensor):
            tensors[name] = value
            return {_TENSOR: name}
        if value.dtype == object:
            raise SerializationError(f"{where or 'tree'}: expected a numeric array, received dtype object")
        tensors[name] = np.asarray(value)
        return {_ARRAY: name, "scalar": isinstance(value, np.generic)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        items = [_encode(v, f"{where}/{i}".lstrip("/"), tensors) for i, v in enumerate(value)]
        return {_TUPLE: items} if isinstance(value, tuple) else items
    if isinstance(value, Mapping):
        bad = [k for k in value if not isinstance(k, (str, int)) or isinstance(k, bool)]
        if bad:
            raise SerializationError(f"{where or 'tree'}: expected str or int keys, received {bad[0]!r}")
        enc = {k: _encode(v, f"{where}/{k}".lstrip("/"), tensors) for k, v in value.items()}
        if all(isinstance(k, str) for k in value) and not any(k in _MARKERS for k in value):
            return enc
        return {_ITEMS: [[k, v] for k, v in enc.items()]}
    raise SerializationError(
        f"{where or 'tree'}: expected a tensor, array, number, str, bool, None, list, tuple or dict, received "
        f"{type(value).__name__}"
    )


def _decode(node: Any, tensors: Mapping[str, Any], stem: Path) -> Any:
    if isinstance(node, list):
        return [_decode(v, tensors, stem) for v in node]
    if not isinstance(node, dict):
        return node
    for marker in (_TENSOR, _ARRAY):
        if marker in node:
            name = node[marker]
            if name not in tensors:
                raise SerializationError(f"{stem}{TENSOR_SUFFIX}: missing tensor {name!r} named by {stem}{JSON_SUFFIX}")
            if marker == _TENSOR:
                return tensors[name]
            array = tensors[name].cpu().numpy()
            return array[()] if node.get("scalar") else array
    if _TUPLE in node:
        return tuple(_decode(v, tensors, stem) for v in node[_TUPLE])
    if _ITEMS in node:
        return {k: _decode(v, tensors, stem) for k, v in node[_ITEMS]}
    return {k: _decode(v, tensors, stem) for k, v in node.items()}


__all__ = [
    "LegacyFormatError",
    "SerializationError",
    "TREE_FORMAT",
    "load_json",
    "load_tensors",
    "load_tree",
    "refuse_legacy",
    "save_json",
    "save_tensors",
    "save_tree",
]
