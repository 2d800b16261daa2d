"""One validated reader of runs.csv (frames.read_runs_csv): a torn, edited or doubled file is refused with one line
naming the file, the line and the fix, never read as fewer or more runs; a header-only file is zero runs, and the
readers that report a cell say so; scripts/reproduction.py turns a torn cell into one line and exit 2."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from reproduction import protocol3

import fakerun
from scalevec.config.codec import to_dict
from scalevec.experiments.frames import read_runs_csv, runs_frame, to_csv
from scalevec.experiments.records import load_runs
from scalevec.experiments.sweep import expand, spec_from_dict
from test_reproduction_script import _script

ROOT = Path(__file__).resolve().parents[1]


def write_good(folder: Path) -> Path:
    """A real runs.csv: fakerun's run directories of 2 strategies × 2 lrs × 2 seeds, through runs_frame and
    to_csv as `scalevec report` writes it."""
    spec = spec_from_dict({"base": {"preset": "tiny", "train": {"batch_size": 4, "seq_len": 32, "steps": 100}},
                           "grid": {"strategy": ["baseline", "unified"], "lr": [1.5e-3, 3e-3], "seed": [0, 1]}})
    for r in expand(spec):
        fakerun.write_run(folder / "runs" / r.name, to_dict(r.cfg))
    (folder / "runs.csv").write_text(to_csv(runs_frame(load_runs(folder))))
    return folder / "runs.csv"


def test_a_good_file_round_trips(tmp_path):
    path = write_good(tmp_path / "cell")
    runs = load_runs(tmp_path / "cell")
    rows = read_runs_csv(path)
    assert [r["run"] for r in rows] == [r.name for r in runs]
    for row, run in zip(rows, runs):
        assert float(row["final_val_loss"]) == run.summary["final_val_loss"]  # repr of a float: exact
        assert float(row["lr"]) == run.cfg.optim.lr and int(row["seed"]) == run.seed and row["status"] == "done"


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _rewrite(path: Path, lines: list[str]) -> None:
    path.write_text("\r\n".join(lines) + "\r\n")


def _set(path: Path, line: int, column: str, value: str) -> None:
    """Set ``column`` of (1-based) ``line`` to ``value``."""
    lines = _lines(path)
    header = lines[0].split(",")
    fields = lines[line - 1].split(",")
    fields[header.index(column)] = value
    lines[line - 1] = ",".join(fields)
    _rewrite(path, lines)


def _torn(path: Path) -> None:  # the last line cut halfway (a copy or a disk that stopped)
    lines = _lines(path)
    lines[-1] = lines[-1][: len(lines[-1]) // 2]
    path.write_text("\r\n".join(lines))


def _extra(path: Path) -> None:
    lines = _lines(path)
    lines[2] += ",oops"
    _rewrite(path, lines)


def _duplicate(path: Path) -> None:
    lines = _lines(path)
    _rewrite(path, [*lines, lines[1]])


def _drop_column(path: Path) -> None:
    lines = [ln.split(",") for ln in _lines(path)]
    i = lines[0].index("lr")
    _rewrite(path, [",".join(f[:i] + f[i + 1:]) for f in lines])


BREAKS = {  # name: (how the file is broken, the line named, the problem's words)
    "torn last line": (_torn, 9, "fields where the header has"),
    "an extra field": (_extra, 3, "fields where the header has"),
    "lr not a number": (lambda p: _set(p, 7, "lr", "abc"), 7, "lr 'abc' is not a number"),
    "seed not an integer": (lambda p: _set(p, 4, "seed", "1.5"), 4, "seed '1.5' is not an integer"),
    "loss not a number": (lambda p: _set(p, 5, "final_val_loss", "2.3x"), 5, "final_val_loss '2.3x' is not a number"),
    "done without a loss": (lambda p: _set(p, 5, "final_val_loss", ""), 5, "a done run without final_val_loss"),
    "done with a nan loss": (lambda p: _set(p, 5, "final_val_loss", "nan"), 5, "final_val_loss is nan"),
    "tokens not a number": (lambda p: _set(p, 6, "tokens", "many"), 6, "tokens 'many' is not a number"),
    # read as 0, a blank size made scripts/reproduction.py divide by zero (tokens per parameter)
    "done without params": (lambda p: _set(p, 5, "params", ""), 5, "a done run without a positive params"),
    "done with 0 tokens": (lambda p: _set(p, 5, "tokens", "0"), 5, "a done run without a positive tokens"),
    "inf tokens": (lambda p: _set(p, 5, "tokens", "inf"), 5, "tokens 'inf' is not a finite number"),
    "nan params": (lambda p: _set(p, 5, "params", "nan"), 5, "params 'nan' is not a finite number"),
    "unknown status": (lambda p: _set(p, 2, "status", "don"), 2, "status 'don' is not one of"),
    "a run listed twice": (_duplicate, 10, "is listed twice (also line 2)"),
    "a missing column": (_drop_column, 1, "the header lacks lr"),
    "an empty file": (lambda p: p.write_text(""), 1, "no header"),
}


@pytest.mark.parametrize("name", BREAKS)
def test_a_broken_file_is_one_line_naming_file_line_and_fix(tmp_path, name):
    path = write_good(tmp_path / "cell")
    assert len(_lines(path)) == 9  # header + 8 runs: the line numbers of BREAKS
    breaks, line, words = BREAKS[name]
    breaks(path)
    with pytest.raises(ValueError) as e:
        read_runs_csv(path)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"{path} line {line}: ") and words in msg, msg
    assert msg.endswith(f"; rewrite it with `scalevec report {path.parent}`"), msg


def test_protocol3_refuses_a_doubled_cell(tmp_path):
    """A run listed twice would enter a ladder cell's Δ twice: protocol3.read_runs raises instead."""
    path = write_good(tmp_path / "ladder-cpu-10k-shakespeare")
    _duplicate(path)
    with pytest.raises(ValueError, match="listed twice"):
        protocol3.read_runs(path.parent)


