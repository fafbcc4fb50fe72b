"""Sim-to-real figures of issue 34 from ``policylink eval`` output folders: the reality gap (nominal policy on the
nominal sim and on a gap preset, randomised policy on the gap) and the camera shift (RGB and pointmap policies on
the nominal cameras and under the shift). Reads each folder's ``results.json`` (one policy x one env cell), writes
the keys ``"gap"`` and ``"camera_shift"`` of ``benchmarks/results/sim2real.json`` (read-modify-write: other keys,
e.g. ``"latency"``, are kept) and a bar plot with 95% Wilson intervals.

    python benchmarks/sim2real.py \\
        --gap preset=worn_gantry task=pick_place nominal_on_nominal=outputs/s2r/eval/nominal_on_none \\
              nominal_on_gap=outputs/s2r/eval/nominal_on_worn_gantry randomized_on_gap=outputs/s2r/eval/rand_on_worn \\
        --camera rgb_nominal=... rgb_shift=... pointmap_nominal=... pointmap_shift=...

Any further ``name=FOLDER`` pairs given to ``--gap`` are kept under ``"gap"."cells"`` (e.g. the other presets). A
cell evaluated since the env faults on diverged physics also counts its faulted episodes (``n_faulted``) and its
success over the other episodes (``success_excluding_faulted``, ``ci95_excluding_faulted``).

``--improve before=X after=Y robot=STORE`` writes the ``"improve"`` key (deploy -> record -> improve): ``X`` and
``Y`` are eval folders or episode stores recorded by ``policylink run --robot ... --record`` (success counted over
every episode kept, an aborted one as a failure); ``robot`` the deployment store the improvement learned from
(``robot_episodes`` = its episodes, ``human_steps`` its takeover steps). Further ``name=X`` pairs are kept as cells
(e.g. the same policies on the gapped env).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from policylink.evaluate.report import wilson_interval

RESULTS = Path(__file__).resolve().parent / "results"
JSON_PATH, PLOT_PATH = RESULTS / "sim2real.json", RESULTS / "sim2real.png"
CAMERA_CELLS = ("rgb_nominal", "rgb_shift", "pointmap_nominal", "pointmap_shift")


def read_cell(folder: str | Path) -> dict[str, Any]:
    """``{"success": fraction, "n_success", "n_episodes", "ci95": [low, high] fractions, "folder"}`` of the single
    cell in ``folder/results.json``.

    Raises:
        ValueError: the folder holds no ``results.json`` or more than one cell.
    """
    path = Path(folder) / "results.json"
    if not path.is_file():
        raise ValueError(f"{folder}: expected a policylink eval output folder with results.json")
    rows = json.loads(path.read_text())
    if len(rows) != 1:
        raise ValueError(f"{path}: expected one policy x env cell, received {len(rows)}")
    k, n = int(rows[0]["n_success"]), int(rows[0]["n_episodes"])
    low, high = wilson_interval(k, n)
    cell = {"success": k / n, "n_success": k, "n_episodes": n, "ci95": [low, high], "folder": str(folder)}
    return {**cell, **fault_counts(folder)}


def fault_counts(folder: str | Path) -> dict[str, Any]:
    """Episodes the env ended on diverged physics (``fault`` in the shards' episodes, evaluations since the check
    of ``sim/mujoco/gap_runtime.py``): ``{"n_faulted", "success_excluding_faulted", "ci95_excluding_faulted"}``,
    or ``{}`` when the shards predate the field (faults not known)."""
    eps = [e for f in sorted(Path(folder).glob("cells/*/shards/*.json")) for e in json.loads(f.read_text())["episodes"]]
    if not eps or any("fault" not in e for e in eps):
        return {}
    kept = [e for e in eps if not e["fault"]]
    k = sum(bool(e["success"]) for e in kept)
    low, high = wilson_interval(k, len(kept)) if kept else (0.0, 0.0)
    return {
        "n_faulted": len(eps) - len(kept),
        "success_excluding_faulted": k / len(kept) if kept else None,
        "ci95_excluding_faulted": [low, high],
    }


def read_store_cell(path: str | Path) -> dict[str, Any]:
    """The cell of an episode store recorded by a deployment: success over every episode (``success`` None, an
    aborted episode, counts as a failure), with its Wilson interval; plus ``aborted`` and ``human_steps``."""
    from policylink.data.buffer import EpisodeStore

    store = EpisodeStore(path, "r")
    metas = store.all_meta()
    k, n = sum(m.success is True for m in metas), len(metas)
    human = int(store.load(["deploy.source"])["deploy.source"].sum()) if "deploy.source" in store.keys else 0
    low, high = wilson_interval(k, n)
    return {"success": k / n, "n_success": k, "n_episodes": n, "ci95": [low, high], "folder": str(path),
            "aborted": sum("aborted" in (m.quality or "") for m in metas), "human_steps": human}  # fmt: skip


def read_any_cell(path: str | Path) -> dict[str, Any]:
    """:func:`read_cell` of an eval folder, :func:`read_store_cell` of an episode store (a ``.zarr`` path)."""
    return read_store_cell(path) if str(path).rstrip("/").endswith(".zarr") else read_cell(path)


def improve_section(args: dict[str, str]) -> dict[str, Any]:
    """The ``"improve"`` key: ``before``/``after`` success fractions, ``robot_episodes`` and every cell.

    Raises:
        ValueError: ``before``, ``after`` or ``robot`` missing."""
    missing = [k for k in ("before", "after", "robot") if k not in args]
    if missing:
        raise ValueError(f"--improve: expected before=, after= and robot= items, missing {missing}")
    robot = read_store_cell(args["robot"])
    cells = {k: read_any_cell(v) for k, v in args.items() if k != "robot"}
    return {"before": cells["before"]["success"], "after": cells["after"]["success"],
            "robot_episodes": robot["n_episodes"], "robot_human_steps": robot["human_steps"],
            "robot_success_with_takeovers": robot["success"], "cells": cells}  # fmt: skip


def pairs(items: list[str], flag: str) -> dict[str, str]:
    """``name=value`` strings as a dict. Raises ValueError naming ``flag`` for an item without ``=``."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{flag}: expected name=value items, received {item!r}")
        out[name] = value
    return out


