"""Live sweep progress: step and loss from metrics.jsonl, a FLOP-weighted ETA, run logs with output."""

import io
import json
import os

import pytest

from scalevec.experiments.progress import GridProgress, format_seconds
from scalevec.experiments.sweep import run_sweep, spec_from_dict
from scalevec.training.rundir import last_row


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def write_rows(run_dir, rows, tail=""):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


def test_last_row_skips_eval_rows_and_a_cut_off_line(tmp_path):
    """rundir.last_row, which the progress line reads: the last complete train row wins; an eval row after it and
    a half-written line are ignored; a row cut by the tail window is skipped, not an error."""
    write_rows(tmp_path / "r", [{"kind": "train", "step": 3, "loss": 2.0}, {"kind": "train", "step": 4, "loss": 1.5},
                                {"kind": "eval", "step": 5, "val_loss": 1.7}], tail='{"kind": "train", "st')
    assert last_row(tmp_path / "r", "train") == {"kind": "train", "step": 4, "loss": 1.5}
    assert last_row(tmp_path / "r", "eval") == {"kind": "eval", "step": 5, "val_loss": 1.7}
    tail = len(json.dumps({"kind": "eval", "step": 5, "val_loss": 1.7})) + len('{"kind": "train", "st') + 5
    assert last_row(tmp_path / "r", "train", tail_bytes=tail) is None  # the window starts inside step 4's row
    assert last_row(tmp_path / "missing", "train") is None


def test_eta_extrapolates_this_sessions_weighted_work(tmp_path):
    """Runs of weight 1 and 3: run a at step 50/100 after 10 s has done 1/8 of the grid, so 70 s are left;
    a resumed run b counts only the steps it took in this session."""
    clock = Clock()
    p = GridProgress([("a", tmp_path / "a", 100, 1.0), ("b", tmp_path / "b", 100, 3.0)],
                     stream=io.StringIO(), tty=False, clock=clock)
    assert p.eta() == (0.0, None) and p.line().endswith("0% · ETA ?")
    p.started("a")
    write_rows(tmp_path / "a", [{"kind": "train", "step": 1, "loss": 2.5}])  # 2 steps: 0.5 % of the grid
    clock.t += 5
    assert p.line().endswith("ETA ?") and p.eta() == (0.005, None)  # start-up dominates the first 1 %
    write_rows(tmp_path / "a", [{"kind": "train", "step": 49, "loss": 2.0}])  # 50 steps taken
    clock.t += 5
    assert "a step 50/100 loss 2.0000" in p.line()
    assert p.eta() == (0.125, 70.0) and p.line().endswith("12% · ETA 1m10s")
    write_rows(tmp_path / "b", [{"kind": "train", "step": 49, "loss": 3.0}])  # b resumes at 50 %
    p.finished("a")
    p.started("b", resumed=True)
    frac, left = p.eta()  # done: a (1) + 3 * 0.5 of 4; this session: all of a (1), none of b yet
    assert frac == 2.5 / 4 and left == 10 * 1.5 / 1.0
    write_rows(tmp_path / "b", [{"kind": "train", "step": 74, "loss": 2.5}])
    clock.t += 10
    assert p.line().startswith("[1/2 done] b step 75/100 loss 2.5000")
    assert p.eta() == (3.25 / 4, 20 * 0.75 / (1.0 + 0.75))


def _eta_trace(tmp_path, seconds: int, stall_after: int | None = None) -> list[float]:
    """The ETA redrawn every second of a synthetic run: 30 s of start-up, then 1 step/s, a metrics row every
    10 steps (log_every 10) until ``stall_after`` seconds, of a 400-step run (what a TTY shows)."""
    clock = Clock()
    p = GridProgress([("a", tmp_path / "a", 400, 1.0)], stream=io.StringIO(), tty=True, clock=clock)
    p.started("a")
    t0, etas = clock.t, []
    for t in range(1, seconds + 1):
        clock.t = t0 + t
        steps = max(0, t - 30)
        if steps and steps % 10 == 0 and (stall_after is None or t <= stall_after):
            write_rows(tmp_path / "a", [{"kind": "train", "step": steps - 1, "loss": 2.0}])
        p.line()
        left = p.eta()[1]
        if left is not None:
            etas.append(left)
    return etas


def test_eta_falls_between_rows_instead_of_climbing(tmp_path):
    """At a steady step rate the ETA never rises: it falls by 1 s per s between rows (the elapsed-time rule
    climbed between rows here, by 1.5 to 39 s per s, in 144 of the 160 seconds), and it ends near the truth."""
    etas = _eta_trace(tmp_path, 200)
    assert len(etas) > 150 and all(b <= a + 1e-9 for a, b in zip(etas, etas[1:]))
    assert sum(a - b == pytest.approx(1.0) for a, b in zip(etas, etas[1:])) > 0.8 * len(etas)  # mostly -1 s per s
    truth = 400 - (200 - 30)  # 230 s of steps left at 1 step/s
    assert truth <= etas[-1] <= truth * 1.2  # the start-up (30 s of 200) still weighs on the rate