def test_a_header_only_file_is_no_runs_and_said_so(tmp_path):
    """Header-only is valid (zero rows); the reproduction's cell section and claims say the cell has no runs
    instead of printing empty tables, and protocol v3's table names the ladder cell it leaves out."""
    path = write_good(tmp_path / "cpu-25k-shakespeare")
    _rewrite(path, _lines(path)[:1])
    assert read_runs_csv(path) == []
    assert protocol3.read_runs(tmp_path / "ladder-x") == []  # no runs.csv, no runs/: nothing, no error
    rep = _script()
    a = rep.analyse(rep.read_cell(path.parent))
    assert a["runs"] == 0
    assert "lists no runs" in "\n".join(rep.cell_section("cpu-25k-shakespeare", a))
    rows = [r for r in rep.comparisons({"cpu-25k-shakespeare": a}) if r["cell"] == "cpu-25k-shakespeare"]
    assert rows and {r["status"] for r in rows} == {"runs.csv lists no runs"}
    ladder_cell = write_good(tmp_path / "ladder-cpu-10k-kjv")  # protocol v3 names the cell it cannot show
    _rewrite(ladder_cell, _lines(ladder_cell)[:1])
    shutil.rmtree(ladder_cell.parent / "runs")  # and no finished run folder to read instead
    assert "Not in the table: `ladder-cpu-10k-kjv` (no runs yet)." in rep.v3_section(tmp_path, None)


def test_reproduction_script_exits_2_with_one_line_on_a_torn_cell(tmp_path):
    """A torn cell: exit 2, one line on stderr naming the file and line, no traceback, nothing on stdout, and a
    --write target left as it was."""
    results = tmp_path / "results"
    write_good(results / "cpu-10k-shakespeare")
    _torn(write_good(results / "cpu-25k-shakespeare"))
    doc = tmp_path / "doc.md"
    doc.write_text("before\n<!-- BEGIN GENERATED (scripts/reproduction.py) -->\nold\n<!-- END GENERATED -->\n")
    for extra in ([], ["--write", str(doc)]):
        p = subprocess.run([sys.executable, str(ROOT / "scripts" / "reproduction.py"), "--results", str(results),
                            *extra], capture_output=True, text=True, timeout=300)
        assert p.returncode == 2, p.stderr
        assert p.stdout == "" and "Traceback" not in p.stderr
        (line,) = p.stderr.splitlines()
        assert f"{results / 'cpu-25k-shakespeare' / 'runs.csv'} line 9:" in line
    assert "old" in doc.read_text() and not (tmp_path / "figures").exists()


