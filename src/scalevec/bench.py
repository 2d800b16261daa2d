"""``scalevec bench``: what each scale-vector strategy costs, and our speed against Hugging Face Llama (issue 9).

For one preset and batch shape it builds every candidate side by side in one process and measures

- **the training step**: forward, backward, gradient clipping at 1.0 and the AdamW step over our role
  param groups (DESIGN.md §5), as ``scalevec train`` takes it. After ``warmup`` steps each, the
  candidates run interleaved (A B C, B C A, ...) so that load from other processes falls on all of
  them alike; each candidate's ratio to the first is taken round by round, then the median is
  reported with its interquartile range.
- **peak memory** of one step: the candidate's persistent tensors (parameters, buffers, optimizer
  state) plus the highest level of what the step allocates on top. On CUDA the step's part is
  ``max_memory_allocated`` minus the level before it; on CPU it is the running sum of the allocation
  events of ``torch.profiler(profile_memory=True)``, which sees every tensor that torch's CPU
  allocator hands out, to the byte (not memory that libraries such as oneDNN allocate by themselves).
  Both are deterministic, unlike the process's resident set, which the other candidates share.
- **inference**: forward-only tokens/s of each foldable strategy's model before and after
  ``fold_scales`` (DESIGN.md §4, §10), against the first candidate's unfolded forward, and the
  folded parameter count against a plain Llama's.
- **generation** (``--generate``, instead of the above; issue 26): greedy tokens/s of ``scalevec
  generate`` (``hf.generate.hf_sample`` on the loaded export) against transformers' own ``generate()``
  called directly on the same loaded export, and against the reference loop over our ``Transformer``
  with its KV cache (``hf.generate.sample``, what ``scalevec generate`` ran before issue 26), per
  strategy (``bench_generate``).

Candidates: strategy names (DESIGN.md §3), ``NAME:activation`` / ``NAME:weight`` to force the way a
strategy applies its scales, and ``hf-llama``: ``transformers.LlamaForCausalLM`` from the same shape
(SDPA attention) holding the baseline's initial weights, trained with the same loss, clipping and a
torch AdamW with the same settings (decay on matrices and LM head, none on embedding and norm gains).
Every candidate starts from the same matrices, so their initial losses agree (a check on equal work).
Speed is a measured figure, never asserted by a test. This module trains nothing and writes no run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from scalevec import __version__
from scalevec.config import PRESET_NAMES, SCALE_CHOICES, ModelConfig, OptimConfig, ScaleConfig
from scalevec.hf.export import hf_config, hf_state_dict
from scalevec.model.flops import cpu_name, flops_per_token, gpu_spec_peak, matmul_peak
from scalevec.model.fold import fold_scales
from scalevec.model.transformer import Transformer, build_model
from scalevec.presets import PRESETS, get_preset
from scalevec.training.distributed import resolve_device
from scalevec.training.optim import build_optimizers, param_groups

HF = "hf-llama"
DENSE = "dense-active"  # an MoE preset's dense twin with the same active matmul parameters (less the router)
FOLDABLE_STEP_TARGET, UNFOLDABLE_STEP_TARGET, MEMORY_TARGET = 1.02, 1.05, 1.01
HF_TARGET, FOLDED_FORWARD_TARGET = 1.0, 1.01
DEFAULT_STRATEGIES = "baseline,hg,dp,or,er,iwd,unified_foldable,unified,hf-llama"
GPU_STRATEGIES = "baseline,unified,unified_foldable,hf-llama"  # the issue's GPU set: few compilations


# ----------------------------------------------------------------------------------------- candidates


@dataclass
class Candidate:
    """One model + optimizer under test. ``step()`` takes one training step and returns the loss."""

    name: str
    model: nn.Module
    optimizers: list[torch.optim.Optimizer]
    step: Callable[[], Tensor]
    forward: Callable[[], Tensor]  # inference: logits of the batch under inference_mode
    params: int
    times: list[float] = field(default_factory=list)
    loss_init: float = math.nan
    peak_bytes: int = 0
    state_bytes: int = 0


def parse_candidates(spec: str) -> list[str]:
    """Split ``a,b,...`` and check every name; ``ValueError`` names the unknown one and the choices."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise ValueError("--strategies is empty; give a comma-separated list, e.g. --strategies baseline,unified")
    for n in names:
        base, _, apply = n.partition(":")
        if n not in (HF, DENSE) and (base not in PRESET_NAMES or (apply and apply not in SCALE_CHOICES["apply"])):
            raise ValueError(f"unknown candidate {n!r} in --strategies; use {HF}, {DENSE} (MoE presets), a strategy "
                             f"({', '.join(PRESET_NAMES)}) or STRATEGY:APPLY ({' / '.join(SCALE_CHOICES['apply'])})")
    if len(set(names)) != len(names):
        raise ValueError(f"--strategies lists a candidate twice: {spec}; list each once")
    return names


