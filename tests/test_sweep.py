"""Tests for scalevec.experiments.sweep: grid expansion, stable names, token budgets, skip/resume, dry run (fake
trainer)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from scalevec.config import ScaleConfig
from scalevec.config.codec import to_dict
from scalevec.config.presets import get_preset
from scalevec.experiments.sweep import expand, load_spec, run_status, run_sweep, spec_from_dict
from scalevec.model.params import count_params
from scalevec.model.transformer import build_model

FAKE = (sys.executable, str(Path(__file__).with_name("fakerun.py")))
ROOT = Path(__file__).resolve().parents[1]

SPEC = {
    "name": "t",
    "base": {"train": {"batch_size": 4, "seq_len": 32}, "optim.weight_decay": 0.05},
    "grid": {"preset": ["tiny"], "strategy": ["baseline", "unified"], "lr": ["1e-3", 3.0e-3], "seed": [0, 1]},
}


def test_expand_crosses_axes_with_stable_names():
    """2 strategies × 2 lr × 2 seeds = 8 runs, named from their axis values, with those values in the config."""
    runs = expand(spec_from_dict(SPEC))
    assert len(runs) == 8
    assert runs[0].name == "tiny_baseline_lr0.001_s0" and runs[-1].name == "tiny_unified_lr0.003_s1"
    assert [r.name for r in runs] == [r.name for r in expand(spec_from_dict(SPEC))]
    r = next(r for r in runs if r.name == "tiny_unified_lr0.001_s1")
    assert r.cfg.optim.lr == 1e-3 and r.cfg.train.seed == 1 and r.cfg.strategy == "unified"
    assert r.cfg.scale == ScaleConfig.preset("unified") and r.cfg.model == get_preset("tiny")
    assert r.cfg.optim.weight_decay == 0.05 and r.cfg.train.batch_size == 4


def test_tokens_per_param_uses_baseline_params():
    """tokens_per_param sets train.tokens = r × the baseline's total parameters, equal for every strategy."""
    spec = spec_from_dict({"grid": {"preset": ["tiny"], "strategy": ["baseline", "unified"], "tpp": [20]}})
    runs = expand(spec)
    n = count_params(build_model(get_preset("tiny"), ScaleConfig.preset("baseline"), device="meta"))["params"]
    assert [r.cfg.train.tokens for r in runs] == [20 * n, 20 * n]
    assert runs[0].name == "tiny_baseline_tpp20"


def test_bundle_axis_and_wsd_floor():
    """A mapping value sets several fields under its name; wsd decays to 0 unless min_lr_ratio is given."""
    spec = spec_from_dict({"grid": {"size": [{"name": "wide", "preset": "tiny", "model.d_ff": 256}],
                                    "schedule": ["cosine", "wsd"]}})
    cos, wsd = expand(spec)
    assert cos.name == "wide_cosine" and cos.cfg.model.d_ff == 256
    assert cos.cfg.schedule.min_lr_ratio == 0.1 and wsd.cfg.schedule.min_lr_ratio == 0.0


@pytest.mark.parametrize("base", [{"train.steps": 4, "train": {"steps": 6}}, {"lr": 1e-3, "optim": {"lr": 2e-3}}])
def test_a_field_set_twice_in_a_sweep_base_is_refused(base):
    """A field given twice in one base or bundle (a dotted key and its section, an alias and its field) is refused
    naming it; before, the later one won silently."""
    key = "train.steps" if "train" in base else "optim.lr"
    with pytest.raises(ValueError, match=rf"^sweep.base sets {key} twice"):
        spec_from_dict({"base": base, "grid": {"strategy": ["baseline"]}})


@pytest.mark.parametrize("key", ["preset", "strategy"])
def test_a_null_preset_or_strategy_is_refused_not_defaulted(key):
    """``strategy: [null]`` (or a preset) is refused naming the key; before, it trained small/baseline labelled
    'None'."""
    with pytest.raises(ValueError, match=rf"^run None: {key} must be a name, like .*; got None"):
        expand(spec_from_dict({"base": {"preset": "tiny"}, "grid": {key: [None]}}))


