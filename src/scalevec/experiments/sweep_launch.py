"""A sweep's trainers: each run a subprocess of ``scalevec train`` (``train_one``), ``jobs`` at a time in threads
(``run_jobs``), each with its share of the CPU threads, all stopped together on SIGINT or SIGTERM.

Choices made here (ours): a run's command line is the sweep's ``command`` (default ``DEFAULT_TRAIN_CMD``) with
``--config OUT/runs/NAME.yaml --out OUT/runs/NAME`` (and ``--resume`` or ``--overwrite`` as its status asks),
its output appended to ``OUT/runs/NAME.log``; SIGINT or SIGTERM to the sweep sends SIGTERM to its trainers,
which checkpoint at their next step and exit, and the sweep then stops (exit 75 after SIGTERM, as ``train``:
stopped and resumable; 130 after Ctrl-C); on Linux a trainer also gets SIGTERM when its sweep dies any other
way, even by SIGKILL (``prctl(PR_SET_PDEATHSIG)``), so none is left training unwatched. A run that another
process holds is found by its lock (``rundir.RunLock``), not here. This module decides nothing about which runs
to train or what their results mean (``sweep``: the runner and its lines).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import TypeVar

import yaml

from scalevec.config.codec import apply_overrides, to_dict
from scalevec.config.run_budget import usable_cpus
from scalevec.experiments.sweep_grid import Run
from scalevec.training import rundir
from scalevec.training.exits import PREEMPTED_EXIT, Preempted  # the trainer's code after SIGTERM
from scalevec.training.rundir import RunDirError

DEFAULT_TRAIN_CMD = (sys.executable, "-m", "scalevec", "train")

write_atomic = rundir.write_atomic  # a per-process temporary file, then a rename

_children: set[subprocess.Popen] = set()  # trainers running now (stopped together with the sweep)
_children_lock = threading.Lock()
_stopping = threading.Event()


def stop_trainers(signum: int = signal.SIGTERM) -> None:
    """Send ``signum`` to every running trainer and start no new one (they checkpoint and exit)."""
    _stopping.set()
    with _children_lock:
        for proc in _children:
            try:
                proc.send_signal(signum)
            except OSError:
                pass


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@cache
def _prctl():
    """libc's ``prctl`` (Linux), or None where there is none; loaded once, in the sweep itself, so that a
    freshly forked child only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent():
    """A ``preexec_fn`` that has the kernel send SIGTERM to the child when the thread that started it
    dies, whatever kills it (SIGKILL, the OOM killer): the trainer then checkpoints at its next step and
    exits, as after a SIGTERM to the sweep, instead of training on unwatched. The sweep's worker thread
    waits on its trainer, so it lives as long as the trainer does. None off Linux."""
    prctl, parent = _prctl(), os.getpid()
    if prctl is None:
        return None

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGTERM))
        if os.getppid() != parent:  # the sweep died between the fork and prctl: the signal would never come
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def unwritable(out: Path, e: OSError) -> RunDirError:
    """The one-line error for a sweep folder that cannot be written (read-only, no permission, full)."""
    return RunDirError(f"cannot write the sweep folder {out} ({e.filename or out}: {e.strerror or e}); choose a "
                       f"writable --out with free space")


def train_one(run: Run, runs_dir: Path, status: str, train_cmd: tuple[str, ...], threads: int) -> int:
    """Train one run in a subprocess (log in ``runs_dir/NAME.log``); returns its exit code (75, "stopped",
    without starting it when the sweep is stopping). The trainer gets SIGTERM if the sweep dies
    (``die_with_parent``). Raises ``RunDirError`` when the run's config or log cannot be written."""
    if _stopping.is_set():
        return PREEMPTED_EXIT
    cfg_path = runs_dir / f"{run.name}.yaml"
    cfg = run.cfg if run.cfg.train.threads else apply_overrides(run.cfg, [f"train.threads={threads}"])
    # not --quiet: the log holds its output
    cmd = [*train_cmd, "--config", str(cfg_path), "--out", str(runs_dir / run.name)]
    cmd += {"resume": ["--resume"], "restart": ["--overwrite"]}.get(status, [])
    env = dict(os.environ)
    try:
        write_atomic(cfg_path, yaml.safe_dump(to_dict(cfg), sort_keys=False))
        log = os.fdopen(rundir.open_own(runs_dir / f"{run.name}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a")
    except OSError as e:
        raise unwritable(runs_dir.parent, e) from None
    with log:
        log.write(f"\n$ {' '.join(cmd)}\n")
        log.flush()
        with _children_lock:
            if _stopping.is_set():
                return PREEMPTED_EXIT
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=die_with_parent())
            _children.add(proc)
        try:
            rc = proc.wait()
        finally:
            with _children_lock:
                _children.discard(proc)
        log.write(f"[exit {rc}]\n")
        return rc