def strategy_config(name: str) -> ScaleConfig:
    base, _, apply = name.partition(":")
    scfg = ScaleConfig.preset(base)
    return dataclasses.replace(scfg, apply=apply) if apply else scfg


def dense_active(cfg: ModelConfig) -> ModelConfig:
    """The dense twin of MoE config ``cfg``: every MoE MLP becomes a SwiGLU of width ``d_expert · (top_k +
    n_shared_experts)``, the matmul width one token uses, so both do the same matmul FLOPs per token but the
    router's (``flops.matmul_params_per_token``). Raises ``ValueError`` for a dense ``cfg``."""
    if cfg.moe is None:
        raise ValueError(f"{DENSE} compares an MoE preset with its dense twin; use it with a moe-* --preset")
    m = cfg.moe
    return dataclasses.replace(cfg, moe=None, d_ff=m.d_expert * (m.top_k + m.n_shared_experts))


def hf_llama(cfg: ModelConfig, init_from: Transformer | None):
    """``LlamaForCausalLM`` of shape ``cfg`` with SDPA attention; weights copied from a baseline model if given."""
    if cfg.moe is not None or cfg.qk_norm or cfg.layout != "pre" or cfg.tie_embeddings:
        raise ValueError(f"{HF} holds only a dense pre-norm model without QK-norm or tied embeddings; "
                         f"drop {HF} from --strategies for this preset")
    try:
        import transformers

        hcfg = hf_config(cfg, "llama")  # export's config: the same Llama that export writes
    except ImportError:
        raise ValueError(f"{HF} needs transformers; pip install 'scalevec[hf]' or drop {HF} "
                         "from --strategies") from None
    hcfg.use_cache = False  # training: no KV cache
    model = transformers.AutoModelForCausalLM.from_config(hcfg, attn_implementation="sdpa")
    if init_from is not None:
        model.load_state_dict(hf_state(init_from), strict=True)
    return model


def hf_state(model: Transformer) -> dict[str, Tensor]:
    """A baseline model's weights under Hugging Face Llama names, through export's name map (``hf/names.py``).

    The model is folded first (``fold_scales``), as export does: the norm weights become ones and γ moves
    into the matrices. Candidates start at initialization, where γ = 1, so the matrices are the model's own
    bit for bit and the Llama starts from exactly the baseline's weights."""
    return hf_state_dict(fold_scales(model), "llama")


def hf_optimizer(model: nn.Module, ocfg: OptimConfig) -> torch.optim.Optimizer:
    """torch AdamW with our settings: wd on 2-D weights except the embedding (as our roles), none on norm gains."""
    decay, plain = [], []
    for name, p in model.named_parameters():
        (decay if p.ndim == 2 and "embed_tokens" not in name else plain).append(p)
    groups = [{"params": decay, "weight_decay": ocfg.weight_decay}, {"params": plain, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=ocfg.lr, betas=tuple(ocfg.betas), eps=ocfg.eps, foreach=True)


def make_candidate(name: str, cfg: ModelConfig, x: Tensor, y: Tensor, device: torch.device, autocast, compile: bool,
                   seed: int, ocfg: OptimConfig) -> Candidate:
    """Build candidate ``name`` on ``device`` with its optimizers and its step / forward closures."""
    if name == HF:
        model = hf_llama(cfg, build_model(cfg, ScaleConfig.preset("baseline"), seed=seed)).to(device)
        optimizers = [hf_optimizer(model, ocfg)]
        layers = model.model.layers

        def logits() -> Tensor:
            return model(input_ids=x, use_cache=False).logits

    else:
        mcfg = dense_active(cfg) if name == DENSE else cfg
        model = build_model(mcfg, strategy_config("baseline" if name == DENSE else name), seed=seed, device=device)
        optimizers = build_optimizers(param_groups(model, ocfg, model.scfg), ocfg)
        layers = model.layers

        def logits() -> Tensor:
            return model(x)

    if compile:
        for layer in layers:  # per block, as the trainer compiles (distributed.wrap)
            layer.compile()
    params = list(model.parameters())

    def step() -> Tensor:
        with autocast:
            if name == HF:
                ce, aux = F.cross_entropy(logits().float().flatten(0, 1), y.flatten(), reduction="sum"), 0.0
            else:
                ce, _, aux = model(x, y)  # aux: the MoE auxiliary loss (0 for a dense model)
        loss = ce / y.numel() + aux
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, ocfg.grad_clip)
        for opt in optimizers:
            opt.step()
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        return loss.detach()

    def forward() -> Tensor:
        with torch.inference_mode(), autocast:
            return logits()

    return Candidate(name, model, optimizers, step, forward, sum(p.numel() for p in params))


