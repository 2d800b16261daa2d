"""The exit codes of every command that trains, the exception that stops one resumably, and the signal
handling that stops a run between two steps.

One contract for ``train``, ``sweep``, ``compare`` and ``study`` (README "Run directories"): 0 done, 2 bad
input or an unusable run directory (``cli.py``), 3 diverged or failed during training, 75 stopped by SIGTERM
(EX_TEMPFAIL: checkpointed, rerun or ``--resume`` to continue), 130 Ctrl-C. Its own module so that the trainer
(which raises ``Preempted``) and the commands that map it to 75 share it without importing each other.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

DIVERGED_EXIT = 3  # the health guard stopped the run (DIVERGED written)
FAILED_EXIT = 3  # training could not go on (an OSError such as a full disk); resumable
PREEMPTED_EXIT = 75  # EX_TEMPFAIL: SIGTERM, checkpointed, continue with --resume
INTERRUPTED_EXIT = 130  # Ctrl-C (128 + SIGINT), also checkpointed


class Preempted(RuntimeError):
    """SIGTERM (how SLURM and Kubernetes preempt): a checkpoint was written at the step boundary. Also
    raised by ``sweep.run_sweep`` when SIGTERM stopped a sweep (its trainers checkpointed); every command
    exits ``PREEMPTED_EXIT`` on it."""


@contextmanager
def deferred_sigint(sigint: bool = True):
    """Within the block, a first Ctrl-C only sets ``flag["set"]`` and SIGTERM sets ``flag["term"]``
    (both checked between steps, so a step is never cut in half); a second Ctrl-C interrupts at once.
    Off outside the main thread; SIGINT is left alone when ``sigint`` is false or when someone else
    handles it."""
    flag = {"set": False, "term": False}
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def on_int(signum, frame):
        if flag["set"]:
            signal.default_int_handler(signum, frame)
        flag["set"] = True

    def on_term(signum, frame):
        flag["term"] = True

    own_int = sigint and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    old_term = signal.getsignal(signal.SIGTERM)
    if own_int:
        signal.signal(signal.SIGINT, on_int)
    signal.signal(signal.SIGTERM, on_term)
    try:
        yield flag
    finally:
        if own_int:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, old_term)


__all__ = ["DIVERGED_EXIT", "FAILED_EXIT", "INTERRUPTED_EXIT", "PREEMPTED_EXIT", "Preempted", "deferred_sigint"]
