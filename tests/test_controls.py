"""The lr-matched controls (reproduction.controls): Δ with the arm at the baseline's lr, paired within one CPU
kind, the re-pick bootstrap, and the WSD cell's stable phase at equal lr, on small synthetic cells."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from reproduction import controls, protocol3

from scalevec.config import RunConfig, ScheduleConfig
from scalevec.config.codec import save_yaml
from scalevec.training import rundir

AMD, INTEL = ("AMD EPYC", "AVX512"), ("Intel(R) Xeon(R) Processor", "AVX512")
LRS = (0.01, 0.02, 0.04)
# tuning curves (seeds 0-1): the baseline picks 0.02, unified picks 0.01
CURVES = {"baseline": {0.01: 2.10, 0.02: 2.00, 0.04: 2.05}, "unified": {0.01: 2.00, 0.02: 2.08, 0.04: 2.20}}


def add_run(folder: Path, strategy: str, lr: float, seed: int, loss: float, kind=INTEL, evals=None,
            cfg: RunConfig | None = None) -> None:
    """A finished run directory as ``scalevec train`` leaves it (summary.json, meta.json, DONE; config.yaml when
    ``cfg``); ``evals``: ``[(step, tokens, val_loss)]``."""
    d = folder / "runs" / f"{strategy}_lr{lr:g}_s{seed}"
    d.mkdir(parents=True)
    (d / rundir.SUMMARY).write_text(json.dumps({
        "strategy": strategy, "lr": lr, "seed": seed, "final_val_loss": loss, "steps": 2005, "tokens": 4106240,
        "params": 41056, "non_embedding_params": 24672, "wall_time_s": 40.0, "cpu_time_s": 0.02,
        "evals": [{"kind": "eval", "step": k, "tokens": t, "val_loss": v} for k, t, v in (evals or [])]}))
    (d / rundir.META).write_text(json.dumps({"format": rundir.RUN_FORMAT, "cpu": kind[0], "cpu_capability": kind[1]}))
    (d / rundir.DONE).write_text("")
    if cfg is not None:
        save_yaml(replace(cfg, strategy=strategy, optim=replace(cfg.optim, lr=lr),
                          train=replace(cfg.train, seed=seed)), d / rundir.CONFIG)


def write_cell(results: Path, name: str = "ladder-cpu-10k-shakespeare", held=range(2, 6), base_loss=2.0,
               tuned_delta=0.05) -> Path:
    """A cell on Intel: seeds 0-1 at every lr of baseline and unified (the CURVES), then each held-out seed with the
    baseline at its pick 0.02 (``base_loss`` + seed/1000) and unified at its pick 0.01 (``tuned_delta`` above it)."""
    cell = results / name
    for s, curve in CURVES.items():
        for lr in LRS:
            for seed in (0, 1):
                add_run(cell, s, lr, seed, curve[lr] + (0.001 if seed else -0.001))
    for k in held:
        add_run(cell, "baseline", 0.02, k, base_loss + k / 1000)
        add_run(cell, "unified", 0.01, k, base_loss + k / 1000 + tuned_delta)
    return cell


def test_delta_at_the_baseline_lr_pairs_the_control_runs_within_their_kind(tmp_path):
    """The control's unified at 0.02 pairs with the control's baseline rerun on AMD (Δ −0.01), never with the cell's
    Intel baseline (1 nat lower: a cross-kind pair would give Δ ≈ +0.99); Δ at tuned lrs stays the cell's +0.05."""
    write_cell(tmp_path, base_loss=1.0)
    control = controls.control_folder(tmp_path, "ladder-cpu-10k-shakespeare")
    assert control.name == "control-cpu-10k-shakespeare"
    for k in range(2, 6):
        add_run(control, "baseline", 0.02, k, 2.0 + k / 1000, kind=AMD)
        add_run(control, "unified", 0.02, k, 2.0 + k / 1000 - 0.01, kind=AMD)
    c = controls.read_control(tmp_path, "ladder-cpu-10k-shakespeare", draws=0)
    a = c.arms["unified"]
    assert (a.tuned_lr, a.base_lr, a.same_pick) == (0.01, 0.02, False)
    assert a.tuned.delta == pytest.approx(0.05, abs=1e-12) and a.tuned.n == 4
    assert a.at_base.delta == pytest.approx(-0.01, abs=1e-12) and a.at_base.n == 4
    assert {p.kind for p in a.pairs} == {"AMD EPYC / AVX512"} and [p.seed for p in a.pairs] == [2, 3, 4, 5]
    assert c.runs == 8