# ----------------------------------------------------------------------------------------- measuring


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


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


def step_peak_bytes(c: Candidate, device: torch.device) -> int:
    """Peak bytes allocated on top of the persistent state during one training step (see the module docstring)."""
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


# ----------------------------------------------------------------------------------------- the benchmark


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
    batch_size = batch_size or 16
    seq_len = seq_len or (cfg.max_seq_len if dev.type == "cuda" else 128)
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


def bench_inference(cands: list[Candidate], cfg: ModelConfig, x: Tensor, dev: torch.device, autocast, compile: bool,
                    steps: int, warmup: int, tokens: int) -> dict:
    """Forward-only timing of every candidate, and of the folded model of every foldable strategy, interleaved."""
    runs: list[Candidate] = list(cands)
    folded_params = {}
    for c in cands:
        if c.name == HF or not c.model.scfg.foldable or c.model.cfg.layout != "pre":
            continue
        folded = fold_scales(c.model).eval()
        if compile:
            for layer in folded.layers:
                layer.compile()

        def fwd(m=folded) -> Tensor:
            with torch.inference_mode(), autocast:
                return m(x)

        runs.append(Candidate(f"{c.name}+folded", folded, [], fwd, fwd, folded.num_params()))
        folded_params[c.name] = folded.num_params()
    for r in runs:
        r.model.eval()
        for _ in range(max(warmup, 1)):
            r.forward()
    summary = summarize(interleave(runs, lambda r: r.forward, steps, dev), runs[0].name, tokens)
    for c in cands:
        c.model.train()
    plain = build_model(cfg, ScaleConfig.preset("none"), device="meta").num_params()
    norm_slots = (2 * cfg.n_layers + 1) * cfg.d_model  # HF Llama's RMSNorm weights (exported as ones, §10)
    rows = []
    for r in runs:
        s = summary[r.name]
        row = {"name": r.name, "params": r.params, "median_s": s["median_s"], "q25_s": s["q25_s"], "q75_s": s["q75_s"],
               "tokens_per_s": s["tokens_per_s"], "ratio": s["ratio"], "ratio_q25": s["ratio_q25"],
               "ratio_q75": s["ratio_q75"], "times_s": s["times_s"]}
        if r.name.endswith("+folded"):
            row["targets"] = {
                "forward": {"limit": FOLDED_FORWARD_TARGET, "ratio": s["ratio"],
                            "met": s["ratio"] <= FOLDED_FORWARD_TARGET},
                "params": {"plain_llama": plain, "hf_llama": plain + norm_slots, "met": r.params == plain},
            }
        rows.append(row)
    return {"reference": runs[0].name, "plain_llama_params": plain, "hf_llama_params": plain + norm_slots,
            "rows": rows}


# ----------------------------------------------------------------------------------------- report


def mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


def mark(t: dict | None) -> str:
    return "" if not t else ("ok" if t["met"] else "MISSED") + f" (<= {t['limit']:.2f}x)"


