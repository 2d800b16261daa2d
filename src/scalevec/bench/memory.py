"""Peak memory of one training step, as ``scalevec bench`` reports it (method in docs/performance.md).

Peak = the candidate's persistent tensors (parameters, buffers, optimizer state) plus the highest level of
what the step allocates on top. On CUDA the step's part is ``max_memory_allocated`` minus the level before
it; on CPU it is the running sum of the allocation events of ``torch.profiler(profile_memory=True)``, which
sees every tensor that torch's CPU allocator hands out, to the byte (not memory that libraries such as
oneDNN allocate by themselves). Both are deterministic, unlike the process's resident set, which the other
candidates share.
"""

from __future__ import annotations

import torch
from torch import Tensor

from scalevec.bench.candidates import Candidate
from scalevec.bench.harness import quiet_stderr, sync


def state_bytes(c: Candidate) -> int:
    """Bytes of the candidate's persistent tensors: parameters, buffers and optimizer state (each storage once)."""
    seen: dict[int, int] = {}
    tensors = [*c.model.parameters(), *c.model.buffers()]
    for opt in c.optimizers:
        for st in opt.state.values():
            tensors += [t for t in st.values() if isinstance(t, Tensor)]
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def step_peak_bytes(c, device: torch.device) -> int:
    """Peak bytes allocated on top of the persistent state during one call of ``c.step()`` (any object with a
    ``step`` method: a ``Candidate``, or a bare training step), by the method of the module docstring."""
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        c.step()
        sync(device)
        return torch.cuda.max_memory_allocated(device) - before
    from torch.profiler import ProfilerActivity, profile

    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        c.step()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    level = peak = 0
    for _, n in events:
        level += n
        peak = max(peak, level)
    return peak
