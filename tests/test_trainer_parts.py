"""The trainer's parts (DESIGN.md §8): monitors as callbacks, the health guard's own state, checkpoints
by default and the resume header, the peak-memory field of the metrics rows on CUDA."""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import sys
from itertools import accumulate
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from monitorchild import RunningLoss, tiny_cfg
from scalevec import build_model
from scalevec.config import RunConfig
from scalevec.resolve import resolve_config
from scalevec.training import monitors
from scalevec.training import trainer as train_mod
from scalevec.training.checkpoint import layout
from scalevec.training.console import Console
from scalevec.training.health import HealthGuard
from scalevec.training.monitors import Monitor, StepEvent
from scalevec.training.telemetry import ScaleTelemetry
from scalevec.training.trainer import Trainer, train

CHILD = str(Path(__file__).with_name("monitorchild.py"))


def tiny_run(tmp_path, steps=6, **over):
    """A seconds-long config: tiny preset, bundled Shakespeare as bytes, small validation set."""
    items = {"train.steps": steps, "train.batch_size": 4, "train.seq_len": 32, "train.eval_every": 3,
             "train.log_every": 2, "train.eval_batch_size": 8, "data.val_tokens": 512,
             "data.cache_dir": str(tmp_path / "cache"), **over}
    return resolve_config("tiny", "unified", [f"{k}={v}" for k, v in items.items()])


def rows(run, kind):
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


def test_a_new_monitor_is_one_class_passed_in(tmp_path):
    """A monitor passed to the trainer beside the defaults sees every step, every evaluation, every row and a
    close; nothing is patched and the run's numbers do not change."""

    class Seen(Monitor):
        def __init__(self):
            self.events = {"steps": [], "evals": [], "rows": [], "closed": 0}

        def after_step(self, ev):
            self.events["steps"].append(ev.step)

        def after_eval(self, ev):
            self.events["evals"].append(ev.step)

        def on_row(self, row):
            self.events["rows"].append(row["kind"])

        def close(self):
            self.events["closed"] += 1

    plain = train(tiny_run(tmp_path), tmp_path / "plain", quiet=True)
    seen = Seen()
    watched = train(tiny_run(tmp_path), tmp_path / "watched", quiet=True, monitors=[*monitors.default(), seen])
    assert seen.events["steps"] == list(range(6)) and seen.events["evals"] == [3, 6]
    assert seen.events["rows"].count("train") == 4 and seen.events["rows"].count("eval") == 2
    assert seen.events["closed"] >= 1
    assert [r["loss"] for r in rows(tmp_path / "plain", "train")] == [r["loss"] for r in rows(tmp_path / "watched",
                                                                                              "train")]
    assert plain["final_val_loss"] == watched["final_val_loss"]


@pytest.mark.slow  # a training subprocess killed, two tiny trainings
def test_monitor_state_survives_a_kill_and_resume_bitwise(tmp_path):
    """A stateful monitor (a running mean of the loss) killed with its process after step 4 and resumed from
    checkpoint 4 ends with the state of the straight run, bit for bit (it would count 2 steps, not 6, if its
    state were not restored); the checkpoint stores it under its name."""
    cache = str(tmp_path / "cache")
    straight = RunningLoss()
    train(tiny_cfg(cache), tmp_path / "straight", quiet=True, monitors=[*monitors.default(), straight])
    out = tmp_path / "killed"
    child = subprocess.run([sys.executable, CHILD, str(out), cache, "4"], timeout=300, capture_output=True, text=True)
    assert child.returncode == -signal.SIGKILL, child.stderr
    state = json.loads((out / "checkpoints" / "step_0000004" / "train_state.json").read_text())
    running = list(accumulate(r["loss"] for r in rows(tmp_path / "straight", "train")))  # left to right, as the monitor
    assert state["extra"]["monitors"] == {"RunningLoss": {"n": 4, "total": running[3]}}
    resumed = RunningLoss()
    train(tiny_cfg(cache), out, resume=True, quiet=True, monitors=[*monitors.default(), resumed])
    assert (resumed.n, resumed.total) == (straight.n, straight.total) == (6, running[5])


