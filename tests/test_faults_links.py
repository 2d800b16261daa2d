"""One rule for the files scalevec writes into and reads from a run directory (outpath.open_owned, replace_file,
read_regular): a file rewritten in place (the lock, metrics.jsonl, a sweep's log) is opened only when it is a
regular file with one name, a file replaced whole is written under a new name and renamed over, and a file read
is read only when it is a regular file. A symbolic link or a hard link to a user's file never has it written
through; a FIFO never hangs a command. Each case: the refusal is one line (exit 2 from the CLI) and the user's
file is intact.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from scalevec.cli import main
from scalevec.config.codec import save_yaml
from scalevec.data.tokenizer import ByteTokenizer, load_tokenizer, load_tokenizer_dir
from scalevec.training import eval_results, rundir
from scalevec.training.checkpoint import integrity, layout, save_load
from test_faults_inputs import deadline, one_line_error
from test_rundir_faults import tiny_setup  # the fault suite's tiny run

KINDS = ["symlink", "hardlink"]
DATA = "the user's own data\n"


@pytest.fixture(scope="module")
def run_env(tmp_path_factory):
    """A config file for the CLI and a finished tiny run (8 steps, about a second)."""
    return tiny_setup(tmp_path_factory.mktemp("faults-links"), "run")


def victim(tmp_path: Path) -> Path:
    v = tmp_path / "precious.txt"
    v.write_text(DATA)
    return v


def link(kind: str, target: Path, at: Path) -> None:
    """Put a link of ``kind`` to ``target`` at ``at`` (what was there removed)."""
    at.unlink(missing_ok=True)
    at.symlink_to(target) if kind == "symlink" else os.link(target, at)


def copy_run(run_env, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(run_env["run"], out)
    return out


# ------------------------------------------------------------------------------------------ files written in place


@pytest.mark.parametrize("kind", KINDS)
def test_lock_refuses_a_link_of_any_kind(tmp_path, kind):
    """The lock is never opened through a symbolic link or a hard link: the linked file keeps its bytes."""
    v = victim(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    link(kind, v, run / rundir.LOCK)
    with pytest.raises(rundir.RunDirError, match="symbolic link" if kind == "symlink" else "hard link"):
        rundir.RunLock(run).acquire()
    assert v.read_text() == DATA


@pytest.mark.parametrize("case", ["new", "resume", "overwrite"])
@pytest.mark.parametrize("kind", KINDS)
def test_train_with_a_linked_lock_is_one_line_and_the_target_is_intact(run_env, tmp_path, capsys, kind, case):
    """`train` into a run whose .lock links to a user's file (a `cp -al` or tar hard link too) exits 2 in one
    line and neither the file nor the run is touched."""
    v = victim(tmp_path)
    if case == "new":
        out = tmp_path / "out"
        out.mkdir()
    else:
        out = copy_run(run_env, tmp_path)
    link(kind, v, out / rundir.LOCK)
    extra = {"new": [], "resume": ["--resume"], "overwrite": ["--overwrite"]}[case]
    assert main(["train", "--config", str(run_env["cfg_file"]), "--out", str(out), "--quiet", *extra]) == 2
    one_line_error(capsys, str(out / rundir.LOCK), "symbolic link" if kind == "symlink" else "hard link")
    assert v.read_text() == DATA
    if case != "new":
        assert rundir.is_done(out)


@pytest.mark.parametrize("kind", [*KINDS, "fifo"])
def test_resume_refuses_a_metrics_file_that_is_not_its_own(run_env, tmp_path, capsys, kind):
    """`train --resume` appends to metrics.jsonl: a symbolic or hard link there, or a FIFO, is refused in one
    line before anything is written (the linked file intact), never hangs."""
    out = copy_run(run_env, tmp_path)
    (out / rundir.DONE).unlink()
    (out / rundir.SUMMARY).unlink()
    v = victim(tmp_path)
    if kind == "fifo":
        (out / rundir.METRICS).unlink()
        os.mkfifo(out / rundir.METRICS)
    else:
        link(kind, v, out / rundir.METRICS)
    with deadline(30):
        assert main(["train", "--resume", "--out", str(out), "--quiet"]) == 2
    words = {"symlink": "symbolic link", "hardlink": "hard link", "fifo": "not a regular file"}[kind]
    one_line_error(capsys, str(out / rundir.METRICS), words)
    assert v.read_text() == DATA


@pytest.mark.parametrize("kind", KINDS)
def test_append_metrics_never_writes_through_a_link(tmp_path, kind):
    """The one appender of metrics.jsonl refuses a linked file (what a run directory made with `cp -al` has)."""
    v = victim(tmp_path)
    link(kind, v, tmp_path / rundir.METRICS)
    with pytest.raises(rundir.RunDirError, match="symbolic link" if kind == "symlink" else "hard link"):
        rundir.append_metrics(tmp_path, {"kind": "train", "step": 0})
    assert v.read_text() == DATA


@pytest.mark.parametrize("kind", KINDS)
def test_sweep_log_is_never_appended_through_a_link(tmp_path, capsys, kind):
    """A sweep appends each run's output to runs/NAME.log: a link there is refused in one line, the file intact."""
    import yaml

    from scalevec.experiments.sweep import expand, load_spec
    from test_faults_inputs import FAKE, FAKE_SWEEP

    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({**FAKE_SWEEP, "command": list(FAKE)}))
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    v = victim(tmp_path)
    link(kind, v, out / "runs" / f"{expand(load_spec(f))[0].name}.log")
    assert main(["sweep", str(f), "--out", str(out), "--no-report", "--jobs", "1"]) != 0
    one_line_error(capsys, ".log", "symbolic link" if kind == "symlink" else "hard link")
    assert v.read_text() == DATA


