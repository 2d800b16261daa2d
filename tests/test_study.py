"""``scalevec study``: the lr grid grows until the best lr is inside, then seeds are added at it (DESIGN.md §9).

The fake trainer (tests/fakerun.py) has its best lr at 3e-3 (loss ∝ log(lr / 3e-3)²), so a grid
written far below it must grow upward, and a study rerun must train nothing new.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from scalevec.experiments.analysis import analyze
from scalevec.experiments.records import load_runs
from scalevec.experiments.study import parse, run_study
from scalevec.experiments.sweepdir import load_specs, write_spec

FAKE = (sys.executable, str(Path(__file__).with_name("fakerun.py")))
STUDY = {
    "name": "s",
    "base": {"preset": "tiny", "train": {"batch_size": 4, "seq_len": 32, "steps": 10}},
    "grid": {"strategy": ["baseline", "unified"], "lr": [2.5e-4, 5e-4], "seed": [0]},
    "study": {"extend": 2.0, "max_extensions": 6, "confirm_seeds": [1, 2]},
}


def _names(log: Path) -> list[str]:
    return log.read_text().split() if log.is_file() else []


@pytest.mark.slow  # an end-to-end study
def test_study_extends_past_the_edge_then_confirms_seeds(tmp_path, monkeypatch):
    """Best lr at the upper edge -> ×2 steps until it is inside; seeds 1, 2 only at the picked lr; a rerun
    trains nothing; the report picks the lr on seed 0 and averages the three seeds there."""
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    out = tmp_path / "study"
    assert run_study(*parse(STUDY), out, train_cmd=FAKE, quiet=True) == 0
    names = _names(log)
    for strategy in ("baseline", "unified"):
        lrs = sorted(float(n.split("_lr")[1].split("_")[0]) for n in names
                     if n.startswith(strategy) and n.endswith("_s0"))
        assert lrs == [2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3, 8e-3]  # 4e-3 wins (optimum 3e-3), inside once 8e-3 ran
        confirm = sorted(n for n in names if n.startswith(strategy) and not n.endswith("_s0"))
        assert len(confirm) == 2 and all("_lr0.004_" in n for n in confirm), confirm  # loss(4e-3) < loss(2e-3)
    a = analyze(load_runs(out), load_specs(out))
    (cell,) = a.cells
    for res in cell.results:
        assert res.pick.lr == 4e-3 and not res.pick.at_edge and [r.seed for r in res.runs] == [0, 1, 2]
    assert not any("widen" in w for w in a.warnings)
    assert run_study(*parse(STUDY), out, train_cmd=FAKE, quiet=True) == 0
    assert _names(log) == names  # resumed: the same decisions from the same results, no new run
    stored = yaml.safe_load((out / "sweep.yaml").read_text())
    assert stored["study"]["confirm_seeds"] == [1, 2] and stored["grid"]["optim.lr"] == [2.5e-4, 5e-4]


@pytest.mark.slow  # an end-to-end study
def test_study_stops_at_max_extensions_and_the_report_warns(tmp_path):
    """With no extension allowed, the edge winner stays and the report says to widen the grid."""
    spec = {**STUDY, "study": {"max_extensions": 0, "confirm_seeds": [1]}}
    out = tmp_path / "study"
    assert run_study(*parse(spec), out, train_cmd=FAKE, quiet=True) == 0
    a = analyze(load_runs(out), load_specs(out))
    assert all(res.pick.at_edge and res.pick.lr == 5e-4 for res in a.cells[0].results)
    assert any("widen the grid" in w for w in a.warnings)


@pytest.mark.parametrize("bad, match", [
    ({"grid": {"strategy": ["baseline"], "seed": [0]}}, "needs a 'lr' axis"),
    ({"grid": {"strategy": ["baseline"], "lr": [1e-3, 2e-3]}}, "needs a 'seed' axis"),
    ({"study": {"extend": 1.0}}, "must be a finite number > 1"),
    ({"study": {"confirm_seeds": [0]}}, "overlap the grid's seeds"),
    ({"study": {"unknown": 1}}, "keys among"),
])
def test_study_file_errors_name_the_fix(bad, match):
    with pytest.raises(ValueError, match=match):
        parse({**STUDY, **bad})


SEEDS_FIX = (r"study\.confirm_seeds must be a list of distinct seeds >= 0 and below 2\*\*63, like \[1, 2\] "
             r"\(or \[\]\); got ")
GRID_FIX = (r"study\.lr_grids\.baseline must be a non-empty list of distinct finite lrs > 0, "
            r"like \[1\.0e-3, 2\.0e-3\]; got ")


STRICT = [  # (the `study:` section, the error it gives)
    ("confirm_seeds: 5", SEEDS_FIX + "5$"),
    ("confirm_seeds: '12'", SEEDS_FIX + "'12'$"),
    ("confirm_seeds: ab", SEEDS_FIX + "'ab'$"),
    ("confirm_seeds: [1.5]", SEEDS_FIX + r"\[1\.5\]$"),
    ("confirm_seeds: [1, 1]", SEEDS_FIX + r"\[1, 1\]$"),
    ("confirm_seeds: [-1]", SEEDS_FIX + r"\[-1\]$"),
    ("confirm_seeds: [9223372036854775808]", SEEDS_FIX + r"\[9223372036854775808\]$"),
    ("max_extensions: 1.5", r"study\.max_extensions must be a whole number >= 0, like 4; got 1\.5$"),
    ("max_extensions: true", r"study\.max_extensions must be a whole number >= 0, like 4; got True$"),
    ("max_extensions: x", r"study\.max_extensions must be a whole number >= 0, like 4; got 'x'$"),
    ("extend: .inf", r"study\.extend must be a finite number > 1 and <= 100, like 2\.0; got inf$"),
    ("extend: abc", r"study\.extend must be a finite number > 1 and <= 100, like 2\.0; got 'abc'$"),
    ("target_halfwidth: x", r"study\.target_halfwidth must be a finite number > 0, like 0\.015 nats; got 'x'$"),
    ("target_halfwidth: .inf", r"study\.target_halfwidth must be a finite number > 0, .*; got inf$"),
    ("max_seeds: x", r"study\.max_seeds must be a whole number >= 2, like 20; got 'x'$"),
    ("max_seeds: 2.5", r"study\.max_seeds must be a whole number >= 2, like 20; got 2\.5$"),
    ("target_halfwidth: 0.01, max_seeds: 2", r"study\.max_seeds must be >= the 3 seeds the study runs anyway "
                                             r"\(grid seeds \[0\] \+ confirm_seeds \[1, 2\]\), like 20; got 2$"),
    ("target_halfwidth: 0.01, halfwidth_on: tuning", r"study\.halfwidth_on must be one of all, held-out; got "
                                                      r"'tuning'$"),
    ("halfwidth_on: held-out", r"study\.halfwidth_on plans target_halfwidth's seeds: add target_halfwidth \(like "
                               r"0\.015\) or remove halfwidth_on$"),
    ("bogus: 1", r"study has unknown key\(s\) bogus; use keys among extend, max_extensions, "),
    ("lr_grids: {baseline: [1.0e-3]}", r"study\.lr_grids must map every strategy of the grid \(baseline, unified\) "
                                       r"and no other to its lrs, like \{baseline: .*; missing unified$"),
    ("lr_grids: {baseline: [1.0e-3], unified: [1.0e-3], bogus: [1.0e-3]}", r"; bogus not a strategy of the grid$"),
    ("lr_grids: {baseline: abc, unified: [1.0e-3]}", GRID_FIX + "'abc'$"),
    ("lr_grids: {baseline: [1.0e-3, .inf], unified: [1.0e-3]}", GRID_FIX + r"\[0\.001, inf\]$"),
    ("lr_grids: {baseline: [true], unified: [1.0e-3]}", GRID_FIX + r"\[True\]$"),
    ("lr_grids: {baseline: [1.0e-3, 1.0e-3], unified: [1.0e-3]}", GRID_FIX + r"\[0\.001, 0\.001\]$"),
]


@pytest.mark.parametrize("section, match", STRICT, ids=[section for section, _ in STRICT])
def test_study_section_values_are_checked_strictly(tmp_path, capsys, section, match):
    """A bad `study:` value is one error line naming study.KEY, the value and what it must be (exit 2 from --dry-run):
    no traceback, no value cut or converted in silence, no plan that only fails in a later phase."""
    import re

    from scalevec.cli import main

    spec_file = tmp_path / "s.yaml"
    spec_file.write_text(yaml.safe_dump({k: v for k, v in STUDY.items() if k != "study"}) + f"study: {{{section}}}\n")
    assert main(["study", str(spec_file), "--dry-run", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"scalevec study: error: {spec_file}.study") and "\n" not in err, err
    assert re.search(match, err), err


def test_study_numbers_may_be_written_with_exponents():
    """YAML 1.1 reads `1.5e-2` without a dot as text: the study reads it as the number, as a grid does."""
    text = "{extend: 2e0, target_halfwidth: 1.5e-2, lr_grids: {baseline: [7e-3, 1.0e-2], unified: [2e-2]}}"
    plan = parse({**STUDY, "study": yaml.safe_load(text)})[1]
    assert plan.extend == 2.0 and plan.target_halfwidth == 0.015
    assert plan.lr_grids == {"baseline": [7e-3, 1e-2], "unified": [2e-2]}


def test_specs_of_several_sweeps_share_a_folder(tmp_path):
    """A second sweep into a folder keeps the first one's spec; the report reads both; disagreement is an error."""
    write_spec(tmp_path, {"name": "a", "tune": ["optim.lr"], "baseline": "baseline",
                          "grid": {"strategy": ["baseline", "none"]}})
    write_spec(tmp_path, {"name": "b", "tune": ["optim.lr"], "grid": {"strategy": ["unified", "none"]}})
    assert yaml.safe_load((tmp_path / "sweep.yaml").read_text())["name"] == "a"
    merged = load_specs(tmp_path)
    assert merged["grid"]["strategy"] == ["baseline", "none", "unified"] and merged["baseline"] == "baseline"
    write_spec(tmp_path, {"name": "c", "baseline": "none", "grid": {"strategy": ["none"]}})
    with pytest.raises(ValueError, match="disagree on 'baseline'.*separate --out"):
        load_specs(tmp_path)