def test_a_checkpoint_without_monitor_state_resumes(tmp_path):
    """A run with stateless monitors stores no monitor state (the checkpoint format of before monitors kept
    state); resumed with a stateful monitor, the run is bitwise the straight one and the monitor starts empty."""
    cfg = tiny_run(tmp_path, **{"train.ckpt_every": 2})
    train(cfg, tmp_path / "straight", quiet=True)
    out = tmp_path / "split"
    assert train(cfg, out, stop_at=4, quiet=True) == {"stopped_at": 4}
    extra = json.loads((out / "checkpoints" / "step_0000004" / "train_state.json").read_text())["extra"]
    assert "monitors" not in extra
    late = RunningLoss()
    train(cfg, out, resume=True, quiet=True, monitors=[*monitors.default(), late])
    losses = [[r["loss"] for r in rows(run, "train")] for run in (out, tmp_path / "straight")]
    assert late.n == 2 and losses[0] == losses[1] != []


def test_two_monitors_with_one_name_are_refused(tmp_path):
    """Two monitors under one name would overwrite each other's checkpoint state: refused before anything is
    written; a set ``name`` tells two of one class apart."""
    with pytest.raises(ValueError, match="two monitors are named 'RunningLoss'"):
        Trainer(tiny_run(tmp_path), tmp_path / "run", monitors=[RunningLoss(), RunningLoss()])
    assert not (tmp_path / "run").exists()
    second = RunningLoss()
    second.name = "RunningLoss2"
    assert [m.name for m in (RunningLoss(), second)] == ["RunningLoss", "RunningLoss2"]


def test_a_monitor_name_is_a_non_empty_str():
    """A name that is not a str (a checkpoint's JSON would give it back as one, so a resumed run would find no state
    under it) or is empty is refused when set."""
    m = RunningLoss()
    for bad in (3, "", None):
        with pytest.raises(TypeError, match="a monitor's name is a non-empty str"):
            m.name = bad
    assert m.name == "RunningLoss"


def test_health_guard_state_round_trips():
    """The guard's state survives ``state_dict`` -> JSON -> ``load_state_dict``; a step-0 checkpoint is a fresh
    start (the reference is the first loss again)."""
    cfg = RunConfig()
    guard = HealthGuard(cfg, "unused", write=False)
    for step, loss in enumerate([5.6, 5.2, 4.9]):
        guard.check_step(step, [loss, 0.0, 1.0])
    back = HealthGuard(cfg, "unused", write=False)
    back.load_state_dict(json.loads(json.dumps(guard.state_dict())))
    assert back.state_dict() == guard.state_dict() and back.reference == max(5.6, math.log(cfg.model.vocab_size))
    fresh = HealthGuard(cfg, "unused", write=False)
    fresh.load_state_dict(guard.state_dict(), fresh_start=True)
    assert fresh.reference is None


def test_peak_memory_in_rows_on_cuda(monkeypatch):
    """On a CUDA device a train row carries ``max_memory_gib`` (``torch.cuda.max_memory_allocated`` / 2**30);
    on CPU the row has no such field. CUDA is faked: only the allocator counter is read."""
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2 ** 30)
    cfg = resolve_config("tiny", "unified", [])
    logged = []
    for device in ("cuda", "cpu"):
        model = build_model(cfg.model, cfg.scale, seed=0)
        fake = SimpleNamespace(cfg=cfg, device=torch.device(device), flops_per_token=1.0, peak_flops=None,
                               model=model, telemetry=ScaleTelemetry(model), log=logged.append)
        rows_monitor = monitors.MetricsRows()
        rows_monitor.start(fake)
        rows_monitor.after_step(StepEvent(0, 1, 5.0, 0.0, 1.0, 1e-3, 128, 0.5, 0.5, elapsed=0.5, logged=True,
                                          evaluates=False))
    assert logged[0]["max_memory_gib"] == 3.0 and "max_memory_gib" not in logged[1]