@pytest.mark.parametrize("bad, match", [
    ({"grid": {"strategy": ["nope"]}}, "unknown strategy"),
    ({"grid": {"lr": 3e-3}}, "non-empty list"),
    ({"grid": {"lr": [1, 2]}, "tune": ["seed"]}, "not a grid axis"),
    ({"grd": {}}, "unknown key"),
    ({"grid": {"model.d_modle": [64]}}, "unknown config key"),
])
def test_bad_specs_raise_value_error(bad, match):
    """Malformed sweep files fail with a ValueError naming the problem."""
    with pytest.raises(ValueError, match=match):
        expand(spec_from_dict(bad))


@pytest.mark.slow  # end-to-end sweep or every shipped file expanded
def test_shipped_sweep_files_parse():
    """Every file in sweeps/ expands into valid, uniquely named configs."""
    files = sorted((ROOT / "sweeps").glob("*.yaml"))
    assert {f.name for f in files} >= {"smoke.yaml", "paper-cpu.yaml", "paper-gpu.yaml"}
    from scalevec.config.files import load_yaml
    from scalevec.experiments.study import parse

    for f in files:  # study files are sweep files with a `study` section (study.py)
        spec = parse(load_yaml(f), str(f))[0] if f.name.startswith("study-") else load_spec(f)
        runs = expand(spec)
        assert len({r.name for r in runs}) == len(runs) > 0


def test_dry_run_prints_budget_and_writes_nothing(tmp_path, capsys):
    """--dry-run lists every run and the total token budget, and creates nothing."""
    spec = spec_from_dict({**SPEC, "base": {**SPEC["base"], "train.steps": 10}})
    assert run_sweep(spec, tmp_path / "out", dry_run=True, train_cmd=FAKE) == 0
    text = capsys.readouterr().out
    assert "tiny_unified_lr0.003_s1" in text and "8 runs (8 to train)" in text
    assert f"total token budget {8 * 10 * 4 * 32:,} tokens" in text
    assert not (tmp_path / "out").exists()


def test_a_folder_of_the_users_is_refused_before_anything_is_written(tmp_path, capsys):
    """--out holding the user's report.md / results.csv (no runs/, no sweep.yaml) or a sweep.yaml that is not a
    sweep's: sweep, compare and study refuse it in one line before training or writing, and the files stay."""
    from test_cli_errors import fails

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("my report")
    (mine / "results.csv").write_text("a,b\n")
    spec = spec_from_dict(SPEC)
    with pytest.raises(FileExistsError, match="holds files that are not a scalevec sweep's .report.md, results.csv"):
        run_sweep(spec, mine, train_cmd=FAKE)
    fails(capsys, ["compare", "--preset", "tiny", "--strategies", "baseline", "--lr", "1e-2", "--seeds", "1",
                   "--steps", "3", "--out", str(mine)], "not a scalevec sweep's", "choose a new or empty --out")
    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump({"name": "s", "base": {"preset": "tiny", "train": {"steps": 3}},
                                     "grid": {"strategy": ["baseline"], "lr": [1e-3], "seed": [0]},
                                     "study": {"confirm_seeds": []}}))
    fails(capsys, ["study", str(study), "--out", str(mine)], "not a scalevec sweep's")
    assert sorted(p.name for p in mine.iterdir()) == ["report.md", "results.csv"]
    assert (mine / "report.md").read_text() == "my report"
    (mine / "sweep.yaml").write_text("- a list\n")
    with pytest.raises(ValueError, match="not a scalevec sweep's spec"):
        run_sweep(spec, mine, train_cmd=FAKE)
    (tmp_path / "empty").mkdir()
    assert run_sweep(spec, tmp_path / "empty", dry_run=True) == 0  # a new or empty folder passes
    beside = tmp_path / "beside"  # or one that holds only the sweep's own file (scripts/gpu_ladder.sh's layout)
    beside.mkdir()
    (beside / "s.yaml").write_text(yaml.safe_dump(SPEC))
    assert run_sweep(load_spec(beside / "s.yaml"), beside, dry_run=True) == 0


