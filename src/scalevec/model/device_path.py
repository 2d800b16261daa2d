"""Which device's code path a tensor takes through the model: CUDA's, or the CPU's (DESIGN.md §3 note).

A few formulas have a CUDA form that differs from the CPU one (torch's fused ``F.rms_norm``, fused Triton
kernels): the same function, other kernels. The model picks the form per tensor with ``on_cuda_path(x)``. On
a CUDA tensor that is True; on a meta tensor it is True inside ``meta_as_cuda()``, which is how
``scalevec bench --count`` walks the CUDA code path on a machine without a GPU (meta tensors carry shapes and
dtypes, no data; ``bench/count.py``). Everything else (CPU tensors, meta tensors outside the block) takes the
CPU path, so nothing on CPU changes.

``autocast_dtype(x)``: the autocast dtype active for that path, or None (the count turns CUDA's autocast on
for meta tensors with ``torch.set_autocast_enabled("cuda", True)``, which torch accepts without a GPU).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor

_META_AS_CUDA: ContextVar[bool] = ContextVar("scalevec_meta_as_cuda", default=False)


def on_cuda_path(x: Tensor) -> bool:
    """True if ``x`` takes the CUDA code path: it is on a CUDA device, or a meta tensor inside ``meta_as_cuda()``."""
    return x.is_cuda or (x.is_meta and _META_AS_CUDA.get())


@contextmanager
def meta_as_cuda() -> Iterator[None]:
    """Within the block, meta tensors take the CUDA code path (``on_cuda_path``): for counting, never for training."""
    token = _META_AS_CUDA.set(True)
    try:
        yield
    finally:
        _META_AS_CUDA.reset(token)


def autocast_dtype(x: Tensor) -> torch.dtype | None:
    """The autocast dtype for ``x``'s code path (``torch.get_autocast_dtype``), or None where autocast is off."""
    device = "cuda" if on_cuda_path(x) else x.device.type
    if device not in ("cpu", "cuda") or not torch.is_autocast_enabled(device):
        return None
    return torch.get_autocast_dtype(device)


__all__ = ["on_cuda_path", "meta_as_cuda", "autocast_dtype"]