def test_eta_holds_when_rows_stop(tmp_path):
    """Once the rows stop, the ETA falls for one gap (10 s) at most, then holds: a stalled run is not counted
    down to 0."""
    etas = _eta_trace(tmp_path, 160, stall_after=100)
    held = etas[-40:]
    assert len(set(held)) == 1 and held[0] > 200


def test_restarted_run_ignores_rows_of_the_earlier_attempt(tmp_path):
    """A run started afresh shows step 0 while metrics.jsonl still holds the rows of a failed attempt."""
    write_rows(tmp_path / "a", [{"kind": "train", "step": 80, "loss": 9.0}])
    old = os.path.getmtime(tmp_path / "a" / "metrics.jsonl") - 60
    os.utime(tmp_path / "a" / "metrics.jsonl", (old, old))
    p = GridProgress([("a", tmp_path / "a", 100, 1.0)], stream=io.StringIO(), tty=False, clock=Clock())
    p.started("a")
    assert "a step 0/100" in p.line() and "9.0" not in p.line()


def test_tty_redraws_one_line_and_messages_clear_it(tmp_path):
    """On a TTY the status is redrawn in place (\\r) and a message first erases it; otherwise plain lines."""
    out = io.StringIO()
    p = GridProgress([("a", tmp_path / "a", 10, 1.0)], stream=out, tty=True, clock=Clock())
    p.show()
    p.show()
    p.say("[1/1] a: val_loss 1.0")
    assert out.getvalue().count("\r\033[K") == 3 and out.getvalue().endswith("\r\033[K[1/1] a: val_loss 1.0\n")
    plain = io.StringIO()
    q = GridProgress([("a", tmp_path / "a", 10, 1.0)], stream=plain, tty=False, clock=Clock())
    q.show()
    assert plain.getvalue() == "progress [0/1 done] starting | 0% · ETA ?\n"
    assert format_seconds(42) == "42s" and format_seconds(370) == "6m10s" and format_seconds(7500) == "2h05m"


@pytest.mark.slow  # a real trainer subprocess: about 8 s
def test_sweep_prints_progress_and_the_log_holds_the_trainers_output(tmp_path, capsys, monkeypatch):
    """A real (tiny) sweep run: periodic progress lines on stdout; OUT/runs/NAME.log holds the step lines."""
    monkeypatch.setenv("SCALEVEC_PROGRESS_EVERY", "0.2")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cache = str(tmp_path / "cache")
    spec = spec_from_dict({"base": {"preset": "tiny", "data.val_tokens": 1024, "data.cache_dir": cache,
                                    "train": {"steps": 20, "batch_size": 2, "seq_len": 16, "eval_every": 20,
                                              "log_every": 1}},
                           "grid": {"strategy": ["baseline"]}})
    assert run_sweep(spec, tmp_path / "out", report=False) == 0
    out = capsys.readouterr().out
    progress = [ln for ln in out.splitlines() if ln.startswith("progress [")]
    assert progress and "ETA" in progress[-1]
    assert "[1/1] baseline: val_loss" in out
    log = (tmp_path / "out" / "runs" / "baseline.log").read_text()
    assert "--quiet" not in log and "step      0/20 loss" in log and "done: val_loss" in log


def test_study_scope_adds_the_whole_studys_bound(tmp_path):
    """Inside a study a sub-sweep's line also shows the study's time left at most: 10 units of work to come at the
    folder's 2 s per unit before this sub-sweep has its own rate (20 s), then at its own rate (20 s per unit after
    half of its one unit in 10 s: 9.5 units left, 190 s); when it stops, its finished work leaves the bound and its
    rate is kept for the next sub-sweep."""
    from scalevec.experiments.progress import StudyScope

    clock, scope = Clock(), StudyScope(left=10.0, rate=2.0)
    p = GridProgress([("a", tmp_path / "a", 100, 1.0)], stream=io.StringIO(), tty=False, clock=clock, scope=scope)
    p.started("a")
    assert p.study_eta() == 20.0 and p.line().endswith("0% · ETA ? · study ≤ 20s")
    write_rows(tmp_path / "a", [{"kind": "train", "step": 49, "loss": 2.0}])
    clock.t += 10
    assert p.line().endswith("50% · ETA 10s · study ≤ 3m10s") and p.study_eta() == 190.0  # line() reads the rows
    write_rows(tmp_path / "a", [{"kind": "train", "step": 99, "loss": 1.9}])
    p.finished("a")
    p.stop()
    p.stop()  # an interrupted sweep may stop twice: its work is taken off once
    assert scope.left == 9.0 and scope.rate == 10.0  # 1 unit in 10 s: the next sub-sweep starts from it
    assert GridProgress([("b", tmp_path / "b", 10, 1.0)], stream=io.StringIO(), tty=False, clock=Clock(),
                        scope=StudyScope(left=5.0)).study_eta() is None  # no rate known yet: "?"