def test_a_control_run_repeating_a_cell_run_on_its_kind_counts_once_and_is_checked(tmp_path):
    """A baseline rerun on the cell's own kind is the cell's run for Δ (the cell's loss, not the rerun's), and the
    config check counts whether its loss is bitwise the cell's: equal → (1, 1), 0.5 nats off → (0, 1)."""
    for i, off in enumerate((0.0, 0.5)):
        results = tmp_path / str(i)
        write_cell(results)
        control = controls.control_folder(results, "ladder-cpu-10k-shakespeare")
        add_run(control, "baseline", 0.02, 2, 2.0 + 2 / 1000 + off)  # Intel, as the cell's
        for k in range(2, 6):
            add_run(control, "unified", 0.02, k, 2.0 + k / 1000 + 0.03)
        c = controls.read_control(results, "ladder-cpu-10k-shakespeare", draws=0)
        assert c.reproduced == ((1, 1) if off == 0 else (0, 1))
        assert c.arms["unified"].at_base.delta == pytest.approx(0.03, abs=1e-12)


def add_tuning_runs(cell: Path, cfg: RunConfig) -> None:
    """The cell's tuning runs: every strategy of ``CURVES`` at every lr of ``LRS`` on seeds 0-1."""
    for s, curve in CURVES.items():
        for lr in LRS:
            for seed in (0, 1):
                add_run(cell, s, lr, seed, curve[lr] + 0.001 * seed, cfg=cfg)


def split_pick_cell(root: Path, unified_held_out_lr: float) -> Path:
    """A cell whose tuning seeds disagree on the baseline's lr: seed 0 prefers 0.02, seed 1 prefers 0.04, their
    mean 0.02; held-out seeds 2-7 run the baseline at 0.02 and unified at ``unified_held_out_lr``, Δ = +0.05 each."""
    cell = root / "ladder-cpu-10k-kjv"
    seed_curves = {0: {0.01: 2.10, 0.02: 2.00, 0.04: 2.08}, 1: {0.01: 2.10, 0.02: 2.06, 0.04: 2.04}}
    for k, curve in seed_curves.items():
        for lr, loss in curve.items():
            add_run(cell, "baseline", lr, k, loss)
            add_run(cell, "unified", lr, k, CURVES["unified"][lr])
    for k in range(2, 8):
        add_run(cell, "baseline", 0.02, k, 2.0 + k / 100)
        add_run(cell, "unified", unified_held_out_lr, k, 2.05 + k / 100)
    return cell


def test_repick_bootstrap_counts_draws_whose_repicked_lr_has_no_held_out_runs(tmp_path):
    """Baseline curve: seed 0 prefers 0.02, seed 1 prefers 0.04, their mean 0.02; a resample {1, 1} (a quarter of
    the draws) re-picks 0.04, where no held-out baseline ran: those draws are uncovered. Every held-out pair has
    Δ = +0.05 exactly, so the covered draws' interval is the point +0.05."""
    split_pick_cell(tmp_path, 0.01)
    c = controls.read_control(tmp_path, "ladder-cpu-10k-kjv", draws=0) or None
    assert c is None  # no control folder yet: nothing to read
    (tmp_path / "control-cpu-10k-kjv").mkdir()
    c = controls.read_control(tmp_path, "ladder-cpu-10k-kjv", draws=2000)
    r = c.arms["unified"].repick
    assert set(r.picks) == {(0.02, 0.01), (0.04, 0.01)}
    # binomial(2000, 1/4): sd 0.0097, so ±0.05 is > 5 sd
    assert r.moved == pytest.approx(0.25, abs=0.05) and r.covered / r.draws == pytest.approx(0.75, abs=0.05)
    assert r.lo == pytest.approx(0.05, abs=1e-9) and r.hi == pytest.approx(0.05, abs=1e-9)
    assert c.arms["unified"].repick_base.covered == 0  # no arm ran at the baseline's lr: nothing to compute


def test_repick_at_base_puts_the_arm_at_the_baselines_repicked_lr(tmp_path):
    """In the control's bootstrap the arm follows the baseline's re-pick: with unified's held-out runs at the
    baseline's 0.02 (Δ −0.02) and at its own 0.01 (Δ +0.05), every covered draw is −0.02."""
    write_cell(tmp_path)
    control = controls.control_folder(tmp_path, "ladder-cpu-10k-shakespeare")
    for k in range(2, 6):
        add_run(control, "unified", 0.02, k, 2.0 + k / 1000 - 0.02)
    a = controls.read_control(tmp_path, "ladder-cpu-10k-shakespeare", draws=200).arms["unified"]
    assert a.repick_base.covered == 200 and a.repick_base.moved == 0
    assert a.repick_base.lo == pytest.approx(-0.02, abs=1e-9) and a.repick_base.hi == pytest.approx(-0.02, abs=1e-9)
    assert a.repick.lo == pytest.approx(0.05, abs=1e-9)


