"""Nothing outside the run is touched, no input is unbounded.

The run's lock file is never followed (a symbolic link, a FIFO), a sweep or study ``name:`` never leaves
``runs/``, every YAML file is read with a bound on its expansion (alias bombs, deep nesting) before a value is
used, messages quote a short prefix of a value, files read from paths are regular files, a sweep that skipped a
run exits non-zero and a second study on one folder is refused with the first's PID. Each case: one line, exit 2
(or the documented code), nothing outside the run written.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from scalevec.cli import main
from scalevec.config.files import MAX_YAML_DEPTH, YAMLBoundError, load_yaml, safe_load
from scalevec.config.typed import short
from scalevec.experiments import study as study_mod
from scalevec.experiments.sweep import expand, load_spec, run_sweep, spec_from_dict
from scalevec.training import rundir
from test_rundir_faults import tiny_setup  # the fault suite's tiny run

FAKE = (sys.executable, str(Path(__file__).with_name("fakerun.py")))
FAKE_SWEEP = {"name": "f", "base": {"train": {"batch_size": 4, "seq_len": 32}},
              "grid": {"preset": ["tiny"], "strategy": ["baseline", "unified"], "lr": [3e-3]}}

# 369 bytes that expand to 9**9 = 387 million strings (nine levels of nine aliases)
BOMB = "".join(f"{chr(97 + i)}: &{chr(97 + i)} [" + ",".join(["x"] * 9 if i == 0 else [f"*{chr(96 + i)}"] * 9)
               + "]\n" for i in range(9))


@contextmanager
def deadline(seconds: int):
    """Fail (instead of hanging the suite) when the block takes longer than ``seconds``."""
    def on_alarm(*_):
        raise AssertionError(f"hung for more than {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def one_line_error(capsys, *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err, err
    last = err.splitlines()[-1] if err else ""
    assert "error" in last, err
    assert len(last) < 600, f"{len(last)} characters: {last[:300]}"
    for needle in needles:
        assert needle in last, err
    return last


@pytest.fixture(scope="module")
def run_env(tmp_path_factory):
    """A config file for the CLI and a finished tiny run (8 steps, about a second)."""
    return tiny_setup(tmp_path_factory.mktemp("faults-inputs"), "run")


def victim(tmp_path: Path) -> Path:
    v = tmp_path / "precious.txt"
    v.write_text("the user's own data\n")
    return v


# ------------------------------------------------------------------------------------------------ the lock file


def test_lock_never_follows_a_symbolic_link(tmp_path):
    v = victim(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / rundir.LOCK).symlink_to(v)
    with pytest.raises(rundir.RunDirError, match="symbolic link"):
        rundir.RunLock(run).acquire()
    with pytest.raises(rundir.RunDirError, match="symbolic link"):
        rundir.locked_by(run)
    assert v.read_text() == "the user's own data\n"


def test_lock_refuses_a_fifo_without_hanging(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / rundir.LOCK)
    with deadline(20):
        with pytest.raises(rundir.RunDirError, match="not a regular file"):
            rundir.RunLock(run).acquire()
        with pytest.raises(rundir.RunDirError, match="not a regular file"):
            rundir.locked_by(run)


def test_lock_still_locks_and_names_the_holder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with rundir.RunLock(run):
        assert rundir.locked_by(run) == str(os.getpid())
        with pytest.raises(rundir.RunLocked, match=f"process {os.getpid()}"):
            rundir.RunLock(run).acquire()
    assert rundir.locked_by(run) is None


@pytest.mark.parametrize("case", ["new", "resume", "overwrite"])
def test_train_with_a_linked_lock_is_refused_and_the_target_is_intact(run_env, tmp_path, capsys, case):
    import shutil

    v = victim(tmp_path)
    out = tmp_path / "out"
    if case == "new":
        out.mkdir()  # a folder holding only the link
    else:
        shutil.copytree(run_env["run"], out)
        (out / rundir.LOCK).unlink()
    (out / rundir.LOCK).symlink_to(v)
    extra = {"new": [], "resume": ["--resume"], "overwrite": ["--overwrite"]}[case]
    rc = main(["train", "--config", str(run_env["cfg_file"]), "--out", str(out), "--quiet", *extra])
    assert rc == 2
    one_line_error(capsys, "symbolic link", str(out / rundir.LOCK))
    assert v.read_text() == "the user's own data\n"
    if case != "new":
        assert rundir.is_done(out)  # the run was not emptied either


@pytest.mark.slow
def test_convert_overwrite_with_a_linked_lock_is_refused(run_env, tmp_path, capsys):
    import shutil

    v = victim(tmp_path)
    out = tmp_path / "out"
    shutil.copytree(run_env["run"], out)
    (out / rundir.LOCK).unlink()
    (out / rundir.LOCK).symlink_to(v)
    rc = main(["convert", str(run_env["run"]), "--strategy", "unified", "--out", str(out), "--overwrite"])
    assert rc == 2
    one_line_error(capsys, "symbolic link")
    assert v.read_text() == "the user's own data\n"


def test_sweep_with_a_fifo_lock_in_an_unfinished_run_does_not_hang(tmp_path, capsys):
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({**FAKE_SWEEP, "command": list(FAKE)}))
    out = tmp_path / "out"
    assert main(["sweep", str(f), "--out", str(out), "--no-report"]) == 0
    run = out / "runs" / expand(load_spec(f))[0].name
    (run / rundir.DONE).unlink()  # unfinished
    (run / rundir.LOCK).unlink(missing_ok=True)
    os.mkfifo(run / rundir.LOCK)
    capsys.readouterr()
    with deadline(30):
        assert main(["sweep", str(f), "--out", str(out), "--no-report"]) == 2
    one_line_error(capsys, str(run / rundir.LOCK), "not a regular file")


# --------------------------------------------------------------------------------------------------- YAML bounds


def test_alias_bomb_in_a_config_is_refused_fast(tmp_path, capsys):
    f = tmp_path / "bomb.yaml"
    f.write_text(BOMB + "train: {steps: *i}\n")
    assert len(f.read_bytes()) < 600
    t0 = time.perf_counter()
    with deadline(30):
        assert main(["train", "--config", str(f), "--print-config"]) == 2
    assert time.perf_counter() - t0 < 10
    one_line_error(capsys, str(f), "expands to more than")


def test_alias_bomb_in_a_study_file_and_as_its_name_is_refused(tmp_path, capsys):
    base = "grid: {strategy: [baseline], lr: [1.0e-3], seed: [0]}\n"
    for i, body in enumerate([BOMB + "name: s\nbase: {train: {steps: *i}}\n" + base,
                              BOMB + "name: *i\n" + base]):
        f = tmp_path / f"study{i}.yaml"
        f.write_text(body)
        with deadline(30):
            assert main(["study", str(f), "--out", str(tmp_path / f"out{i}")]) == 2
        one_line_error(capsys, "expands to more than")
        assert not (tmp_path / f"out{i}").exists()


def test_alias_bomb_in_an_override_is_refused(capsys, tmp_path):
    value = "{" + ", ".join(f"{chr(97 + i)}: &{chr(97 + i)} [" + ",".join(
        ["x"] * 9 if i == 0 else [f"*{chr(96 + i)}"] * 9) + "]" for i in range(9)) + "}"
    with deadline(30):
        assert main(["train", "--print-config", f"train.steps={value}"]) == 2
    one_line_error(capsys, "train.steps", "expands to more than")


def test_bounded_loader_limits(tmp_path):
    with pytest.raises(YAMLBoundError, match="deeper than"):
        safe_load("[" * 5000 + "]" * 5000)
    with pytest.raises(YAMLBoundError, match="deeper than"):  # depth reached through aliases
        safe_load("".join(f"l{i}: &l{i} [*l{i - 1}]\n" if i else "l0: &l0 [x]\n" for i in range(MAX_YAML_DEPTH + 5)))
    with pytest.raises(YAMLBoundError, match="recursive"):
        safe_load("x: &a [1, *a]")
    # ordinary documents, aliases included, still load
    assert safe_load("a: &a [1, 2]\nb: *a\nc: {d: 2024-01-01}") == {"a": [1, 2], "b": [1, 2], "c": {"d": "2024-01-01"}}


def test_a_key_set_twice_in_a_yaml_file_is_refused_with_its_line(tmp_path, capsys):
    """A mapping that sets one key twice (PyYAML kept the last value silently) is refused in one line naming the key
    and its line; a key brought in by a merge (``<<``) may still be set again below it."""
    f = tmp_path / "c.yaml"
    f.write_text("train:\n  steps: 3\n  steps: 4\n")
    assert main(["train", "--config", str(f), "--print-config"]) == 2
    assert "line 3" in one_line_error(capsys, str(f), "'steps' is set twice")
    s = tmp_path / "s.yaml"
    s.write_text("name: n\nbase:\n  model: {init_width: null}\n  model: {layout: peri}\ngrid: {strategy: [baseline]}\n")
    assert main(["sweep", str(s), "--dry-run"]) == 2
    one_line_error(capsys, str(s), "'model' is set twice")
    assert safe_load("a: &a {x: 1, y: 2}\nb: {<<: *a, x: 3}") == {"a": {"x": 1, "y": 2}, "b": {"x": 3, "y": 2}}


@pytest.mark.parametrize("kind", ["sweep", "study"])
def test_deeply_nested_grid_is_one_line(tmp_path, capsys, kind):
    f = tmp_path / "s.yaml"
    f.write_text("name: n\ngrid: {lr: " + "[" * 5000 + "]" * 5000 + "}\n")
    assert main([kind, str(f), "--dry-run"]) == 2
    one_line_error(capsys, str(f), "deeper than")


def test_yaml_inputs_must_be_regular_bounded_files(tmp_path, capsys):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with deadline(20):
        for path in (str(fifo), "/dev/zero"):
            assert main(["train", "--config", path, "--print-config"]) == 2
            one_line_error(capsys, path, "not a regular file")
            assert main(["sweep", path, "--dry-run"]) == 2
            one_line_error(capsys, "not a regular file")
    big = tmp_path / "big.yaml"
    big.write_text("train: {steps: 1}\n" + "#" * (2 << 20))
    with pytest.raises(ValueError, match="bytes"):
        load_yaml(big)


def test_binary_and_set_values_are_refused_with_the_key(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("train: {steps: !!binary aGVsbG8=}\n")
    with pytest.raises(ValueError, match=r"train\.steps is a bytes"):
        load_yaml(f)


def test_messages_quote_a_short_prefix(tmp_path, capsys):
    f = tmp_path / "c.yaml"
    f.write_text("train: {steps: [" + ", ".join(["1"] * 50000) + "]}\n")
    assert main(["train", "--config", str(f), "--print-config"]) == 2
    last = one_line_error(capsys, "train.steps")
    assert len(last) < 300
    assert len(short(list(range(100000)))) <= 60 and len(short("x" * 10**6)) <= 60


# ----------------------------------------------------------------------------------------- sweep and study files


STUDY = {"base": {"preset": "tiny", "train": {"steps": 2}}, "grid": {"strategy": ["baseline"], "lr": [1e-3],
                                                                       "seed": [0]}}


@pytest.mark.parametrize("kind", ["sweep", "study"])
@pytest.mark.parametrize("name", ["../../evil", "a/b", "..", ".", "x" * 500, "a\nb", ["a"]])
def test_a_name_that_is_no_folder_name_is_refused(tmp_path, capsys, monkeypatch, kind, name):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "deep" / "er").mkdir(parents=True)
    f = tmp_path / "deep" / "er" / "s.yaml"
    f.write_text(yaml.safe_dump({"name": name, **STUDY}))
    monkeypatch.chdir(tmp_path / "deep" / "er")
    before = sorted(p for p in tmp_path.rglob("*"))
    assert main([kind, str(f)]) == 2
    one_line_error(capsys, "name")
    assert sorted(p for p in tmp_path.rglob("*")) == before


def test_a_bundle_name_with_a_path_is_refused():
    with pytest.raises(ValueError, match="not a usable name"):
        spec_from_dict({"grid": {"strategy": [{"name": "../x", "strategy": "baseline"}]}})


def test_study_date_as_lr_is_one_line(tmp_path, capsys):
    f = tmp_path / "s.yaml"
    f.write_text("name: d\nbase: {preset: tiny}\ngrid: {strategy: [baseline], lr: [2024-01-01], seed: [0]}\n")
    assert main(["study", str(f), "--dry-run"]) == 2
    one_line_error(capsys, "optim.lr", "2024-01-01")


@pytest.mark.parametrize("kind", ["sweep", "study"])
def test_nested_lists_as_seeds_are_one_line(tmp_path, capsys, kind):
    f = tmp_path / "s.yaml"
    f.write_text("name: d\nbase: {preset: tiny}\ngrid: {strategy: [baseline], lr: [1.0e-3], seed: [[0], [1]]}\n")
    assert main([kind, str(f), "--dry-run"]) == 2
    one_line_error(capsys, "grid.seed")


@pytest.mark.parametrize("extend", ["1e308", "101", ".inf"])
def test_study_extend_out_of_range_is_refused_at_validation(extend):
    data = {**STUDY, "name": "e", "study": {"extend": yaml.safe_load(extend)}}
    with pytest.raises(ValueError, match="study.extend"):
        study_mod.parse(data)


def test_study_tune_of_the_wrong_kind_is_one_line():
    with pytest.raises(ValueError, match="tune"):
        spec_from_dict({**STUDY, "tune": 5})


# ------------------------------------------------------------------------------------------------- concurrency


def test_sweep_that_skipped_a_locked_run_exits_nonzero(tmp_path, capsys):
    spec = spec_from_dict(FAKE_SWEEP)
    out = tmp_path / "out"
    assert run_sweep(spec, out, train_cmd=FAKE, report=False, quiet=True) == 0
    held = out / "runs" / expand(spec)[0].name
    (held / rundir.DONE).unlink()  # killed before it finished ...
    with rundir.RunLock(held):  # ... and its dying orphan trainer still holds it
        assert run_sweep(spec, out, train_cmd=FAKE, report=False, quiet=True) == 1
    assert "1 run(s) skipped" in capsys.readouterr().err
    assert not rundir.is_done(held)
    assert run_sweep(spec, out, train_cmd=FAKE, report=False, quiet=True) == 0  # once free, the rerun finishes


def test_second_study_on_one_folder_is_refused_with_the_first_pid(tmp_path, capsys):
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"name": "two", **STUDY}))
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\n"
                               f"fd = os.open({str(out / rundir.LOCK)!r}, os.O_RDWR | os.O_CREAT)\n"
                               "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, f'{os.getpid()}\\n'.encode())\n"
                               "print('held', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(["study", str(f), "--out", str(out)]) == 2
        one_line_error(capsys, f"process {holder.pid}")
        assert sorted(p.name for p in out.iterdir()) == [rundir.LOCK]  # nothing written by the refused study
    finally:
        holder.kill()
        holder.wait()


# ------------------------------------------------------------------------------------------------ weak messages


def test_usage_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--lr", "1e-3,1e-2"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "usage" not in err, err
    assert "invalid float value" in err and "compare --lr" in err and "scalevec train --help" in err


@pytest.mark.parametrize("argv", [["train", "--lr", "-1e-3", "--print-config"],
                                  ["compare", "--lr", "-1e-3", "--dry-run"]])
def test_a_negative_lr_reaches_the_lr_check(capsys, argv):
    assert main(argv) == 2
    one_line_error(capsys, "optim.lr=-0.001 must be finite and > 0")


def _enospc(path=None):
    import errno

    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path) if path else None)


def test_full_disk_in_prepare_data_names_the_place_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    from scalevec.data import prepared

    src = tmp_path / "corpus.txt"
    src.write_text("".join(f"document {i}: some words of text.\n\n\n" for i in range(50)))
    real = prepared._ShardWriter._write

    def full(self, arr):
        real(self, arr[: len(arr) // 2])
        raise _enospc(self.dir / f"{self._name}.bin")

    monkeypatch.setattr(prepared._ShardWriter, "_write", full)
    out = tmp_path / "data" / "prep"
    assert main(["prepare-data", str(src), "--out", str(out), "--quiet"]) == 2
    one_line_error(capsys, "No space left on device", str(out), "free space")
    assert not out.exists() and list((tmp_path / "data").iterdir()) == []


def test_full_disk_in_report_leaves_no_truncated_figure(tmp_path, capsys, monkeypatch):

    spec = spec_from_dict(FAKE_SWEEP)
    out = tmp_path / "out"
    assert run_sweep(spec, out, train_cmd=FAKE, report=False, quiet=True) == 0
    real = os.fdopen

    def full(fd, mode="r", *a, **k):
        # a figure is written whole into a new file beside its name (outpath.replace_file); a full disk fails that
        # write, leaving the new file created and empty
        name = os.readlink(f"/proc/self/fd/{fd}")
        if "w" in mode and ".png." in name:
            os.close(fd)
            raise _enospc(name)
        return real(fd, mode, *a, **k)

    monkeypatch.setattr(os, "fdopen", full)
    assert main(["report", str(out)]) == 2
    one_line_error(capsys, "No space left on device", "free space", str(out))
    assert not list(out.glob("*.png")) and not list(out.glob(".*tmp*"))
    monkeypatch.setattr(os, "fdopen", real)
    assert main(["report", str(out)]) == 0
    assert (out / "loss_curves.png").stat().st_size > 0


def test_step_time_that_the_load_made_implausible_is_flagged():
    import math

    from scalevec.experiments.analysis import StrategyResult
    from scalevec.experiments.tables import LEGEND, LOAD_MARK, step_time_text

    def result(extra: int, ratio: float) -> StrategyResult:
        r = StrategyResult.__new__(StrategyResult)
        r.extra_params, r.step_time_ratio = extra, ratio
        return r

    assert step_time_text(result(0, 1.0), is_baseline=True) == "1.00×"
    assert step_time_text(result(1663, 0.92)) == f"0.92× {LOAD_MARK}"  # more work, 8 % faster: the load changed
    assert step_time_text(result(1663, 0.56)) == f"0.56× {LOAD_MARK}"
    assert step_time_text(result(1663, 0.97)) == "0.97×"  # within noise
    assert step_time_text(result(1663, 1.10)) == "1.10×"
    assert step_time_text(result(-336, 0.90)) == "0.90×"  # fewer parameters: faster is plausible
    assert step_time_text(result(1663, math.nan)) == "—"
    assert LOAD_MARK in LEGEND and "load" in LEGEND


@pytest.mark.parametrize("body", ["strategy: {x}", "preset: {x}", "optim: {{name: {x}}}", "data: {{source: {x}}}"])
def test_a_huge_value_is_quoted_as_a_short_prefix(tmp_path, capsys, body):
    f = tmp_path / "c.yaml"
    f.write_text(body.format(x="x" * 200_000) + "\n")
    assert main(["train", "--config", str(f), "--out", str(tmp_path / "out"), "--steps", "1"]) == 2
    one_line_error(capsys)
    assert not (tmp_path / "out").exists()


def test_a_fifo_as_data_source_is_refused(tmp_path, capsys):
    fifo = tmp_path / "corpus.txt"
    os.mkfifo(fifo)
    with deadline(60):
        assert main(["train", "--preset", "tiny", "--data", str(fifo), "--steps", "1", "--out",
                     str(tmp_path / "out"), "--quiet"]) == 2
    one_line_error(capsys, str(fifo), "not a regular file")


def test_step_time_measured_under_another_load_is_flagged():
    """A step-time ratio from runs whose CPU seconds per wall second differ from the baseline's by more than 20 %
    is marked ‡ whichever way it points (`none` showed 1.51x the baseline from load alone, unmarked)."""
    from scalevec.experiments.analysis import StrategyResult, cpu_share
    from scalevec.experiments.tables import LEGEND, LOAD_MARK, step_time_text

    def result(ratio: float, share_change: float) -> StrategyResult:
        r = StrategyResult.__new__(StrategyResult)
        r.extra_params, r.step_time_ratio, r.cpu_share_change = 0, ratio, share_change
        return r

    assert step_time_text(result(1.51, 0.45)) == f"1.51× {LOAD_MARK}"  # slower, and it ran on other terms
    assert step_time_text(result(0.80, -0.30)) == f"0.80× {LOAD_MARK}"
    assert step_time_text(result(1.51, 0.10)) == "1.51×"  # the same load: the ratio stands
    assert step_time_text(result(1.51, 0.45), is_baseline=True) == "1.51×"
    assert cpu_share({"cpu_time_s": 0.9, "step_time_s": 0.45}) == 2.0  # two threads busy the whole step
    assert cpu_share({"step_time_s": 0.45}) != cpu_share({"step_time_s": 0.45})  # nan: not logged
    assert "CPU seconds per wall second" in LEGEND


def test_yaml_1_1_octal_and_base_60_numbers_are_refused_not_misread(tmp_path, capsys):
    """YAML 1.1 reads ``010`` as 8 and ``1:30`` as 90, so ``steps: 010`` trained 8 steps: a file is refused in one
    line naming the value and its line; on the command line the text is the field's own (``train.steps=010`` is
    10, ``1:30`` refused as no whole number). Hex ``0x10`` and ``1_000`` keep their one meaning."""
    f = tmp_path / "c.yaml"
    for text, value in [("010", "010"), ("1:30", "1:30"), ("-007", "-007"), ("1:30.5", "1:30.5")]:
        f.write_text(f"train:\n  steps: 3\n  seed: {text}\n")
        assert main(["train", "--config", str(f), "--print-config"]) == 2
        assert "line 3" in one_line_error(capsys, str(f), f"{value} is a base-8 or base-60 number in YAML 1.1")
    assert safe_load("a: 0x10\nb: 1_000\nc: 0\nd: '010'\ne: 0.5\nf: 10:00 am") == {
        "a": 16, "b": 1000, "c": 0, "d": "010", "e": 0.5, "f": "10:00 am"}
    from scalevec.resolve import resolve_config
    assert resolve_config("tiny", "unified", ["train.steps=010"]).train.steps == 10
    with pytest.raises(ValueError, match=r"train.steps must be a whole number; got '1:30'"):
        resolve_config("tiny", "unified", ["train.steps=1:30"])


@pytest.mark.parametrize("text, got", [("", "None"), ("- 1\n", "[1]"), ("just text\n", "'just text'")])
def test_a_yaml_file_that_is_no_mapping_is_refused_in_the_one_form(tmp_path, capsys, text, got):
    """An empty file, a list or a bare word as a config is one line in the one form (what it must be, an example,
    what it holds, the fix); it said only 'must hold a mapping'."""
    f = tmp_path / "c.yaml"
    f.write_text(text)
    assert main(["train", "--config", str(f), "--print-config"]) == 2
    one_line_error(capsys, f"config file {f} must be a mapping of keys to values, like train: {{steps: 100}}; "
                           f"got {got}; write key: value lines")
