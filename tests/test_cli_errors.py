"""Bad command lines: a one-line error naming problem and fix, exit code 2, nothing written or lost."""

from __future__ import annotations

import os
import signal

import pytest

from scalevec.cli import main

TINY_RUN = ["--preset", "tiny", "--steps", "3", "--batch-size", "4", "--seq-len", "32"]
TINY_OVR = ["data.val_tokens=1024", "train.eval_every=2"]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEVEC_CACHE", str(tmp_path / "cache"))


def fails(capsys, argv: list[str], *words: str) -> str:
    """Run the CLI; assert exit 2, one stderr line containing ``words``, no traceback. Returns the line."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    return err


def train_argv(out, *extra: str) -> list[str]:
    return ["train", *TINY_RUN, "--out", str(out), "--quiet", *extra, *TINY_OVR]


@pytest.mark.parametrize("override, words", [
    ("optim.betas=0.9", ("optim.betas", "[a,b]")),
    ("optim.betas=[0.9]", ("optim.betas", "[0, 1)")),
    ("optim.betas=[0.9,0.95,0.99]", ("optim.betas", "[0, 1)")),
    ("optim.eps=-1", ("optim.eps", "> 0")),
    ("optim.muon_momentum=5", ("optim.muon_momentum", "[0, 1)")),
    ("optim.lr=inf", ("optim.lr", "finite")),
    ("model.norm_eps=nan", ("model.norm_eps", "finite")),
    ("train.seed=-1", ("train.seed", ">= 0")),
    ("model.d_model=true", ("model.d_model must be a whole number; got True (a bool)",)),
    ("model.moe=3", ("model.moe must be a mapping",)),
    ("data.source=", ("data.source is empty",)),
    ("model.d_model=[x", ("model.d_model must be a whole number; got '[x' (a str)",)),
    ("train.peak_flops=nan", ("train.peak_flops=nan must be finite",)),
    ("train.peak_flops=inf", ("train.peak_flops=inf must be finite",)),
    ("train.tokens=" + "9" * 400, ("train.tokens=", "must be below 2**63")),
    ("train.batch_size=10000000000000", ("a step's batch", "GiB", "use a smaller batch")),
])
def test_bad_config_values_exit_2_and_write_nothing(tmp_path, capsys, override, words):
    """Malformed or out-of-range config values (betas, eps, momentum, inf/nan, seed, bool-as-int, counts past
    int64, a batch no memory holds) exit 2 before writing."""
    out = tmp_path / "run"
    fails(capsys, train_argv(out, override), *words)
    assert not out.exists()


def test_string_fields_take_the_text_not_yaml(tmp_path, capsys):
    """--data values YAML would misread ('hf:' as a mapping, '[x' as an error) reach the data loader as text."""
    out = tmp_path / "run"
    fails(capsys, train_argv(out, "--data=hf:"), "'hf:' names no dataset")
    fails(capsys, train_argv(out, f"--data={tmp_path}/[x].txt"), "[x].txt", "does not exist")
    assert not out.exists()


def test_overwrite_refuses_a_directory_that_is_not_a_run(tmp_path, capsys):
    """--overwrite never deletes a non-empty directory without config.yaml (e.g. a typo'd --out of $HOME)."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    fails(capsys, train_argv(out, "--overwrite"), "not a scalevec run directory", "--out")
    assert (out / "thesis.tex").read_text() == "precious"


def test_out_below_a_file_names_the_file(tmp_path, capsys):
    """--out under an existing file fails up front with the file's name, not an errno from mkdir."""
    (tmp_path / "f").write_text("x")
    fails(capsys, train_argv(tmp_path / "f" / "run"), "is a file", "choose another --out")


@pytest.mark.slow  # trains, interrupts and resumes
def test_ctrl_c_checkpoints_and_resume_continues(tmp_path, capsys, monkeypatch):
    """Ctrl-C mid-run saves the completed steps (exit 130); --resume then finishes the run."""
    from scalevec.training import trainer as train_mod

    out = tmp_path / "run"
    real_step = train_mod.Trainer.train_step
    # a shell starts background jobs with SIGINT ignored; Python's own handler is what a terminal user has
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def step_then_ctrl_c(self, step):
        result = real_step(self, step)
        if step == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return result

    monkeypatch.setattr(train_mod.Trainer, "train_step", step_then_ctrl_c)
    argv = ["train", "--preset", "tiny", "--steps", "5", "--batch-size", "4", "--seq-len", "32", "--out", str(out),
            "--quiet", *TINY_OVR]
    assert main(argv) == 130
    assert "--resume" in capsys.readouterr().err
    assert (out / "checkpoints" / "latest").read_text().strip().endswith("step_0000002")
    monkeypatch.setattr(train_mod.Trainer, "train_step", real_step)
    assert main(["train", "--resume", "--out", str(out), "--quiet"]) == 0
    assert (out / "DONE").is_file()


def test_sweep_empty_grid_duplicates_bad_yaml_and_directory(tmp_path, capsys):
    """sweep: an empty grid, a value listed twice, malformed YAML and a directory as the spec exit 2 on one line."""
    cases = {"empty.yaml": ("name: x\ngrid: {}\n", "grid is empty"),
             "dup.yaml": ("name: x\ngrid:\n  strategy: [baseline, baseline]\n", "'baseline' twice"),
             "bad.yaml": ("name: x\ngrid: [\n", "not valid YAML at line")}
    for name, (text, words) in cases.items():
        (tmp_path / name).write_text(text)
        fails(capsys, ["sweep", str(tmp_path / name), "--out", str(tmp_path / "out")], words)
    fails(capsys, ["sweep", str(tmp_path), "--dry-run"], "is a directory")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["sweep", "compare", "study"])