def format_report(r: dict) -> str:
    """The human-readable tables of a ``bench`` result (the README's Performance tables)."""
    ref = r["reference"]
    lines = [
        f"scalevec bench · preset {r['preset']} · batch {r['batch_size']} x seq {r['seq_len']} "
        f"({r['tokens_per_step']} tokens/step) · {r['device']} ({r['device_name']}, {r['threads']} threads) · "
        f"{r['dtype']}{' · compile' if r['compile'] else ''} · {r['steps']} interleaved rounds after "
        f"{r['warmup']} warm-up · torch {r['torch']}",
        f"load average (1/5/15 min) at start {'/'.join(f'{v:.2f}' for v in r['loadavg_start'])}, "
        f"at end {'/'.join(f'{v:.2f}' for v in r['loadavg_end'])}",
        f"FLOPs per token {r['flops_per_token']:,.0f} (scalevec.model.flops: 6 N_active + attention); "
        f"MFU against a matmul peak of {r['peak_tflops']:.3f} TFLOP/s ({r['peak_source']})"
        + (f", and against the GPU's dense bf16 spec {r['spec_peak_tflops']:.0f} TFLOP/s"
           if r.get("spec_peak_tflops") else ""),
        "",
        "Training step (forward + backward + clip + AdamW). Ratio: paired, round by round, vs the first candidate; "
        "median [IQR]. CPU time: the same ratio of process CPU seconds (time.process_time), which waiting for a "
        "core taken by another process does not inflate.",
        "",
        "| candidate | params | loss at init | step ms, median [IQR] | tokens/s | "
        + "TFLOP/s | MFU | " + f"step vs {ref} | CPU time vs {ref} | peak MiB | memory vs {ref} | target |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for t in r["train"]:
        flops = f"{t['tflops']:.3f} | {t['mfu']:.1%}" + (f" ({t['mfu_spec']:.1%} of spec)" if t.get("mfu_spec") else "")
        ts = t.get("targets", {})
        notes = "; ".join(f"{k} {mark(v)}" + (f" {v['ratio']:.3f}x" if k == "baseline_vs_hf" else "")
                          for k, v in ts.items() if "limit" in v)
        lines.append(
            f"| {t['name']} | {t['params']:,} | {t['loss_init']:.5f} | {1e3 * t['median_s']:.1f} "
            f"[{1e3 * t['q25_s']:.1f}, {1e3 * t['q75_s']:.1f}] | {t['tokens_per_s']:,.0f} | {flops} | "
            f"{t['ratio']:.3f} [{t['ratio_q25']:.3f}, {t['ratio_q75']:.3f}] | "
            f"{t['cpu_ratio']:.3f} [{t['cpu_ratio_q25']:.3f}, {t['cpu_ratio_q75']:.3f}] | "
            + (f"{mib(t['mem_peak_bytes'])} | {t['mem_ratio']:.4f} | " if "mem_peak_bytes" in t else "- | - | ")
            + f"{notes} |")
    if r["memory_method"]:
        lines += ["", f"Peak memory = parameters + buffers + optimizer state + the step's peak allocation "
                      f"({r['memory_method']})."]
    inf = r.get("inference")
    if inf:
        lines += ["", f"Inference (forward only, no grad). Ratio: paired vs {inf['reference']}; median [IQR]. "
                      f"A plain Llama (no scale vectors) has {inf['plain_llama_params']:,} parameters; "
                      f"transformers counts {inf['hf_llama_params']:,} with its RMSNorm weights "
                      "(exported as ones).", "",
                  f"| model | params | forward ms, median [IQR] | tokens/s | vs {inf['reference']} | target |",
                  "|---|---:|---:|---:|---:|---|"]
        for row in inf["rows"]:
            ts = row.get("targets", {})
            notes = ""
            if ts:
                notes = f"forward {mark(ts['forward'])}; params {'= plain model' if ts['params']['met'] else 'MISSED'}"
            lines.append(f"| {row['name']} | {row['params']:,} | {1e3 * row['median_s']:.1f} "
                         f"[{1e3 * row['q25_s']:.1f}, {1e3 * row['q75_s']:.1f}] | {row['tokens_per_s']:,.0f} | "
                         f"{row['ratio']:.3f} "
                         f"[{row['ratio_q25']:.3f}, {row['ratio_q75']:.3f}] | {notes} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------- generation

GENERATE_STRATEGIES = "baseline,unified,dnp"  # a foldable export (plain Llama) and two custom-code ones
GENERATE_WAYS = ("scalevec", "hf", "loop")  # scalevec generate, transformers generate() directly, the reference loop


def bench_generate(preset: str = "small", strategies: str | None = None, new_tokens: int = 200, prompt_len: int = 7,
                   rounds: int = 3, threads: int | None = 1, seed: int = 0,
                   log: Callable[[str], None] | None = None) -> dict:
    """Greedy generation speed on CPU of each strategy's random-init model of ``preset``, exported as
    ``scalevec export`` does (custom code where it cannot fold), then loaded the way ``scalevec generate``
    loads an export: ``new_tokens`` greedy tokens after a ``prompt_len``-token prompt, ``rounds`` times
    each way (``GENERATE_WAYS``, the order rotated every round), after one untimed warm-up each. Times are
    this process's CPU seconds (``time.process_time``): with one thread the compute generation costs,
    whatever else runs on a shared machine. Checks that the three ways give the same ids. Returns
    ``{"strategies": {name: {way: {tokens_per_s, median_s, times_s}, "vs_hf": ratio, "vs_loop": ratio,
    "format": ...}}, ...}``, the ratios being scalevec's speed over the other's, the median of the rounds'.
    Raises ``ValueError`` for an unknown preset or strategy, a bad size or a
    context too short for the prompt and the new tokens, and ``RuntimeError`` when the ways disagree.
    """
    import tempfile
    from pathlib import Path

    from scalevec.data.tokenizer import load_tokenizer
    from scalevec.hf.export import export_model
    from scalevec.hf.generate import load_generator

    say = log or (lambda _msg: None)
    cfg = get_preset(preset)
    names = [n.strip() for n in (strategies or GENERATE_STRATEGIES).split(",") if n.strip()]
    if new_tokens < 1 or prompt_len < 1 or rounds < 1:
        raise ValueError(f"--new-tokens {new_tokens} / --prompt-len {prompt_len} / --steps {rounds}: use 1 or more")
    if prompt_len + new_tokens > cfg.max_seq_len:
        # past the context every way reruns a cropped window: a different workload, not what this measures
        raise ValueError(f"--prompt-len {prompt_len} + --new-tokens {new_tokens} exceed preset {preset}'s context of "
                         f"{cfg.max_seq_len}; ask for fewer tokens")
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads {threads}: use 1 or more CPU threads")
        torch.set_num_threads(threads)
    prompt = torch.randint(0, cfg.vocab_size, (prompt_len,), generator=torch.Generator().manual_seed(seed)).tolist()
    results = {}
    with tempfile.TemporaryDirectory(prefix="scalevec-bench-generate-") as tmp:
        tok_dir = Path(tmp) / "tokenizer"
        load_tokenizer("bytes").save(tok_dir)  # the presets' byte vocabulary: no EOS, so all 200 tokens come
        for name in names:
            model = build_model(cfg, strategy_config(name), seed=seed).eval()
            out = export_model(model, Path(tmp) / name, tok_dir)
            row = _generate_row(name, model, load_generator(out), prompt, new_tokens, rounds)
            results[name] = row
            say(f"{name} ({row['format']}): " + "  ".join(f"{w} {row[w]['tokens_per_s']:.0f}" for w in GENERATE_WAYS)
                + " tokens/s")
    return {"mode": "generate", "preset": preset, "new_tokens": new_tokens, "prompt_len": prompt_len,
            "rounds": rounds, "threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": _transformers_version(), "cpu": cpu_name(), "scalevec": __version__, "strategies": results}


def _generate_row(name: str, model: Transformer, g, prompt: list[int], new_tokens: int, rounds: int) -> dict:
    """One strategy's row of ``bench_generate``: ``model`` and ``g`` (its export, loaded as ``scalevec
    generate`` loads it) timed each way. Raises ``RuntimeError`` when their greedy ids differ."""
    from scalevec.hf.generate import hf_sample, sample
    from scalevec.model.transformer import KVCache

    def loop(n: int) -> list[int]:
        def cached(x, cache):
            cache = cache if cache is not None else KVCache(model.cfg.n_layers)
            return model.decode(x, cache), cache
        return sample(model, prompt, n, temperature=0.0, context=model.cfg.max_seq_len, cached=cached)

    def hf(n: int) -> list[int]:
        x = torch.tensor([prompt])
        with torch.no_grad():
            y = g.model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                                 pad_token_id=g.pad_id)
        return y[0, len(prompt):].tolist()

    ways = {"scalevec": lambda n: hf_sample(g, prompt, n, temperature=0.0), "hf": hf, "loop": loop}
    ids = {w: fn(new_tokens) for w, fn in ways.items()}  # the warm-up, and the equality check
    if len({tuple(v) for v in ids.values()}) != 1 or len(ids["hf"]) != new_tokens:
        raise RuntimeError(f"{name}: greedy ids differ between {', '.join(ways)}: "
                           f"{ {w: v[:8] for w, v in ids.items()} }")
    times: dict[str, list[float]] = {w: [] for w in ways}
    order = list(ways)
    for r in range(rounds):
        for w in order[r % len(order):] + order[:r % len(order)]:  # rotated: no way always runs first
            t0 = time.process_time()
            ways[w](new_tokens)
            times[w].append(time.process_time() - t0)
    row = {w: {"median_s": statistics.median(ts), "tokens_per_s": new_tokens / statistics.median(ts), "times_s": ts}
           for w, ts in times.items()}
    # speed ratios taken round by round, then the median: load from other processes falls on both alike
    for other in ("hf", "loop"):
        row[f"vs_{other}"] = statistics.median(t / ts for t, ts in zip(times[other], times["scalevec"]))
    row["format"] = type(g.model).__name__
    return row


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def format_generate_report(r: dict) -> str:
    """The ``bench_generate`` results as a markdown table: tokens/s each way and scalevec's ratios."""
    lines = [f"greedy generation, preset {r['preset']}: {r['new_tokens']} new tokens after {r['prompt_len']}, "
             f"{r['threads']} thread(s), median of {r['rounds']} rounds of CPU time; {r['cpu']}, torch {r['torch']}, "
             f"transformers {r['transformers']}",
             "",
             "| strategy | export | scalevec generate tok/s | HF generate() tok/s | reference loop tok/s "
             "| scalevec / HF | scalevec / loop |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for name, row in r["strategies"].items():
        lines.append(f"| {name} | {row['format']} | {row['scalevec']['tokens_per_s']:.0f} | "
                     f"{row['hf']['tokens_per_s']:.0f} | {row['loop']['tokens_per_s']:.0f} | {row['vs_hf']:.2f}x | "
                     f"{row['vs_loop']:.2f}x |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------- CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="small", help=f"one of: {', '.join(PRESETS)}")
    p.add_argument("--strategies",
                   help=f"comma-separated candidates, the first is the reference: a strategy, STRATEGY:APPLY "
                        f"({' / '.join(SCALE_CHOICES['apply'])}; fused is opt-in, not bitwise), {HF} or {DENSE} "
                        f"(default {DEFAULT_STRATEGIES}; on CUDA {GPU_STRATEGIES})")
    p.add_argument("--batch-size", type=int, help="sequences per step (default 16)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default 128 on CPU, the preset's context on CUDA)")
    p.add_argument("--steps", type=int, help="timed interleaved rounds (default 20; 3 with --generate)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per candidate first (default 3)")
    p.add_argument("--compile", action="store_true", help="torch.compile each block, as the trainer does")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="float32, or bfloat16 autocast as the trainer uses on CUDA (default float32)")
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda")
    p.add_argument("--no-inference", action="store_true", help="skip the forward-only / folded-model timing")
    p.add_argument("--generate", action="store_true",
                   help=f"instead: greedy generation tokens/s of scalevec generate vs transformers generate() on the "
                        f"same export, on CPU (strategies default {GENERATE_STRATEGIES}, --steps rounds, default 3; "
                        f"--threads default 1)")
    p.add_argument("--new-tokens", type=int, default=200, help="with --generate: greedy tokens per run (default 200)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory pass")
    p.add_argument("--peak-tflops", type=float,
                   help="the peak TFLOP/s for MFU (default: measured in this process, best square matmul)")
    p.add_argument("--threads", type=int,
                   help="CPU threads for torch (default torch's); 1 is steadier on a shared machine")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")
    p.add_argument("--save", help="also write the JSON results to this file")


def run(args: argparse.Namespace) -> int:
    log = (lambda m: print(m, file=sys.stderr, flush=True))
    if args.generate:
        r = bench_generate(args.preset, args.strategies, args.new_tokens, rounds=args.steps or 3,
                           threads=args.threads or 1, seed=args.seed, log=log)
    else:
        r = bench(args.preset, args.strategies, args.batch_size, args.seq_len, args.steps or 20, args.warmup,
                  args.compile, args.dtype, args.device, inference=not args.no_inference, memory=not args.no_memory,
                  seed=args.seed, peak=args.peak_tflops, threads=args.threads, log=log)
    if args.save:
        with open(args.save, "w") as f:
            json.dump(r, f, indent=1)
    print(json.dumps(r, indent=1) if args.json else (format_generate_report if args.generate else format_report)(r))
    return 0
