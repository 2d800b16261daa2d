"""Training FLOPs per token from a model config, a matmul peak, and MFU: the one home of these figures
(docs/performance.md).

``flops_per_token`` is PaLM's estimate (Chowdhery et al. 2022, appendix B): ``6 · N + 12 · n_layers ·
seq_len · n_heads · head_dim``, where N counts the matmul weights one token passes through (every
linear map including the LM head and the MoE router; for MoE only the ``top_k`` routed experts and the
shared experts: the *active* matmul parameters, DESIGN.md §6). The input embedding is a lookup (no
FLOPs), scale vectors and norms are elementwise (left out, as in PaLM), and causal masking is not
discounted. ``scalevec bench``, the trainer's ``flops_per_s`` / ``mfu`` metrics and
``scripts/gpu_check.sh`` all use this function.

``matmul_peak`` measures what the machine's matmul reaches in this process (fp32 on CPU, bf16 on GPU):
the best of a few square matmuls, the denominator of MFU when no spec figure is given. ``peak_flops``
resolves the peak the trainer uses: ``train.peak_flops`` if set, else the vendor's dense bf16 figure of
a known GPU, else a measurement cached per machine, dtype and thread count (measured once, < 0.5 s).
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

from scalevec.config import ModelConfig
from scalevec.config.files import load_json
from scalevec.config.typed import is_number
from scalevec.outpath import replace_file

# dense bf16 TFLOP/s without sparsity, vendor figures; the first name contained in the device name wins
GPU_PEAK_TFLOPS = {"H100 PCIe": 756.0, "H200": 989.4, "H100": 989.4, "B200": 2250.0, "A100": 312.0, "L40S": 362.0,
                   "L4": 121.0, "4090": 165.2}


def matmul_params_per_token(cfg: ModelConfig) -> int:
    """Matmul weights one token's forward pass uses (see the module docstring): attention q, k, v, o, the
    MLP (dense SwiGLU, or router + ``top_k`` routed experts + shared experts) in every block, and the LM head."""
    d, attn = cfg.d_model, cfg.n_heads * cfg.head_dim
    kv = cfg.n_kv_heads * cfg.head_dim
    attention = d * (attn + 2 * kv) + attn * d
    dense_mlp = 3 * d * cfg.d_ff
    total = 0
    for layer in range(cfg.n_layers):
        if cfg.moe is not None and layer >= cfg.moe.first_dense:
            m = cfg.moe
            mlp = d * m.n_experts + 3 * d * m.d_expert * (m.top_k + m.n_shared_experts)
        else:
            mlp = dense_mlp
        total += attention + mlp
    return total + d * cfg.vocab_size


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward) at context ``seq_len``: ``6 N + 12 L T n_heads head_dim``."""
    return 6.0 * matmul_params_per_token(cfg) + 12.0 * cfg.n_layers * seq_len * cfg.n_heads * cfg.head_dim


def matmul_peak(device: torch.device | str = "cpu", dtype: torch.dtype | None = None, size: int | None = None,
                budget_s: float = 0.3) -> float:
    """FLOP/s of the best of repeated ``size × size`` matmuls on ``device`` (``2 size³`` FLOPs each) within about
    ``budget_s`` seconds after one warm-up. Default dtype: float32 on CPU, bfloat16 on CUDA; default size 512 on
    CPU and 8192 on CUDA. Uses a private
    generator: the global RNG is not touched."""
    device = torch.device(device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    n = size or (8192 if device.type == "cuda" else 512)
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.mm(a, b)
    sync()
    best, t_end = float("inf"), time.perf_counter() + budget_s
    for i in range(100):
        t0 = time.perf_counter()
        torch.mm(a, b)
        sync()
        best = min(best, time.perf_counter() - t0)
        if i >= 2 and time.perf_counter() > t_end:
            break
    return 2.0 * n ** 3 / best


def gpu_spec_peak(device: torch.device) -> float | None:
    """The vendor's dense bf16 FLOP/s of the CUDA device's model (``GPU_PEAK_TFLOPS``), None if unknown or not CUDA."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v * 1e12 for k, v in GPU_PEAK_TFLOPS.items() if k in name), None)


def _cache_path() -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "scalevec" / "matmul_peak.json"


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def peak_flops(device: torch.device, dtype: torch.dtype, given: float = 0.0) -> tuple[float, str]:
    """``(peak FLOP/s, where it came from)`` for MFU: ``given`` (``train.peak_flops``) if > 0, else a known GPU's
    spec figure when ``dtype`` is bf16 / fp16 (the table's dtype), else a matmul measurement cached in
    ``~/.cache/scalevec/matmul_peak.json`` by device name,
    dtype, thread count and torch version (first call: one ``matmul_peak``, about 0.3 s)."""
    if given > 0:
        return float(given), "train.peak_flops"
    # the spec table holds dense bf16/fp16 figures: an fp32 run is measured in fp32 (its own peak, not the bf16 one)
    spec = gpu_spec_peak(device) if dtype in (torch.bfloat16, torch.float16) else None
    if spec is not None:
        return spec, "spec"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    key = f"{device.type}|{name}|{dtype}|{torch.get_num_threads()}|{torch.__version__}"
    path = _cache_path()
    try:
        cache = load_json(path, "matmul peak cache", "")
    except (OSError, ValueError):  # missing or damaged: measured again and rewritten
        cache = {}
    cache = cache if isinstance(cache, dict) else {}
    if is_number(cache.get(key), finite=False):
        return float(cache[key]), "measured (cached)"
    value = matmul_peak(device, dtype)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        cache[key] = value
        replace_file(path, json.dumps(cache, indent=1))
    except OSError:
        pass  # a read-only home: measure again next time
    return value, "measured"


__all__ = ["GPU_PEAK_TFLOPS", "matmul_params_per_token", "flops_per_token", "matmul_peak", "gpu_spec_peak",
           "peak_flops", "cpu_name"]