def test_a_dangling_link_above_a_sweep_out_is_one_line(tmp_path, capsys, command):
    """sweep, compare and study --out below a symbolic link that leads nowhere was mkdir's bare '[Errno 17] File
    exists': one line (exit 2) naming the link, where it leads and the fix; nothing is created, the link is kept."""
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nbase: {preset: tiny, train: {steps: 3, batch_size: 4, seq_len: 32}}\n"
                    "grid: {strategy: [baseline], lr: [1.0e-3], seed: [0]}\n"
                    + ("study: {extend: 2.0, max_extensions: 1, confirm_seeds: [1]}\n" if command == "study" else ""))
    link = tmp_path / "dang"
    link.symlink_to(tmp_path / "nowhere")
    out = link / "sweeps" / "s"
    argv = {"sweep": ["sweep", str(spec)], "study": ["study", str(spec)],
            "compare": ["compare", *TINY_RUN, "--seeds", "1", "--lr", "1e-3"]}[command]
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    err = fails(capsys, [*argv, "--out", str(out)], f"--out {out}: {link} is a symbolic link that leads nowhere (to "
                f"{os.path.realpath(tmp_path / 'nowhere')}); remove it or choose another --out")
    assert "Errno" not in err and sorted(str(p) for p in tmp_path.rglob("*")) == before


OUT_COMMANDS = ["train", "convert", "export", "sweep", "compare", "study", "prepare-data", "theory", "plot", "bench"]


