"""scripts/reproduction.py (docs/reproduction.md's generator): claims, verdicts, the C4 arm axis and the
C8 joint fit, on synthetic runs whose true effects are known (tests/fakerun.py's loss model)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

import fakerun
from scalevec.experiments.report import write_report
from scalevec.experiments.stats import PowerLawFit, SharedFit
from test_report import BASE, SIZES, fabricate

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("reproduction_script", ROOT / "scripts" / "reproduction.py")
    mod = importlib.util.module_from_spec(spec)
    # its dataclasses look their module up there ("reproduction" is the package)
    sys.modules["reproduction_script"] = mod
    spec.loader.exec_module(mod)
    return mod


def _cell(root: Path, name: str, size: dict, grid: dict) -> None:
    base = {**BASE, **{k: v for k, v in size.items() if k != "name"}}
    fabricate(root / name, {"base": base, "grid": {"lr": [1.5e-3, 3e-3, 6e-3], "seed": [0, 1, 2], **grid},
                            "tune": ["optim.lr"], "baseline": "baseline"})
    write_report(root / name, quiet=True)


@pytest.mark.slow  # three report folders with their figures: ~20 s on an idle 2-core machine
def test_verdicts_and_compute_multiplier_recover_the_planted_effects(tmp_path):
    """fakerun: `unified` acts like 2x the parameters (compute multiplier 4), `none` like 0.8x (0.64); every
    seed shifts all strategies alike, so the paired intervals are tight. C1 and C6 must read 'reproduced',
    the joint fit must find 4 and 0.64, and a cell still missing its control says so."""
    for name, size in zip(("cpu-10k-shakespeare", "cpu-25k-shakespeare", "cpu-80k-shakespeare"), SIZES):
        _cell(tmp_path, name, size, {"strategy": ["baseline", "none", "unified"]})
    rep = _script()
    cells = {f.name: rep.analyse(rep.read_cell(f)) for f in sorted(tmp_path.iterdir())}
    assert {a["arms"]["baseline"]["lr"] for a in cells.values()} == {3e-3}  # fakerun's LR_STAR
    # every lr has seeds 0-2, so the pick is on their mean (the why-lrpick protocol), not on seed 0 alone
    assert {tuple(a["arms"]["unified"]["tuning_seeds"]) for a in cells.values()} == {(0, 1, 2)}
    rows = {(r["claim"], r["cell"], r["arm"]): r for r in rep.comparisons(cells)}
    for cell in cells:
        assert rows[("C1", cell, "none")]["verdict"] == "reproduced"
        assert rows[("C1", cell, "none")]["delta"].delta > 0
        assert rows[("C6", cell, "unified")]["verdict"] == "reproduced"
    assert ("C6", "cpu-10k-shakespeare", "unified_foldable") not in rows  # not in this grid: not a missing result
    assert rows[("C5", "cpu-25k-shakespeare", "hg")]["status"] == "not run yet"
    (fit,) = rep.scaling(cells)
    assert fit["status"] == "ok" and fit["sizes"] == [10, 25, 80]
    # seed noise 0.01 and run noise 0.001 on losses ~1.6: the multipliers are recovered to a few percent
    assert fit["shared"]["unified"].multiplier == pytest.approx(fakerun.K_STRATEGY["unified"] ** 2, rel=0.15)
    assert fit["shared"]["none"].multiplier == pytest.approx(fakerun.K_STRATEGY["none"] ** 2, rel=0.15)
    text = rep.generate(tmp_path)
    assert "| C6 | cpu-80k-shakespeare | unified vs baseline |" in text and "reproduced" in text


def _c8_fit(E: float, E_err: float) -> dict:
    base = PowerLawFit(E=E, A=5.0, alpha=0.3, E_err=E_err, A_err=0.1, alpha_err=0.02, n_points=9, rmse=0.01)
    return {"corpus": "shakespeare", "sizes": [10, 25, 80], "status": "ok", "base": base,
            "shared": {"unified": SharedFit(base=base, m=0.9, multiplier=0.81, multiplier_err=0.05)}}


def test_c8_prints_its_multiplier_over_the_measured_sizes_only_when_the_fit_is_identified():
    """C8's multiplier is labelled as holding over the row's measured sizes (no other size is named), and withheld
    when the baseline's E sits at its bound (the first protocol's Shakespeare fit: E 0.000 ± 3.446)."""
    rep = _script()
    shown = "\n".join(rep.scaling_lines([_c8_fit(E=1.2, E_err=0.1)]))
    assert "over these sizes" in shown and "| unified | 0.810 ± 0.050 |" in shown
    withheld = "\n".join(rep.scaling_lines([_c8_fit(E=0.0, E_err=3.446)]))
    assert "| unified | not identified" in withheld and "0.810" not in withheld


def test_weight_decay_study_compares_setting_values_not_strategies(tmp_path):
    """A C4 cell (one strategy, scale.wd on an axis) has the scale.wd values as its arms; fakerun gives them
    no effect, so the comparisons against wd=none exist and none is 'reproduced'."""
    _cell(tmp_path, "c4-cpu-25k-shakespeare", SIZES[0], {"strategy": ["baseline"],
                                                         "scale.wd": ["none", "input", "output", "all"]})
    rep = _script()
    a = rep.analyse(rep.read_cell(tmp_path / "c4-cpu-25k-shakespeare"))
    assert a["axis"] == "scale.wd" and sorted(a["arms"]) == ["all", "input", "none", "output"]
    cell = "c4-cpu-25k-shakespeare"
    rows = {r["arm"]: r for r in rep.comparisons({cell: a}) if r["cell"] == cell}
    assert sorted(rows) == ["all", "input", "output"]
    assert all(r["control"] == "none" and r["status"] == "ok" for r in rows.values())
    assert rows["all"]["verdict"].startswith("no claim")
    assert rows["input"]["verdict"] in ("inconclusive", "contradicted")  # no planted effect: never 'reproduced'


@pytest.mark.slow  # a report folder with its figures: ~5 s
def test_variants_are_arms_compared_with_baseline_and_unified(tmp_path):
    """A why-variants cell (named variants on the strategy axis) has each variant as an arm and the 'why'
    claims compare every other arm with the baseline and with unified, without a verdict on the paper.
    fakerun knows no variant name, so `unified-no-or` acts like the baseline: worse than unified (k = 2)."""
    variants = [{"name": "baseline", "strategy": "baseline"}, {"name": "unified", "strategy": "unified"},
                {"name": "unified-no-or", "strategy": "unified", "scale.param": "direct"}]
    _cell(tmp_path, "why-variants-cpu-25k-shakespeare", SIZES[0], {"strategy": variants})
    rep = _script()
    a = rep.analyse(rep.read_cell(tmp_path / "why-variants-cpu-25k-shakespeare"))
    assert a["axis"] == "strategy" and sorted(a["arms"]) == ["baseline", "unified", "unified-no-or"]
    rows = {(r["control"], r["arm"]): r for r in rep.comparisons({"why-variants-cpu-25k-shakespeare": a})
            if r["claim"] == "why" and r["status"] != "not run yet"}
    assert sorted(rows) == [("baseline", "unified-no-or"), ("unified", "unified-no-or")]  # C6 has unified's
    assert rows[("unified", "unified-no-or")]["verdict"] == "no claim: higher"
    c6 = [r for r in rep.comparisons({"why-variants-cpu-25k-shakespeare": a})
          if r["claim"] == "C6" and r["cell"] == "why-variants-cpu-25k-shakespeare"]
    assert not c6  # the variants cell is no C6 cell


@pytest.mark.slow  # a report folder with its figures: ~5 s
def test_machine_time_counts_a_copied_run_once_and_bpe_claims_skip_why_folders(tmp_path):
    """A run directory copied into a second folder (the bpe why-lrpick study reuses the C6 cell's runs that way)
    is one run of training: the machine-time total counts it once. The bpe claims read the C6 cells only, so a
    why-lrpick folder with a bpe tokenizer shows its comparison once (under its own claim), not twice."""
    import shutil

    _cell(tmp_path, "cpu-25k-shakespeare-bpe4096", SIZES[0], {"strategy": ["baseline", "unified"]})
    rep = _script()

    first = tmp_path / "cpu-25k-shakespeare-bpe4096"
    assert rep.training_seconds([first]) == 18.0  # 2 strategies x 3 lrs x 3 seeds, fakerun's 1 s each
    shutil.copytree(first, tmp_path / "why-lrpick-cpu-25k-shakespeare-bpe4096")
    assert rep.training_seconds(sorted(tmp_path.iterdir())) == 18.0
    text = rep.generate(tmp_path)
    assert text.count("| why-lrpick-cpu-25k-shakespeare-bpe4096 | unified vs baseline |") == 1
    assert "| C1 | why-lrpick-cpu-25k-shakespeare-bpe4096 |" not in text

def test_study_script_runs_every_committed_study_file_into_its_folder(tmp_path):
    """scripts/study.sh is the regenerate-everything command of docs/reproduction.md: each committed
    sweeps/study-*.yaml must be run by it (a file left out would make a results folder no command
    regenerates), and each study's folder must be the one its sweep file's header names."""
    import re
    import subprocess

    log = tmp_path / "calls.txt"
    stub = tmp_path / "sv"
    stub.write_text(f'#!/usr/bin/env bash\necho "$2 $4" >> {log}\n')  # study FILE --out DIR ...
    stub.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "SCALEVEC": str(stub), "PYTHON": sys.executable, "REDO": "1",
           "MARKS": "0", "BUILD": "0", "PYTHONPATH": str(ROOT / "src")}  # run all, mark nothing, build no corpus
    subprocess.run(["bash", str(ROOT / "scripts" / "study.sh")], env=env, check=True, capture_output=True)
    for bad in ([""], ["ladder", "extra"], ["bogus"]):  # an empty part is a mistake, not "all"
        p = subprocess.run(["bash", str(ROOT / "scripts" / "study.sh"), *bad], env=env, capture_output=True,
                           text=True)
        assert p.returncode == 2 and p.stderr.startswith("usage: ") and p.stderr.count("\n") == 1, bad
    calls = {tuple(line.split()) for line in log.read_text().splitlines()}
    ran = {f for f, _ in calls}
    committed = {f"sweeps/{p.name}" for p in (ROOT / "sweeps").glob("study-*.yaml")}
    assert committed - ran == set(), "not declared in reproduction.claims"
    assert ran - committed == set(), "declared, not optional, but its file is missing"
    for f, out in calls:
        header = re.search(r"--out (\S+)", (ROOT / f).read_text())
        assert header is not None and header.group(1) == out, (f, out)


def test_study_script_skips_a_finished_study_until_its_file_changes(tmp_path):
    """A study marked done with its file's sha256 is not run again (run folders are not committed, so a new
    session would retrain it); REDO=1 runs it."""
    import shutil
    import subprocess

    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "study.sh", root / "scripts" / "study.sh")
    shutil.copytree(ROOT / "sweeps", root / "sweeps")
    shutil.copytree(ROOT / "reproduction", root / "reproduction")  # the declaration of the studies it runs
    log, stub = tmp_path / "calls.txt", tmp_path / "sv"
    stub.write_text(f'#!/usr/bin/env bash\necho "$2" >> {log}\n')
    stub.chmod(0o755)
    base_env = {"PATH": "/usr/bin:/bin", "SCALEVEC": str(stub), "PYTHON": sys.executable,
                "PYTHONPATH": str(ROOT / "src")}
    run = lambda **env: subprocess.run(["bash", str(root / "scripts" / "study.sh"), "ladder"], check=True,
                                       capture_output=True, env={**base_env, **env})
    (root / "results" / "ladder-cpu-10k-kjv").mkdir(parents=True)
    run()
    first = log.read_text().splitlines()
    assert "sweeps/study-ladder-cpu-10k-kjv.yaml" in first
    assert (root / "results" / "ladder-cpu-10k-kjv" / ".study-ladder-cpu-10k-kjv.done").is_file()
    log.unlink()
    run()
    assert not log.exists() or "sweeps/study-ladder-cpu-10k-kjv.yaml" not in log.read_text()
    run(REDO="1")
    assert "sweeps/study-ladder-cpu-10k-kjv.yaml" in log.read_text()


def test_a_cell_varying_two_settings_is_a_one_line_error_naming_its_runs_csv(tmp_path, monkeypatch, capsys):
    """A runs.csv with two setting columns (the script reads one arm axis) stopped with a bare SystemExit, exit 1
    and no file named: now the script's one-line error, exit 2, naming the file."""
    mod = _script()
    cell = tmp_path / "cpu-25k-shakespeare"
    cell.mkdir()
    (cell / "runs.csv").write_text(
        "run,status,preset,strategy,lr,seed,final_val_loss,tokens,params,non_embedding_params,wall_time_s,"
        "scale.wd,model.layout\nbaseline_s0,done,cpu-25k,baseline,0.003,0,2.0,1000,100,50,1.0,0.1,pre\n")
    monkeypatch.setattr(sys, "argv", ["reproduction.py", "--results", str(tmp_path)])
    assert mod.main() == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"reproduction.py: error: {cell / 'runs.csv'} varies "), err
