"""``train.compile: auto | true | false``: when the trainer compiles its blocks with ``torch.compile`` (DESIGN.md §8).

``true`` compiles every block (``distributed.wrap``), ``false`` runs eager, ``auto`` (the default) decides
from the device and the run length with the rule below, derived from measurements in docs/performance.md
("Compile"):

- **CPU: eager.** Compiled kernels round differently from eager ones (the losses are not bitwise equal),
  and the reproduction study and tests/test_golden.py are eager CPU runs that must stay bitwise
  reproducible. Measured on the 2-core EPYC (1 thread, under load): compiling costs 23-80 s and a compiled
  step 0.73-0.84x the eager CPU time at tiny/small (``benchmarks/compile_cost.py``); on one whole main-job
  run (cpu-80k, ``unified``, 1,054 steps; docs/performance.md "One run of the first protocol's main job end to
  end") a compiled step took 0.70-0.77x the eager CPU time, but compiling these shapes with an empty inductor
  cache cost ~60 s of CPU, so the run took 161-169 s of CPU compiled against 117-141 s eager (break-even
  ~2,500 steps at that size); with the cache warm, 104.5 s. So on CPU compiling gains nothing dependable for
  a single run at the study's run lengths, and ``auto`` keeps eager, which also keeps the bits.
- **CUDA: compiled when the run has at least ``CUDA_MIN_STEPS`` steps**, eager below (a short check run
  would spend most of its time compiling). The threshold is the break-even ``compile seconds / (eager step
  seconds · fractional gain)`` for an assumed minute of compilation and 20-30 % gain per step on a ~0.1B
  model: an estimate, not measured on a GPU (none was lent); ``scripts/gpu_check.sh`` prints eager and
  compiled step times that would revise it.
- **Never under double backward**: theory probes (``train.sharpness_every``) take Hessian-vector products,
  which compiled graphs do not support, so ``auto`` runs eager when they are on.

Resume is exact under compile (tests/test_speed.py, slow): a run compiled from the start and one resumed under
compile from its checkpoint compute the same losses.
"""

from __future__ import annotations

import torch

from scalevec.config import normalize_compile

CUDA_MIN_STEPS = 1000


def resolve(value, device: torch.device | str, steps: int, double_backward: bool = False) -> tuple[bool, str]:
    """``(compile?, why)`` for ``train.compile=value`` on ``device`` for a run of ``steps`` steps (module docstring)."""
    v = normalize_compile(value)
    if v != "auto":
        return v == "true", f"train.compile={v}"
    kind = torch.device(device).type
    if double_backward:
        return False, "auto: eager (theory probes take double backward, which compiled graphs do not support)"
    if kind != "cuda":
        return False, f"auto: eager on {kind} (keeps CPU runs bitwise reproducible; docs/performance.md)"
    if steps < CUDA_MIN_STEPS:
        return False, f"auto: eager ({steps} steps < {CUDA_MIN_STEPS}, too short to pay back compilation)"
    return True, f"auto: compiled ({kind}, {steps} steps >= {CUDA_MIN_STEPS})"


__all__ = ["CUDA_MIN_STEPS", "resolve"]