def stopping() -> bool:
    """Whether the sweep is stopping (a signal came, ``stop_trainers``): a run that ends now was stopped, not failed."""
    return _stopping.is_set()


def threads_per_run(jobs: int) -> int:
    """Each of ``jobs`` concurrent runs gets an explicit share of the usable CPUs (``train.threads``, at least 1),
    never torch's guess, which would give every trainer all of them."""
    return max(1, usable_cpus() // jobs)


T = TypeVar("T")


def run_jobs(work: Callable[[T], None], items: Sequence[T], jobs: int, runs_dir: Path,
             on_stop: Callable[[], None] | None = None, deadline: float | None = None) -> None:
    """Call ``work(item)`` for every item, ``jobs`` at a time in threads (``work`` trains one run with
    ``train_one``). SIGINT / SIGTERM, when called from the main thread: the trainers get SIGTERM (they checkpoint
    and stop), no new run starts, the running ones are waited for, ``on_stop`` is called, and the signal is
    raised on: ``Preempted`` after SIGTERM (exit 75, resumable; its message names ``runs_dir``),
    ``KeyboardInterrupt`` after Ctrl-C; the previous signal handlers are restored in any case. An exception
    raised by ``work`` propagates as it is. ``deadline`` (``time.time()`` seconds, a GPU slice's end): then the
    running trainers get SIGTERM (they checkpoint and exit 75, resumable) and no run starts after it
    (``work`` sees ``stopping()``); the items are still all called and this returns normally."""
    stopped_by: list[int] = []  # the first signal decides the exit code: 75 for SIGTERM, 130 for Ctrl-C

    def on_signal(signum, frame):  # SIGINT / SIGTERM: the trainers checkpoint and stop, then the sweep stops
        stop_trainers(signal.SIGTERM)
        if not stopped_by or signum == signal.SIGINT:  # a second Ctrl-C stops waiting; another SIGTERM does not
            stopped_by.append(signum)
            raise KeyboardInterrupt

    main = threading.current_thread() is threading.main_thread()
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    for s in old:
        signal.signal(s, on_signal)
    _stopping.clear()
    timer = None
    if deadline is not None:  # the slice's end: checkpoint what trains, start nothing more
        timer = threading.Timer(max(deadline - time.time(), 0.0), stop_trainers)
        timer.daemon = True
        timer.start()
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        for future in [pool.submit(work, item) for item in items]:
            future.result()
    except KeyboardInterrupt:  # start no new run; wait for the running trainers to checkpoint and exit
        stop_trainers(signal.SIGTERM)
        pool.shutdown(wait=True, cancel_futures=True)
        if on_stop:
            on_stop()
        if stopped_by == [signal.SIGTERM]:  # preempted like a trainer: exit 75 (cli.py), resumable
            raise Preempted(f"SIGTERM: stopped the sweep; its running trainers checkpointed; rerun the same command "
                            f"to resume ({runs_dir})") from None
        raise
    finally:
        if timer is not None:
            timer.cancel()
        for s, h in old.items():
            signal.signal(s, h)
    pool.shutdown()


__all__ = [
    "DEFAULT_TRAIN_CMD",
    "die_with_parent",
    "run_jobs",
    "stop_trainers",
    "stopping",
    "threads_per_run",
    "train_one",
    "unwritable",
]
