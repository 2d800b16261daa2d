"""The sweep folder's own files: the specs of the sweeps that trained into it (DESIGN.md §9).

A sweep folder ``OUT/`` holds ``runs/NAME/`` (ordinary run directories, see ``rundir``) and the spec
of every sweep that trained into it: ``OUT/sweep.yaml`` for the first one (and any rerun of it, under
the same ``name``), ``OUT/sweeps/NAME.yaml`` for each further sweep of another name (several sweeps
may share a folder, e.g. the lr grid of a study and its added seeds). ``scalevec report``
reads them all with ``load_specs``: the tuned axis and the baseline must agree, and the strategy order
is the order of first appearance.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from scalevec.config.files import load_yaml
from scalevec.outpath import check_out_path, replace_file
from scalevec.training.rundir import LOCK, has_config

SPEC_FILE = "sweep.yaml"
MORE_SPECS = "sweeps"


def spec_path(out: Path, name: str) -> Path:
    """Where the spec of sweep ``name`` lives in folder ``out`` (module docstring)."""
    first = out / SPEC_FILE
    if not first.is_file():
        return first
    try:
        first_name = str(load_yaml(first).get("name") or "")
    except ValueError:
        first_name = ""
    if first_name == name:
        return first
    return out / MORE_SPECS / (re.sub(r"[^A-Za-z0-9._+-]+", "-", name) + ".yaml")


RUNS = "runs"  # OUT/runs/NAME/: the run directories


def check_folder(out: Path, spec_file: str | Path | None = None) -> None:
    """Refuse an ``--out`` that holds files but is not a sweep folder (no ``runs/`` and no readable
    ``sweep.yaml``): a sweep writes ``report.md``, ``results.csv``, ``runs.csv``, figures and specs there, which
    would replace a user's files of those names. A new or empty folder, one that holds only ``spec_file`` (the
    sweep's own file kept beside its results, as ``scripts/gpu_ladder.sh`` does), or a sweep folder passes.
    Raises ``FileExistsError`` naming a few of the files and the fix, ``ValueError`` for a ``sweep.yaml`` that
    is not a sweep's, ``FileNotFoundError`` for a symbolic link that leads nowhere or loops, as ``out`` or a
    folder above it, and ``NotADirectoryError`` for an ``out`` under a file (``outpath.check_out_path``: creating
    the folder would fail with a bare errno); ``NotADirectoryError`` for an ``out`` that is a file and
    ``FileExistsError`` for one that is a training run (sweep, compare and study alike)."""
    out = Path(out)
    check_out_path(out)
    if out.exists() and not out.is_dir():  # a file, or a link to one: mkdir would fail with a bare errno
        raise NotADirectoryError(f"--out {out} exists and is not a directory; choose another --out")
    if has_config(out):
        raise FileExistsError(f"--out {out} is a single training run (config.yaml), not a sweep folder; choose "
                              f"another --out")
    own = Path(spec_file).resolve() if spec_file else None
    if not out.is_dir() or all(p.resolve() == own or p.name == LOCK for p in out.iterdir()):  # a study's lock
        return
    if (out / SPEC_FILE).is_file():
        fix = f"choose another --out (a sweep writes its own {SPEC_FILE} there)"
        try:
            spec = load_yaml(out / SPEC_FILE)
        except ValueError as e:
            raise ValueError(f"{e}: not a scalevec sweep's spec; {fix}") from None
        if "grid" not in spec:
            raise ValueError(f"{out / SPEC_FILE} has no grid: not a scalevec sweep's spec; {fix}")
        return
    if (out / RUNS).is_dir():
        return
    names = sorted(p.name for p in out.iterdir() if p.resolve() != own and p.name != LOCK)
    raise FileExistsError(f"--out {out} holds files that are not a scalevec sweep's ({', '.join(names[:4])}"
                          f"{', ...' if len(names) > 4 else ''}); choose a new or empty --out (a sweep writes "
                          f"report.md, results.csv, runs.csv and figures there)")


def write_spec(out: Path, spec: dict) -> Path:
    """Store ``spec`` (a sweep mapping with a ``name``) in ``out`` without touching other sweeps' specs."""
    path = spec_path(out, str(spec.get("name") or "sweep"))
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_file(path, yaml.safe_dump(spec, sort_keys=False))
    return path


def spec_files(out: Path) -> list[Path]:
    """The specs stored in the sweep folder ``out``: ``sweep.yaml``, then ``sweeps/*.yaml`` (more sweeps trained
    into it, e.g. by ``compare``), in that order; [] when there is none."""
    out = Path(out)
    return ([out / SPEC_FILE] if (out / SPEC_FILE).is_file() else []) + sorted((out / MORE_SPECS).glob("*.yaml"))


def load_specs(out: Path) -> dict | None:
    """The merged spec of every sweep stored in ``out`` (None when there is none).

    Returns ``{"name", "tune", "baseline", "grid": {"strategy": [...]}}`` as ``report.analyze`` reads it.
    Raises ``ValueError`` when two specs tune different axes or name different baselines (the report
    would have to pick one): keep such sweeps in separate folders. A spec that tunes nothing (``tune: []``)
    defers to one that tunes an axis.
    """
    paths = spec_files(out)
    if not paths:
        return None
    specs = [(p, load_yaml(p)) for p in paths]
    merged: dict = {"name": specs[0][1].get("name"), "grid": {"strategy": []}}
    for key in ("tune", "baseline"):
        values = {p: s.get(key) for p, s in specs if s.get(key) is not None}
        if key == "tune" and any(values.values()):
            # a sweep that tunes nothing does not contradict one that tunes: `tune` is how the report reads the
            # runs, not part of their configs, so it may be added later to a folder whose runs stay
            values = {p: v for p, v in values.items() if v}
        if len({repr(v) for v in values.values()}) > 1:
            listed = ", ".join(f"{p.name}: {v}" for p, v in values.items())
            raise ValueError(f"the sweeps in {out} disagree on {key!r} ({listed}); put them in separate --out folders")
        if values:
            merged[key] = next(iter(values.values()))
    for _, s in specs:
        grid = s.get("grid") or {}
        for strategy in grid.get("strategy") or []:
            if isinstance(strategy, dict):  # a bundle (a strategy with its own lr, or a named variant)
                strategy = str(strategy.get("name") or strategy.get("strategy"))
            if strategy not in merged["grid"]["strategy"]:
                merged["grid"]["strategy"].append(strategy)
    return merged


__all__ = ["check_folder", "load_specs", "spec_files", "spec_path", "write_spec"]