@pytest.mark.slow  # end-to-end sweep or every shipped file expanded
def test_sweep_runs_all_then_skips_done(tmp_path, monkeypatch):
    """A sweep trains every run once; running it again trains nothing (DONE runs are skipped)."""
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    spec = spec_from_dict(SPEC)
    assert run_sweep(spec, tmp_path / "out", jobs=2, train_cmd=FAKE, quiet=True) == 0
    assert sorted(log.read_text().split()) == sorted(r.name for r in expand(spec))
    assert (tmp_path / "out" / "report.md").is_file() and (tmp_path / "out" / "sweep.yaml").is_file()
    assert run_sweep(spec, tmp_path / "out", train_cmd=FAKE, quiet=True) == 0
    assert len(log.read_text().split()) == 8


def test_diverged_run_is_not_retried(tmp_path, monkeypatch, capsys):
    """A run that diverged is a result: the sweep exits 0, and a rerun does not train it again."""
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.setenv("FAKE_DIVERGE_LR", "0.01")
    spec = spec_from_dict({**SPEC, "grid": {"preset": ["tiny"], "strategy": ["baseline"], "lr": [3e-3, 1e-2]}})
    assert run_sweep(spec, tmp_path / "out", train_cmd=FAKE, report=False) == 0
    assert "tiny_baseline_lr0.01: diverged" in capsys.readouterr().out
    assert run_status(expand(spec)[1], tmp_path / "out" / "runs") == "diverged"
    assert run_sweep(spec, tmp_path / "out", train_cmd=FAKE, report=False) == 0
    assert log.read_text().split() == ["tiny_baseline_lr0.003", "tiny_baseline_lr0.01"]


@pytest.mark.slow  # spawns the fake trainer
def test_a_failed_run_is_named_with_its_cause(tmp_path, monkeypatch, capsys):
    """A run that fails is named on the sweep's line with the error line of its log, the others still run, and
    the sweep exits 1."""
    monkeypatch.setenv("FAKE_FAIL_LR", "0.01")
    spec = spec_from_dict({**SPEC, "grid": {"preset": ["tiny"], "strategy": ["baseline"], "lr": [3e-3, 1e-2]}})
    assert run_sweep(spec, tmp_path / "out", train_cmd=FAKE, report=False) == 1
    out = capsys.readouterr().out
    log = tmp_path / "out" / "runs" / "tiny_baseline_lr0.01.log"
    assert f"tiny_baseline_lr0.01: FAILED (exit 2): the fake trainer fails at this lr; see {log}" in out
    assert run_status(expand(spec)[0], tmp_path / "out" / "runs") == "done"
    monkeypatch.setenv("FAKE_FAIL_QUIET", "1")  # the retry dies without a word: the first attempt's error is not its
    assert run_sweep(spec, tmp_path / "out", train_cmd=FAKE, report=False) == 1
    assert f"tiny_baseline_lr0.01: FAILED (exit 2); see {log}" in capsys.readouterr().out


@pytest.mark.slow  # spawns the fake trainer
def test_a_missing_data_source_stops_the_sweep_and_its_dry_run(tmp_path, capsys):
    """A --data that does not exist (or a folder without text, a file of another type) fails the sweep and its
    dry run in one line before anything is written, not every run; a finished run's source is not re-checked."""
    for source, message in [(tmp_path / "gone.txt", "does not exist"), (tmp_path, "has no .txt files"),
                            (Path(__file__), "unsupported type '.py'"), ("hf:", "names no dataset")]:
        spec = spec_from_dict({**SPEC, "base": {**SPEC["base"], "data.source": str(source)}})
        for dry in (True, False):
            with pytest.raises((FileNotFoundError, ValueError), match=f"run tiny_baseline_lr0.001_s0: .*{message}"):
                run_sweep(spec, tmp_path / "out", dry_run=dry, train_cmd=FAKE)
            assert not (tmp_path / "out").exists()
    from test_cli_errors import fails

    study = tmp_path / "s.yaml"  # a study too, its dry run included, before its spec is written
    study.write_text(yaml.safe_dump({"name": "s", "base": {"preset": "tiny", "train": {"steps": 3},
                                                           "data": {"source": str(tmp_path / "gone.txt")}},
                                     "grid": {"strategy": ["baseline"], "lr": [1e-3], "seed": [0]},
                                     "study": {"confirm_seeds": []}}))
    for dry in ([], ["--dry-run"]):
        fails(capsys, ["study", str(study), "--out", str(tmp_path / "out"), *dry], "gone.txt' does not exist")
        assert not (tmp_path / "out").exists()
    (tmp_path / "corpus.txt").write_text("some text\n" * 50)
    spec = spec_from_dict({**SPEC, "base": {**SPEC["base"], "data.source": str(tmp_path / "corpus.txt")}})
    assert run_sweep(spec, tmp_path / "out", train_cmd=FAKE, report=False, quiet=True) == 0
    (tmp_path / "corpus.txt").unlink()  # every run is done: the sweep still reads as finished
    assert run_sweep(spec, tmp_path / "out", dry_run=True, train_cmd=FAKE) == 0