def gap_section(args: dict[str, str]) -> dict[str, Any]:
    """The ``"gap"`` key: preset, task, the three required success fractions (and ``randomized_on_gap`` over the
    episodes that did not fault, when its eval knows), and every cell's details."""
    cells = {k: read_cell(v) for k, v in args.items() if k not in ("preset", "task")}
    out: dict[str, Any] = {"preset": args["preset"], "task": args["task"]}
    for key in ("nominal_on_nominal", "nominal_on_gap", "randomized_on_gap"):
        out[key] = cells[key]["success"] if key in cells else None
    if "success_excluding_faulted" in cells.get("randomized_on_gap", {}):  # diverged physics: unwinnable episodes
        out["randomized_on_gap_excluding_faulted"] = cells["randomized_on_gap"]["success_excluding_faulted"]
    out["cells"] = cells
    return out


def camera_section(args: dict[str, str], shift: str) -> dict[str, Any]:
    """The ``"camera_shift"`` key: success under the shift / nominal success for RGB and pointmap policies."""
    unknown = sorted(set(args) - set(CAMERA_CELLS))
    if unknown:
        raise ValueError(f"--camera: expected cells among {list(CAMERA_CELLS)}, received {unknown}")
    cells = {k: read_cell(v) for k, v in args.items()}

    def ratio(kind: str) -> float | None:  # None: a cell was not measured, or the nominal success is 0
        nominal, shifted = cells.get(f"{kind}_nominal"), cells.get(f"{kind}_shift")
        if nominal is None or shifted is None or nominal["success"] == 0:
            return None
        return shifted["success"] / nominal["success"]

    missing = [c for c in CAMERA_CELLS if c not in cells]
    return {"rgb_ratio": ratio("rgb"), "pointmap_ratio": ratio("pointmap"), "shift": shift, "cells": cells,
            "not_measured": missing}  # fmt: skip


def plot(sections: dict[str, Any], path: Path) -> None:
    """One bar per cell (success %, 95% Wilson interval as error bars), one panel per section."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [s for s in ("gap", "camera_shift", "improve") if s in sections and sections[s]]
    widths = [max(3, len(sections[n]["cells"])) for n in names]  # about one inch per bar
    fig, axes = plt.subplots(1, len(names), figsize=(1.2 * sum(widths), 4.5), squeeze=False,
                             gridspec_kw={"width_ratios": widths})  # fmt: skip
    for ax, name in zip(axes[0], names):
        cells = sections[name]["cells"]
        labels = list(cells)
        y = [100 * cells[c]["success"] for c in labels]
        err = [[y[i] - 100 * cells[c]["ci95"][0] for i, c in enumerate(labels)],
               [100 * cells[c]["ci95"][1] - y[i] for i, c in enumerate(labels)]]  # fmt: skip
        ax.bar(range(len(labels)), y, yerr=err, capsize=4, color="#4878d0")
        ax.set_xticks(range(len(labels)), [c.replace("_", "\n") for c in labels], fontsize=8)
        ax.set_ylim(0, 105)
        ax.set_ylabel("success (%)")
        title = sections[name].get("preset") or sections[name].get("shift") or ""
        ax.set_title(f"{name}: {title}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gap", nargs="*", default=None, help="preset=NAME task=TASK and cell=EVAL_FOLDER pairs")
    p.add_argument("--camera", nargs="*", default=None, help="rgb_nominal= rgb_shift= pointmap_nominal= ...")
    p.add_argument("--camera-shift", default="moved_camera", help="what the shift cells ran under (a preset name)")
    p.add_argument("--improve", nargs="*", default=None, help="before=X after=Y robot=STORE")
    p.add_argument("--json", type=Path, default=JSON_PATH)
    p.add_argument("--plot", type=Path, default=PLOT_PATH)
    a = p.parse_args(argv)
    doc = json.loads(a.json.read_text()) if a.json.is_file() else {}
    if a.gap:
        doc["gap"] = gap_section(pairs(a.gap, "--gap"))
    if a.camera:
        doc["camera_shift"] = camera_section(pairs(a.camera, "--camera"), a.camera_shift)
    if a.improve:
        doc["improve"] = improve_section(pairs(a.improve, "--improve"))
    a.json.write_text(json.dumps(doc, indent=2) + "\n")
    plot(doc, a.plot)
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "cells"} for k, v in doc.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