def test_runs_checkpoint_periodically_by_default():
    """``train.ckpt_every`` is on by default: a kill loses at most that many steps."""
    assert RunConfig().train.ckpt_every > 0


def test_checkpoint_by_minutes_and_two_kept(tmp_path, monkeypatch):
    """With ``CKPT_MINUTES`` elapsed after every step, each step is checkpointed and pruning keeps the two newest
    (the guard's look-back off); the losses equal a run that checkpoints only at the end."""
    monkeypatch.setattr(train_mod, "CKPT_MINUTES", 0.0)
    cfg = tiny_run(tmp_path, **{"train.ckpt_every": 1000, "train.guard_dead_steps": 0})
    train(cfg, tmp_path / "often", quiet=True)
    assert [p.name for p in layout.checkpoint_dirs(tmp_path / "often")] == ["step_0000006", "step_0000005"]
    monkeypatch.setattr(train_mod, "CKPT_MINUTES", 1e9)
    train(cfg, tmp_path / "once", quiet=True)
    assert [p.name for p in layout.checkpoint_dirs(tmp_path / "once")] == ["step_0000006"]
    assert rows(tmp_path / "often", "train") != [] and (
        [r["loss"] for r in rows(tmp_path / "often", "train")] == [r["loss"] for r in rows(tmp_path / "once", "train")])


def test_resume_says_where_it_continues(tmp_path, capsys):
    """A resumed run prints one line naming the checkpoint and the step it continues from."""
    cfg = tiny_run(tmp_path, **{"train.ckpt_every": 2})
    out = tmp_path / "run"
    assert train(cfg, out, stop_at=3, quiet=True) == {"stopped_at": 3}
    capsys.readouterr()
    trainer = Trainer(cfg, out, resume=True)
    trainer.fit()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"resume: {out} continues from checkpoint {out / 'checkpoints' / 'step_0000003'} (step 3 of 6)"


STEP_LINE = re.compile(r"step +(\d+)/(\d+) loss ([\d.]+) lr \S+ grad \S+ ([\d,]+) tok/s mfu ([\d.]+)% "
                       r"(mem|rss) ([\d.]+) GiB elapsed (\S+) eta (\S+)")


@pytest.mark.slow  # a real training subprocess
def test_piped_train_prints_elapsed_eta_speed_mfu_and_memory(tmp_path):
    """`scalevec train ... | cat` (stdout and stderr not terminals): each log step is one line with elapsed
    time, the ETA, tokens/s, MFU and memory; tokens/s and MFU are the metrics row's, and the last step has no
    time left."""
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "scalevec", "train", "--preset", "tiny", "--steps", "4",
                           "--batch-size", "4", "--seq-len", "32", "--threads", "1", "--out", str(out),
                           "data.val_tokens=512", "train.log_every=1", f"data.cache_dir={tmp_path / 'cache'}"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = [m for m in map(STEP_LINE.match, proc.stdout.splitlines()) if m]
    assert [(int(m[1]), int(m[2])) for m in lines] == [(0, 4), (1, 4), (2, 4), (3, 4)], proc.stdout
    for m, row in zip(lines, rows(out, "train")):
        assert int(m[4].replace(",", "")) == round(row["tok_per_s"]) and float(m[5]) == round(100 * row["mfu"], 2)
        assert float(m[7]) > 0 and m[6] == "rss"  # the process's peak resident set on CPU
    assert lines[-1][9] == "0s" and lines[-1][8].endswith("s")


