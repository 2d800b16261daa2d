"""GPU-ladder slices (scripts/gpu_slice.sh, reproduction/slices.py): every strategy in flight, a budget, runs in
OUT."""

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml
from reproduction import slices

from scalevec.config.run_budget import run_tokens
from scalevec.experiments.study import parse
from scalevec.experiments.sweep import interleaved, run_sweep
from scalevec.experiments.sweep_grid import expand

ROOT = Path(__file__).resolve().parents[1]
TINY_STEPS = {"train.steps": 6, "train.batch_size": 4, "train.seq_len": 32, "train.eval_every": 6,
              "train.eval_batch_size": 8, "data.val_tokens": 2048, "schedule.warmup": 1}


def plan(tmp_path: Path, name: str = "ladder-tiny-rehearsal") -> Path:
    """A study file of three strategies at one lr each on seed 0: the rehearsal's plan."""
    spec = {"name": name, "base": {"preset": "tiny", "data.source": "shakespeare", "data.val_windows": "per_document",
                                   "data.cache_dir": str(tmp_path / "cache"), "train.device": "cpu", **TINY_STEPS},
            "grid": {"strategy": ["baseline", "none", "unified"], "lr": [0.003], "seed": [0]},
            "tune": ["optim.lr"], "baseline": "baseline", "study": {"confirm_seeds": [], "max_extensions": 0}}
    path = tmp_path / f"study-{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_runs_start_in_turn_by_strategy(tmp_path):
    """interleaved: the first run of each strategy, then the second of each, each strategy's order kept."""
    spec, _, _ = parse({**yaml.safe_load(plan(tmp_path).read_text()),
                        "grid": {"strategy": ["baseline", "none", "unified"], "lr": [0.001, 0.002], "seed": [0]}})
    runs = sorted(expand(spec), key=lambda r: r.cfg.strategy)  # strategy-major, as a per-strategy study step was
    order = [r.cfg.strategy for r, _ in interleaved([(r, "new") for r in runs])]
    assert order == ["baseline", "none", "unified"] * 2


def test_no_run_starts_past_the_deadline(tmp_path, capsys):
    """A sweep whose deadline has passed starts no trainer, says so, and counts nothing as failed (rc 0)."""
    spec, _, _ = parse(yaml.safe_load(plan(tmp_path).read_text()))
    rc = run_sweep(spec, tmp_path / "out", deadline=time.time() - 1, report=False)
    out = capsys.readouterr().out
    assert rc == 0 and out.count("not started, the slice has 0 s left") == 3
    assert not any((tmp_path / "out" / "runs").glob("*/DONE")) and not list((tmp_path / "out" / "runs").glob("*.log"))


def test_packing_rule_fills_an_idle_gpu_within_bounds():
    """packing_jobs: 2 runs at 30 % busy -> 4 (at most x2), 4 at 60 % -> 6, 8 at 95 % -> 8; no samples -> same."""
    assert [slices.packing_jobs(2, 0.3), slices.packing_jobs(4, 0.6), slices.packing_jobs(8, 0.95),
            slices.packing_jobs(12, 0.1), slices.packing_jobs(3, None)] == [4, 6, 8, 16, 3]
    assert slices.busy_fraction([50.0, 100.0]) == 0.75 and slices.busy_fraction([]) is None


def test_cpu_rehearsal_of_a_slice_writes_its_runs_into_out(tmp_path):
    """DEVICE=cpu gpu_slice.sh on a tiny plan: the three strategies train at once, and OUT/results/NAME holds them in
    results/ format (DONE, summary.json, config.yaml, runs.csv; no checkpoints or metrics) with slice.json."""
    out, work = tmp_path / "OUT", tmp_path / "work"
    env = {**os.environ, "DEVICE": "cpu", "JOBS": "3", "BUDGET_S": "240", "OUT": str(out), "WORK": str(work),
           "RESULTS": str(tmp_path / "results"), "PYTHON": sys.executable}
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_slice.sh"), str(plan(tmp_path))], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    # ~21 CPU-seconds in all (five interpreters' start-up, 3 x 6 steps, the report's figures): under a minute on
    # CI's 2 idle cores. The budget (240 s) leaves room for a loaded machine, which stretches the start-ups many-fold:
    # a run cut by the budget would be checkpointed, not DONE (the deadline itself: test_no_run_starts_past_...)
    home = out / "results" / "ladder-tiny-rehearsal"
    runs = sorted(p.name for p in (home / "runs").iterdir())
    assert [n.split("_")[0] for n in runs] == ["baseline", "none", "unified"]
    for n in runs:
        assert {p.name for p in (home / "runs" / n).iterdir()} == {"config.yaml", "meta.json", "summary.json",
                                                                   "optim_groups.txt", "DONE"}
        meta = json.loads((home / "runs" / n / "meta.json").read_text())
        assert meta["validation_windows"]["rule"] == "per_document"
    with open(home / "runs.csv") as f:
        assert sorted(row["strategy"] for row in csv.DictReader(f)) == ["baseline", "none", "unified"]
    # in flight at once: every run's trainer started (its NAME.yaml) before the first one finished (its DONE)
    started = [(work / "ladder-tiny-rehearsal" / "runs" / f"{n}.yaml").stat().st_mtime for n in runs]
    done = [(work / "ladder-tiny-rehearsal" / "runs" / n / "DONE").stat().st_mtime for n in runs]
    assert max(started) < min(done)
    rec = json.loads((out / "slice.json").read_text())
    assert rec["runs_finished"] == 3 and rec["plans"][0]["finished_before"] == 0 and rec["gpu_busy_fraction"] is None


