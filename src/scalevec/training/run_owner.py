"""The run directory's owner during training: lock, checks, creation or restart, rank 0's writes (DESIGN.md §8).

``RunDirOwner`` is the one place a training run touches its run directory outside ``checkpoints/``. It is
built on ``rundir``'s functions (the files, the lock, the out-dir checks, ``--overwrite``) and adds what
several processes need: rank 0 writes, and every rank agrees on the outcome so that they fail together.
It does not choose or load a checkpoint (``checkpoint.resume_checkpoint``, the trainer's) and decides
nothing about the run's content: the run files come from a callable of the trainer.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch

from scalevec.training import distributed, rundir
from scalevec.training.checkpoint import layout
from scalevec.training.rundir import RunDirError, check_out_dir


class TrainingFailed(RuntimeError):
    """Training could not go on (an ``OSError`` such as a full disk while writing); the run resumes
    from its last checkpoint with ``--resume`` once the cause is fixed."""


def check_target(out: Path, resume: bool, overwrite: bool) -> None:
    """``rundir.check_out_dir``, with the way on named for a run that cannot be resumed: a finished run
    (``DONE``: extend it as a branch, ``--init-from RUN --schedule-from continue``) or a diverged one
    (``DIVERGED``: a result). Raises as ``check_out_dir``; the refusal of an existing run is always a
    ``FileExistsError`` saying that ``out`` already holds a run."""
    try:
        check_out_dir(out, resume, overwrite)
    except FileExistsError:
        if resume or overwrite or not rundir.is_run(out):
            raise
        if rundir.is_done(out):
            raise FileExistsError(
                f"{out} already holds a run, and it is finished (DONE), so --resume has nothing left to do; to "
                f"train it further branch it into a new --out: scalevec train --init-from {out} --schedule-from "
                f"continue --steps N --out NEW (N beyond its steps); or pass --overwrite to replace it, or choose "
                f"a new --out") from None
        if (out / rundir.DIVERGED).exists():
            raise FileExistsError(
                f"{out} already holds a run, and it diverged (DIVERGED), so --resume would refuse it; it is kept as "
                f"a result: choose a new --out (with a lower lr), or pass --overwrite to replace it") from None
        raise


class RunDirOwner:
    """One run directory, held by one training run (every rank builds one; rank 0 writes).

    ``out``: the run directory; ``resume`` / ``overwrite``: the command's flags; ``dist``: the processes
    (``distributed.setup``). The caller checks the target first (``check_target``, before anything else is set
    up), then takes the lock of an existing one at once (``lock_existing``)."""

    def __init__(self, out: str | Path, resume: bool, overwrite: bool, dist):
        self.out, self.resume, self.overwrite = Path(out), resume, overwrite
        self.rank, self.world, self.device = dist.rank, dist.world_size, dist.device
        self.write = self.rank == 0
        self.lock = rundir.RunLock(self.out)

    def lock_existing(self) -> None:
        """Rank 0 takes the lock of an existing run directory (``rundir.RunLock``); all ranks fail together
        if it cannot (``RunLocked`` naming the holder, or ``RunDirError`` for a lock file it cannot create)."""
        if not self.out.is_dir():
            return
        err = None
        if self.write:
            try:
                self.lock.acquire()
            except RunDirError as e:
                err = e
            except OSError as e:
                err = RunDirError(f"cannot create the lock file {self.lock.path} ({e.strerror}); choose a writable "
                                  "--out")
        if self.world > 1:
            failed = distributed.all_reduce_sum(torch.tensor(float(err is not None), device=self.device)).item()
            if failed and err is None:
                err = rundir.RunLocked(f"{self.out} is in use by another process (rank 0 could not lock it)")
        if err is not None:
            raise err

    def release(self) -> None:
        """Release the run directory's lock (safe to call twice)."""
        self.lock.release()

    def notice(self, msg: str) -> None:
        """A line on stderr from rank 0, even with --quiet (skipped checkpoints, repaired metrics)."""
        if self.write:
            print(f"note: {msg}", file=sys.stderr, flush=True)

    def rank0_writes(self, work: Callable[[], None]) -> None:
        """Run ``work`` (writes into the run directory) on rank 0 and agree on its outcome: every rank raises
        when it failed; an ``OSError`` (read-only, full disk) becomes a one-line ``RunDirError``."""
        err = None
        if self.write:
            try:
                work()
            except (ValueError, OSError) as e:
                err = e
        if self.world > 1:
            failed = distributed.all_reduce_sum(torch.tensor(float(err is not None), device=self.device)).item()
            if failed and err is None:
                err = RunDirError(f"rank 0 could not prepare the run directory {self.out} (see its error)")
        if isinstance(err, OSError) and not isinstance(err, (FileExistsError, FileNotFoundError, NotADirectoryError)):
            raise RunDirError(f"cannot write the run directory: {err.filename or self.out}: {err.strerror or err}; "
                              f"choose a writable --out with free space") from None
        if err is not None:
            raise err

    def prepare(self, write_run_files: Callable[[], None]) -> None:
        """Lock the run directory and check it again under the lock (a run that appeared meanwhile is never
        touched), remove dead writers' temporaries; for a new run, empty the target (``--overwrite`` empties a
        scalevec run directory, and nothing else, naming what it leaves) and call ``write_run_files``. A resumed
        run is left as it is: the trainer then resumes from a checkpoint or calls ``restart``. An unusable
        target (read-only, full disk) is a one-line ``RunDirError``, on every rank."""
        self.rank0_writes(lambda: self._prepare(write_run_files))

    def _prepare(self, write_run_files: Callable[[], None]) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self.lock.acquire()
        check_target(self.out, self.resume, self.overwrite)  # again, now that no other writer can change it
        for name in rundir.clean_temporaries(self.out) + layout.clean_temporaries(self.out):
            self.notice(f"removed {name}, a temporary file left by an interrupted writer")
        if self.resume:
            return
        if self.overwrite and any(p.name != rundir.LOCK for p in self.out.iterdir()):
            # check_target passed: a scalevec run (or a set-up interrupted before config.yaml); empty it,
            # naming what scalevec did not write (it stays)
            rundir.remove_run(self.out, notice=self.notice)
        write_run_files()

    def restart(self, write_run_files: Callable[[], None]) -> None:
        """A resumed run without a checkpoint that loads trains from step 0: its metrics are dropped and its
        run files written anew (rank 0; every rank fails together)."""
        def work():
            self.notice(f"{self.out} has no intact checkpoint; training it from step 0")
            rundir.rewrite_metrics(self.out, keep=lambda r: False, notice=self.notice)
            write_run_files()

        self.rank0_writes(work)

    def truncate_metrics(self, step: int) -> None:
        """Drop the metrics rows past checkpoint ``step`` (and a cut-off last line, with a notice): they belong
        to a lost future. Train rows are numbered by the step taken, eval and probe rows by the steps done."""
        self.rank0_writes(lambda: rundir.rewrite_metrics(
            self.out, keep=lambda r: r["step"] < step or (r["kind"] != "train" and r["step"] == step),
            notice=self.notice))

    def append_metrics(self, row: dict) -> None:
        """Append one row to ``metrics.jsonl`` (rank 0)."""
        if self.write:
            rundir.append_metrics(self.out, row)

    def finish(self, summary: dict) -> None:
        """Write ``summary.json``, then ``DONE`` (rank 0): the run is complete."""
        if self.write:
            rundir.write_summary(self.out, summary)
            rundir.mark_done(self.out)

    def failed(self, e: OSError, step: int) -> TrainingFailed:
        """The ``TrainingFailed`` for an ``OSError`` at ``step`` (a full disk, a read-only remount, a vanished
        mount): one line naming the file, the fix and the checkpoint ``--resume`` continues from."""
        ckpts = layout.checkpoint_dirs(self.out)
        last = f"its last checkpoint is {ckpts[0].name}" if ckpts else "it has no checkpoint yet (resumes from step 0)"
        return TrainingFailed(f"cannot write {e.filename or self.out} at step {step}: {e.strerror or e}; free space or "
                              f"fix the filesystem, then continue with: scalevec train --resume --out {self.out} "
                              f"({last})")


__all__ = ["RunDirOwner", "TrainingFailed", "check_target"]