def test_step_line_reads_speed_mfu_memory_and_the_sessions_eta(monkeypatch):
    """A step line of a session resumed at step 2 of 10: 8 s for its 4 steps so far give 2 s a step and an ETA of
    8 s for the 4 left; tokens/s and MFU from the step's time and the peak; CUDA's memory from the allocator."""
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2 ** 30)
    clock = iter([100.0, 108.0])
    monkeypatch.setattr(monitors.time, "perf_counter", lambda: next(clock))
    ctx = SimpleNamespace(device=torch.device("cuda"), flops_per_token=1.0, peak_flops=1e4, first=2, end=10,
                          console=Console(quiet=False))
    progress = monitors.Progress()
    progress.start(ctx)
    ev = StepEvent(5, 6, 2.5, 0.0, 0.5, 1e-3, 1000, 0.5, 0.5, elapsed=40.0, logged=True, evaluates=False)
    assert progress.line(ev) == ("step      5/10 loss 2.5000 lr 1.00e-03 grad 0.500 2,000 tok/s mfu 20.00% "
                                 "mem 3.00 GiB elapsed 40s eta 8s")


def test_monitor_state_json_would_change_is_refused_at_the_checkpoint(tmp_path):
    """A monitor state that a checkpoint's JSON would not give back as it is (an int key comes back a str, a tensor
    not at all) fails the checkpoint with a TypeError naming the monitor, instead of a resumed run reading other
    keys or json's bare error."""

    class PerStep(Monitor):
        def __init__(self, value):
            self.name, self.value, self.seen = f"PerStep{type(value).__name__}", value, {}

        def after_step(self, ev):
            self.seen[ev.step] = self.value

        def state_dict(self):
            return {"seen": self.seen}

    keyed = PerStep(1.0)
    keyed.seen = {1: 1.0}
    with pytest.raises(TypeError, match=r"'PerStepfloat': state_dict\(\) has the key 1 \(int\) in state\['seen'\]"):
        monitors.checkpoint_state(keyed)
    tensor = PerStep(torch.ones(2))
    tensor.seen = {"1": tensor.value}
    with pytest.raises(TypeError, match=r"monitor 'PerStepTensor': state_dict\(\) holds a Tensor at state\['seen'\]"):
        monitors.checkpoint_state(tensor)
    plain = PerStep(2.5)
    plain.seen = {"1": [2.5, None, True, "x"]}
    assert monitors.checkpoint_state(plain) == {"seen": {"1": [2.5, None, True, "x"]}}
    cfg = tiny_run(tmp_path, **{"train.ckpt_every": 2})
    with pytest.raises(TypeError, match="monitor 'PerStepfloat'"):
        train(cfg, tmp_path / "run", quiet=True, monitors=[*monitors.default(), PerStep(1.0)])
    assert not list((tmp_path / "run" / "checkpoints").glob("step_*"))


def test_a_monitor_state_that_is_not_a_dict_is_refused_at_the_checkpoint(tmp_path):
    """A state_dict() returning a list or str (truthy, so stored) made every checkpoint of the run fail the resume's
    check of its extras, leaving a run that could only be deleted: refused at the checkpoint, naming the monitor."""

    class Listed(Monitor):
        def state_dict(self):
            return [1, 2]

    with pytest.raises(TypeError, match=r"monitor 'Listed': state_dict\(\) returned a list, not a dict"):
        monitors.checkpoint_state(Listed())
    cfg = tiny_run(tmp_path, steps=2, **{"train.ckpt_every": 1})
    with pytest.raises(TypeError, match="monitor 'Listed'"):
        train(cfg, tmp_path / "run", quiet=True, monitors=[*monitors.default(), Listed()])
    assert not list((tmp_path / "run" / "checkpoints").glob("step_*"))