def test_the_packages_plans_are_the_issues_ladder_under_one_pass():
    """sweeps/ladder-packages: cpu-1m, gpu-3m, gpu-6m at 20 tokens/parameter and cpu-1m, gpu-3m at 100, three
    strategies, >= 8 held-out seeds, per_document validation, each run's tokens under the corpus's train split."""
    recipe = json.loads((ROOT / "data" / "packages-corpus.json").read_text())
    got = set()
    for path in sorted((ROOT / "sweeps" / "ladder-packages").glob("study-*.yaml")):
        spec, study, _ = parse(yaml.safe_load(path.read_text()))
        run = expand(spec)[0]
        got.add((run.cfg.preset, spec.base["tokens_per_param"]))
        assert run.cfg.data.val_windows == "per_document" and run.cfg.data.source.endswith("data/packages/prepared")
        assert sorted(study.lr_grids) == ["baseline", "none", "unified"] and len(study.confirm_seeds) >= 8
        assert run_tokens(run.cfg) < recipe["result"]["train_tokens"]  # one pass at most: no token seen twice
    assert got == {("cpu-1m", 20), ("gpu-3m", 20), ("gpu-6m", 20), ("cpu-1m", 100), ("gpu-3m", 100)}


def test_the_deadline_stops_the_running_run_and_starts_no_other(tmp_path, capsys, monkeypatch):
    """At the deadline the trainer in flight gets SIGTERM (a real one checkpoints and exits 75) and is said to be
    stopped, the next run is not started, and neither counts as failed: the fake trainer (tests/fakerun.py)
    finishes the first run at once and sleeps 60 s in the second."""
    monkeypatch.setenv("FAKE_SLEEP", "60")
    spec, _, _ = parse(yaml.safe_load(plan(tmp_path).read_text()))
    fake = (sys.executable, str(ROOT / "tests" / "fakerun.py"))
    t0 = time.time()
    rc = run_sweep(spec, tmp_path / "out", jobs=1, train_cmd=fake, report=False, deadline=t0 + 8)
    out = capsys.readouterr().out
    assert rc == 0 and time.time() - t0 < 40  # stopped at the deadline, not after the 60-s sleep
    assert len(list((tmp_path / "out" / "runs").glob("*/DONE"))) == 1
    assert "none_lr0.003_s0: stopped with the sweep" in out and "unified_lr0.003_s0: not started" in out


def test_a_budget_or_jobs_that_is_no_positive_whole_number_is_refused_before_anything_is_written(tmp_path):
    """BUDGET_S=0 or -5 ran a 'slice' that started nothing and exited 0, 1.5 or nan broke the shell's arithmetic
    part-way: each is one line naming the variable, exit 2, before OUT or WORK exists (likewise JOBS)."""
    for var, value in [("BUDGET_S", "0"), ("BUDGET_S", "-5"), ("BUDGET_S", "1.5"), ("BUDGET_S", "nan"),
                       ("JOBS", "0"), ("JOBS", "two")]:
        out, work = tmp_path / "OUT", tmp_path / "work"
        env = {**os.environ, "DEVICE": "cpu", "JOBS": "3", "BUDGET_S": "240", "OUT": str(out), "WORK": str(work),
               "RESULTS": str(tmp_path / "results"), "PYTHON": sys.executable, var: value}
        r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_slice.sh"), str(plan(tmp_path))], env=env,
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and r.stdout == "", (var, value, r.stdout, r.stderr)
        assert r.stderr.strip() == (f"gpu_slice: {var} must be a whole number > 0, like "
                                    f"{480 if var == 'BUDGET_S' else 4}; got '{value}'"), r.stderr
        assert not out.exists() and not work.exists()