def test_report_picks_the_lr_on_the_seeds_every_lr_has(tmp_path):
    """Seeds added at one lr confirm it but do not re-choose: the pick uses only the common seeds."""
    from fakerun import write_run
    from scalevec.experiments.sweep import expand, spec_from_dict

    grid = spec_from_dict({"name": "r", "base": {"preset": "tiny", "train": {"steps": 10}},
                           "grid": {"strategy": ["baseline"], "lr": [1e-3, 3e-3, 1e-2], "seed": [0]}})
    extra = spec_from_dict({"name": "r2", "base": {"preset": "tiny", "train": {"steps": 10}},
                            "grid": {"strategy": ["baseline"], "lr": [1e-2], "seed": [1, 2]}})
    from scalevec.config.codec import to_dict

    for run in expand(grid) + expand(extra):
        # seeds 1 and 2 at lr 1e-2 are made far better than anything: a mean over all seeds would pick 1e-2
        curve = [2.0, 1.0] if run.cfg.train.seed else None
        write_run(tmp_path / "runs" / run.name, to_dict(run.cfg), curve=curve)
    (res,) = analyze(load_runs(tmp_path)).cells[0].results
    assert res.pick.lr == 3e-3 and [r.seed for r in res.runs] == [0]


@pytest.mark.slow  # an end-to-end study (10 fake runs, ~5 s)
def test_a_variant_is_tuned_on_its_own(tmp_path):
    """A named variant of the strategy axis (``sweep.strategy_label``) gets its own lr extension and
    confirmation seeds, under its own run names, and the report lists it as a strategy."""
    spec = {**STUDY, "grid": {"strategy": [{"name": "baseline", "strategy": "baseline"},
                                           {"name": "unified-no-or", "strategy": "unified", "scale.param": "direct"}],
                              "lr": [1e-3, 2e-3], "seed": [0]},
            "study": {"extend": 2.0, "max_extensions": 2, "confirm_seeds": [1]}}
    out = tmp_path / "study"
    assert run_study(*parse(spec), out, train_cmd=FAKE, quiet=True) == 0
    names = sorted(p.name for p in (out / "runs").iterdir() if p.is_dir())
    for label in ("baseline", "unified-no-or"):  # edge winners 2e-3, 4e-3 -> 4e-3, 8e-3 added; 4e-3 wins; seed 1
        assert [n for n in names if n.startswith(label + "_")] == [
            f"{label}_lr0.001_s0", f"{label}_lr0.002_s0", f"{label}_lr0.004_s0", f"{label}_lr0.004_s1",
            f"{label}_lr0.008_s0"]
    a = analyze(load_runs(out), load_specs(out))
    assert [r.strategy for r in a.cells[0].results] == ["baseline", "unified-no-or"]
    assert all(r.pick.lr == 4e-3 and [x.seed for x in r.runs] == [0, 1] for r in a.cells[0].results)


