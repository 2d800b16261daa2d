"""Live progress of a sweep or comparison: which runs train, their step and loss, an ETA for the grid (DESIGN.md §9).

``GridProgress`` watches the ``metrics.jsonl`` of the runs it is told have started (the trainer appends
a row every ``train.log_every`` steps; ``rundir.last_row`` reads the last one), so it needs nothing from
the trainer processes but their run directories. On a terminal it redraws one line every second::

    [2/6 done] unified_s0 step 120/400 loss 2.3456 | none_s1 step 80/400 loss 2.5012 | 41% · ETA 6m10s

Elsewhere (a log file, CI) it prints the same text as a plain line every ``interval`` seconds (60 by
default, ``SCALEVEC_PROGRESS_EVERY`` to change it), and messages go through ``say`` so that they never
collide with the status line.

The ETA weights each run by its training FLOPs (6 · params · tokens, as ``sweep --dry-run``) and
extrapolates the rate of this session's work (a resumed run counts from the step it resumed at), measured
up to the newest metrics row seen: ``ETA = remaining work / rate - time since that row``. Between rows the
ETA so falls by a second per second (computed from the elapsed time alone it climbed between rows,
a staircase, since the work done only moves when a row arrives), for at most the longest gap seen between
rows, after which it holds: a run that stopped writing rows is not counted down to 0. It is ``?`` until this
session has done 1 % of the grid's work (before that, start-up time dominates the rate).

Inside ``scalevec study`` each phase is a sub-sweep, so the grid's ETA covers one phase; a ``StudyScope`` adds the
whole study's bound after it::

    [0/6 done] none_lr0.002_s0 step 700/2241 | none_lr0.002_s1 step 690/2241 | 10% · ETA 12m05s · study ≤ 3h10m

``study ≤`` is the study's work still to come at most (phase 1's runs left, later phases at their worst case, as
``study --dry-run`` counts them, less what this session has trained since) at the same rate, or, until this
sub-sweep has measured its own rate, at the previous sub-sweep's rate (at the start: the folder's finished runs'
rate shared by the jobs).
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from scalevec.training import rundir
from scalevec.training.console import format_seconds


def _seconds(s: float | None) -> str:
    return "?" if s is None else format_seconds(s)


@dataclass
class StudyScope:
    """The whole study around its sub-sweeps' progress lines (module docstring). ``left``: training FLOPs (6·N·D)
    the study may still need, at most; each sub-sweep's finished runs are taken off it as it ends. ``rate``:
    seconds per FLOP to assume before a sub-sweep has measured its own (NaN: none known); the last sub-sweep's
    rate once one has measured it."""

    left: float
    rate: float = math.nan


@dataclass
class _Run:
    name: str
    run_dir: Path
    steps: int
    weight: float
    state: str = "waiting"  # waiting | running | finished
    start_frac: float = 0.0
    step: int = 0
    loss: float | None = None
    not_before: float = 0.0  # wall time: metrics.jsonl older than this is a previous attempt's (restart)

    @property
    def frac(self) -> float:
        return 1.0 if self.state == "finished" else min(1.0, self.step / self.steps) if self.steps else 0.0


class GridProgress:
    """Progress of runs ``(name, run_dir, total steps, weight)``; see the module docstring.

    ``started(name)`` / ``finished(name)`` are called by the sweep around each trainer; ``start()``
    begins the background redraw, ``stop()`` ends it. ``stream`` defaults to stdout; ``tty`` to
    ``stream.isatty()``; ``clock`` is for tests; ``scope`` adds the whole study's bound (``StudyScope``).
    """

    def __init__(self, runs: list[tuple[str, Path, int, float]], stream: TextIO | None = None,
                 tty: bool | None = None, interval: float | None = None, clock=time.monotonic,
                 scope: StudyScope | None = None):
        self.runs = {name: _Run(name, Path(d), int(steps), float(weight)) for name, d, steps, weight in runs}
        self.scope = scope
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.interval = 1.0 if self.tty else float(interval or os.environ.get("SCALEVEC_PROGRESS_EVERY") or 60)
        self.clock, self.t0 = clock, clock()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shown = False  # a status line is on screen (TTY)
        # the rate behind the ETA: this session's work at the newest row seen, when it was seen, the longest gap
        self._work, self._seen, self._gap = 0.0, self.t0, 0.0

    # -- state ---------------------------------------------------------------------------------------

    def _refresh(self, run: _Run) -> None:
        try:
            if (run.run_dir / rundir.METRICS).stat().st_mtime < run.not_before:
                return
        except OSError:
            return
        row = rundir.last_row(run.run_dir, "train")
        if row is not None:
            run.step, run.loss = int(row.get("step", 0)) + 1, row.get("loss")  # train rows count the step taken

    def started(self, name: str, resumed: bool = False) -> None:
        """Run ``name`` begins; ``resumed``: it continues from a checkpoint (its steps so far are not
        this session's)."""
        with self._lock:
            run = self.runs[name]
            if resumed:
                self._refresh(run)
            else:  # a new or restarted run: rows left by an earlier attempt are not its progress
                run.not_before, run.step, run.loss = time.time() - 1.0, 0, None
            run.state, run.start_frac = "running", run.frac

    def finished(self, name: str) -> None:
        with self._lock:
            self.runs[name].state = "finished"

    def _session_work(self) -> float:
        return sum(r.weight * max(0.0, r.frac - r.start_frac) for r in self.runs.values() if r.state != "waiting")

    def _rate(self) -> tuple[float | None, float]:
        """``(seconds per unit of work this session, or None while unknown; seconds since the newest row seen,
        capped at the longest gap)``. Each call that finds more work done than the last records when it saw it
        (the rate's end point)."""
        total = sum(r.weight for r in self.runs.values()) or 1.0
        session, now = self._session_work(), self.clock()
        if session != self._work:  # a new row, a finished run (or a restarted one: less work): measure up to here
            if 0 < self._work < session:
                self._gap = max(self._gap, now - self._seen)
            self._work, self._seen = session, now
        lag = min(now - self._seen, self._gap)
        # start-up (imports, data, the first steps) dominates the first 1 %: no ETA from it (it read 14 h for 6)
        return ((self._seen - self.t0) / session if session >= 0.01 * total else None), lag

    def eta(self) -> tuple[float, float | None]:
        """``(fraction of the grid's work done, seconds left or None while unknown)`` (module docstring)."""
        total = sum(r.weight for r in self.runs.values()) or 1.0
        done = sum(r.weight * r.frac for r in self.runs.values())
        rate, lag = self._rate()
        if rate is None:
            return done / total, None
        return done / total, max(0.0, rate * (total - done) - lag)

    def study_eta(self) -> float | None:
        """Seconds the whole study may still take, at most (module docstring); None without a scope or a rate."""
        if self.scope is None:
            return None
        rate, lag = self._rate()
        if rate is None:
            rate, lag = self.scope.rate, 0.0
        left = max(0.0, self.scope.left - self._session_work())
        return max(0.0, rate * left - lag) if math.isfinite(rate) else None

    def line(self) -> str:
        """The status text: runs finished, each running run's step and loss, % of the grid and the ETA."""
        with self._lock:
            for r in self.runs.values():
                if r.state == "running":
                    self._refresh(r)
            n_done = sum(r.state == "finished" for r in self.runs.values())
            parts = [f"[{n_done}/{len(self.runs)} done]"]
            running = [r for r in self.runs.values() if r.state == "running"]
            parts.append(" | ".join(f"{r.name} step {r.step}/{r.steps}"
                                    + (f" loss {r.loss:.4f}" if r.loss is not None else "")
                                    for r in running) or "starting")
            frac, left = self.eta()
            study = "" if self.scope is None else f" · study ≤ {_seconds(self.study_eta())}"
        return f"{' '.join(parts)} | {frac:.0%} · ETA {_seconds(left)}{study}"

    # -- output --------------------------------------------------------------------------------------

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed pipe must not kill the sweep
            pass

    def _clear(self) -> None:
        if self.tty and self._shown:
            self._write("\r\033[K")
            self._shown = False

    def show(self) -> None:
        """Draw the status once: redraw the line on a TTY, else print it as a plain line."""
        text = self.line()
        with self._lock:
            if self.tty:
                width = shutil.get_terminal_size((120, 20)).columns - 1
                self._write("\r\033[K" + (text if len(text) <= width else text[:width - 1] + "…"))
                self._shown = True
            else:
                self._write(f"progress {text}\n")

    def say(self, *args) -> None:
        """Print a message line (in place of the status line on a TTY; it is redrawn at the next tick)."""
        with self._lock:
            self._clear()
            self._write(" ".join(str(a) for a in args) + "\n")

    def start(self) -> GridProgress:
        def loop():
            while not self._stop.wait(self.interval):
                self.show()

        self._thread = threading.Thread(target=loop, name="scalevec-progress", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the redraw; with a scope, take this sub-sweep's finished work off the study's bound and hand its
        measured rate on to the next sub-sweep (which shows it until it has its own)."""
        if self.scope is not None:
            rate, _ = self._rate()
            if rate is not None:
                self.scope.rate = rate
            self.scope.left = max(0.0, self.scope.left - self._session_work())
            for r in self.runs.values():  # stop() may be called twice (an interrupted sweep): count once
                r.start_frac = r.frac
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        with self._lock:
            self._clear()


__all__ = ["GridProgress", "StudyScope", "format_seconds"]