# ------------------------------------------------------------------------------------------- files replaced whole


def _write_config(d: Path, run_env) -> Path:
    save_yaml(run_env["cfg"], d / rundir.CONFIG)
    return d / rundir.CONFIG


def _write_meta(d: Path, run_env) -> Path:
    rundir.write_meta(d, {"x": 1})
    return d / rundir.META


def _write_summary(d: Path, run_env) -> Path:
    rundir.write_summary(d, {"final_val_loss": 1.0})
    return d / rundir.SUMMARY


def _write_done(d: Path, run_env) -> Path:
    rundir.mark_done(d)
    return d / rundir.DONE


def _write_eval(d: Path, run_env) -> Path:
    return eval_results.write_eval(d, {"t": {"acc,none": 0.5}}, 0, None)


def _write_tokenizer(d: Path, run_env) -> Path:
    ByteTokenizer().save(d)
    return d / "tokenizer_config.json"


def _write_latest(d: Path, run_env) -> Path:
    save_load.point_latest(d, "step_2")
    return d / layout.CKPT_DIR / layout.LATEST


REPLACED = {"config.yaml": _write_config, "meta.json": _write_meta, "summary.json": _write_summary,
            "DONE": _write_done, "eval.json": _write_eval, "tokenizer_config.json": _write_tokenizer,
            "latest": _write_latest}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", list(REPLACED))
def test_files_replaced_whole_replace_a_link_never_its_target(run_env, tmp_path, kind, name):
    """Every file a command rewrites whole is written under a new name and renamed over: a link in its place is
    replaced (the new file has one name), the linked file keeps its bytes."""
    v = victim(tmp_path)
    if name == "eval.json":  # merged into: the linked file must read as one
        v.write_text('{"tasks": {}}\n')
    before = v.read_text()
    d = tmp_path / "d"
    d.mkdir()
    target = d / (f"{layout.CKPT_DIR}/{layout.LATEST}" if name == "latest" else name)
    target.parent.mkdir(exist_ok=True)
    link(kind, v, target)
    written = REPLACED[name](d, run_env)
    assert written == target and not written.is_symlink() and written.stat().st_nlink == 1
    assert v.read_text() == before


@pytest.mark.parametrize("kind", KINDS)
def test_a_link_planted_at_the_temporary_name_is_never_written_through(tmp_path, kind):
    """replace_file's temporary name (.NAME.PID.tmp) is predictable: a link planted there is unlinked, not
    written through."""
    from scalevec.outpath import replace_file

    v = victim(tmp_path)
    link(kind, v, tmp_path / f".x.json.{os.getpid()}.tmp")
    replace_file(tmp_path / "x.json", "{}\n")
    assert (tmp_path / "x.json").read_text() == "{}\n"
    assert v.read_text() == DATA