@pytest.mark.parametrize("command", OUT_COMMANDS)
def test_an_out_below_a_file_is_one_line_from_every_command(tmp_path, capsys, monkeypatch, command):
    """An --out (bench: --save) below a regular file was a raw errno: mkdir's '[Errno 17] File exists: 'f'' or
    '[Errno 20] Not a directory', for plot and bench after the work. Every command that writes an output refuses it
    through the one check (outpath.check_out_path), before any work: exit 2, one line naming the file and the fix;
    nothing is created and the file is kept."""
    import fakerun
    from scalevec.bench import command as bench_command
    from scalevec.config.codec import to_dict
    from scalevec.experiments import gamma_plot
    from scalevec.experiments.theory import lab
    from scalevec.resolve import resolve_config

    def no_work(*a, **k):
        raise AssertionError("the work ran before the refusal")

    monkeypatch.setattr(bench_command, "bench", no_work)
    monkeypatch.setattr(gamma_plot, "plot_runs", no_work)
    monkeypatch.setattr(lab, "run_experiment", no_work)
    run = tmp_path / "run"
    fakerun.write_run(run, to_dict(resolve_config("tiny", "unified", ["train.steps=50"])))
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nbase: {preset: tiny, train: {steps: 3, batch_size: 4, seq_len: 32}}\n"
                    "grid: {strategy: [baseline], lr: [1.0e-3], seed: [0]}\n"
                    + ("study: {extend: 2.0, max_extensions: 1, confirm_seeds: [1]}\n" if command == "study" else ""))
    docs = tmp_path / "d.jsonl"
    docs.write_text('{"text": "to be or not to be"}\n')
    f = tmp_path / "f"
    f.write_text("precious")
    out = f / "sub" / {"plot": "g.png", "bench": "b.json"}.get(command, "out")
    flag = "--save" if command == "bench" else "--out"
    argv = {"train": ["train", *TINY_RUN, "--quiet", *TINY_OVR],
            "convert": ["convert", str(run), "--strategy", "baseline"],
            "export": ["export", str(run)],
            "sweep": ["sweep", str(spec), "--no-report"],
            "compare": ["compare", *TINY_RUN, "--seeds", "1", "--lr", "1e-3"],
            "study": ["study", str(spec)],
            "prepare-data": ["prepare-data", str(docs), "--quiet"],
            "theory": ["theory", "magdir"],
            "plot": ["plot", str(run)],
            "bench": ["bench", "--preset", "tiny", "--device", "cpu"]}[command]
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    err = fails(capsys, [*argv, flag, str(out)])
    assert err == f"scalevec {command}: error: {flag} {out}: {f} is a file, not a folder; choose another {flag}"
    assert "Errno" not in err and sorted(str(p) for p in tmp_path.rglob("*")) == before
    assert f.read_text() == "precious"


def test_check_out_path_names_what_stands_above_out(tmp_path):
    """check_out_path: the first existing path above --out must be a folder; a link to a file and a FIFO there are
    named for what they are; --out itself being a file is the caller's question, a folder above passes."""
    from scalevec.outpath import check_out_path

    f = tmp_path / "f"
    f.write_text("x")
    (tmp_path / "flink").symlink_to(f)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(NotADirectoryError, match=rf"^--out {tmp_path}/flink/a/b: {tmp_path}/flink is a symbolic link "
                                                 rf"to {os.path.realpath(f)}, not a folder; choose another --out$"):
        check_out_path(tmp_path / "flink" / "a" / "b")
    with pytest.raises(NotADirectoryError, match=rf"^--save {tmp_path}/fifo/x: {tmp_path}/fifo is not a folder; "
                                                 rf"choose another --save$"):
        check_out_path(tmp_path / "fifo" / "x", flag="--save")
    check_out_path(f)  # what --out itself is: each command's own question
    check_out_path(tmp_path / "new" / "deeper" / "out")  # missing folders below a folder: created by the command
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f", "fifo", "flink"]


