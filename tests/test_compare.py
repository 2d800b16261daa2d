"""Tests for scalevec.experiments.compare: the command line -> a strategy × seed sweep -> the paired table."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from scalevec.cli import main
from scalevec.config.codec import to_dict
from scalevec.experiments import compare, sweep
from scalevec.experiments.sweep import expand, spec_from_dict

FAKE = (sys.executable, str(Path(__file__).with_name("fakerun.py")))
RESULTS = Path(__file__).resolve().parents[1] / "results"  # the committed study `--lr tuned` reads


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    compare.add_arguments(p)
    return p.parse_args(list(argv))


def test_no_arguments_is_the_main_job():
    """`scalevec compare` alone trains DEFAULTS: baseline, none, unified × seeds, each strategy at the study's
    tuned lr for the default setting, on a budget of DEFAULTS' tokens per parameter, paired per seed."""
    spec = spec_from_dict(compare.build_spec(parse()))
    runs = expand(spec)
    d = compare.DEFAULTS
    assert [r.name for r in runs] == [f"{s}_s{i}" for s in d["strategies"].split(",") for i in range(d["seeds"])]
    key = (d["preset"], "shakespeare", "bytes", d["optimizer"], d["schedule"], d["tokens_per_param"])
    tuned = compare.study_lrs(compare.TUNED[key], RESULTS)
    base_params = sweep.baseline_params(runs[0].cfg)
    for r in runs:
        assert r.cfg.preset == d["preset"] and r.cfg.optim.lr == tuned[r.cfg.strategy]
        assert r.cfg.train.tokens == round(d["tokens_per_param"] * base_params)
        assert r.cfg.data.source == "shakespeare" and r.cfg.data.tokenizer == "bytes"
        for k, v in compare.TUNED[key].protocol.items():  # the setting the lrs were tuned in
            section, field = k.split(".")
            assert getattr(getattr(r.cfg, section), field) == v
    assert spec.tune == ["optim.lr"]
    # same seed => identical configs apart from the strategy and its lr (the trainer gives the same data and matrices)
    strip = [dict(to_dict(r.cfg), strategy=None, scale=None, optim=None) for r in runs]
    n = d["seeds"]
    for i in range(n):  # run i of every strategy shares seed i, and differs from the other seeds
        assert all(strip[i] == strip[i + k * n] for k in range(len(runs) // n))
    assert strip[0] != strip[1]


def test_tuned_lrs_are_read_from_the_results_folder_it_is_given(tmp_path, monkeypatch):
    """--lr tuned reads RESULTS/<cell>/results.csv (the study's best_value; RESULTS defaults to ``results`` in the
    working directory, never the checkout found from the module's path), and a missing file is a one-line
    ValueError naming it, never a silent default."""
    import csv

    key = ("cpu-80k", "shakespeare", "bytes", "adamw", "cosine", 20.0)
    cell = compare.TUNED[key]
    with (RESULTS / cell.folder / "results.csv").open() as f:
        committed = {r["strategy"]: float(r["best_value"]) for r in csv.DictReader(f)}
    assert compare.study_lrs(cell, RESULTS) == committed
    monkeypatch.chdir(RESULTS.parent)
    assert compare.study_lrs(cell) == committed  # the default: results/ under the working directory
    monkeypatch.chdir(tmp_path)  # no results/ here: the default finds nothing, whatever checkout scalevec is in
    with pytest.raises(ValueError, match=f"results/{cell.folder}/results.csv, which is not here"):
        compare.study_lrs(cell)


def test_every_tuned_cell_is_the_committed_study_of_its_key():
    """Each TUNED key names the setting its cell's study file trained (preset, corpus, tokenizer, optimizer,
    schedule, budget, batch × length, warmup), and its committed results.csv tunes baseline, none and unified:
    a key pointing at another setting's lrs would run the main job at lrs tuned for something else."""
    import yaml

    from scalevec.config.presets import get_preset

    for key, cell in compare.TUNED.items():
        name = cell.folder
        base = yaml.safe_load((RESULTS.parent / "sweeps" / f"study-{name}.yaml").read_text())["base"]
        trained = (base["preset"], base["data"]["source"], base["data"]["tokenizer"], base["optim"]["name"],
                   base["schedule"]["name"], float(base["tokens_per_param"]))
        assert trained == key, name
        assert {"batch_size": base["train"]["batch_size"], "seq_len": base["train"]["seq_len"]} == compare.TUNED_AT
        assert base["schedule"]["warmup_frac"] == cell.protocol["schedule.warmup_frac"], name
        assert get_preset(key[0]).init_width == cell.protocol["model.init_width"], name  # the study's init
        assert {"baseline", "none", "unified"} <= set(compare.study_lrs(cell, RESULTS)), name


def test_tuned_lr_refuses_a_setting_the_study_did_not_cover():
    """--lr tuned on an untuned preset, a changed batch or a missing strategy: a ValueError naming the fix."""
    with pytest.raises(ValueError, match="no tuned lr for this setting.*--lr with a comma list"):
        compare.build_spec(parse("--preset", "tiny"))
    with pytest.raises(ValueError, match="tuned at batch 16 × 128 and you gave --batch-size 8"):
        compare.build_spec(parse("--batch-size", "8"))
    with pytest.raises(ValueError, match="no tuned lr for dnp"):
        compare.build_spec(parse("--strategies", "baseline,dnp"))


def test_lr_list_tunes_per_strategy_and_overrides_apply():
    """--lr a,b becomes a tuned lr axis; key=value overrides reach every run's config."""
    spec = spec_from_dict(compare.build_spec(parse("--strategies", "none,baseline", "--seeds", "1",
                                                   "--lr", "3e-3,1e-2", "model.qk_norm=true")))
    runs = expand(spec)
    assert spec.tune == ["optim.lr"] and spec.baseline == "none"
    assert [r.name for r in runs] == ["none_lr0.003_s0", "none_lr0.01_s0", "baseline_lr0.003_s0", "baseline_lr0.01_s0"]
    assert all(r.cfg.model.qk_norm for r in runs)


@pytest.mark.parametrize("argv, message", [
    (["--strategies", "baseline,bogus"], "unknown strategy 'bogus'"),
    (["--strategies", "baseline,baseline"], "twice"),
    (["--seeds", "0"], "--seeds 0"),
    (["--lr", "fast"], "--lr 'fast'"),
    (["--steps", "0", "--lr", "1e-2"], "train.steps=0"),
    (["--lr", "1e-2", "model.d_modle=8"], "unknown config key"),
    (["--steps", "10", "--tokens-per-param", "20"], "give one of them"),
])
def test_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, argv, message):
    """Bad strategies, seeds, lr, steps or keys: exit code 2, a one-line message, no output folder."""
    out = tmp_path / "cmp"
    assert main(["compare", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists()


@pytest.mark.slow  # trains: ~2 s
def test_compare_prints_paired_table_and_writes_files(tmp_path, capsys, monkeypatch):
    """With the synthetic trainer: unified's planted gain is flagged, and report.md/results.csv/loss_curves.png
    exist."""
    monkeypatch.setattr(sweep, "DEFAULT_TRAIN_CMD", FAKE)
    out = tmp_path / "cmp"
    assert main(["compare", "--preset", "tiny", "--steps", "20", "--seeds", "3", "--lr", "3e-3",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    rows: dict[str, str] = {}
    for line in text.splitlines():  # the first table's rows (the per-seed table below starts its rows the same way)
        if line.split()[:1] in (["baseline"], ["none"], ["unified"]):
            rows.setdefault(line.split()[0], line)
    assert set(rows) == {"baseline", "none", "unified"}
    assert rows["unified"].count("*") == 1 and " — " in rows["baseline"]
    assert "per seed" in text and "seed 2" in text  # the values behind mean ± std and the interval
    wrote = next(line for line in text.splitlines() if line.startswith("wrote "))[len("wrote "):].split(", ")
    for name in ("report.md", "results.csv", "loss_curves.png", "runs.csv", "gamma_trajectories.png"):
        assert (out / name).is_file() and str(out / name) in wrote  # the message names every file it wrote
    assert all(Path(p).is_file() for p in wrote)
    # rerunning the same command trains nothing new and prints the same table
    before = {p.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*/summary.json")}
    assert main(["compare", "--preset", "tiny", "--steps", "20", "--seeds", "3", "--lr", "3e-3",
                 "--out", str(out)]) == 0
    assert {p.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*/summary.json")} == before


@pytest.mark.slow  # real trainer subprocesses: ~25 s
def test_compare_end_to_end_same_start_per_seed(tmp_path, capsys):
    """Real training on `tiny`: strategies equal at init see the same first batch and matrices per seed."""
    out = tmp_path / "cmp"
    argv = ["compare", "--strategies", "baseline,unified_foldable", "--seeds", "2", "--preset", "tiny", "--steps", "6",
            "--batch-size", "4", "--seq-len", "32", "--lr", "3e-3", "--jobs", "2", "--out", str(out),
            "data.val_tokens=2048", "train.log_every=1"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "unified_foldable" in text and "val loss" in text

    def first_loss(name: str) -> float:
        rows = [json.loads(x) for x in (out / "runs" / name / "metrics.jsonl").read_text().splitlines()]
        return next(r["loss"] for r in rows if r["kind"] == "train" and r["step"] == 0)

    for seed in (0, 1):  # γ = 1 and s = 1 at init: unified_foldable computes the baseline's function
        assert first_loss(f"unified_foldable_s{seed}") == pytest.approx(first_loss(f"baseline_s{seed}"), abs=1e-5)
    assert abs(first_loss("baseline_s0") - first_loss("baseline_s1")) > 1e-4
    for name in ("report.md", "results.csv", "loss_curves.png"):
        assert (out / name).is_file()


def test_threads_reach_every_run_and_bad_threads_exit_2(tmp_path, capsys):
    """--threads N sets train.threads on every run (what bitwise reproduction depends on); 0 is refused."""
    runs = expand(spec_from_dict(compare.build_spec(parse("--threads", "1"))))
    assert runs and all(r.cfg.train.threads == 1 for r in runs)
    assert main(["compare", "--threads", "0", "--out", str(tmp_path / "c")]) == 2
    assert "--threads 0" in capsys.readouterr().err and not (tmp_path / "c").exists()


def test_report_hides_implausible_step_times_and_names_mixed_machines(tmp_path):
    """A step-time ratio no scale-vector strategy can have (here 30x) is not printed but explained, and runs made
    on two CPU kinds or thread counts get a warning."""
    import json as _json

    from scalevec.experiments.analysis import analyze
    from scalevec.experiments.records import load_runs
    from scalevec.experiments.sweepdir import load_specs

    out = tmp_path / "cmp"
    args = parse("--strategies", "baseline,unified", "--seeds", "2", "--lr", "1e-2", "--steps", "10", "--out", str(out))
    assert sweep.run_sweep(spec_from_dict(compare.build_spec(args)), out, train_cmd=FAKE, report=False, quiet=True) == 0
    for d in (p for p in (out / "runs").iterdir() if p.is_dir()):
        s = _json.loads((d / "summary.json").read_text())
        if d.name.startswith("unified"):
            s["step_time_s"] = s["step_time_s"] * 30  # the fake trainer logs wall time per step only
        (d / "summary.json").write_text(_json.dumps(s))
        meta = _json.loads((d / "meta.json").read_text())
        meta |= {"cpu": "AMD EPYC", "cpu_capability": "AVX512" if d.name.endswith("s1") else "AVX2", "threads": 1}
        (d / "meta.json").write_text(_json.dumps(meta))
    a = analyze(load_runs(out), load_specs(out))
    unified = next(r for r in a.cells[0].results if r.strategy == "unified")
    assert unified.step_time_ratio != unified.step_time_ratio  # nan: not shown
    assert any("not plausible" in w for w in a.warnings)
    assert any("2 machine kinds or thread counts" in w and "AVX512" in w for w in a.warnings)


def test_an_explicit_lr_keeps_the_tuned_cells_protocol_and_short_runs_warn(tmp_path, capsys):
    """--lr changes the lr alone: the runs keep the study cell's init and warmup (the ladder's, the main job's),
    and a --steps budget at or below the warmup is said on the console, not only in the trainers' logs."""
    key = ("cpu-80k", "shakespeare", "bytes", "adamw", "cosine", 20.0)
    for argv in ((), ("--lr", "1e-2"), ("--lr", "5e-3,1e-2")):
        for r in expand(spec_from_dict(compare.build_spec(parse(*argv)))):
            assert r.cfg.model.init_width == 640 and r.cfg.schedule.warmup_frac == 0.05, argv
    assert compare.TUNED[key].protocol == {"model.init_width": 640, "schedule.warmup_frac": 0.05}
    args = parse("--strategies", "baseline", "--seeds", "1", "--steps", "30", "--lr", "1e-2", "--out",
                 str(tmp_path / "c"), "--dry-run", "schedule.warmup_frac=null")  # an override beats the protocol
    compare.run(args)
    printed = capsys.readouterr().out
    assert "schedule.warmup=50 is not below the run's 30 steps" in printed
    assert f"would write the runs and the report into {tmp_path / 'c'}" in printed and not (tmp_path / "c").exists()


@pytest.mark.parametrize("lr", ["0.01", "tuned"])
def test_a_whole_section_as_an_override_is_refused_first(lr):
    """optim=adamw names a section, not a field: refused as such before the tuned-lr lookup (which, on an untuned
    preset, would otherwise complain about the lr) and before a run is expanded."""
    with pytest.raises(ValueError, match=r"^optim is a section, not a field; set one of its fields, e\.g\. optim\.n"):
        compare.build_spec(parse("--lr", lr, "--preset", "cpu-10k", "--steps", "3", "optim=adamw"))


@pytest.mark.parametrize("item, flag", [("train.seed=abc", "--seeds"), ("seed=3", "--seeds"), ("lr=0.1", "--lr"),
                                        ("optim.lr=0.1", "--lr"), ("strategy=dp", "--strategies"),
                                        ("preset=tiny", "--preset"), ("data.source=kjv", "--data"),
                                        ("optimizer=muon", "--optimizer"), ("tokens_per_param=5", "--tokens-per-param"),
                                        ("data.tokenizer=bpe:512", "--tokenizer")])
@pytest.mark.parametrize("lr", ["0.01", "tuned"])
def test_an_override_of_what_a_flag_sets_is_refused(item, flag, lr):
    """key=value of a field compare sets from a flag (the grid's strategy, lr, seed; the setting the tuned lr is
    read for) would be dropped silently or bypass the tuned-lr lookup: refused, naming the flag to use."""
    with pytest.raises(ValueError, match=f"set by compare's {flag}; use {flag} instead of {item}"):
        compare.build_spec(parse("--lr", lr, "--steps", "3", item))
    compare.build_spec(parse("--lr", "0.01", "--steps", "3", "model.qk_norm=true"))  # any other field: an override