@pytest.mark.parametrize("kind", KINDS)
def test_restart_rewrites_the_run_files_never_through_a_link(run_env, tmp_path, capsys, kind):
    """A resumed run with no checkpoint restarts and writes its files anew (optim_groups.txt, the tokenizer):
    links in their place are replaced, the linked files keep their bytes."""
    out = copy_run(run_env, tmp_path)
    for p in (rundir.DONE, rundir.SUMMARY):
        (out / p).unlink()
    shutil.rmtree(out / "checkpoints")
    v, w = victim(tmp_path), tmp_path / "other.txt"
    w.write_text(DATA)
    link(kind, v, out / rundir.GROUPS)
    link(kind, w, out / rundir.TOKENIZER / "tokenizer_config.json")
    assert main(["train", "--resume", "--out", str(out), "--quiet"]) == 0
    assert v.read_text() == DATA and w.read_text() == DATA
    assert (out / rundir.GROUPS).stat().st_nlink == 1 and rundir.is_done(out)


# ------------------------------------------------------------------------------------------------- files read


def test_plot_refuses_a_fifo_metrics_file_without_hanging(run_env, tmp_path, capsys):
    """`plot` reads metrics.jsonl: a FIFO there is one line, exit 2, at once."""
    out = copy_run(run_env, tmp_path)
    (out / rundir.METRICS).unlink()
    os.mkfifo(out / rundir.METRICS)
    with deadline(30):
        assert main(["plot", str(out), "--out", str(tmp_path / "g.png")]) == 2
    one_line_error(capsys, str(out / rundir.METRICS), "not a regular file")


def _fifo(path: Path) -> None:
    if path.exists():
        path.unlink()
    os.mkfifo(path)


READERS = {
    "read_metrics": (rundir.METRICS, lambda d: rundir.read_metrics(d)),
    "read_summary": (rundir.SUMMARY, lambda d: rundir.read_summary(d)),
    "read_diverged": (rundir.DIVERGED, lambda d: rundir.read_diverged(d)),
    "load_config": (rundir.CONFIG, lambda d: rundir.load_config(d)),
    "load_tokenizer": ("tokenizer/tokenizer_config.json", lambda d: load_tokenizer_dir(d / rundir.TOKENIZER)),
    "--tokenizer FILE": ("tok.json", lambda d: load_tokenizer(str(d / "tok.json"))),
    "verify_checkpoint": ("checkpoints/step_0000008/MANIFEST.json",
                          lambda d: integrity.verify_checkpoint(d / "checkpoints" / "step_0000008")),
    "read_train_state": ("checkpoints/step_0000008/train_state.json",
                         lambda d: integrity.read_train_state(d / "checkpoints" / "step_0000008")),
}


@pytest.mark.parametrize("reader", list(READERS))
def test_every_reader_of_a_run_file_refuses_a_fifo(run_env, tmp_path, reader):
    """Each reader of a run directory's files refuses a FIFO in one line (ValueError) at once, never hangs."""
    out = copy_run(run_env, tmp_path)
    name, read = READERS[reader]
    _fifo(out / name)
    with deadline(20):
        with pytest.raises(ValueError, match="not a regular file"):
            read(out)


@pytest.mark.parametrize("reader", ["read_meta", "last_row", "eval_columns"])
def test_lenient_readers_skip_a_fifo_without_hanging(run_env, tmp_path, reader):
    """The readers that treat a damaged file as absent (meta.json, a live view of metrics, eval.json) do the same
    with a FIFO, at once."""
    out = copy_run(run_env, tmp_path)
    name, read, empty = {"read_meta": (rundir.META, rundir.read_meta, {}),
                         "last_row": (rundir.METRICS, lambda d: rundir.last_row(d, "train"), None),
                         "eval_columns": (rundir.EVAL, eval_results.eval_columns, {})}[reader]
    _fifo(out / name)
    with deadline(20):
        assert read(out) == empty
