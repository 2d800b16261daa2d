"""Temporary folders owned and cleaned (outpath.temporary_folder): `export` and `prepare-data` write into
``.NAME.tmp-PID-HEX`` beside their --out; SIGTERM or Ctrl-C removes it with a note; a folder whose process is gone
(SIGKILL) is removed with a note by the next write to that --out; no reader takes a temporary folder for a model
or for prepared data.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalevec.cli import main
from test_faults_inputs import one_line_error
from test_rundir_faults import tiny_setup  # the fault suite's tiny run

SRC = str(Path(__file__).resolve().parents[1] / "src")

# a child `scalevec ARGV` whose step STEP (a dotted function) sleeps: the temporary folder exists meanwhile
SLOW_CHILD = """import importlib, sys, time
module, name = sys.argv[1].rsplit(".", 1)
m = importlib.import_module(module)
real = getattr(m, name)
def slow(*a, **k):
    time.sleep(120)
    return real(*a, **k)
setattr(m, name, slow)
from scalevec.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.fixture(scope="module")
def run_env(tmp_path_factory):
    """A finished tiny run (8 steps, about a second)."""
    return tiny_setup(tmp_path_factory.mktemp("faults-tmp"), "run")


def temporaries(out: Path) -> list[Path]:
    return sorted(out.parent.glob(f".{out.name}.tmp-*"))


def dead_pid() -> int:
    """The PID of a process that has ended (not reused this soon)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def interrupted(argv: list[str], slow: str, out: Path, sig: int) -> subprocess.CompletedProcess:
    """Run ``scalevec argv`` in a child whose ``slow`` step sleeps, send ``sig`` once its temporary folder of
    ``out`` exists, and return the finished child."""
    env = {**os.environ, "PYTHONPATH": SRC}
    child = subprocess.Popen([sys.executable, "-c", SLOW_CHILD, slow, *argv], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not temporaries(out) and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert temporaries(out), "the child never made its temporary folder"
    assert str(child.pid) in temporaries(out)[0].name  # the name carries the writer's PID
    child.send_signal(sig)
    stdout, stderr = child.communicate(timeout=60)
    return subprocess.CompletedProcess(argv, child.returncode, stdout, stderr)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_export_interrupted_removes_its_temporary_folder_and_says_so(run_env, tmp_path, sig):
    """`export --verify` stopped by SIGTERM or Ctrl-C while its temporary folder exists leaves nothing, says so in
    a note and exits non-zero (it left a complete but unverified export that `generate` loaded)."""
    out = tmp_path / "X"
    done = interrupted(["export", str(run_env["run"]), "--out", str(out), "--verify"], "scalevec.hf.export.verify",
                       out, sig)
    assert done.returncode != 0
    assert temporaries(out) == [] and not out.exists()
    assert "removed" in done.stderr and ".X.tmp-" in done.stderr
    assert "Traceback" not in done.stderr


def test_prepare_data_interrupted_removes_its_temporary_folder(tmp_path):
    """`prepare-data` stopped by SIGTERM removes its temporary folder and says so."""
    src = tmp_path / "a.txt"
    src.write_text("to be or not to be\n\nthat is the question\n" * 50)
    out = tmp_path / "P"
    done = interrupted(["prepare-data", str(src), "--out", str(out), "--quiet"],
                       "scalevec.data.prepared._write_json", out, signal.SIGTERM)
    assert done.returncode != 0
    assert temporaries(out) == [] and not out.exists()
    assert "removed" in done.stderr


def test_a_stale_temporary_folder_is_removed_by_the_next_export(run_env, tmp_path, capsys):
    """A temporary folder whose process is gone (SIGKILL) is removed, with a note, by the next export to that
    --out; a live process's folder is kept."""
    out = tmp_path / "X"
    stale = tmp_path / f".X.tmp-{dead_pid()}-0badcafe"
    live = tmp_path / f".X.tmp-{os.getpid()}-0000beef"
    for d in (stale, live):
        d.mkdir()
        (d / "config.json").write_text("{}")
    assert main(["export", str(run_env["run"]), "--out", str(out)]) == 0
    assert not stale.exists() and live.exists()
    err = capsys.readouterr().err
    assert f"removed {stale}" in err and "is gone" in err