def test_tuned_repick_reads_the_cells_pairs_not_a_controls_rerun_on_another_kind(tmp_path):
    """A control holding unified at its own pick 0.01 and the baseline at 0.02 on AMD (Δ −0.02, as the WSD cell's
    control does) must not replace the cell's Intel pairs (Δ +0.05) in the tuned column's re-pick interval: that
    interval belongs to the tuned Δ beside it (+0.05), while the baseline-lr column's reads the control."""
    write_cell(tmp_path)
    control = controls.control_folder(tmp_path, "ladder-cpu-10k-shakespeare")
    for k in range(2, 6):
        add_run(control, "baseline", 0.02, k, 2.0 + k / 1000, kind=AMD)
        add_run(control, "unified", 0.01, k, 2.0 + k / 1000 - 0.02, kind=AMD)
        add_run(control, "unified", 0.02, k, 2.0 + k / 1000 + 0.01, kind=AMD)
    a = controls.read_control(tmp_path, "ladder-cpu-10k-shakespeare", draws=200).arms["unified"]
    assert a.tuned.delta == pytest.approx(0.05, abs=1e-12)
    assert a.repick.lo == pytest.approx(0.05, abs=1e-9) and a.repick.hi == pytest.approx(0.05, abs=1e-9)
    assert a.repick_base.lo == pytest.approx(0.01, abs=1e-9) and a.repick_base.hi == pytest.approx(0.01, abs=1e-9)


def test_repick_counts_covered_draws_whose_pick_moved(tmp_path):
    """Seed 1 alone re-picks the baseline at 0.04: with no held-out baseline there, those draws are uncovered
    (``moved_covered`` 0, and the note says every interval is a bootstrap at the picks); once held-out baselines
    and unified ran at 0.04 the same draws are covered and counted (about a quarter of 2000)."""
    cell = split_pick_cell(tmp_path, 0.02)
    control = controls.control_folder(tmp_path, cell.name)
    control.mkdir()
    r = controls.read_control(tmp_path, cell.name, draws=2000).arms["unified"].repick_base
    assert r.moved == pytest.approx(0.25, abs=0.05) and r.moved_covered == 0  # binomial(2000, 1/4): sd 0.0097
    assert "in none of the 1 intervals did a covered draw move a pick" in controls.repick_note([r, None])
    for k in range(2, 8):
        add_run(control, "baseline", 0.04, k, 2.0 + k / 100)
        add_run(control, "unified", 0.04, k, 2.0 + k / 100)
    r = controls.read_control(tmp_path, cell.name, draws=2000).arms["unified"].repick_base
    assert r.covered == 2000 and r.moved_covered / 2000 == pytest.approx(0.25, abs=0.05)
    assert controls.repick_note([r]).startswith("**Re-pick intervals**: in 1 of the 1 intervals some covered draws")


def test_stable_evaluations_end_where_the_wsd_decay_starts():
    """WSD over 2005 steps, 5 % warmup (100 steps), decay over the last 20 % (401 steps, from step 1604): the
    evaluations every 100 steps in the stable phase are 200-1600 (not 100, which ends the warmup, nor 1700+)."""
    sched = ScheduleConfig(name="wsd", warmup_frac=0.05, min_lr_ratio=0.0, decay_frac=0.2)
    assert controls.stable_steps(sched, 2005, range(100, 2006, 100)) == set(range(200, 1601, 100))


