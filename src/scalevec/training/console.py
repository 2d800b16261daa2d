"""The run's console: the one sink of its progress lines, and how times and memory read in them (DESIGN.md §8).

``Console`` prints rank 0's lines on stdout unless quiet; the trainer says what it does through it (the
header, resume, done) and the ``monitors.Progress`` monitor draws the steps on it: a tqdm bar when stderr is a
terminal, else one line per log step with elapsed time, ETA, tokens/s, MFU and memory. It formats nothing the
run computes and changes nothing training reads.
"""

from __future__ import annotations

import os
import sys

import torch

GIB = 2 ** 30


class Console:
    """Lines on stdout from the process that reports (rank 0), nothing when ``quiet``. A reader that went away
    (``train ... | head``) ends the lines, not the run: its files are the record, and a broken pipe is no
    write error."""

    def __init__(self, quiet: bool):
        self.quiet = quiet

    @property
    def tty(self) -> bool:
        """Whether a progress bar can be drawn (tqdm draws on stderr)."""
        return not self.quiet and sys.stderr.isatty()

    def say(self, msg: str) -> None:
        """One line on stdout (unless quiet)."""
        if self.quiet:
            return
        try:
            print(msg, flush=True)
        except BrokenPipeError:
            self.quiet = True
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the final flush must not fail


def format_seconds(s: float) -> str:
    """``42s``, ``6m10s``, ``2h05m``."""
    s = max(0, int(round(s)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def peak_memory_gib(device: torch.device) -> tuple[str, float] | None:
    """What a step line shows as memory, in GiB (2**30 bytes): on CUDA ``("mem", peak allocated by tensors)``
    (``torch.cuda.max_memory_allocated``, a counter of the allocator: no device sync), elsewhere ``("rss", the
    process's peak resident set)`` (``resource.getrusage``: KiB on Linux, bytes on macOS); ``None`` where neither
    is known (Windows has no ``resource``)."""
    if device.type == "cuda":
        return "mem", torch.cuda.max_memory_allocated(device) / GIB
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return "rss", peak / GIB if sys.platform == "darwin" else peak * 1024 / GIB


__all__ = ["GIB", "Console", "format_seconds", "peak_memory_gib"]