@pytest.mark.slow  # an end-to-end study
def test_study_adds_seeds_until_the_interval_target_then_stops(tmp_path, monkeypatch):
    """target_halfwidth: after seeds 0-1 every strategy gets the same further seeds at its tuned lr until the
    paired differences plan the target (fakerun's per-run noise, sd ≈ 0.0014 per Δ), never past max_seeds;
    a rerun trains nothing, and an unreachable target stops at exactly max_seeds."""
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    spec = {**STUDY, "grid": {**STUDY["grid"], "lr": [2e-3, 4e-3, 8e-3]},
            "study": {"extend": 2.0, "max_extensions": 2, "confirm_seeds": [1], "target_halfwidth": 0.0015,
                      "max_seeds": 12}}
    out = tmp_path / "study"
    assert run_study(*parse(spec), out, train_cmd=FAKE, quiet=True) == 0
    (cell,) = analyze(load_runs(out), load_specs(out)).cells
    seeds = {res.strategy: [r.seed for r in res.runs] for res in cell.results}
    assert seeds["baseline"] == seeds["unified"] and 2 < len(seeds["baseline"]) <= 12, seeds
    from scalevec.experiments import stats

    by = {res.strategy: [r.final_loss for r in res.runs] for res in cell.results}
    diffs = [u - b for u, b in zip(by["unified"], by["baseline"])]
    need = stats.seeds_for_halfwidth(diffs, 0.0015, max_seeds=12) or 12
    assert need <= len(diffs)  # the plan is met with the seeds it trained
    names = _names(log)
    assert run_study(*parse(spec), out, train_cmd=FAKE, quiet=True) == 0 and _names(log) == names
    tight = {**spec, "study": {**spec["study"], "target_halfwidth": 1e-9, "max_seeds": 5}}
    out2 = tmp_path / "tight"
    assert run_study(*parse(tight), out2, train_cmd=FAKE, quiet=True) == 0
    (cell,) = analyze(load_runs(out2), load_specs(out2)).cells
    assert all([r.seed for r in res.runs] == [0, 1, 2, 3, 4] for res in cell.results)


