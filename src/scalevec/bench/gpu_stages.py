"""The GPU check's in-process stages (DESIGN.md §8): each measures one thing about scalevec's CUDA path and
writes its figures as ``WORK/NAME.json``; any of them runs on its own. A checkout's ``scripts/gpu_check.sh`` runs
each in its own process (under a timeout, ``torchrun`` for ``resume``) so that a crash or a hang in one never stops
the next.

    python -m scalevec.bench.gpu_stages env|parity|busy|resume|torchtitan --work DIR --device cuda|cpu

The sizes depend on the device: on CUDA the stages measure at the sizes of real runs (a GPU-ladder rung,
``llama-0.12b``); on CPU (the rehearsal, ``DEVICE=cpu``) the same code runs at tiny sizes in seconds.

- ``env``: torch / CUDA / GPU, bf16 support, ``torch.nn.functional.grouped_mm``, and that every scalevec module
  imports (an import error names its module; the torchtitan and OLMo-core adapters, whose frameworks are optional,
  are listed apart in ``optional_not_importable``).
- ``parity``: every strategy's fp32 logits on the device against CPU from the same initial matrices (drawn on
  CPU), at init and after 5 AdamW steps on one fixed batch; TF32 off. Tolerances, and why, in ``PARITY_TOL``.
- ``busy``: eager bf16 training steps of baseline and unified at a ladder-rung size (``scalevec bench``'s step:
  model, loss, backward, clip, optimizer), step time, tokens/s and the GPU-busy fraction (the sum of the CUDA
  kernels' device time over the wall time of the same steps, ``torch.profiler``); on CPU the fraction is None.
- ``resume``: ``llama-0.12b`` / unified, bf16, FSDP2 + ``torch.compile`` (under ``torchrun``): one run of ``2k``
  steps, and a second run stopped after ``k`` (its checkpoint) then resumed to ``2k``; the two runs' logged losses
  compared (bitwise, else the largest difference), and the first run's speed, MFU and memory. On CUDA two
  uninterrupted runs are not bitwise equal (atomic adds in backward kernels), so the losses logged *before* the
  checkpoint, where both runs are uninterrupted, measure that run-to-run drift, and a resume is judged against it
  (``resume_ok``: the first logged step after the checkpoint within ``RESUME_TOL`` of the drift at the checkpoint,
  every later one within 0.05 nats; on CPU both must be 0). Its step time, tokens/s and MFU are the median of the
  steps that log nothing (``quiet_step_times``); the logged steps' median is kept as ``step_ms_log_steps``.
- ``torchtitan``: torchtitan's Llama3 debugmodel converted to ``unified`` trains a few steps (``gpu_torchtitan.py``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import pkgutil
import statistics
import sys
import time
from pathlib import Path

import torch

from scalevec.bench.gpu_torchtitan import torchtitan_stage
from scalevec.training.monitors import Monitor

# fp32 parity CUDA vs CPU: same matrices, TF32 off. At init the only difference is the order of fp32 sums
# (cuBLAS vs CPU kernels): relative rounding ~1e-6 per dot product of a few hundred terms, logits O(1-10),
# so 1e-4 absolute is a 10x margin. After 5 AdamW steps a gradient entry near zero can change sign between
# devices, and Adam's normalised update then moves that weight by up to lr in either direction: with lr 1e-3
# the logits can differ by O(lr) = 1e-3 per step, hence 1e-2 after 5 steps (and no more: a real bug moves them
# by O(1)).
PARITY_TOL = {"init": 1e-4, "after_5_steps": 1e-2}
PARITY_LR = 1e-3
# A resume that restored everything continues the same trajectory: its first logged step after the checkpoint differs
# from the uninterrupted run by about the drift the two runs already had (measured on the steps before it), plus what
# one nondeterministic step adds; 5e-3 nats is ~3x the drift measured on an H200 at step 19 of 0.12B (1.8e-3). A lost
# optimizer state or schedule step moves it by far more (AdamW restarting from zero moments: > 0.1).
RESUME_TOL = 5e-3

# the adapters of frameworks scalevec does not need (the ``frameworks`` extra): without the framework they cannot
# import, which the env stage records beside the failures, not as one (the torchtitan stage says "not run")
OPTIONAL_ADAPTERS = ("scalevec.integrations.torchtitan", "scalevec.integrations.olmo_core")

SIZES = {  # per device: (preset, batch, seq) of each stage
    "cuda": {"parity": ("cpu-200k", 4, 64), "busy": ("gpu-6m", 64, 256), "resume": ("llama-0.12b", 16, 1024)},
    "cpu": {"parity": ("cpu-10k", 2, 32), "busy": ("cpu-25k", 8, 64), "resume": ("tiny", 4, 64)},
}


def env_report(device: str) -> dict:
    """Versions, the device, bf16 and grouped-GEMM support, and every scalevec module's import (name -> error)."""
    import scalevec

    failed, optional = {}, {}
    # __main__ modules run the CLI when imported: they are the entry points, not libraries
    modules = [m.name for m in pkgutil.walk_packages(scalevec.__path__, "scalevec.") if not m.name.endswith("__main__")]
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as e:  # an import error of any kind is what this stage reports
            (optional if name in OPTIONAL_ADAPTERS and isinstance(e, ImportError) else failed)[name] = \
                f"{type(e).__name__}: {e}"[:300]
    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
           "scalevec_from": str(Path(scalevec.__file__).parent),
           "cuda_available": torch.cuda.is_available(), "grouped_mm": hasattr(torch.nn.functional, "grouped_mm"),
           "modules": len(modules), "import_failures": failed, "optional_not_importable": optional}
    for lib in ("transformers", "numpy", "scipy", "safetensors", "tokenizers", "yaml"):
        try:
            out[lib] = importlib.import_module(lib).__version__
        except Exception:
            out[lib] = None
    if device == "cuda" and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        out.update(gpu=torch.cuda.get_device_name(0), capability=f"{p.major}.{p.minor}", gpus=torch.cuda.device_count(),
                   gpu_memory_gib=round(p.total_memory / 2**30, 1), bf16=torch.cuda.is_bf16_supported())
    out["ok"] = not failed and (device != "cuda" or out["cuda_available"])
    return out