@pytest.mark.slow  # end-to-end sweep or every shipped file expanded
def test_changed_config_of_finished_run_is_an_error(tmp_path):
    """Rerunning into a folder whose finished run has another config fails before writing anything."""
    spec = spec_from_dict(SPEC)
    run_sweep(spec, tmp_path / "out", train_cmd=FAKE, quiet=True, report=False)
    changed = spec_from_dict({**SPEC, "base": {**SPEC["base"], "optim.weight_decay": 0.2}})
    before = sorted(p.name for p in (tmp_path / "out" / "runs").iterdir())
    with pytest.raises(ValueError, match="different config.*weight_decay"):
        run_sweep(changed, tmp_path / "out", train_cmd=FAKE, quiet=True)
    assert sorted(p.name for p in (tmp_path / "out" / "runs").iterdir()) == before
    assert yaml.safe_load((tmp_path / "out" / "sweep.yaml").read_text())["base"]["optim.weight_decay"] == 0.05


@pytest.mark.slow  # kills and reruns a sweep: ~1.5 s
def test_interrupted_sweep_resumes_without_rerunning(tmp_path, monkeypatch):
    """Kill a sweep after its first run finished: the rerun trains only the others, never the first again."""
    out, log = tmp_path / "out", tmp_path / "calls.log"
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text(yaml.safe_dump({**SPEC, "grid": {**SPEC["grid"], "lr": [3e-3]}}, sort_keys=False))
    runs = expand(load_spec(spec_file))
    code = ("import sys; from scalevec.experiments.sweep import load_spec, run_sweep; "
            f"sys.exit(run_sweep(load_spec({str(spec_file)!r}), {str(out)!r}, train_cmd={FAKE!r}, report=False))")
    env = {**os.environ, "FAKE_LOG": str(log), "FAKE_SLEEP": "60"}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first, second = out / "runs" / runs[0].name, out / "runs" / runs[1].name
    try:
        deadline = time.monotonic() + 180  # generous: two trainer start-ups on a loaded 2-core machine
        # wait until the second run has left its partial directory (the fake trainer logs before it makes it)
        while not (first / "DONE").exists() or not (second / "config.yaml").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the sweep never finished its first run"
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its trainer child, as a Ctrl-C / preemption would
        proc.wait()
    assert not (second / "DONE").exists()
    assert run_status(runs[1], out / "runs") == "restart"
    done_mtime = (first / "summary.json").stat().st_mtime_ns
    monkeypatch.setenv("FAKE_LOG", str(log))
    assert run_sweep(load_spec(spec_file), out, train_cmd=FAKE, quiet=True, report=False) == 0
    calls = log.read_text().split()
    assert calls.count(first.name) == 1 and calls.count(second.name) == 2
    assert (first / "summary.json").stat().st_mtime_ns == done_mtime
    assert all((out / "runs" / r.name / "DONE").exists() for r in runs)


