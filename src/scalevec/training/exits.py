"""The exit codes of every command that trains, and the exception that stops one resumably (issue 24).

One contract for ``train``, ``sweep``, ``compare`` and ``study`` (README "Run directories"): 0 done, 2 bad
input or an unusable run directory (``cli.py``), 3 diverged or failed during training, 75 stopped by SIGTERM
(EX_TEMPFAIL: checkpointed, rerun or ``--resume`` to continue), 130 Ctrl-C. Its own module so that the trainer
(which raises ``Preempted``) and the commands that map it to 75 share it without importing each other.
"""

from __future__ import annotations

DIVERGED_EXIT = 3  # the health guard stopped the run (DIVERGED written)
FAILED_EXIT = 3  # training could not go on (an OSError such as a full disk); resumable
PREEMPTED_EXIT = 75  # EX_TEMPFAIL: SIGTERM, checkpointed, continue with --resume
INTERRUPTED_EXIT = 130  # Ctrl-C (128 + SIGINT), also checkpointed


class Preempted(RuntimeError):
    """SIGTERM (how SLURM and Kubernetes preempt): a checkpoint was written at the step boundary. Also
    raised by ``sweep.run_sweep`` when SIGTERM stopped a sweep (its trainers checkpointed); every command
    exits ``PREEMPTED_EXIT`` on it."""


__all__ = ["DIVERGED_EXIT", "FAILED_EXIT", "INTERRUPTED_EXIT", "PREEMPTED_EXIT", "Preempted"]