def test_wsd_stable_phase_at_equal_lr_compares_runs_at_one_lr(tmp_path):
    """A WSD cell where the baseline at its own (higher) lr trails by 0.03 through the stable phase, while at the
    arm's lr it equals the arm: the tuned comparison's stable-phase mean is −0.03, the equal-lr one's 0; the end
    (decay) evaluation is left out of both means (it carries a +1 nat offset there)."""
    cfg = RunConfig()
    cfg = replace(cfg, schedule=ScheduleConfig(name="wsd", warmup_frac=0.05, min_lr_ratio=0.0, decay_frac=0.2))
    name = "ladder-cpu-25k-shakespeare-tpp100-wsd"
    cell = tmp_path / name
    steps = [100, 800, 1600, 2005]

    def ev(level, end):
        return [(k, k * 2048, level + (end if k == 2005 else 0.0)) for k in steps]

    add_tuning_runs(cell, cfg)
    control = controls.control_folder(tmp_path, name)
    for k in range(2, 5):
        add_run(cell, "baseline", 0.02, k, 2.03 + k / 100, evals=ev(2.03 + k / 100, 0.0), cfg=cfg)
        add_run(cell, "unified", 0.01, k, 3.0 + k / 100, evals=ev(2.0 + k / 100, 1.0), cfg=cfg)
        add_run(control, "baseline", 0.01, k, 2.0, kind=AMD, evals=ev(2.0 + k / 100, 0.0), cfg=cfg)
        add_run(control, "unified", 0.01, k, 3.0, kind=AMD, evals=ev(2.0 + k / 100, 1.0), cfg=cfg)
    rows = {(e.arm, e.base_lr, e.arm_lr, e.pairs[0].kind if e.pairs else None): e
            for e in controls.equal_lr_curves(tmp_path, name)}
    tuned = rows[("unified", 0.02, 0.01, "Intel(R) Xeon(R) Processor / AVX512")]
    equal = rows[("unified", 0.01, 0.01, "AMD EPYC / AVX512")]
    assert tuned.stable.delta == pytest.approx(-0.03, abs=1e-12) and tuned.stable.n == 3
    assert equal.stable.delta == pytest.approx(0.0, abs=1e-12) and equal.stable.n == 3
    assert equal.final.delta == pytest.approx(1.0, abs=1e-12)
    assert rows[("unified", 0.02, 0.02, None)].pairs == ()  # no unified run at the baseline's lr


def test_wsd_verdict_says_a_gain_remains_only_where_the_equal_lr_interval_is_below_zero():
    """The verdict names a remaining gain at 0.0089 when that equal-lr interval lies below 0, and says "not
    distinguishable from 0" when it spans 0, whatever the tuned comparison shows."""
    from scalevec.experiments.stats import paired_delta

    def row(tuned, lr, stable):
        return controls.EqualLr("x", tuned, "unified", 0.0178 if tuned else lr, 0.0089 if tuned else lr, (), [],
                                stable, None)

    gain = paired_delta([2.0, 2.0, 2.0], [1.97, 1.98, 1.96])  # Δ −0.03, interval below 0
    flat = paired_delta([2.0, 2.0, 2.0], [2.01, 1.99, 2.00])  # Δ 0, interval spans 0
    v = controls.wsd_verdict([row(True, 0, gain), row(False, 0.0089, gain)])
    assert "a gain remains at equal lr 0.0089 (the arm's pick)." in v
    v = controls.wsd_verdict([row(True, 0, gain), row(False, 0.0089, flat)])
    assert "not distinguishable from 0" in v and "a gain remains at equal lr" not in v


def test_wsd_verdict_names_the_equal_lr_where_the_gain_does_not_remain():
    """A gain at the arm's pick (0.0089) with a null at the baseline's (0.0178) is said as both, each lr named with
    whose pick it is: the gain never stands alone as the verdict."""
    from scalevec.experiments.stats import paired_delta

    def row(tuned, lr, stable):
        return controls.EqualLr("x", tuned, "none", 0.0178 if tuned else lr, 0.0089 if tuned else lr, (), [],
                                stable, None)

    gain = paired_delta([2.0, 2.0, 2.0], [1.97, 1.98, 1.96])
    flat = paired_delta([2.0, 2.0, 2.0], [2.01, 1.99, 2.00])
    v = controls.wsd_verdict([row(True, 0, gain), row(False, 0.0089, gain), row(False, 0.0178, flat)])
    assert ("a gain remains at equal lr 0.0089 (the arm's pick); not distinguishable from 0 at 0.0178 (the "
            "baseline's pick).") in v