def test_held_out_planning_leaves_the_tuning_seeds_out():
    """halfwidth_on: held-out plans the interval of Δ on the seeds after the tuning seeds (protocol v3): a wild
    tuning-seed difference (seed 0: +0.5 nats) must not ask for more seeds, and the tuning seeds are added to
    the count the held-out seeds plan; over all seeds the same outlier asks for max_seeds."""
    from scalevec.experiments.stats import seeds_for_halfwidth
    from scalevec.experiments.study import StudyPlan, seeds_needed

    seeds, tuning = [0, 1, 2, 3, 4, 5], [0, 1]
    base = [2.0] * 6
    held = [0.010, 0.012, 0.011, 0.013]  # seeds 2-5: sd 0.0013, a ±0.005 target needs 3 held-out seeds
    finals = {"baseline": base, "unified": [2.5, 2.01] + [2.0 + d for d in held]}
    plan = StudyPlan(target_halfwidth=0.005, max_seeds=16, halfwidth_on="held-out")
    assert seeds_for_halfwidth(held, 0.005) == 3
    assert seeds_needed(finals, "baseline", seeds, tuning, plan) == 2 + 3
    plan.halfwidth_on = "all"
    assert seeds_needed(finals, "baseline", seeds, tuning, plan) == 16  # the outlier's sd: no n <= 16 reaches it
    noisy = {"baseline": base, "unified": [2.0, 2.0, 2.03, 1.99, 2.02, 1.98]}  # held-out sd 0.0224
    plan.halfwidth_on = "held-out"
    n_held = seeds_for_halfwidth([0.03, -0.01, 0.02, -0.02], 0.015, max_seeds=14)
    plan.target_halfwidth = 0.015
    assert n_held is not None and seeds_needed(noisy, "baseline", seeds, tuning, plan) == 2 + n_held