def _fixed_batch(vocab: int, batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def _adamw_run(model, x, y, steps: int) -> list[float]:
    """``steps`` AdamW steps (the trainer's groups and optimizer) on one batch; returns the losses."""
    from scalevec.config import OptimConfig
    from scalevec.training.optim import build_optimizers, param_groups

    ocfg = OptimConfig(lr=PARITY_LR)
    opts = build_optimizers(param_groups(model, ocfg, model.scfg, model.param_roles()), ocfg)
    losses = []
    for _ in range(steps):
        ce, _, aux = model(x, y)
        loss = ce / y.numel() + aux
        loss.backward()
        for o in opts:
            o.step()
            o.zero_grad(set_to_none=True)
        losses.append(float(loss))
    return losses


def parity(device: str) -> dict:
    """Every strategy's fp32 logits on ``device`` vs CPU, same initial matrices, at init and after 5 AdamW steps.

    Returns ``{strategy: {"init": max |Δlogit|, "after_5_steps": ...}, "ok": bool, "tolerance": PARITY_TOL}``.
    On CPU the "device" is CPU too (the rehearsal exercises the code; its differences are 0)."""
    from scalevec.config import PRESET_NAMES, ScaleConfig
    from scalevec.config.presets import get_preset
    from scalevec.model.transformer import build_model

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    preset, batch, seq = SIZES[device]["parity"]
    cfg = get_preset(preset)
    x, y = _fixed_batch(cfg.vocab_size, batch, seq)
    dev = torch.device(device)
    out: dict = {"preset": preset, "batch": [batch, seq], "lr": PARITY_LR, "tolerance": PARITY_TOL, "strategies": {}}
    ok = True
    for name in PRESET_NAMES:
        scfg = ScaleConfig.preset(name)
        ref = build_model(cfg, scfg, seed=0)  # drawn on CPU
        other = build_model(cfg, scfg, seed=0)
        other.load_state_dict(ref.state_dict())
        other.to(dev)
        diffs = {}
        with torch.no_grad():
            diffs["init"] = (ref(x).float() - other(x.to(dev)).float().cpu()).abs().max().item()
        _adamw_run(ref, x, y, 5)
        _adamw_run(other, x.to(dev), y.to(dev), 5)
        with torch.no_grad():
            diffs["after_5_steps"] = (ref(x).float() - other(x.to(dev)).float().cpu()).abs().max().item()
        good = all(diffs[k] <= PARITY_TOL[k] for k in PARITY_TOL)
        ok &= good
        out["strategies"][name] = {**diffs, "ok": good}
    out["max_init"] = max(v["init"] for v in out["strategies"].values())
    out["max_after_5_steps"] = max(v["after_5_steps"] for v in out["strategies"].values())
    out["ok"] = ok
    return out


def _busy_fraction(step, device: torch.device, steps: int) -> float | None:
    """Sum of CUDA kernel time ÷ wall time over ``steps`` calls of ``step`` (None on CPU)."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize(device)
        wall = time.perf_counter() - t0
    # "self" device time: each kernel counted once, not again in the ops that launched it
    kernel_us = sum(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
                    for e in prof.key_averages())
    return kernel_us / 1e6 / wall if wall > 0 else None


def busy(device: str) -> dict:
    """Eager bf16 (fp32 on CPU) training steps of baseline and unified at a ladder-rung size: median step time,
    tokens/s and the GPU-busy fraction (see the module docstring)."""
    from scalevec.bench.candidates import make_candidate
    from scalevec.bench.harness import timed
    from scalevec.config import OptimConfig
    from scalevec.config.presets import get_preset

    preset, batch, seq = SIZES[device]["busy"]
    cfg = get_preset(preset)
    dev = torch.device(device)
    x, y = (t.to(dev) for t in _fixed_batch(cfg.vocab_size, batch, seq))
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")
    rows = {}
    for name in ("baseline", "unified"):
        c = make_candidate(name, cfg, x, y, dev, autocast, False, 0, OptimConfig(lr=1e-3))
        for _ in range(3):
            c.step()
        times = [timed(c.step, dev) for _ in range(20 if dev.type == "cuda" else 5)]
        med = statistics.median(times)
        rows.update({f"{name}_step_ms": med * 1e3, f"{name}_tokens_per_s": batch * seq / med,
                     f"{name}_gpu_busy": _busy_fraction(c.step, dev, 10)})
        del c
    rows["unified_step_ratio"] = rows["unified_step_ms"] / rows["baseline_step_ms"]
    return {"preset": preset, "batch": [batch, seq], "dtype": "bfloat16" if dev.type == "cuda" else "float32",
            "compile": False, **rows, "ok": math.isfinite(rows["unified_step_ratio"])}


def resume_verdict(a: dict[int, float], b: dict[int, float], k: int, exact: bool) -> dict:
    """Compare the uninterrupted run's logged losses ``a`` with the resumed run's ``b`` (``{step index: nats}``,
    step index ``k`` the first after the checkpoint). ``exact``: every resumed loss must equal (CPU); else the
    first resumed step must lie within ``RESUME_TOL`` of the drift the runs had before the checkpoint and every
    later one within 0.05 nats (see the module docstring). Returns the figures and ``resume_ok``."""
    before = [abs(a[s] - b[s]) for s in sorted(a) if s < k and s in b]  # both runs uninterrupted here
    steps = [s for s in sorted(a) if s >= k]
    missing = [s for s in steps if s not in b]
    diffs = [abs(a[s] - b[s]) for s in steps if s in b]
    drift = before[-1] if before else 0.0
    ok = bool(diffs) and not missing and (max(diffs) == 0.0 if exact else
                                          diffs[0] <= drift + RESUME_TOL and max(diffs) <= 0.05)
    return {"resumed_steps_compared": len(diffs), "resume_missing_steps": missing, "drift_before_checkpoint": drift,
            "resume_first_step_diff": diffs[0] if diffs else None, "resume_bitwise": bool(diffs) and max(diffs) == 0.0,
            "resume_max_abs_loss_diff": max(diffs, default=None), "resume_ok": ok}


class QuietSteps(Monitor):
    """A training monitor that keeps the wall seconds of every step after the first ``warmup`` that logged nothing
    (no per-vector telemetry, no metrics row): what a step of a long run costs. The trainer's own ``step_time_s`` is
    the median of the logged steps, the slower ones."""

    def __init__(self, warmup: int):
        self.warmup = warmup
        self.times: list[float] = []

    def after_step(self, ev) -> None:
        if not ev.logged and ev.step >= self.warmup:
            self.times.append(ev.step_time)


def quiet_step_times(cfg, out: Path, warmup: int) -> list[float]:
    """Train ``cfg`` into ``out`` (``trainer.train`` with its default monitors and ``QuietSteps``) and return the
    wall seconds of the steps after the first ``warmup`` that logged nothing."""
    from scalevec.training import monitors
    from scalevec.training.trainer import train

    quiet = QuietSteps(warmup)
    train(cfg, out, quiet=True, monitors=[*monitors.default(), quiet])
    return quiet.times


def resume(device: str, work: Path) -> dict:
    """Run A of ``2k`` steps, run B stopped at ``k`` and resumed (see the module docstring); rank 0 returns the
    figures. Launched under ``torchrun --nproc_per_node 1``: the process group is made here, once, with
    ``device_id``, and used as is by the three trainings."""
    import torch.distributed as dist

    from scalevec.bench.run_speed import run_figures
    from scalevec.resolve import resolve_config
    from scalevec.training.distributed import init_group
    from scalevec.training.rundir import read_metrics
    from scalevec.training.trainer import train

    cuda = device == "cuda"
    preset, batch, seq = SIZES[device]["resume"]
    k = 20 if cuda else 3
    init_group(torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu"))
    try:
        cfg = resolve_config(preset, "unified", {
            "train.steps": 2 * k, "train.batch_size": batch, "train.micro_batch_size": batch, "train.seq_len": seq,
            "train.device": device, "train.dtype": "bfloat16" if cuda else "float32", "train.dist": "fsdp2",
            "train.compile": "true" if cuda else "false", "train.ckpt_every": k, "train.eval_every": 2 * k,
            # log every 5th step (CPU: 2nd): the step time is taken from the steps in between, without telemetry
            "train.log_every": 5 if cuda else 2, "schedule.warmup": k // 2, "data.tokenizer": "bytes",
            "data.val_tokens": 8 * seq})
        t0 = time.perf_counter()
        quiet = quiet_step_times(cfg, work / "resume-a", warmup=5 if cuda else 1)
        t_a = time.perf_counter() - t0
        train(cfg, work / "resume-b", quiet=True, stop_at=k)
        train(cfg, work / "resume-b", quiet=True, resume=True)
        if dist.get_rank() != 0:
            return {}
        loss = {r: {m["step"]: m["loss"] for m in read_metrics(work / r, "train")} for r in ("resume-a", "resume-b")}
        verdict = resume_verdict(loss["resume-a"], loss["resume-b"], k, exact=not cuda)
        fig = run_figures(work / "resume-a")
        fig["step_ms_log_steps"] = fig["step_ms"]
        if quiet:  # speed from the steps that log nothing
            step_s = statistics.median(quiet)
            tok_s = fig["tokens_per_step"] / step_s
            fig.update(step_ms=step_s * 1e3, tokens_per_s=tok_s, tflops=fig["flops_per_token"] * tok_s / 1e12,
                       mfu=fig["flops_per_token"] * tok_s / (fig["peak_tflops"] * 1e12))
        return {"quiet_steps_timed": len(quiet), "preset": preset, "strategy": "unified", "batch": [batch, seq],
                "steps": 2 * k, "checkpoint_at": k,
                "dtype": cfg.train.dtype, "compile": cfg.train.compile, "dist": "fsdp2", "wall_s_run_a": t_a,
                **verdict, **fig, "ok": verdict["resume_ok"] and fig["loss_last"] < fig["loss_first"]}
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """``python -m scalevec.bench.gpu_stages NAME --work DIR --device D``: run a stage, write ``DIR/NAME.json``.
    Exit 0 when the stage's own check passed (``ok``), 1 when it did not; an exception propagates (exit 1)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stage", choices=["env", "parity", "busy", "resume", "torchtitan"])
    p.add_argument("--work", required=True)
    p.add_argument("--device", choices=["cuda", "cpu"], required=True)
    args = p.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.device == "cpu":
        torch.set_num_threads(min(2, torch.get_num_threads()))
    fn = {"env": lambda: env_report(args.device), "parity": lambda: parity(args.device),
          "busy": lambda: busy(args.device), "resume": lambda: resume(args.device, work),
          "torchtitan": lambda: torchtitan_stage(args.device)}[args.stage]
    result = fn()
    if result:  # the rank-0 process of a distributed stage writes
        (work / f"{args.stage}.json").write_text(json.dumps(result, indent=1, default=str))
        print(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}, default=str))
    return 0 if result.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
