"""The training-step benchmark of ``scalevec bench`` (docs/performance.md): step time, MFU, peak memory, the targets.

For one preset and batch shape it builds every candidate side by side in one process (``candidates``) and
measures

- **the training step**: forward, backward, gradient clipping at 1.0 and the AdamW step over our role
  param groups (DESIGN.md §5), as ``scalevec train`` takes it, timed interleaved after ``warmup`` steps
  each (``harness``: paired ratio to the first candidate, median and IQR, wall clock and CPU time);
  achieved TFLOP/s and MFU against a matmul peak measured in the same process (``model.flops``);
- **peak memory** of one step (``memory``);
- **inference**: forward-only speed before and after ``fold_scales`` (``inference``).

Each ratio is set against the issue's target for its candidate (``targets``). The first loss of every
candidate is the equal-work check: all start from the same matrices and the same batch.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from contextlib import nullcontext

import torch

from scalevec import __version__
from scalevec.bench.candidates import (
    DEFAULT_STRATEGIES,
    DENSE,
    GPU_STRATEGIES,
    HF,
    dense_active,
    make_candidate,
    parse_candidates,
)
from scalevec.bench.harness import interleave, peak_tflops, quantiles, summarize, sync
from scalevec.bench.inference import bench_inference
from scalevec.bench.memory import state_bytes, step_peak_bytes
from scalevec.config import PRESET_NAMES, OptimConfig, ScaleConfig
from scalevec.config.presets import get_preset
from scalevec.model.flops import cpu_name, flops_per_token, gpu_spec_peak
from scalevec.training.distributed import resolve_device

# The issue's targets, as ratios to the baseline (step, memory) or to hf-llama's step (HF_TARGET)
FOLDABLE_STEP_TARGET, UNFOLDABLE_STEP_TARGET, MEMORY_TARGET, HF_TARGET = 1.02, 1.05, 1.01, 1.0


def bench(preset: str = "small", strategies: str | None = None, batch_size: int | None = None,
          seq_len: int | None = None, steps: int = 20, warmup: int = 3, compile: bool = False, dtype: str = "float32",
          device: str = "cpu", inference: bool = True, memory: bool = True, seed: int = 0,
          peak: float | None = None, threads: int | None = None, log: Callable[[str], None] | None = None) -> dict:
    """Run the benchmark and return its results as a JSON-ready dict (see the module docstring).

    ``strategies`` defaults to ``DEFAULT_STRATEGIES`` on CPU and ``GPU_STRATEGIES`` on CUDA;
    ``batch_size`` / ``seq_len`` to 16 × 128 on CPU and 16 × the preset's context on CUDA.
    Raises ``ValueError`` for an unknown preset / candidate, a bad size, or CUDA asked for but absent.
    """
    say = log or (lambda _msg: None)
    cfg = get_preset(preset)
    dev = resolve_device(device)
    names = parse_candidates(strategies or (GPU_STRATEGIES if dev.type == "cuda" else DEFAULT_STRATEGIES))
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"--dtype {dtype} is unknown; use float32 or bfloat16")
    if steps < 1 or warmup < 0:
        raise ValueError(f"--steps {steps} / --warmup {warmup}: use steps >= 1 and warmup >= 0")
    batch_size = 16 if batch_size is None else batch_size  # `or` would turn an asked-for 0 into the default
    if seq_len is None:
        seq_len = cfg.max_seq_len if dev.type == "cuda" else 128
    if batch_size < 1 or not 1 <= seq_len <= cfg.max_seq_len:
        raise ValueError(f"--batch-size {batch_size} / --seq-len {seq_len}: use a batch >= 1 and a sequence length "
                         f"in 1..{cfg.max_seq_len} (preset {preset}'s context)")
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads {threads}: use 1 or more CPU threads")
        torch.set_num_threads(threads)
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16) if dtype == "bfloat16" else nullcontext()
    ocfg = OptimConfig()
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, cfg.vocab_size, (batch_size, seq_len + 1), generator=g).to(dev)
    x, y = data[:, :-1], data[:, 1:]
    tokens = batch_size * seq_len
    load_start = os.getloadavg()
    pk, pk_source = peak_tflops(dev, peak, dtype)  # before the candidates: their memory does not disturb it
    spec = gpu_spec_peak(dev)
    say(f"matmul peak {pk:.3f} TFLOP/s ({pk_source})")

    say(f"building {len(names)} candidates: {', '.join(names)}")
    cands = [make_candidate(n, cfg, x, y, dev, autocast, compile, seed, ocfg) for n in names]
    for c in cands:  # warm-up (and compilation); the first loss is the equal-work check
        t0 = time.perf_counter()
        c.loss_init = float(c.step())
        for _ in range(warmup - 1):
            c.step()
        sync(dev)
        say(f"  warm-up {c.name}: loss at init {c.loss_init:.5f}, {time.perf_counter() - t0:.1f}s")
    say(f"timing {steps} interleaved rounds of training steps")
    cpu: dict[str, list[float]] = {}
    train = summarize(interleave(cands, lambda c: c.step, steps, dev, cpu), names[0], tokens)
    for name, row in summarize(cpu, names[0], tokens).items():  # CPU time: what load from other processes spares
        train[name].update({"cpu_median_s": row["median_s"], "cpu_ratio": row["ratio"],
                            "cpu_ratio_q25": row["ratio_q25"], "cpu_ratio_q75": row["ratio_q75"]})

    mem = {}
    if memory:
        for c in cands:
            c.state_bytes = state_bytes(c)
            c.peak_bytes = c.state_bytes + step_peak_bytes(c, dev)
        ref = cands[0].peak_bytes
        mem = {c.name: {"peak_bytes": c.peak_bytes, "state_bytes": c.state_bytes,
                        "step_bytes": c.peak_bytes - c.state_bytes, "ratio": c.peak_bytes / ref} for c in cands}

    infer: dict = {}
    if inference:
        say("timing forward-only passes before and after fold_scales")
        infer = bench_inference(cands, cfg, x, dev, autocast, compile, steps, warmup, tokens)

    fpt = flops_per_token(cfg, seq_len)
    results = []
    base = next((c for c in cands if c.name.partition(":")[0] == "baseline"), None)
    for c in cands:
        t = train[c.name]
        row = {"name": c.name, "params": c.params, "loss_init": c.loss_init, **{k: v for k, v in t.items()}}
        row["flops_per_token"] = flops_per_token(dense_active(cfg), seq_len) if c.name == DENSE else fpt
        row["tflops"] = row["flops_per_token"] * t["tokens_per_s"] / 1e12
        row["mfu"] = row["tflops"] / pk
        row["mfu_spec"] = row["tflops"] * 1e12 / spec if spec else None
        if memory:
            row.update({f"mem_{k}": v for k, v in mem[c.name].items()})
        row["targets"] = targets(c.name, names[0], train, mem, base.name if base else None)
        results.append(row)
    return {
        "scalevec": __version__, "torch": torch.__version__, "python": platform.python_version(),
        "preset": preset, "batch_size": batch_size, "seq_len": seq_len, "tokens_per_step": tokens,
        "device": str(dev), "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu_name(),
        "threads": torch.get_num_threads(), "dtype": dtype, "compile": compile, "steps": steps, "warmup": warmup,
        "seed": seed, "reference": names[0], "flops_per_token": fpt, "peak_tflops": pk,
        "peak_source": pk_source, "spec_peak_tflops": spec / 1e12 if spec else None,
        "memory_method": ("torch.cuda.max_memory_allocated" if dev.type == "cuda" else "torch.profiler profile_memory")
        if memory else None,
        "loadavg_start": list(load_start), "loadavg_end": list(os.getloadavg()),
        "train": results, "inference": infer,
    }


def targets(name: str, ref: str, train: dict, mem: dict, base: str | None) -> dict:
    """The issue's targets that apply to candidate ``name`` (ratios against ``ref``, the first candidate)."""
    out = {}
    strategy = name.partition(":")[0]
    if name != ref and strategy in PRESET_NAMES and ref.partition(":")[0] == "baseline":
        limit = FOLDABLE_STEP_TARGET if ScaleConfig.preset(strategy).foldable else UNFOLDABLE_STEP_TARGET
        out["step"] = {"limit": limit, "ratio": train[name]["ratio"], "met": train[name]["ratio"] <= limit}
        if mem:
            ratio = mem[name]["ratio"]
            out["memory"] = {"limit": MEMORY_TARGET, "ratio": ratio, "met": ratio <= MEMORY_TARGET}
    if name == HF and base is not None:  # baseline step time / hf-llama's, paired round by round
        ratios = [b / h for b, h in zip(train[base]["times_s"], train[HF]["times_s"])]
        r = quantiles(ratios)[1]
        out["baseline_vs_hf"] = {"limit": HF_TARGET, "ratio": r, "met": r <= HF_TARGET}
    return out