@pytest.mark.parametrize("plan, match", [({"target_halfwidth": 0}, "target_halfwidth"),
                                         ({"target_halfwidth": 0.01, "max_seeds": 1}, "max_seeds")])
def test_study_interval_target_is_validated(plan, match):
    with pytest.raises(ValueError, match=match):
        parse({**STUDY, "study": {**STUDY["study"], **plan}})


@pytest.mark.slow  # an end-to-end study
def test_study_lr_grids_give_each_strategy_its_own_lrs(tmp_path, monkeypatch):
    """With lr_grids, phase 1 trains each strategy on its own lrs only (then grows them at an edge as usual)."""
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    spec = {**STUDY, "study": {"extend": 2.0, "max_extensions": 3, "confirm_seeds": [],
                               "lr_grids": {"baseline": [1.5e-3, 3e-3, 6e-3], "unified": [6e-3, 1.2e-2]}}}
    assert run_study(*parse(spec), tmp_path / "s", train_cmd=FAKE, quiet=True) == 0
    lrs = {s: sorted(float(n.split("_lr")[1].split("_")[0]) for n in _names(log) if n.startswith(s))
           for s in ("baseline", "unified")}
    assert lrs["baseline"] == [1.5e-3, 3e-3, 6e-3]  # best inside: nothing added, the grid's 2.5e-4 never run
    assert lrs["unified"] == [1.5e-3, 3e-3, 6e-3, 1.2e-2]  # best at the lower edge: grown down to the optimum
    with pytest.raises(ValueError, match="lr_grids"):
        parse({**spec, "study": {"lr_grids": {"baseline": [1e-3]}}})  # unified has no grid


def test_study_command_reads_data_paths_beside_the_study_file(tmp_path, monkeypatch):
    """`scalevec study FILE` resolves a relative data.source beside FILE (sweep.spec_paths), not in the shell's
    working directory: every run of the study reads the corpus next to the study file."""
    from scalevec.cli import main
    from scalevec.experiments import study as study_mod
    from scalevec.experiments.sweep import expand

    studies = tmp_path / "studies"
    studies.mkdir()
    (studies / "corpus.txt").write_text("one\n\n\ntwo\n")
    spec_file = studies / "s.yaml"
    spec_file.write_text(yaml.safe_dump({**STUDY, "base": {**STUDY["base"], "data": {"source": "corpus.txt"}}}))
    seen = []

    def fake_run_study(spec, plan, stored, out, **kwargs):
        seen.extend(expand(spec))
        return 0

    monkeypatch.setattr(study_mod, "run_study", fake_run_study)
    monkeypatch.chdir(tmp_path)
    assert main(["study", "studies/s.yaml", "--dry-run"]) == 0
    assert len(seen) == 4 and {r.cfg.data.source for r in seen} == {str(studies / "corpus.txt")}


def test_tune_may_be_added_later_to_a_folder_whose_runs_stay(tmp_path):
    """A sweep stored with `tune: []` and a later one into the same folder that tunes optim.lr: the report
    tunes (tune is analysis, not the runs' configs); two sweeps tuning different axes still disagree."""
    write_spec(tmp_path, {"name": "a", "tune": [], "baseline": "baseline", "grid": {"strategy": ["baseline"]}})
    write_spec(tmp_path, {"name": "b", "tune": ["optim.lr"], "grid": {"strategy": ["baseline", "unified"]}})
    assert load_specs(tmp_path)["tune"] == ["optim.lr"]
    write_spec(tmp_path, {"name": "c", "tune": ["optim.weight_decay"], "grid": {"strategy": ["baseline"]}})
    with pytest.raises(ValueError, match="disagree on 'tune'"):
        load_specs(tmp_path)


