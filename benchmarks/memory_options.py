"""Peak memory of one training step with activation checkpointing and the chunked cross-entropy (docs/performance.md, "Memory options").

    python benchmarks/memory_options.py [--d-model 256 --n-layers 8 --vocab 32768 --batch 8 --seq 256 --chunk 256]

Forward + backward of a baseline model on one CPU thread, for each memory option; the peak is the bytes
that torch's CPU allocator hands out on top of the persistent state during the step (the allocation
events of ``torch.profiler(profile_memory=True)``, as ``scalevec bench`` measures it: deterministic, to
the byte). Gradients of every option are compared with the plain path's. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import time
import types

import torch

from scalevec import ModelConfig, ScaleConfig, build_model
from scalevec.bench.memory import step_peak_bytes
from scalevec.model.params import count_params


def main() -> None:
    p = argparse.ArgumentParser()
    for name, default in (("d-model", 256), ("n-layers", 8), ("vocab", 32768), ("batch", 8), ("seq", 256),
                          ("chunk", 256)):
        p.add_argument(f"--{name}", type=int, default=default)
    a = p.parse_args()
    torch.set_num_threads(1)
    from scalevec.config import checkpoint_blocks

    cfg = ModelConfig(d_model=a.d_model, n_layers=a.n_layers, n_heads=a.d_model // 64, n_kv_heads=a.d_model // 64,
                      d_ff=a.d_model * 8 // 3, vocab_size=a.vocab, max_seq_len=a.seq)
    model = build_model(cfg, ScaleConfig.preset("baseline"), seed=0)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
    y = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)

    def step():
        model.zero_grad(set_to_none=False)  # gradients persist between steps: not part of the step's peak
        ce, n, _ = model(x, y)
        (ce / n).backward()

    print(f"d_model {a.d_model}, {a.n_layers} blocks, vocab {a.vocab}, batch {a.batch} x {a.seq} tokens, "
          f"{count_params(model)['params']:,} params, fp32, 1 CPU thread\n")
    print("| option | peak above persistent state | saved | step time | max grad diff / grad norm |")
    print("|---|---:|---:|---:|---:|")
    ref_peak = ref_grads = None
    options = [("plain", "none", 0), ("checkpoint every_2", "every_2", 0), ("checkpoint all", "all", 0),
               (f"chunked CE ({a.chunk} tokens)", "none", a.chunk), ("checkpoint all + chunked CE", "all", a.chunk)]
    for name, spec, chunk in options:
        model.set_memory_options(checkpoint_blocks(spec, cfg.n_layers), chunk)
        step()  # warm-up; allocates the gradients
        t0 = time.perf_counter()
        step()
        dt = time.perf_counter() - t0
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        peak = step_peak_bytes(types.SimpleNamespace(step=step), torch.device("cpu"))
        if ref_peak is None:
            ref_peak, ref_grads = peak, grads.clone()
        diff = ((grads - ref_grads).abs().max() / ref_grads.norm()).item()
        print(f"| {name} | {peak / 2**20:,.0f} MiB | {1 - peak / ref_peak:.0%} | {dt:.2f} s | {diff:.1e} |")


if __name__ == "__main__":
    main()