def test_prepare_data_removes_a_stale_temporary_folder(tmp_path, capsys):
    """prepare-data removes the stale temporary folder of its --out with a note."""
    src = tmp_path / "a.txt"
    src.write_text("to be or not to be\n\nthat is the question\n" * 20)
    stale = tmp_path / f".P.tmp-{dead_pid()}-0badcafe"
    stale.mkdir()
    assert main(["prepare-data", str(src), "--out", str(tmp_path / "P"), "--quiet"]) == 0
    assert not stale.exists() and f"removed {stale}" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["generate", "eval", "convert", "train --init-from"])
def test_no_reader_takes_a_temporary_folder_for_a_model(run_env, tmp_path, capsys, command):
    """A complete export under a temporary name is refused by every reader of a model, in one line."""
    exp = tmp_path / "exp"
    assert main(["export", str(run_env["run"]), "--out", str(exp)]) == 0
    tmp = tmp_path / f".exp.tmp-{dead_pid()}-0badcafe"
    shutil.copytree(exp, tmp)
    text = tmp_path / "t.txt"
    text.write_text("ROMEO: hello\n")
    capsys.readouterr()
    argv = {"generate": ["generate", str(tmp), "--prompt", "a", "--max-new-tokens", "2"],
            "eval": ["eval", str(tmp), "--text", str(text)],
            "convert": ["convert", str(tmp), "--strategy", "unified", "--out", str(tmp_path / "c")],
            "train --init-from": ["train", "--config", str(run_env["cfg_file"]), "--init-from", str(tmp), "--out",
                                  str(tmp_path / "t"), "--quiet"]}[command]
    assert main(argv) == 2
    one_line_error(capsys, str(tmp), "temporary folder")


def test_a_temporary_prepared_folder_is_not_prepared_data(tmp_path, capsys):
    """A prepared folder under a temporary name is refused as a data source."""
    src = tmp_path / "a.txt"
    src.write_text("to be or not to be\n\nthat is the question\n" * 20)
    assert main(["prepare-data", str(src), "--out", str(tmp_path / "P"), "--quiet"]) == 0
    tmp = tmp_path / f".P.tmp-{dead_pid()}-0badcafe"
    (tmp_path / "P").rename(tmp)
    capsys.readouterr()
    assert main(["prepare-data", "--verify", str(tmp)]) == 2
    one_line_error(capsys, str(tmp), "temporary folder")


def test_a_stale_token_cache_folder_is_removed_by_the_next_writer(tmp_path, capsys):
    """The token cache's temporary folder carries its writer's PID too: one left by a killed trainer is removed,
    with a note, when the cache entry is written again."""
    from scalevec.config import DataConfig
    from scalevec.data.corpus import prepare_data

    cfg = DataConfig(cache_dir=str(tmp_path / "cache"), val_tokens=256)
    prepare_data(cfg)
    entry = next(p for p in (tmp_path / "cache").rglob("*") if p.is_dir() and (p / "meta.json").is_file())
    shutil.rmtree(entry)
    stale = entry.with_name(f".{entry.name}.tmp-{dead_pid()}-0badcafe")
    stale.mkdir()
    capsys.readouterr()
    prepare_data(cfg)
    assert not stale.exists() and (entry / "meta.json").is_file()
    assert f"removed {stale}" in capsys.readouterr().err


def test_a_temporary_name_with_an_impossible_pid_is_kept_not_a_crash(tmp_path):
    """A folder named like a temporary one but with a PID too large for the system (os.kill's OverflowError) is
    left alone: the next writer neither crashes on it nor removes it."""
    from scalevec.outpath import clean_stale_temporaries

    odd = tmp_path / f".model.tmp-{2**70}-ab"
    odd.mkdir()
    gone = tmp_path / ".model.tmp-999999999-cd"  # above Linux's pid_max (4194304): no such process
    gone.mkdir()
    notes = []
    assert clean_stale_temporaries(tmp_path / "model", notes.append) == [gone.name]
    assert odd.is_dir() and not gone.exists() and len(notes) == 1
