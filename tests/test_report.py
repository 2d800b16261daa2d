"""Tests for scalevec report (records, analysis, tables, frames, figures): run folders -> tables, lr picks, paired
deltas, token efficiency, scaling fits."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

import fakerun
from scalevec.cli import main
from scalevec.config.codec import to_dict
from scalevec.experiments import stats
from scalevec.experiments.analysis import analyze, multiplier_within
from scalevec.experiments.labels import si
from scalevec.experiments.records import load_runs
from scalevec.experiments.report import write_report
from scalevec.experiments.sweep import expand, run_sweep, spec_from_dict
from scalevec.experiments.tables import scaling_rows

ROOT = Path(__file__).resolve().parents[1]
BASE = {"train": {"batch_size": 4, "seq_len": 32, "steps": 100}}
SIZES = [{"name": "d64", "preset": "tiny"},
         {"name": "d96", "preset": "tiny", "model": {"d_model": 96, "n_heads": 3, "n_kv_heads": 3, "d_ff": 256}},
         {"name": "d128", "preset": "small"},
         {"name": "d192", "preset": "small", "model": {"d_model": 192, "n_heads": 6, "n_kv_heads": 6, "d_ff": 512}}]


def fabricate(root: Path, spec: dict, curves: dict[str, list[float]] | None = None) -> list:
    """Write the synthetic run directories of ``spec`` (fakerun's loss model) and ``sweep.yaml`` under ``root``."""
    parsed = spec_from_dict(spec)
    runs = expand(parsed)
    for r in runs:
        fakerun.write_run(root / "runs" / r.name, to_dict(r.cfg), curve=(curves or {}).get(r.cfg.strategy))
    (root / "sweep.yaml").write_text(yaml.safe_dump(parsed.to_dict(), sort_keys=False))  # as sweepdir.write_spec
    return runs


def read_csv(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_report_tables_match_run_summaries(tmp_path):
    """results.csv holds the seed mean, the paired delta and the step-time ratio computed from summary.json."""
    fabricate(tmp_path, {"base": {**BASE, "preset": "tiny"},
                         "grid": {"strategy": ["baseline", "none", "unified"], "seed": [0, 1, 2]}})
    write_report(tmp_path, quiet=True)
    runs = {r.name: r.summary for r in load_runs(tmp_path)}
    rows = {r["strategy"]: r for r in read_csv(tmp_path / "results.csv")}
    base = [runs[f"baseline_s{s}"]["final_val_loss"] for s in range(3)]
    uni = [runs[f"unified_s{s}"]["final_val_loss"] for s in range(3)]
    assert float(rows["unified"]["val_loss_mean"]) == pytest.approx(np.mean(uni), abs=1e-12)
    assert float(rows["unified"]["val_loss_std"]) == pytest.approx(np.std(uni, ddof=1), abs=1e-12)
    assert float(rows["unified"]["delta"]) == pytest.approx(np.mean(uni) - np.mean(base), abs=1e-12)
    assert float(rows["unified"]["step_time_ratio"]) == pytest.approx(fakerun.STEP_TIME["unified"] / 0.10)
    assert rows["baseline"]["delta"] == ""
    assert {r["step_time_clock"] for r in rows.values()} == {"wall"}  # the fake runs log no CPU time
    assert len(read_csv(tmp_path / "runs.csv")) == 9
    for d in (tmp_path / "runs").iterdir():  # every run with CPU time: results.csv averages it, and says so
        if (d / "summary.json").is_file():
            s = json.loads((d / "summary.json").read_text())
            (d / "summary.json").write_text(json.dumps({**s, "cpu_time_s": 2 * s["step_time_s"] + 1}))
    write_report(tmp_path, quiet=True)
    rows = {r["strategy"]: r for r in read_csv(tmp_path / "results.csv")}
    assert rows["baseline"]["step_time_clock"] == "cpu" and float(rows["baseline"]["step_time_s"]) == pytest.approx(1.2)
    assert float(rows["unified"]["step_time_ratio"]) == pytest.approx((2 * fakerun.STEP_TIME["unified"] + 1) / 1.2)
    # one run of the cell without CPU time: the whole cell falls back to the wall clock, no ratio across clocks
    s = json.loads((tmp_path / "runs" / "baseline_s1" / "summary.json").read_text())
    (tmp_path / "runs" / "baseline_s1" / "summary.json").write_text(json.dumps({**s, "cpu_time_s": math.nan}))
    write_report(tmp_path, quiet=True)
    rows = {r["strategy"]: r for r in read_csv(tmp_path / "results.csv")}
    assert {r["step_time_clock"] for r in rows.values()} == {"wall"}
    assert float(rows["unified"]["step_time_ratio"]) == pytest.approx(fakerun.STEP_TIME["unified"] / 0.10)
    per_run = {r["run"]: r for r in read_csv(tmp_path / "runs.csv")}
    assert float(per_run["baseline_s0"]["cpu_time_s"]) == pytest.approx(1.2)
    assert float(per_run["baseline_s0"]["step_time_s"]) == pytest.approx(0.1)
    for d in (tmp_path / "runs").iterdir():  # runs too short to time (under 6 steps): no clock, no ratio, no warning
        if (d / "summary.json").is_file():
            s = json.loads((d / "summary.json").read_text())
            (d / "summary.json").write_text(json.dumps({**s, "cpu_time_s": math.nan, "step_time_s": math.nan}))
    a = analyze(load_runs(tmp_path), yaml.safe_load((tmp_path / "sweep.yaml").read_text()))
    assert {r.step_time_clock for r in a.cells[0].results} == {""} and not any("plausible" in w for w in a.warnings)
    # a time that is no time (0, negative, null, a string: a hand-edited file) counts as not logged, no crash
    for i, (d, bad) in enumerate(zip(sorted(p for p in (tmp_path / "runs").iterdir() if p.is_dir()),
                                     [0, -1, None, "0.3"] * 3)):
        s = json.loads((d / "summary.json").read_text())
        (d / "summary.json").write_text(json.dumps({**s, "cpu_time_s": bad, "step_time_s": 0.1 + i / 100}))
    a = analyze(load_runs(tmp_path), yaml.safe_load((tmp_path / "sweep.yaml").read_text()))
    assert {r.step_time_clock for r in a.cells[0].results} == {"wall"} and not any("plausible" in w for w in a.warnings)
    text = (tmp_path / "report.md").read_text()
    assert "| unified |" in text and "![loss_curves.png](loss_curves.png)" in text
    assert (tmp_path / "loss_curves.png").stat().st_size > 1000


def test_report_flags_planted_effect_not_seed_noise(tmp_path):
    """unified (k=2) is significantly better; none (k=0.8, a +0.018 shift vs 0.01 seed noise) is flagged worse."""
    fabricate(tmp_path, {"base": {**BASE, "preset": "tiny"},
                         "grid": {"strategy": ["baseline", "none", "unified"], "seed": [0, 1, 2]}})
    a = analyze(load_runs(tmp_path), yaml.safe_load((tmp_path / "sweep.yaml").read_text()))
    res = {r.strategy: r for r in a.cells[0].results}
    assert res["unified"].delta.significant and res["unified"].delta.hi < 0
    assert res["none"].delta.significant and res["none"].delta.lo > 0


@pytest.mark.slow  # synthetic sweep: ~1 s
def test_lr_is_tuned_per_strategy_with_edge_warning(tmp_path):
    """Each strategy is compared at its own best lr (3e-3, interior); a grid ending at the optimum warns."""
    spec = {"base": {**BASE, "preset": "tiny"},
            "grid": {"strategy": ["baseline", "unified"], "lr": [1e-3, 3e-3, 1e-2], "seed": [0, 1]}}
    fabricate(tmp_path / "a", spec)
    a = write_report(tmp_path / "a", quiet=True)
    assert [r.pick.lr for r in a.cells[0].results] == [3e-3, 3e-3]
    assert not any("widen" in w for w in a.warnings)
    assert all(r.runs[0].cfg.optim.lr == 3e-3 for r in a.cells[0].results)
    assert (tmp_path / "a" / "lr_sweep.png").is_file()
    fabricate(tmp_path / "b", {**spec, "grid": {**spec["grid"], "lr": [3e-4, 1e-3, 3e-3]}})
    b = write_report(tmp_path / "b", quiet=True)
    assert sum("largest value of the grid" in w for w in b.warnings) == 2
    assert "| 0.003 † |" in (tmp_path / "b" / "report.md").read_text()


def test_diverged_run_is_left_out_and_its_lr_counts_as_failed(tmp_path):
    """A diverged run (no DONE, its log says so) is a result: its lr cannot win, the pick goes on without it."""
    spec = {"base": {**BASE, "preset": "tiny"},
            "grid": {"strategy": ["baseline"], "lr": [1e-3, 3e-3, 1e-2], "seed": [0]}}
    fabricate(tmp_path, spec)
    (tmp_path / "runs" / "baseline_lr0.01_s0" / "DONE").unlink()
    (tmp_path / "runs" / "baseline_lr0.01_s0.log").write_text("$ train\nnon-finite loss at step 3\n[exit 3]\n")
    a = write_report(tmp_path, quiet=True)
    assert a.cells[0].results[0].pick.lr == 3e-3 and not a.cells[0].results[0].pick.at_edge
    assert math.isinf(a.cells[0].results[0].pick.mean_loss[1e-2])
    assert any("diverged" in w and "baseline_lr0.01_s0" in w for w in a.warnings)
    rows = {r["run"]: r["status"] for r in read_csv(tmp_path / "runs.csv")}
    assert rows == {"baseline_lr0.001_s0": "done", "baseline_lr0.003_s0": "done", "baseline_lr0.01_s0": "diverged"}


def test_unfinished_tuning_run_blocks_the_pick_instead_of_losing_to_it(tmp_path, capsys):
    """An unfinished tuning run may still win: the report must not pick past it (helper-13 found a starred Δ at
    an lr picked while the best one was still training). unified's best lr 3e-3 is unfinished: unified gets
    no result, and the baseline, whose runs all finished, is still reported."""
    spec = {"base": {**BASE, "preset": "tiny"},
            "grid": {"strategy": ["baseline", "unified"], "lr": [1e-3, 3e-3, 1e-2], "seed": [0]}}
    fabricate(tmp_path, spec)
    (tmp_path / "runs" / "unified_lr0.003_s0" / "DONE").unlink()
    a = write_report(tmp_path, quiet=True)
    assert [r.strategy for r in a.cells[0].results] == ["baseline"]
    assert any("unified" in w and "no optim.lr pick until" in w and "unified_lr0.003_s0" in w for w in a.warnings)
    # the baseline unfinished too: nothing to compare, and the advice is to rerun (a rerun finishes it)
    (tmp_path / "runs" / "baseline_lr0.003_s0" / "DONE").unlink()
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "nothing to compare yet" in err and "baseline_lr0.003_s0" in err and "rerun it" in err


def test_every_lr_diverged_says_a_rerun_changes_nothing(tmp_path, capsys):
    """With every baseline run diverged a sweep's rerun does not help (it never retries a diverged run), even while
    another strategy's run is unfinished: the message says to change the grid (or rerun a study, which may grow
    it), names the lowering of the lr grid, and does not say "rerun it"."""
    spec = {"base": {**BASE, "preset": "tiny"},
            "grid": {"strategy": ["baseline", "unified"], "lr": [1e-3, 3e-3], "seed": [0]}}
    fabricate(tmp_path, spec)
    for run in ("baseline_lr0.001_s0", "baseline_lr0.003_s0"):
        (tmp_path / "runs" / run / "DONE").unlink()
        (tmp_path / "runs" / f"{run}.log").write_text("$ train\nnon-finite loss at step 3\n[exit 3]\n")
    (tmp_path / "runs" / "unified_lr0.003_s0" / "DONE").unlink()
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "lower the lr grid" in err and "rerun it" not in err and "no baseline run is left to finish" in err


def test_a_planned_run_without_a_folder_holds_back_the_pick(tmp_path, capsys):
    """unified's best lr 0.003 and 0.01 never started (no folders: failed before creating one, or deleted to
    retrain): the report picked 0.001 from the one lr left and starred its Δ, with no warning. The sweep's grid
    (sweep.yaml) plans them: unified gets no pick and the warning names them; the baseline is reported."""
    import shutil

    spec = {"base": {**BASE, "preset": "tiny"},
            "grid": {"strategy": ["baseline", "unified"], "lr": [1e-3, 3e-3, 1e-2], "seed": [0, 1]}}
    fabricate(tmp_path, spec)
    gone = [f"unified_lr{lr}_s{s}" for lr in ("0.003", "0.01") for s in (0, 1)]
    for name in gone:
        shutil.rmtree(tmp_path / "runs" / name)
    a = write_report(tmp_path, quiet=True)
    assert [r.strategy for r in a.cells[0].results] == ["baseline"] and a.waiting == {"unified"}
    (w,) = [w for w in a.warnings if "unified" in w and "not yet started" in w]
    assert all(name in w for name in gone)
    shutil.rmtree(tmp_path / "runs" / "baseline_lr0.01_s1")  # the baseline waits too: a rerun trains it
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "baseline_lr0.01_s1" in err and "rerun it" in err


def test_done_without_summary_is_refused_by_report_and_sweep_alike(tmp_path, capsys):
    """DONE without summary.json: a sweep skipped it as finished while the report called it unfinished, so
    "rerun it" could never help. Both now name the damaged run and the fix (delete its DONE)."""
    from scalevec.experiments.sweep_grid import run_status
    from scalevec.training import rundir

    spec = {"base": {**BASE, "preset": "tiny"}, "grid": {"strategy": ["baseline"], "seed": [0]}}
    runs = fabricate(tmp_path, spec)
    (tmp_path / "runs" / runs[0].name / "summary.json").unlink()
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "no summary.json" in err and f"{runs[0].name}/DONE" in err and len(err.splitlines()) == 1
    with pytest.raises(rundir.RunDirError, match="delete .*DONE to train it again"):
        run_status(runs[0], tmp_path / "runs")
    (tmp_path / "runs" / runs[0].name / "DIVERGED").write_text("{}")  # deleting DONE alone: a diverged result
    with pytest.raises(rundir.RunDirError, match="delete .*DONE and .*DIVERGED to train it again"):
        run_status(runs[0], tmp_path / "runs")


@pytest.mark.parametrize("value", [True, "2.0", None, [2.0]])
def test_a_summary_whose_final_loss_is_no_number_is_refused(tmp_path, capsys, value):
    """summary.json with final_val_loss true or "2.0" was ranked as a loss of 1.0 or 2.0 (true won the lr pick),
    null or a list raised a TypeError: the report refuses it in one line naming the file and the fix."""
    spec = {"base": {**BASE, "preset": "tiny"}, "grid": {"strategy": ["baseline"], "lr": [1e-3, 3e-3]}}
    runs = fabricate(tmp_path, spec)
    summary = tmp_path / "runs" / runs[0].name / "summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "final_val_loss": value}))
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{summary}: final_val_loss is" in err and "not a finite number" in err and "DONE" in err
    assert not (tmp_path / "report.md").exists()


def test_token_efficiency_interpolates_to_baseline_loss(tmp_path):
    """Baseline ends at 2.0 after 2 evals; a strategy at 2.5 then 1.5 gets there at 3/4 of the tokens: 1.33×."""
    fabricate(tmp_path, {"base": {**BASE, "preset": "tiny"}, "grid": {"strategy": ["baseline", "unified", "none"]}},
              curves={"baseline": [3.0, 2.0], "unified": [2.5, 1.5], "none": [3.5, 2.5]})
    a = write_report(tmp_path, quiet=True)
    res = {r.strategy: r for r in a.cells[0].results}
    assert res["unified"].token_efficiency == pytest.approx(4 / 3)
    assert math.isnan(res["none"].token_efficiency)
    assert "not reached" in (tmp_path / "report.md").read_text()


@pytest.mark.slow  # a 12-run synthetic fit: ~2 s
def test_scaling_fit_recovers_compute_multiplier(tmp_path):
    """Four sizes × 3 seeds: the shared fit finds unified's k²=4 and none's 0.64 (fakerun's planted factors)."""
    fabricate(tmp_path, {"base": BASE, "grid": {"size": SIZES, "strategy": ["baseline", "none", "unified"],
                                                "seed": [0, 1, 2]}})
    a = write_report(tmp_path, quiet=True)
    assert len(a.scaling) == 1 and len(a.scaling[0].sizes) == 4
    s = a.scaling[0]
    assert s.shared["unified"].multiplier == pytest.approx(4.0, rel=0.1)
    assert s.shared["none"].multiplier == pytest.approx(0.64, rel=0.1)
    assert s.fits["baseline"].alpha == pytest.approx(fakerun.ALPHA, abs=4 * s.fits["baseline"].alpha_err)
    assert (tmp_path / "scaling.png").is_file() and "## Scaling" in (tmp_path / "report.md").read_text()


def test_multiplier_within_reads_the_fit_only_inside_the_measured_sizes():
    """L = 1 + 1/N measured on [50, 400]: a loss the baseline reaches at 200 gives (200/100)² = 4; one it would
    reach only at 1000 (or never, below E) gives the bound > (400/100)², one at 10 the bound < (50/100)²."""
    fit = stats.PowerLawFit(E=1.0, A=1.0, alpha=1.0, E_err=0.0, A_err=0.0, alpha_err=0.0, n_points=4, rmse=0.0)
    assert multiplier_within(fit, 1 + 1 / 200, 100, 50, 400) == pytest.approx((4.0, ""))
    assert multiplier_within(fit, 1 + 1 / 1000, 100, 50, 400) == (16.0, ">")
    assert multiplier_within(fit, 0.9, 100, 50, 400) == (16.0, ">")
    assert multiplier_within(fit, 1 + 1 / 10, 100, 50, 400) == (0.25, "<")
    assert math.isnan(multiplier_within(fit, math.nan, 100, 50, 400)[0])


@pytest.mark.slow  # a 12-run synthetic fit: ~2 s
def test_report_prints_no_multiplier_outside_the_measured_sizes(tmp_path):
    """report.md's scaling table has a multiplier column for each measured size and none other; unified (planted as
    2× the parameters) at the largest size and none (0.8×) at the smallest need the baseline's fit beyond the
    measured sizes, so they print the bounds > 1.000 and < 1.000, not fakerun's 4 and 0.64."""
    fabricate(tmp_path, {"base": BASE, "grid": {"size": SIZES, "strategy": ["baseline", "none", "unified"],
                                                "seed": [0, 1, 2]}})
    a = write_report(tmp_path, quiet=True)
    (s,) = a.scaling
    header, rows = scaling_rows(s, a.baseline)
    at = [h.removeprefix("compute × at ") for h in header if h.startswith("compute × at ")]
    assert at == [lbl for lbl, _ in s.sizes] and len(at) == len(SIZES)
    assert [h for h in header if "compute ×" in h and not h.startswith("compute × at ")] == [
        f"compute × (shared fit, {si(s.n_min)}–{si(s.n_max)})"]
    row = {r[0]: dict(zip(header, r)) for r in rows}
    assert row["unified"][f"compute × at {at[-1]}"] == "> 1.000"
    assert row["none"][f"compute × at {at[0]}"] == "< 1.000"
    md = (tmp_path / "report.md").read_text()
    assert "| " + " | ".join(header) + " |" in md and "extrapolat" not in md


@pytest.mark.slow  # a 24-run synthetic fit: ~3 s
def test_scaling_does_not_fit_a_strategy_on_fewer_sizes_than_the_baseline(tmp_path):
    """unified's largest size waits for an unfinished tuning run: fitted on 3 sizes against the baseline's 4, its
    extrapolated multiplier moved (3.65 -> 4.93 in the break-it pass) with no warning. It is not fitted now, and
    the warning names the size."""
    fabricate(tmp_path, {"base": BASE, "grid": {"size": SIZES, "strategy": ["baseline", "unified"],
                                                "lr": [1e-3, 3e-3, 1e-2], "seed": [0, 1]}})
    (name,) = [p.name for p in (tmp_path / "runs").iterdir() if p.name.startswith("d192") and "unified" in p.name
               and "lr0.003_s0" in p.name]
    (tmp_path / "runs" / name / "DONE").unlink()
    a = write_report(tmp_path, quiet=True)
    (s,) = a.scaling
    assert "unified" not in s.fits and "unified" not in s.per_size and "baseline" in s.fits
    assert any("[scaling" in w and "unified: no result at" in w for w in a.warnings)


def test_report_cli_on_empty_folder_fails_cleanly(tmp_path, capsys):
    """`scalevec report` on a folder without runs exits 2 with a one-line fix and writes nothing."""
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no run directories" in err and "scalevec sweep" in err
    assert list(tmp_path.iterdir()) == []


def test_report_cli_on_partly_finished_folder_names_what_is_missing(tmp_path, capsys):
    """A finished baseline run whose lr still waits for a tuning seed is not 'no finished run' (a new user read
    that as a bug): the message names the tuning runs the pick waits for, and nothing is written."""
    spec = {"base": {**BASE, "preset": "tiny"}, "grid": {"strategy": ["baseline"], "lr": [1e-3, 3e-3], "seed": [0, 1]}}
    fabricate(tmp_path, spec)
    for run in ("baseline_lr0.001_s1", "baseline_lr0.003_s0", "baseline_lr0.003_s1"):
        (tmp_path / "runs" / run / "DONE").unlink()
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "nothing to compare yet" in err and "no finished run" not in err.replace("(no finished run, a", "")
    assert "no optim.lr pick until its 3 unfinished" in err and "baseline_lr0.003_s1" in err and "rerun it" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.slow
def test_smoke_sweep_end_to_end_and_report(tmp_path, capsys):
    """sweeps/smoke.yaml trains for real (2 jobs), and `scalevec report` renders every file from the folder."""
    from scalevec.experiments.sweep import load_spec

    out = tmp_path / "smoke"
    assert run_sweep(load_spec(ROOT / "sweeps" / "smoke.yaml"), out, jobs=2, report=False, quiet=True) == 0
    assert main(["report", str(out), "--print"]) == 0
    printed = capsys.readouterr().out
    assert "baseline" in printed and "unified" in printed
    for name in ("report.md", "results.csv", "runs.csv", "loss_curves.png", "lr_sweep.png"):
        assert (out / name).is_file(), name
    rows = read_csv(out / "runs.csv")
    assert len(rows) == 8 and all(r["status"] == "done" and math.isfinite(float(r["final_val_loss"])) for r in rows)

    # kept as git keeps a study's runs (only rundir.KEPT): the sweep has nothing to train, the report is the same
    import shutil

    from scalevec.training import rundir
    kept = tmp_path / "kept"
    for d in (out / "runs").iterdir():
        if d.is_dir():
            for f in d.iterdir():
                if f.name in rundir.KEPT:
                    (kept / "runs" / d.name).mkdir(parents=True, exist_ok=True)
                    shutil.copy(f, kept / "runs" / d.name / f.name)
    shutil.copy(out / "sweep.yaml", kept / "sweep.yaml")
    assert run_sweep(load_spec(ROOT / "sweeps" / "smoke.yaml"), kept, jobs=1, report=False, quiet=True) == 0
    assert not any((kept / "runs" / r).joinpath(rundir.METRICS).exists() for r in (x["run"] for x in rows))
    assert main(["report", str(kept)]) == 0
    assert (kept / "results.csv").read_text() == (out / "results.csv").read_text()
    assert read_csv(kept / "runs.csv") == rows


def test_gitignore_keeps_exactly_the_kept_run_files():
    """.gitignore re-includes, under results/*/runs/*/, exactly the files rundir.KEPT names."""
    from scalevec.training import rundir
    lines = (ROOT / ".gitignore").read_text().splitlines()
    kept = {ln.removeprefix("!results/*/runs/*/") for ln in lines if ln.startswith("!results/*/runs/*/") and
            ln != "!results/*/runs/*/"}
    assert kept == set(rundir.KEPT)
    assert "results/*/runs/*/*" in lines  # and everything else inside a run is ignored


def test_runs_csv_names_a_setting_that_varies_within_a_strategy(tmp_path):
    """A weight-decay study (one strategy, scale.wd on a grid axis) gets a scale.wd column in runs.csv;
    a plain strategy x seed sweep gets none (the strategy alone explains its scale.* differences)."""
    fabricate(tmp_path / "wd", {"base": {**BASE, "preset": "tiny"},
                                "grid": {"strategy": ["baseline"], "scale.wd": ["none", "input", "output"],
                                         "seed": [0, 1]}})
    write_report(tmp_path / "wd", quiet=True)
    rows = read_csv(tmp_path / "wd" / "runs.csv")
    assert sorted({r["scale.wd"] for r in rows}) == ["input", "none", "output"]
    assert {r["run"]: r["scale.wd"] for r in rows}["baseline_wdoutput_s1"] == "output"
    fabricate(tmp_path / "plain", {"base": {**BASE, "preset": "tiny"},
                                   "grid": {"strategy": ["baseline", "unified"], "seed": [0, 1]}})
    write_report(tmp_path / "plain", quiet=True)
    assert not [k for k in read_csv(tmp_path / "plain" / "runs.csv")[0] if k.startswith("scale.")]


def _set_meta(run_dir: Path, **fields) -> None:
    """Add ``fields`` (what environment.run_meta records) to a fake run's meta.json."""
    import json

    meta = json.loads((run_dir / "meta.json").read_text())
    (run_dir / "meta.json").write_text(json.dumps({**meta, **fields}))


def test_runs_csv_and_report_name_the_machine(tmp_path):
    """runs.csv carries each run's cpu, cpu_capability, threads and torch from meta.json; report.md names the
    machine, and says when the runs come from several (not bitwise comparable); runs whose meta.json records
    none get no such columns."""
    from scalevec.experiments.frames import runs_frame
    from scalevec.experiments.report import render_markdown
    from scalevec.experiments.sweepdir import load_specs

    spec = {"base": {**BASE, "preset": "tiny"}, "grid": {"strategy": ["baseline", "unified"], "seed": [0, 1]}}
    runs = fabricate(tmp_path, spec)
    assert not {"cpu", "torch"} & set(runs_frame(load_runs(tmp_path))[0])  # fakerun's meta.json names no machine
    for r in runs:
        _set_meta(tmp_path / "runs" / r.name, cpu="AMD EPYC", cpu_capability="AVX512", threads=1, torch="2.13.0+cpu")
    rows = runs_frame(load_runs(tmp_path))
    assert {(r["cpu"], r["cpu_capability"], r["threads"], r["torch"]) for r in rows} == {
        ("AMD EPYC", "AVX512", 1, "2.13.0+cpu")}

    def machine_line() -> str:
        text = render_markdown(analyze(load_runs(tmp_path), load_specs(tmp_path)), tmp_path, [])
        return next(ln for ln in text.splitlines() if ln.startswith("Machine"))

    assert machine_line().startswith("Machine: AMD EPYC (AVX512), 1 thread(s), torch 2.13.0+cpu (4 run(s))")
    _set_meta(tmp_path / "runs" / "unified_s1", cpu_capability="AVX2", torch="2.9.0")
    line = machine_line()
    assert line.startswith("Machines: the runs come from 2 machines, so their losses are not bitwise comparable")
    assert "AMD EPYC (AVX512), 1 thread(s), torch 2.13.0+cpu (3 run(s))" in line
    assert "AMD EPYC (AVX2), 1 thread(s), torch 2.9.0 (1 run(s))" in line



def test_report_names_the_validation_split(tmp_path):
    """report.md says which documents the runs validated on (the split record the trainer writes to meta.json as
    ``validation_split``), and says so when runs of one report validated on different documents."""
    from scalevec.data.split import split_documents
    from scalevec.experiments.report import render_markdown
    from scalevec.experiments.sweepdir import load_specs

    runs = fabricate(tmp_path, {"base": {**BASE, "preset": "tiny"},
                                "grid": {"strategy": ["baseline", "unified"], "seed": [0, 1]}})
    docs = [f"document {i} " * (i + 1) for i in range(20)]
    strided = split_documents(docs, 0.25, "strided")[2].as_dict()
    for r in runs:
        _set_meta(tmp_path / "runs" / r.name, validation_split=strided)

    def split_line() -> str:
        text = render_markdown(analyze(load_runs(tmp_path), load_specs(tmp_path)), tmp_path, [])
        return next(ln for ln in text.splitlines() if ln.startswith("Validation split"))

    line = split_line()
    assert line.startswith("Validation split: `")
    assert "strided (every 4th document): 5 of 20 documents" in line and "(4 run(s))" in line
    assert strided["val_index_sha256"][:12] in line
    other = split_documents(docs, 0.25, "random", seed=1)[2].as_dict()
    _set_meta(tmp_path / "runs" / "unified_s1", validation_split=other)
    line = split_line()
    assert line.startswith("Validation splits: the runs validated on 2 different document sets")
    assert "(3 run(s))" in line and "(1 run(s))" in line and other["val_index_sha256"][:12] in line

def test_lr_sweep_plots_the_tuning_seeds_and_says_so(tmp_path):
    """lr_sweep.png's curve is the mean over the tuning seeds (what picked the lr), and its label names them: with
    seeds 1-2 added at baseline's pick far below seed 0, the curve there is seed 0's loss and the mean of all three
    seeds is a separate point; strategies tuned on different seeds name theirs in the legend."""
    from scalevec.experiments.figures import lr_sweep_series, plot_lr_sweep, seeds_text

    base = {**BASE, "preset": "tiny"}
    fabricate(tmp_path, {"base": base, "grid": {"strategy": ["baseline", "unified"], "lr": [1e-3, 3e-3, 1e-2],
                                                "seed": [0]}})
    more = spec_from_dict({"base": base, "grid": {"strategy": ["baseline"], "lr": [3e-3], "seed": [1, 2]}})
    for r in expand(more):
        fakerun.write_run(tmp_path / "runs" / r.name, to_dict(r.cfg), curve=[2.0, 1.0])
    for r in expand(spec_from_dict({"base": base, "grid": {"strategy": ["unified"], "lr": [1e-3, 3e-3, 1e-2],
                                                           "seed": [1]}})):
        fakerun.write_run(tmp_path / "runs" / r.name, to_dict(r.cfg))
    a = analyze(load_runs(tmp_path), yaml.safe_load((tmp_path / "sweep.yaml").read_text()))
    ylabel, series = lr_sweep_series(a.cells[0])
    assert ylabel == "final validation loss\n(mean over each strategy's tuning seeds)"
    by = {s["strategy"]: s for s in series}
    assert by["baseline"]["label"] == "baseline (seed 0)" and by["unified"]["label"] == "unified (seeds 0, 1)"
    loss = {r.name: r.final_loss for r in load_runs(tmp_path)}
    assert dict(by["baseline"]["points"])[3e-3] == loss["baseline_lr0.003_s0"]  # not pulled down by seeds 1-2
    assert by["baseline"]["confirmed"] == (3e-3, pytest.approx((loss["baseline_lr0.003_s0"] + 2 * 1.0) / 3))
    assert by["unified"]["confirmed"] is None  # no seed beyond its tuning seeds at its pick
    assert seeds_text([0]) == "seed 0" and seeds_text([0, 1, 2]) == "seeds 0-2"
    plot_lr_sweep(a, tmp_path / "lr_sweep.png")
    assert (tmp_path / "lr_sweep.png").stat().st_size > 1000


def test_a_compare_at_tuned_lrs_draws_no_lr_sweep_and_says_what_it_waits_for(tmp_path):
    """A compare at the study's tuned lrs (one lr per strategy, tuned key optim.lr for the "best lr" column) has no
    lr curve to draw: no lr_sweep.png; a strategy whose run at its one lr is unfinished waits for that run, not
    for "tuning runs" of a pick it does not make. A folder where a strategy ran two lrs still gets the figure."""
    from scalevec.experiments.figures import swept_cells

    base = {**BASE, "preset": "tiny"}
    grid = {"strategy": [{"name": "baseline", "strategy": "baseline", "optim.lr": 3e-3},
                         {"name": "unified", "strategy": "unified", "optim.lr": 1e-2}], "seed": [0, 1]}
    fabricate(tmp_path / "c", {"base": base, "grid": grid, "tune": ["optim.lr"]})
    a = write_report(tmp_path / "c", quiet=True)
    assert [r.pick.lr for r in a.cells[0].results] == [3e-3, 1e-2] and swept_cells(a) == []
    assert not (tmp_path / "c" / "lr_sweep.png").exists() and (tmp_path / "c" / "loss_curves.png").is_file()
    assert "lr_sweep.png" not in (tmp_path / "c" / "report.md").read_text()
    (tmp_path / "c" / "runs" / "unified_s1" / "DONE").unlink()
    w = analyze(load_runs(tmp_path / "c"), yaml.safe_load((tmp_path / "c" / "sweep.yaml").read_text())).warnings
    assert any("unified: no result until its 1 unfinished or not yet started run(s) at its one optim.lr finish "
               "(unified_s1)" in x for x in w), w
    assert not any("tuning run" in x for x in w), w
    fabricate(tmp_path / "t", {"base": base, "grid": {"strategy": ["baseline", "unified"], "lr": [3e-3, 1e-2],
                                                      "seed": [0]}})
    t = write_report(tmp_path / "t", quiet=True)
    assert len(swept_cells(t)) == 1 and (tmp_path / "t" / "lr_sweep.png").is_file()
