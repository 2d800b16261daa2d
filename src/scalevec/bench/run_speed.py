"""A finished training run's speed figures (DESIGN.md §8): what the GPU check reports of the runs it trains.

``run_figures`` reads a finished run directory (config.yaml, summary.json, metrics.jsonl) and computes step time,
tokens/s, FLOPs per token (``model.flops``), achieved TFLOP/s and MFU against the peak *of the run's matmul dtype*
(bf16 spec figure for a bf16 run on a known GPU, a measured fp32 peak for an fp32 run), the trainer's own logged
MFU, losses, and the peak GPU memory when the trainer logged it.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from scalevec.config.run_budget import tokens_per_step
from scalevec.model.flops import flops_per_token, peak_flops
from scalevec.training.rundir import load_config, read_metrics, read_summary


def run_figures(run: str | Path) -> dict:
    """Speed and loss figures of the finished run in ``run`` (see the module docstring).

    Keys: ``step_ms`` (the trainer's median step after warm-up), ``tokens_per_step``, ``tokens_per_s``,
    ``flops_per_token``, ``tflops`` (achieved, TFLOP/s), ``peak_tflops`` and ``peak_source`` (for the run's
    matmul dtype), ``mfu`` (a fraction), ``mfu_logged_median`` (the trainer's per-step metric after step 5, None
    if it logged none), ``loss_first`` / ``loss_last`` (train, nats/token), ``final_val_loss``, ``compiled``,
    ``max_memory_gib`` (largest ``max_memory_allocated`` the trainer logged, GiB; None if none).
    Raises ``rundir.RunDirError`` (a ``ValueError``) for a run directory without its files."""
    run = Path(run)
    cfg = load_config(run)
    summary = read_summary(run)
    rows = read_metrics(run, "train")
    per_step = tokens_per_step(cfg)
    step_s = summary.get("step_time_s")
    fpt = flops_per_token(cfg.model, cfg.train.seq_len)
    device = torch.device("cuda" if cfg.train.device.startswith("cuda") else "cpu")
    mm_dtype = torch.bfloat16 if device.type == "cuda" and cfg.train.dtype != "float32" else torch.float32
    peak, source = summary.get("peak_flops"), "the run's summary"
    if not peak:
        peak, source = peak_flops(device, mm_dtype, cfg.train.peak_flops)
    tok_s = per_step / step_s if step_s else None
    logged = [r["mfu"] for r in rows if r.get("step", 0) >= 5 and r.get("mfu") is not None]
    mem = [r[k] for r in rows for k in ("max_memory_gib", "max_memory_allocated_gib") if r.get(k) is not None]
    return {"step_ms": step_s * 1e3 if step_s else None, "tokens_per_step": per_step, "tokens_per_s": tok_s,
            "flops_per_token": fpt, "tflops": fpt * tok_s / 1e12 if tok_s else None, "matmul_dtype": str(mm_dtype),
            "peak_tflops": peak / 1e12, "peak_source": source, "mfu": fpt * tok_s / peak if tok_s else None,
            "mfu_logged_median": statistics.median(logged) if logged else None,
            "loss_first": rows[0]["loss"] if rows else None, "loss_last": rows[-1]["loss"] if rows else None,
            "final_val_loss": summary.get("final_val_loss"), "compiled": summary.get("compiled"),
            "max_memory_gib": max(mem) if mem else None}


__all__ = ["run_figures"]