@pytest.mark.parametrize("case", ["no-results", "empty-results", "missing-doc", "doc-is-folder", "no-markers",
                                  "markers-reversed"])
def test_reproduction_script_refuses_bad_paths_before_writing_anything(tmp_path, case):
    """A mistyped --results or --write is one line and exit 2 (no traceback), and leaves the doc and its figures
    untouched: an empty results folder used to replace the generated section with "no cell has reported", and a
    doc with its markers reversed had its figures written before the traceback."""
    results = tmp_path / "results"
    write_good(results / "ladder-cpu-10k-kjv")
    doc = tmp_path / "doc.md"
    good = "before\n<!-- BEGIN GENERATED (scripts/reproduction.py) -->\nold\n<!-- END GENERATED -->\n"
    doc.write_text(good)
    words = {"no-results": "is not a folder", "empty-results": "holds no study cell",
             "missing-doc": "cannot be read", "doc-is-folder": "cannot be read", "no-markers": "needs one",
             "markers-reversed": "needs one"}[case]
    if case == "no-results":
        results = tmp_path / "typo"
    elif case == "empty-results":
        results = tmp_path / "empty"
        results.mkdir()
    elif case == "missing-doc":
        doc = tmp_path / "missing.md"
    elif case == "doc-is-folder":
        doc = tmp_path / "folder.md"
        doc.mkdir()
    elif case == "no-markers":
        doc.write_text(good := "no markers here\n")
    else:
        a, b = "<!-- BEGIN GENERATED (scripts/reproduction.py) -->", "<!-- END GENERATED -->"
        doc.write_text(good := f"x\n{b}\nold\n{a}\n")
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "reproduction.py"), "--results", str(results),
                        "--write", str(doc)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stdout == "" and "Traceback" not in p.stderr, p.stderr
    (line,) = p.stderr.splitlines()
    assert words in line
    assert not (tmp_path / "figures").exists()
    if doc.is_file():
        assert doc.read_text() == good


def test_a_study_step_rewrites_runs_csv_as_each_run_lands(tmp_path):
    """``run_sweep(report=False, tables=True)``, a study's step: when run k starts, runs.csv already lists the
    k - 1 runs that finished before it, and results.csv exists once the baseline has a result."""
    from scalevec.experiments.sweep import run_sweep

    seen = tmp_path / "seen.txt"
    wrapper = tmp_path / "train.sh"  # logs how many runs runs.csv lists, then trains like fakerun
    wrapper.write_text(f"#!/bin/sh\n(tail -n +2 {tmp_path}/cell/runs.csv 2>/dev/null | wc -l) >> {seen}\n"
                       f"exec {sys.executable} {Path(fakerun.__file__)} \"$@\"\n")
    wrapper.chmod(0o755)
    spec = spec_from_dict({"base": {"preset": "tiny", "train": {"batch_size": 4, "seq_len": 32, "steps": 100}},
                           "grid": {"strategy": ["baseline", "unified"], "seed": [0, 1]}})
    assert run_sweep(spec, tmp_path / "cell", train_cmd=(str(wrapper),), report=False, tables=True, quiet=True) == 0
    assert [int(x) for x in seen.read_text().split()] == [0, 1, 2, 3]
    rows = read_runs_csv(tmp_path / "cell" / "runs.csv")
    assert len(rows) == 4 and all(r["status"] == "done" for r in rows)
    assert (tmp_path / "cell" / "results.csv").is_file() and not (tmp_path / "cell" / "report.md").exists()


def _committed_folders() -> list[Path]:
    """Every committed results folder that keeps its run directories (older folders keep runs.csv only)."""
    return [f for f in sorted((ROOT / "results").iterdir()) if (f / "runs").is_dir()]