def test_dry_run_prints_the_whole_plan_with_worst_cases_and_time(tmp_path, capsys):
    """--dry-run: phase 1's 4 runs; then at most 6 extensions × 1 tuning seed × 2 strategies = 12, 2 confirmation
    seeds × 2 = 4 and (5 - 3 seeds) × 2 = 4 runs: 24 in all, labelled an upper bound; the time follows --step-time
    (1 s per step × 10 steps of each baseline run, unified's 1.3 % longer by FLOPs: 12 × 10 + 12 × 10.13 s) or,
    once phase 1 ran, the measured rate of its runs (fakerun: 1 s each); nothing is written."""
    from fakerun import write_run
    from scalevec.cli import main
    from scalevec.config.codec import to_dict
    from scalevec.experiments.study import plan_text
    from scalevec.experiments.study_grid import phase1_runs

    spec = {**STUDY, "study": {**STUDY["study"], "target_halfwidth": 0.01, "max_seeds": 5}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp_path / "out"
    assert main(["study", str(tmp_path / "s.yaml"), "--dry-run", "--out", str(out), "--step-time", "1"]) == 0
    text = capsys.readouterr().out
    assert not out.exists()
    assert "phase 1, the grid: 4 runs, 4 to train, about 40s" in text  # 2 × 10 s + 2 × 10.13 s
    assert "phase 2, lr extensions" in text and "at most 12 runs" in text
    assert "phase 3, confirmation seeds [1, 2] at each strategy's tuned lr: at most 4 runs" in text
    assert "phase 4, seeds until a ±0.01-nat interval" in text and "2 past the first 3): at most 4 runs" in text
    assert "whole study: at most 24 runs to train in 1 cell(s)" in text and "at most about 4m02s" in text
    parsed = parse(spec)
    for run in phase1_runs(parsed[0], parsed[1].lr_grids):
        write_run(out / "runs" / run.name, to_dict(run.cfg))
    last = plan_text(parsed[0], parsed[1], out).splitlines()[-1]
    assert "at most 20 runs to train" in last and "at most about 20s" in last and "4 finished run(s)" in last
    grids = parse({**STUDY, "study": {**STUDY["study"], "lr_grids": {"baseline": [1e-3, 2e-3, 4e-3],
                                                                     "unified": [2e-3, 4e-3]}}})
    assert [r.name for r in phase1_runs(grids[0], grids[1].lr_grids)] == [
        "baseline_lr0.001_s0", "baseline_lr0.002_s0", "baseline_lr0.004_s0", "unified_lr0.002_s0", "unified_lr0.004_s0"]


EXAMPLE = Path(__file__).resolve().parents[1] / "sweeps" / "examples" / "study-own-corpus.yaml"


def test_the_own_corpus_example_reads_its_file_from_any_directory(tmp_path, monkeypatch, capsys):
    """sweeps/examples/study-own-corpus.yaml names tests/data/own-corpus.txt relative to itself: its dry run works
    from another working directory, and every run's config names that file."""
    from scalevec.cli import main
    from scalevec.config.files import load_yaml
    from scalevec.experiments.sweep import expand

    monkeypatch.chdir(tmp_path)
    assert main(["study", str(EXAMPLE), "--dry-run", "--out", "x"]) == 0
    assert "whole study: at most 8 runs to train" in capsys.readouterr().out
    spec, _, _ = parse(load_yaml(EXAMPLE))
    corpus = EXAMPLE.parents[2] / "tests" / "data" / "own-corpus.txt"
    from dataclasses import replace

    assert {r.cfg.data.source for r in expand(replace(spec, file=str(EXAMPLE)))} == {str(corpus)}


@pytest.mark.slow  # the example study trained for real: 8 tiny runs, ~40 CPU-seconds
def test_the_own_corpus_example_runs(tmp_path):
    """The example trains end to end with the real trainer and its report compares both strategies at their lrs."""
    from dataclasses import replace

    from scalevec.config.files import load_yaml

    spec, plan, stored = parse(load_yaml(EXAMPLE))
    assert run_study(replace(spec, file=str(EXAMPLE)), plan, stored, tmp_path / "own", quiet=True) == 0
    (cell,) = analyze(load_runs(tmp_path / "own"), load_specs(tmp_path / "own")).cells
    assert [r.strategy for r in cell.results] == ["baseline", "unified"] and all(len(r.runs) == 2 for r in cell.results)
    assert "Machine: " in (tmp_path / "own" / "report.md").read_text()


@pytest.mark.slow  # a fake study with sleeping runs: ~15 s
def test_study_progress_lines_carry_the_whole_studys_bound(tmp_path, monkeypatch, capsys):
    """Every progress line of a study (each phase is a sub-sweep) ends with the whole study's bound, and the bound
    starts at what --dry-run counts (study_scope = plan_text's FLOPs), shrinking as phases train."""
    from scalevec.experiments.study import plan_text, study_scope

    monkeypatch.setenv("SCALEVEC_PROGRESS_EVERY", "0.05")
    monkeypatch.setenv("FAKE_SLEEP", "0.3")
    spec, plan, stored = parse(STUDY)
    out = tmp_path / "study"
    flops = float(plan_text(spec, plan, out).splitlines()[-1].split("cell(s), ")[1].split(" FLOP")[0])
    assert study_scope(spec, plan, out).left == pytest.approx(flops, rel=1e-2)  # the text rounds to 3 digits
    assert run_study(spec, plan, stored, out, train_cmd=FAKE) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("progress [")]
    assert len(lines) > 3 and all(" · study ≤ " in ln for ln in lines)
    assert study_scope(spec, plan, out).left < flops  # phase 1 is done now: only later phases' bound is left