@pytest.mark.slow  # real trainer subprocesses: ~2 s
def test_checkpointed_run_is_resumed_by_the_real_trainer(tmp_path, capsys):
    """A run stopped mid-way with a checkpoint gets --resume (not a restart) and ends with each step logged once;
    the sweep's lines say it resumes and that its time counts from the resume."""
    from scalevec.training.trainer import train

    spec = spec_from_dict({"base": {"preset": "tiny", "data.val_tokens": 2048,
                                    "train": {"steps": 6, "batch_size": 4, "seq_len": 32, "eval_every": 3,
                                              "ckpt_every": 3, "log_every": 1}},
                           "grid": {"strategy": ["baseline"]}})
    run = expand(spec)[0]
    runs_dir = tmp_path / "out" / "runs"
    train(run.cfg, runs_dir / run.name, stop_at=3, quiet=True)
    assert run_status(run, runs_dir) == "resume"
    capsys.readouterr()
    assert run_sweep(spec, tmp_path / "out", report=False) == 0
    said = capsys.readouterr().out
    assert "0 already done, 1 to train (1 resume from a checkpoint)" in said and " s since its resume)" in said
    assert "--resume" in (runs_dir / f"{run.name}.log").read_text()
    rows = [yaml.safe_load(x) for x in (runs_dir / run.name / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == list(range(6))
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [3, 6]
    assert run_status(run, runs_dir) == "done"


VARIANTS = {"base": {"preset": "tiny", "tokens_per_param": 1},
            "grid": {"strategy": [{"name": "baseline", "strategy": "baseline"},
                                  {"name": "unified-no-or", "strategy": "unified", "scale.param": "direct"}],
                     "lr": [0.01], "seed": [0]}}


def test_a_named_variant_is_reported_under_its_name_and_its_config_resolves_back():
    """A strategy-axis bundle is a variant: its name labels the run (``cfg.strategy``) and names the run dir,
    its scales are the preset's with the bundle's overrides, and the stored config (what the sweep hands to
    ``train --config``) resolves to the same config although the name is no preset."""
    from scalevec.resolve import resolve_config

    baseline, variant = expand(spec_from_dict(VARIANTS))
    assert (baseline.name, baseline.cfg.strategy) == ("baseline_lr0.01_s0", "baseline")
    assert (variant.name, variant.cfg.strategy) == ("unified-no-or_lr0.01_s0", "unified-no-or")
    assert variant.cfg.scale == replace(ScaleConfig.preset("unified"), param="direct")
    assert variant.cfg.train.tokens == baseline.cfg.train.tokens  # the baseline's budget for every arm
    assert resolve_config(sections=to_dict(variant.cfg)) == variant.cfg
    with pytest.raises(ValueError, match="unknown strategy 'unified-no-or'"):
        resolve_config(sections={"strategy": "unified-no-or"})  # a variant's name alone names no scales


@pytest.mark.parametrize("bundle, match", [
    ({"name": "baseline", "strategy": "unified"}, "may only label that preset"),
    ({"name": "x", "scale.param": "direct"}, "needs a 'strategy' key"),
])
def test_bad_variant_bundles_raise(bundle, match):
    spec = {**VARIANTS, "grid": {**VARIANTS["grid"], "strategy": [{"name": "b", "strategy": "baseline"}, bundle]}}
    with pytest.raises(ValueError, match=match):
        spec_from_dict(spec)


@pytest.mark.parametrize("tokenizer, stored_vocab, ok", [("bpe:4096", 4096, True), ("bytes", 4096, False),
                                                         ("bpe:4096", 200, False)])
def test_a_finished_bpe_run_is_done_although_the_trainer_grew_its_vocabulary(tmp_path, tokenizer, stored_vocab, ok):
    """The trainer grows a preset's vocabulary to fit a BPE tokenizer (resolve.fit_vocab) and stores it, so a
    rerun of the sweep (and a study's later phases) must see that run as done, not as another config; any
    other vocabulary difference is still an error."""
    from fakerun import write_run

    (run,) = expand(spec_from_dict({"base": {"preset": "tiny", "data.tokenizer": tokenizer, "train.steps": 10},
                                    "grid": {"strategy": ["baseline"]}}))
    cfg = to_dict(run.cfg)
    cfg["model"]["vocab_size"] = stored_vocab
    write_run(tmp_path / run.name, cfg)
    if ok:
        assert run_status(run, tmp_path) == "done"
    else:
        with pytest.raises(ValueError, match="different config.*vocab_size"):
            run_status(run, tmp_path)


def test_tokens_per_param_counts_the_vocabulary_of_the_runs_tokenizer():
    """With ``bpe:N`` the trainer grows the preset's 256-row embedding and head to N rows, so the budget of
    ``tokens_per_param`` counts those N rows (it counted the bytes model before)."""
    (run,) = expand(spec_from_dict({"base": {"preset": "tiny", "data.tokenizer": "bpe:512", "tokens_per_param": 2},
                                    "grid": {"strategy": ["baseline"]}}))
    cfg = replace(get_preset("tiny"), vocab_size=512)
    assert run.cfg.train.tokens == 2 * count_params(build_model(cfg, ScaleConfig.preset("baseline")))["params"]
    assert run.cfg.model.vocab_size == 256  # the config itself is left for the trainer to fit (resolve.fit_vocab)


def test_a_variant_alone_is_its_own_baseline():
    """A grid of one variant compares against that variant (its label), not the preset it starts from."""
    spec = spec_from_dict({"grid": {"strategy": [{"name": "unified-input-only", "strategy": "unified",
                                                  "scale.placement": "input"}]}})
    assert spec.baseline == "unified-input-only"


def test_relative_data_paths_resolve_beside_the_sweep_file(tmp_path, monkeypatch):
    """A relative data.source / data.tokenizer in a sweep file names the path beside that file, from any working
    directory (it used to be read from the shell's); a path found only from the working directory (a file under
    sweeps/ written for the repo root) is kept as written; named corpora and hf: stay names; a path in neither
    place is read beside the file (a run still to train is then refused, naming it); run names come from the
    values as written."""
    from scalevec.data.tokenizer import ByteTokenizer

    studies, shell = tmp_path / "studies", tmp_path / "shell"
    (shell / "data").mkdir(parents=True)
    studies.mkdir()
    (studies / "corpus.txt").write_text("one\n\n\ntwo\n")
    (studies / "shakespeare").write_text("a file that is not the bundled corpus")
    (shell / "data" / "old.txt").write_text("from the repo root")
    ByteTokenizer().save(studies / "tok")
    monkeypatch.chdir(shell)

    def data_of(source, tokenizer="bytes"):
        spec = studies / "s.yaml"
        spec.write_text(yaml.safe_dump({"base": {"preset": "tiny", "data": {"tokenizer": tokenizer}},
                                        "grid": {"strategy": ["baseline"], "data.source": [source]}}, sort_keys=False))
        (run,) = expand(load_spec(spec))
        return run.name, run.cfg.data

    name, data = data_of("corpus.txt", "tok/tokenizer.json")
    assert (data.source, data.tokenizer) == (str(studies / "corpus.txt"), str(studies / "tok" / "tokenizer.json"))
    assert name == "baseline_corpus.txt"
    assert data_of("data/old.txt")[1].source == "data/old.txt"
    for name in ("shakespeare", "hf:someone/corpus"):
        assert data_of(name)[1].source == name
    assert data_of(str(studies / "corpus.txt"))[1].source == str(studies / "corpus.txt")
    assert data_of("missing.txt")[1].source == str(studies / "missing.txt")  # neither: beside, refused to train
    with pytest.raises(FileNotFoundError, match=r"run baseline_missing.txt: data source '.*studies/missing.txt' does "
                                                r"not exist"):
        run_sweep(load_spec(studies / "s.yaml"), tmp_path / "out", dry_run=True)
    assert spec_from_dict({"grid": {"strategy": ["baseline"], "data.source": ["corpus.txt"]}}).file is None


@pytest.mark.slow  # spawns the fake trainer
def test_a_finished_sweep_reads_as_done_after_its_data_moved(tmp_path, monkeypatch, capsys):
    """A relative data path kept as written (found from the working directory) or resolved beside the sweep file
    names one file for a finished run: after the data moves, or from another working directory, its dry run
    shows every run done instead of calling them trained with a different config."""
    from scalevec.experiments.sweep import same_path

    assert same_path("data/a.txt", "/x/sweeps/data/a.txt") and same_path("/x/a.txt", "a.txt")
    assert not same_path("a.txt", "/x/b.txt") and not same_path("/x/a.txt", "/y/a.txt")
    assert not same_path("a.txt", "/x/ba.txt") and not same_path("shakespeare", "/x/shakespeare")
    # a study file's path written from sweeps/ (kept verbatim in OUT/sweep.yaml) against its runs' absolute one
    assert same_path("/w/data/corpora/q.txt", "../data/corpora/q.txt") and not same_path("/w/q.txt", "..")
    assert not same_path("/w/data/q.txt", "../other/q.txt") and not same_path("/w/xdata/q.txt", "../data/q.txt")
    (tmp_path / "sweeps").mkdir()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text("some text\n" * 50)
    (tmp_path / "sweeps" / "s.yaml").write_text(yaml.safe_dump({**SPEC, "base": {**SPEC["base"],
                                                                                  "data.source": "corpus.txt"}},
                                                               sort_keys=False))
    assert run_sweep(load_spec("sweeps/s.yaml"), "out", train_cmd=FAKE, report=False, quiet=True) == 0
    assert yaml.safe_load((tmp_path / "out" / "runs" / "tiny_baseline_lr0.001_s0" / "config.yaml").read_text()
                          )["data"]["source"] == "corpus.txt"  # kept as written
    (tmp_path / "corpus.txt").rename(tmp_path / "moved.txt")
    assert run_sweep(load_spec("sweeps/s.yaml"), "out", dry_run=True) == 0
    assert "8 runs (0 to train)" in capsys.readouterr().out


BUNDLED_LRS = {"name": "own", "base": {"preset": "tiny", "train": {"batch_size": 4, "seq_len": 32, "steps": 10}},
               "grid": {"strategy": [{"name": "baseline", "strategy": "baseline", "lr": 1e-3},
                                     {"name": "unified", "strategy": "unified", "lr": 4e-3}], "seed": [0, 1]}}


def test_lrs_set_inside_bundles_are_tuned_without_tune(tmp_path, capsys):
    """Each strategy at its own lr inside its bundle and no `tune`: optim.lr is tuned (one cell with both
    strategies, each at its lr; it used to be a cell per lr, the unified one skipped for lack of a baseline),
    and the CLI says so in one line; an explicit `tune: []` keeps the cell per lr, silently."""
    from fakerun import write_run
    from scalevec.cli import main
    from scalevec.experiments.analysis import analyze
    from scalevec.experiments.records import load_runs
    from scalevec.experiments.sweepdir import load_specs, write_spec

    spec = spec_from_dict(BUNDLED_LRS)
    assert spec.tune == ["optim.lr"] and "tune: []" in spec.notice and spec.to_dict()["tune"] == ["optim.lr"]
    for run in expand(spec):
        write_run(tmp_path / "runs" / run.name, to_dict(run.cfg))
    write_spec(tmp_path, spec.to_dict())
    (cell,) = analyze(load_runs(tmp_path), load_specs(tmp_path)).cells
    assert {r.strategy: (r.pick.lr, len(r.runs)) for r in cell.results} == {"baseline": (1e-3, 2), "unified": (4e-3, 2)}
    kept = spec_from_dict({**BUNDLED_LRS, "tune": []})
    assert kept.tune == [] and not kept.notice
    assert spec_from_dict(SPEC).tune == ["optim.lr"] and not spec_from_dict(SPEC).notice  # a plain lr axis: as before
    (tmp_path / "own.yaml").write_text(yaml.safe_dump({**BUNDLED_LRS, "command": list(FAKE)}))
    assert main(["sweep", str(tmp_path / "own.yaml"), "--dry-run", "--out", str(tmp_path / "dry")]) == 0
    notes = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("note:")]
    assert len(notes) == 1 and "tuning it (tune: [optim.lr]" in notes[0]


def test_a_field_set_by_bundles_and_by_an_axis_is_an_error():
    """An lr in a strategy bundle and an lr axis: the later axis would silently win; refused, naming the fix."""
    bad = {**BUNDLED_LRS, "grid": {**BUNDLED_LRS["grid"], "lr": [1e-3, 2e-3]}}
    with pytest.raises(ValueError, match=r"grid.strategy bundles set optim.lr, which is also a grid axis.*lr_grids"):
        spec_from_dict(bad)
