"""How ``scalevec bench`` times: interleaved rounds, paired ratios, and the peak MFU divides by (docs/performance.md).

After warm-up the candidates run interleaved (A B C, B C A, ...) so that load from other processes falls on
all of them alike; each candidate's ratio to the first is taken round by round, then the median is reported
with its interquartile range. Beside wall-clock time each call's process CPU time is kept, which waiting
for a core taken by another process does not inflate.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager

import torch

from scalevec.bench.candidates import Candidate
from scalevec.model.flops import matmul_peak


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); nothing on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Wall-clock seconds of one call of ``fn``, the device synchronized before and after."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def quantiles(xs: list[float]) -> tuple[float, float, float]:
    """(q25, median, q75) of ``xs``."""
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[1], q[2]


def interleave(cands: list[Candidate], fn: Callable[[Candidate], Callable[[], object]], rounds: int,
               device: torch.device, cpu_times: dict[str, list[float]] | None = None) -> dict[str, list[float]]:
    """Time ``fn(c)`` for every candidate, ``rounds`` times, rotating the order each round (A B C, B C A, ...).
    If ``cpu_times`` is given, each call's process CPU seconds (``time.process_time``) are appended to it too."""
    times: dict[str, list[float]] = {c.name: [] for c in cands}
    for r in range(rounds):
        k = r % len(cands)
        for c in cands[k:] + cands[:k]:
            c0 = time.process_time()
            times[c.name].append(timed(fn(c), device))
            if cpu_times is not None:
                cpu_times.setdefault(c.name, []).append(time.process_time() - c0)
    return times


def summarize(times: dict[str, list[float]], ref: str, tokens: int) -> dict[str, dict]:
    """Median and IQR of each candidate's times, and its paired (round-by-round) ratio to ``ref``."""
    out = {}
    for name, ts in times.items():
        q25, med, q75 = quantiles(ts)
        ratios = [t / r for t, r in zip(ts, times[ref])]
        r25, rmed, r75 = quantiles(ratios)
        out[name] = {"median_s": med, "q25_s": q25, "q75_s": q75, "min_s": min(ts), "tokens_per_s": tokens / med,
                     "ratio": rmed, "ratio_q25": r25, "ratio_q75": r75, "times_s": ts}
    return out


@contextmanager
def quiet_stderr():
    """Send file descriptor 2 to /dev/null for the block: the profiler's C++ side prints ``USDT ... profiler_start``
    / ``profiler_stop`` lines there on every start and stop (kineto), which no Python setting turns off."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def peak_tflops(device: torch.device, given: float | None, dtype: str) -> tuple[float, str]:
    """``(peak TFLOP/s, source)``: ``given`` (``--peak-tflops``), else measured now in this process with
    ``flops.matmul_peak`` (fp32 on CPU; bf16 on CUDA, or fp32 when the benchmark runs fp32)."""
    if given:
        return given, "--peak-tflops"
    mm_dtype = torch.bfloat16 if dtype == "bfloat16" or device.type == "cuda" else torch.float32
    kind = str(mm_dtype).removeprefix("torch.")
    return matmul_peak(device, mm_dtype) / 1e12, f"measured: best {kind} matmul, this process"