def test_compare_into_a_training_run_is_refused(tmp_path, capsys):
    """compare/sweep --out at a single training run (config.yaml) exits 2 and adds nothing to it."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("preset: tiny\n")
    fails(capsys, ["compare", *TINY_RUN, "--seeds", "1", "--lr", "1e-3", "--out", str(run)], "single training run")
    assert [p.name for p in run.iterdir()] == ["config.yaml"]


@pytest.mark.parametrize("dry", [[], ["--dry-run"]])
def test_study_out_at_a_file_or_a_link_to_one_is_refused(tmp_path, capsys, dry):
    """study --out FILE printed a whole plan with --dry-run and failed with a bare "[Errno 17]" without it; sweep
    and train already refused. One check (sweepdir.check_folder) for sweep, compare and study; the file is kept."""
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nbase: {preset: tiny, train: {steps: 2, batch_size: 2, seq_len: 16}}\n"
                    "grid: {strategy: [baseline], lr: [0.001, 0.002], seed: [0]}\nbaseline: baseline\n"
                    "study: {confirm_seeds: [1]}\n")
    f = tmp_path / "f"
    f.write_text("keep")
    (tmp_path / "flink").symlink_to(f)
    for out in (f, tmp_path / "flink"):
        fails(capsys, ["study", str(spec), "--out", str(out), *dry], "exists and is not a directory")
    assert f.read_text() == "keep" and (tmp_path / "flink").is_symlink()


@pytest.mark.parametrize("extra, words", [
    (["--max-new-tokens", "0"], ("--max-new-tokens=0", ">= 1")),
    (["--device", "tpu"], ("--device 'tpu'", "use cpu")),
])
def test_generate_bad_arguments(tmp_path, capsys, extra, words):
    """generate: zero new tokens or an unknown device exit 2 (checked before any model is loaded)."""
    fails(capsys, ["generate", str(tmp_path), "--prompt", "hi", *extra], *words)


@pytest.mark.slow  # spawns the CLI: ~10-20 s
def test_a_closed_pipe_ends_the_command_quietly():
    """`scalevec study X --dry-run | head` whose reader is gone: no error line and no traceback, the exit code a
    shell gives a program killed by SIGPIPE (141), not the bad-input code 2. The reader closes before the child
    has imported torch, so the child's first write meets the closed pipe."""
    import subprocess
    import sys
    from pathlib import Path

    from scalevec.cli import BROKEN_PIPE_EXIT

    example = Path(__file__).resolve().parents[1] / "sweeps" / "examples" / "study-own-corpus.yaml"
    proc = subprocess.Popen([sys.executable, "-m", "scalevec", "study", str(example), "--dry-run"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == BROKEN_PIPE_EXIT and err == ""


@pytest.mark.slow  # a real training subprocess
def test_training_piped_into_head_finishes_its_run(tmp_path):
    """`scalevec train ... | head -2`: once the reader is gone the run goes on without its progress lines and
    finishes (exit 0, DONE), instead of stopping as if its run directory could not be written (exit 3)."""
    import subprocess
    import sys

    out = tmp_path / "run"
    env = {**os.environ, "SCALEVEC_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "scalevec", "train", *TINY_RUN, "--out", str(out), *TINY_OVR,
                             "train.steps=40", "train.log_every=1", "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    for _ in range(2):
        proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0, err
    assert (out / "DONE").is_file() and "Traceback" not in err


def test_a_dashed_config_field_gets_a_hint(capsys):
    """`train --moe.n_experts=4` (a config field written as a flag): argparse's error names the fix, the field
    without its dashes."""
    with pytest.raises(SystemExit) as e:
        main(["train", "--moe.n_experts=4", "--print-config"])
    assert e.value.code == 2
    assert "(a config field is set as moe.n_experts=4, without the dashes)" in capsys.readouterr().err


def test_ctrl_c_before_the_command_runs_prints_no_traceback(capsys, monkeypatch):
    """Ctrl-C while the subcommands' modules import (torch takes seconds): one line and exit 130."""
    import importlib

    def interrupted(name, *args):
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib, "import_module", interrupted)
    assert main(["train", "--print-config"]) == 130
    assert capsys.readouterr().err == "scalevec: interrupted\n"


def test_a_negative_step_count_is_named_not_the_warmup_it_implies(capsys):
    """`train --steps -1` names train.steps (the default warmup, 10 % of the steps, used to be -1 and was named)."""
    fails(capsys, ["train", "--steps", "-1", "--print-config"], "train.steps=-1", "positive")


def test_an_out_below_a_folder_this_user_may_not_write_is_one_line(tmp_path, capsys, monkeypatch):
    """sweep --out locked/x where locked is not writable by this user: mkdir's bare "[Errno 13] Permission denied"
    named no fix. outpath.check_out_path refuses it first (os.access is patched: the tests may run as root, for
    whom every folder is writable)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **k: False if os.fspath(p) == str(locked) else real(p, mode, **k))
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nbase: {preset: tiny, train: {steps: 2, batch_size: 2, seq_len: 16}}\n"
                    "grid: {strategy: [baseline]}\n")
    err = fails(capsys, ["sweep", str(spec), "--out", str(locked / "x")], "may not create anything in", "writable")
    assert "Errno" not in err and list(locked.iterdir()) == []


@pytest.mark.parametrize("threads, words", [("100000", ("--threads 100000", "CPUs")), ("0", ("--threads 0", ">= 1")),
                                            ("-1", ("threads", ">= 0"))])
def test_threads_are_bounded_by_the_machine(tmp_path, capsys, threads, words):
    """--threads outside [1, CPUs] is one line, exit 2, before anything is written (100000 crashed torch with a
    segmentation fault, 0 was taken silently)."""
    out = tmp_path / "run"
    fails(capsys, train_argv(out, f"--threads={threads}"), *words)
    assert not out.exists()


def test_a_stored_thread_count_above_the_machines_cpus_is_refused(tmp_path, capsys):
    """train.threads from a config above this machine's CPUs is one line naming the field."""
    out = tmp_path / "run"
    fails(capsys, train_argv(out, f"train.threads={(os.cpu_count() or 1) + 1}"), "train.threads", "CPUs")
    assert not out.exists()


def test_ckpt_every_zero_is_said(tmp_path, capsys):
    """train.ckpt_every=0 (checkpoints only at the end) is not taken silently: a note says what it means."""
    out = tmp_path / "run"
    assert main(train_argv(out, "train.ckpt_every=0")) == 0
    assert "train.ckpt_every=0: checkpoints only at the end" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["-rf", "--help"])
def test_an_out_whose_name_starts_with_a_dash_is_refused(tmp_path, capsys, monkeypatch, name):
    """--out=-rf is refused (a shell command given the folder would read it as options), nothing created."""
    monkeypatch.chdir(tmp_path)
    fails(capsys, ["train", *TINY_RUN, f"--out={name}", "--quiet", *TINY_OVR], "starting with '-'")
    assert not (tmp_path / name).exists()


def test_a_sweep_name_starting_with_a_dash_is_refused():
    """A sweep or study `name: -rf` is refused: it names a folder under runs/."""
    from scalevec.experiments.sweep_spec import check_name

    with pytest.raises(ValueError, match="not starting with '-'"):
        check_name("-rf", "sweep.name")


@pytest.mark.parametrize("err", [30, 16, 17])  # EROFS (a read-only mount), EBUSY (a mount point), EEXIST
def test_a_bare_os_error_is_one_line_with_the_path_and_a_fix(tmp_path, capsys, monkeypatch, err):
    """An OSError with no message of scalevec's (a read-only mount point as --out: "[Errno 30]", "[Errno 16]")
    is one line naming the path, the problem and a fix, never a raw "[Errno N]"."""
    import scalevec.hf.export as export

    def refuse(src, dst):
        raise OSError(err, os.strerror(err), str(dst))

    run = tmp_path / "run"
    assert main(train_argv(run)) == 0
    capsys.readouterr()
    monkeypatch.setattr(export.os, "rename", refuse)  # the export's last step: its rename into place
    line = fails(capsys, ["export", str(run), "--out", str(tmp_path / "exp")], str(tmp_path / "exp"), "; ")
    assert "[Errno" not in line
    assert not list(tmp_path.glob(".exp.tmp-*"))  # the temporary folder is removed too


def test_a_tokenizer_fifo_is_named_as_what_it_is(tmp_path, capsys):
    """--tokenizer naming a FIFO says it is not a regular file (it said "does not exist"), at once."""
    fifo = tmp_path / "tok.json"
    os.mkfifo(fifo)
    fails(capsys, train_argv(tmp_path / "run", f"--tokenizer={fifo}"), str(fifo), "not a regular file")
