"""Bytes per token that DNP's SwiGLU moves on the CUDA path, fused (``scalevec::dnp_swiglu``) and not.

    .venv/bin/python benchmarks/dnp_swiglu_bytes.py --d-ff 1706 --tokens 2048

Runs each form's forward and backward once on meta tensors (bf16 y_g, y_u; float32 s_g, s_u) through ``bench
--count``'s recorder (``bench.count.record_step``: every kernel reads its tensor inputs and writes its outputs once)
and prints the kernels and the bytes read + written per token, also in units of d_ff. The loss wrapper the recorder
needs (``(out * g).sum()``, g fixed) is subtracted. The forms: the
baseline's ``silu(gate) ⊙ up``; DNP as ``kernels._DNPSwiGLU`` (the CUDA path before the fused op); DNP as the
fused op (``model/triton_dnp.py``, counted through its fake implementation). docs/performance.md quotes it.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from scalevec.bench.count import record_step
from scalevec.model import kernels, triton_dnp

EPS = 1e-6
FORMS = {
    "baseline silu(gate) * up": lambda yg, yu, sg, su: F.silu(yg) * yu,
    "DNP, kernels._DNPSwiGLU": lambda yg, yu, sg, su: kernels._DNPSwiGLU.apply(yg, yu, sg, su, EPS),
    "DNP, scalevec::dnp_swiglu": lambda yg, yu, sg, su: triton_dnp.dnp_swiglu(yg, yu, sg, su, EPS),
}


def _record(fn, tokens: int, d_ff: int) -> tuple[int, int]:
    """``(kernels, bytes)`` of ``(fn(y_g, y_u, s_g, s_u) * g).sum()`` forward and backward, as ``bench --count``
    records them (g: a fixed bf16 gradient for the output)."""
    meta = lambda *shape, dtype=torch.bfloat16: torch.empty(*shape, dtype=dtype, device="meta", requires_grad=True)
    yg, yu = meta(tokens, d_ff), meta(tokens, d_ff)
    sg, su = meta(d_ff, dtype=torch.float32), meta(d_ff, dtype=torch.float32)
    g = torch.empty(tokens, d_ff, dtype=torch.bfloat16, device="meta")
    ops = record_step(lambda: (fn(yg, yu, sg, su) * g).sum(), None)
    return len(ops), sum(b for _, b in ops)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d-ff", type=int, default=1706, help="SwiGLU width (llama-0.12b: 1706)")
    p.add_argument("--tokens", type=int, default=2048)
    args = p.parse_args()
    n, d = args.tokens, args.d_ff
    wrapper_kernels, wrapper_bytes = _record(lambda yg, yu, sg, su: yg, n, d)  # the loss wrapper alone
    print(f"DNP's SwiGLU forward + backward, bf16 activations, d_ff {d}, {n} tokens")
    print(f"{'form':28s} {'kernels':>7s} {'bytes/token':>12s} {'× d_ff':>7s}")
    for name, fn in FORMS.items():
        kernels_, bytes_ = _record(fn, n, d)
        per_token = (bytes_ - wrapper_bytes) / n
        print(f"{name:28s} {kernels_ - wrapper_kernels:7d} {per_token:12.0f} {per_token / d:7.1f}")


if __name__ == "__main__":
    main()