@pytest.mark.slow  # spawns the fake trainer
def test_a_finished_study_on_its_own_lrs_dry_runs_after_its_data_moved(tmp_path, capsys):
    """With ``lr_grids`` phase 1 trains each strategy on its own lrs, not the grid's: the up-front data check
    covers those runs (so a finished study still dry-runs after its data moved), and a missing source is refused
    before anything is written."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text\n" * 50)
    spec = {**STUDY, "base": {**STUDY["base"], "data.source": str(corpus)},
            "grid": {**STUDY["grid"], "lr": [2.5e-4]},
            "study": {"max_extensions": 0, "confirm_seeds": [], "lr_grids": {"baseline": [3e-3], "unified": [3e-3]}}}
    out = tmp_path / "study"
    assert run_study(*parse(spec), out, train_cmd=FAKE, quiet=True) == 0
    corpus.unlink()
    assert run_study(*parse(spec), out, dry_run=True, train_cmd=FAKE) == 0
    capsys.readouterr()
    with pytest.raises(FileNotFoundError, match="corpus.txt' does not exist"):
        run_study(*parse(spec), tmp_path / "new", dry_run=True, train_cmd=FAKE)
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("dry_run", [True, False])
@pytest.mark.parametrize("jobs", [0, -1])
def test_jobs_below_one_are_refused_before_the_folder_is_written(tmp_path, dry_run, jobs):
    """``--jobs 0`` printed a dry run's plan as if fine, and a real study created its folder, lock and spec before
    phase 1's sweep refused it: refused at once now, nothing written."""
    spec, plan, stored = parse(STUDY)
    with pytest.raises(ValueError, match=rf"^--jobs {jobs} must be >= 1$"):
        run_study(spec, plan, stored, tmp_path / "out", jobs=jobs, dry_run=dry_run, train_cmd=FAKE)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag, value", [("--budget-s", "inf"), ("--budget-s", "nan"), ("--budget-s", "0"),
                                         ("--budget-s", "-5"), ("--budget-s", "1e12"),
                                         ("--step-time", "inf")])
def test_a_budget_or_step_time_that_is_no_finite_positive_number_is_refused(tmp_path, capsys, flag, value):
    """``--budget-s inf`` passed ``> 0`` and became a deadline whose timer thread died with an OverflowError
    traceback (the slice then had no end): every value that is not a finite number > 0 is one line in the one form,
    exit 2, before the folder is written."""
    from scalevec.cli import main

    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(STUDY))
    assert main(["study", str(f), "--out", str(tmp_path / "out"), flag, value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{flag} must be a finite number > 0" in err[0] and ", like " in err[0], err
    assert f"; got {float(value)!r}" in err[0], err
    assert not (tmp_path / "out").exists()