def test_every_committed_runs_csv_lists_every_run_of_its_folder():
    """Each committed results/*/runs.csv names exactly the run directories of its folder, with each one's status
    (done / diverged / unfinished, from the markers) and, when done, its summary's final loss: a stale file
    (runs that landed after it was written) fails here; regenerate it with `scalevec report FOLDER`."""
    from scalevec.training import rundir

    folders = _committed_folders()
    assert len(folders) >= 20  # the ladder's cells keep their runs (rundir.KEPT)
    bad = []
    for folder in folders:
        on_disk = {d.name: d for d in (folder / "runs").iterdir() if rundir.is_run(d)}
        rows = {r["run"]: r for r in read_runs_csv(folder / "runs.csv")}
        if set(rows) != set(on_disk):
            bad.append(f"{folder.name}: runs.csv lacks {sorted(set(on_disk) - set(rows))}, lists absent "
                       f"{sorted(set(rows) - set(on_disk))}")
            continue
        for name, d in on_disk.items():
            status = "done" if rundir.is_done(d) else "diverged" if rundir.is_diverged(d) else "unfinished"
            if rows[name]["status"] != status:
                bad.append(f"{folder.name}/{name}: runs.csv says {rows[name]['status']}, the folder {status}")
            elif status == "done" and float(rows[name]["final_val_loss"]) != rundir.read_summary(d)["final_val_loss"]:
                bad.append(f"{folder.name}/{name}: runs.csv's final loss is not its summary.json's")
    assert not bad, "stale runs.csv (regenerate with `scalevec report FOLDER`):\n" + "\n".join(bad)


def _same(a: str, b: str) -> bool:
    """Two CSV cells hold the same value (numbers compared as numbers: 0.01 and 1e-2 are one lr)."""
    try:
        return float(a) == float(b)
    except ValueError:
        return a == b


def test_every_committed_results_csv_counts_every_finished_seed():
    """Each committed results/*/results.csv gives each strategy of each cell as many seeds as runs.csv has finished
    runs of it in that cell (the cell's key columns, and its tuned lr when tuned): a results.csv older than its
    runs fails here."""
    import csv

    bad = []
    for folder in _committed_folders():
        with (folder / "results.csv").open() as f:
            results = list(csv.DictReader(f))
        runs = read_runs_csv(folder / "runs.csv")
        for r in results:
            keys = list(r)[1:list(r).index("strategy")]  # the cell's key columns, between "cell" and "strategy"
            assert all(k in runs[0] for k in keys), f"{folder.name}: runs.csv lacks a key column of {keys}"
            done = [x for x in runs if x["strategy"] == r["strategy"] and x["status"] == "done"
                    and all(_same(x[k], r[k]) for k in keys)
                    and (not r["best_value"] or _same(x["lr"], r["best_value"]))]
            if int(r["seeds"]) != len(done):
                bad.append(f"{folder.name}: {r['cell']}: {r['strategy']} has {r['seeds']} seeds in results.csv, "
                           f"{len(done)} finished in runs.csv")
    assert not bad, "stale results.csv (regenerate with `scalevec report FOLDER`):\n" + "\n".join(bad)


def test_how_a_run_executes_never_splits_a_cell(tmp_path):
    """Seeds trained later with another checkpoint interval or thread count (config.EXECUTION_FIELDS) stay in
    their cell: results.csv counts them with the others instead of splitting the cell in two."""
    from scalevec.experiments.analysis import analyze

    spec = spec_from_dict({"base": {"preset": "tiny", "train": {"batch_size": 4, "seq_len": 32, "steps": 100}},
                           "grid": {"strategy": ["baseline", "unified"], "seed": [0, 1, 2]}})
    for i, r in enumerate(expand(spec)):
        cfg = to_dict(r.cfg)
        cfg["train"].update(ckpt_every=0 if i % 2 else 100, threads=1 + i % 2)
        fakerun.write_run(tmp_path / "runs" / r.name, cfg)
    (cell,) = analyze(load_runs(tmp_path), {}).cells
    assert [len(res.runs) for res in cell.results] == [3, 3]