def test_a_resume_without_a_monitor_keeps_its_stored_state(tmp_path, capsys):
    """A run resumed without one of its stateful monitors (``scalevec train --resume`` passes only the defaults)
    carries that monitor's stored state into its later checkpoints, with a note, so that a resume with it again
    finds it; it was dropped at the next checkpoint without a word."""
    cfg = tiny_run(tmp_path, **{"train.ckpt_every": 2})
    out = tmp_path / "run"
    first = RunningLoss()
    train(cfg, out, stop_at=2, quiet=True, monitors=[*monitors.default(), first])
    train(cfg, out, stop_at=4, quiet=True, resume=True)
    assert "checkpoint holds state of monitor(s) 'RunningLoss', not passed to this run" in capsys.readouterr().err
    extra = json.loads((out / "checkpoints" / "step_0000004" / "train_state.json").read_text())["extra"]
    assert extra["monitors"] == {"RunningLoss": {"n": 2, "total": first.total}}
    again = RunningLoss()
    train(cfg, out, resume=True, quiet=True, monitors=[*monitors.default(), again])
    total = first.total
    for r in rows(out, "train"):  # steps 4 and 5 are both logged; added left to right, as the monitor does
        total += r["loss"] if r["step"] >= 4 else 0.0
    assert (again.n, again.total) == (4, total)


def test_a_monitor_whose_load_state_dict_raises_fails_the_resume_naming_it(tmp_path):
    """A monitor whose load_state_dict raises on the stored state fails the resume with a ValueError naming the
    monitor and the checkpoint (it was the bare KeyError of its code), and the run is left as it was."""

    class Renamed(RunningLoss):
        def load_state_dict(self, state):
            self.n = state["count"]  # a key its older version did not write

    cfg = tiny_run(tmp_path, **{"train.ckpt_every": 2})
    out = tmp_path / "run"
    train(cfg, out, stop_at=4, quiet=True, monitors=[*monitors.default(), RunningLoss()])
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and p.name != "LOCK"}
    with pytest.raises(ValueError, match=r"monitor 'RunningLoss': load_state_dict\(\) raised KeyError\('count'\) on "
                                         r"the state of checkpoint step_0000004"):
        newer = Renamed()
        newer.name = "RunningLoss"
        train(cfg, out, resume=True, quiet=True, monitors=[*monitors.default(), newer])
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and p.name != "LOCK"} == before


def test_a_stateful_monitor_that_ran_another_run_is_refused(tmp_path):
    """One RunningLoss instance passed to a second run would carry the first run's count and sum into the second's
    checkpoints without a word: refused before anything is written; the same instance resuming its own run is fine."""
    cfg = tiny_run(tmp_path, steps=2)
    shared = RunningLoss()
    train(cfg, tmp_path / "a", stop_at=1, quiet=True, monitors=[*monitors.default(), shared])
    with pytest.raises(ValueError, match=r"monitor 'RunningLoss' holds the state of run .*/a; pass a new instance"):
        Trainer(cfg, tmp_path / "b", monitors=[*monitors.default(), shared])
    assert not (tmp_path / "b").exists()
    train(cfg, tmp_path / "a", resume=True, quiet=True, monitors=[*monitors.default(), shared])
    assert shared.n == 2


def test_a_monitor_whose_close_raises_still_releases_the_run_and_closes_the_others(tmp_path):
    """A close() that raises left the run directory locked by its own process (a resume in the same process was
    refused as 'in use') and the monitors after it unclosed: its error propagates, every other monitor is closed,
    the lock is released, and a resume without it finishes the run."""

    class BadClose(Monitor):
        def close(self):
            raise RuntimeError("close broke")

    class Closed(Monitor):
        closed = 0

        def close(self):
            self.closed += 1

    cfg, out, after = tiny_run(tmp_path, steps=2), tmp_path / "run", Closed()
    with pytest.raises(RuntimeError, match="close broke"):
        train(cfg, out, quiet=True, monitors=[*monitors.default(), BadClose(), after])
    assert after.closed >= 1
    train(cfg, out, resume=True, quiet=True)
    assert (out / "DONE").is_file()