def test_a_cell_read_from_its_runs_csv_pairs_with_control_run_directories(tmp_path):
    """A committed cell is often its runs.csv alone: the picks and the tuned Δ (+0.05) come from it, and the
    control's run directories give Δ at the baseline's lr (−0.02) on the same held-out seeds, seeds 0-1 never."""
    import csv

    cols = ["run", "status", "preset", "strategy", "optimizer", "schedule", "lr", "seed", "final_val_loss", "tokens",
            "params", "non_embedding_params", "wall_time_s", "cpu", "cpu_capability"]
    rows = []

    def add(s, lr, seed, loss):
        rows.append({"run": f"{s}_lr{lr:g}_s{seed}", "status": "done", "preset": "cpu-25k", "strategy": s,
                     "optimizer": "adamw", "schedule": "cosine", "lr": lr, "seed": seed, "final_val_loss": loss,
                     "tokens": 820480, "params": 41056, "non_embedding_params": 24672, "wall_time_s": 9.0,
                     "cpu": AMD[0], "cpu_capability": AMD[1]})

    for s, curve in CURVES.items():
        for lr in LRS:
            for seed in (0, 1):
                add(s, lr, seed, curve[lr] + 0.001 * seed)
    for k in (2, 3, 4):
        add("baseline", 0.02, k, 2.0 + k / 100)
        add("unified", 0.01, k, 2.05 + k / 100)
    cell = tmp_path / "ladder-cpu-25k-prose"
    cell.mkdir()
    with (cell / "runs.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    control = controls.control_folder(tmp_path, cell.name)
    for k in (0, 1, 2, 3, 4):  # seeds 0-1 here would be tuning seeds: they must not enter the held-out Δ
        add_run(control, "unified", 0.02, k, 2.0 + k / 100 - 0.02 + (1.0 if k < 2 else 0.0), kind=AMD)
    a = controls.read_control(tmp_path, cell.name, draws=0).arms["unified"]
    assert a.tuned.delta == pytest.approx(0.05, abs=1e-12) and a.tuned.n == 3
    assert a.at_base.delta == pytest.approx(-0.02, abs=1e-12) and [p.seed for p in a.pairs] == [2, 3, 4]


def test_a_control_rerun_under_a_cell_runs_name_reads_its_own_evaluations(tmp_path):
    """A control run named as a cell run (the baseline rerun on another CPU kind) gives Δ(t) its own summary's
    evaluations, not the cell run's (which carry a 0.5 nat offset here: the stable-phase Δ at equal lr would read
    about −0.5, not 0); a summary of another run under the name in both folders is an error naming the files."""
    cfg = replace(RunConfig(), schedule=ScheduleConfig(name="wsd", warmup_frac=0.05, min_lr_ratio=0.0, decay_frac=0.2))
    name = "ladder-cpu-25k-shakespeare-tpp100-wsd"
    cell, steps = tmp_path / name, [100, 800, 1600, 2005]
    add_tuning_runs(cell, cfg)
    control = controls.control_folder(tmp_path, name)
    for k in range(2, 5):
        add_run(cell, "baseline", 0.02, k, 2.5, evals=[(t, t * 2048, 2.5) for t in steps], cfg=cfg)
        add_run(cell, "unified", 0.01, k, 2.0, evals=[(t, t * 2048, 2.0) for t in steps], cfg=cfg)
        add_run(control, "baseline", 0.02, k, 2.0, kind=AMD, evals=[(t, t * 2048, 2.0) for t in steps], cfg=cfg)
        add_run(control, "unified", 0.02, k, 2.0, kind=AMD, evals=[(t, t * 2048, 2.0) for t in steps], cfg=cfg)
    rows = {(e.arm, e.base_lr, e.arm_lr): e for e in controls.equal_lr_curves(tmp_path, name)}
    equal = rows[("unified", 0.02, 0.02)]
    assert equal.pairs[0].kind == "AMD EPYC / AVX512" and equal.final.delta == 0.0
    assert equal.stable.delta == 0.0 and all(d.delta == 0.0 for _, d in equal.curve)
    listed = replace(equal.pairs[0].base, seed=7)  # a runs.csv row of seed 7 under this run's name
    with pytest.raises(ValueError, match=r"baseline_lr0.02_s2/summary.json and .*baseline_lr0.02_s2/summary.json is "
                                         r"not the summary of run baseline_lr0.02_s2 \(baseline, lr 0.02, seed 7"):
        protocol3.run_summary([cell, control], listed)


def test_cpu_hours_refuses_a_finished_runs_unreadable_summary(tmp_path):
    """The hours spent add every finished run: a damaged summary.json is an error naming it, never skipped (the
    sum would be lower than what was spent)."""
    add_run(tmp_path, "baseline", 0.02, 2, 2.0)
    f = next((tmp_path / "runs").glob("*/summary.json"))
    assert controls.cpu_hours(tmp_path) == pytest.approx(0.02 * 2005 / 3600, rel=1e-12)  # seconds/step x steps
    f.write_text('{"cpu_time_s": "x", "steps": "y"}')
    with pytest.raises(ValueError, match="summary.json holds no CPU seconds"):
        controls.cpu_hours(tmp_path)
    f.write_text("{not json")
    with pytest.raises(ValueError, match="summary.json"):
        controls.cpu_hours(tmp_path)
