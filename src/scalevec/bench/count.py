"""``scalevec bench --count``: the kernels and the memory traffic of a CUDA training step, counted without a GPU.

For each strategy the model is built on the meta device (shapes and dtypes, no data, no arithmetic) and one
training step's forward and backward run through it, the way a CUDA step would run them:

- **the CUDA code path of the model**: inside ``device_path.meta_as_cuda()`` every formula with a CUDA form
  (``on_cuda_path``) takes it, and registered custom ops (fused Triton kernels) run through their fake
  implementations;
- **CUDA's autocast** (``--dtype bfloat16``, as the trainer runs CUDA): meta tensors have no autocast of their
  own, so ``CudaRouting`` applies CUDA autocast's rules to the functions it names (``AUTOCAST_LOWER``:
  matmuls and attention in bf16, weights cast once per forward, as autocast's cache does; ``AUTOCAST_FP32``:
  upcast; ``AUTOCAST_FP32_SUM``: accumulate in float32). The model calls no other function that CUDA
  autocast changes;
- **CUDA's choice of kernel** inside torch where it differs from the meta device's: ``F.rms_norm`` is CUDA's
  fused RMSNorm (one kernel forward; backward one for the input gradient and one for the weight gradient,
  stood in for by the ``scalevec_count::`` ops below), ``F.scaled_dot_product_attention`` is flash attention
  (bf16/fp16) or memory-efficient attention (fp32), as CUDA's SDPA picks them for a causal mask without
  dropout.

Every operator that reaches the device is then one kernel, with the bytes of its tensor inputs and outputs
(read + written), except views, allocations and other metadata-only ops (``NOT_KERNELS``). Matmuls and the
attention kernels (``MATMUL_OPS``) are kernels like the others, but their bytes are left out of the non-matmul
bytes, the memory-bound work the count is for. A fused op whose implementation needs a package (Triton) is counted
where that package is installed, as the CUDA machine would run it.

**Per block** is the difference between the whole model's step and the same model with its blocks removed
(embedding, final norm, LM head and loss), divided by the number of blocks: work done once per step for all
blocks (γ of the whole model) is shared out among them. Bytes per token divide by the step's tokens
(batch × sequence, default 16 × the preset's context, as ``bench`` on CUDA). The optimizer step is not counted.

What this is not: a timing. Kernel counts and bytes are what a CUDA step launches and moves if every kernel
reads its inputs and writes its outputs once; caches, fusion inside cuBLAS and launch overlap are not modelled.
docs/performance.md checks it against an H200 measurement.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from scalevec.bench.candidates import DENSE, HF, METRICS, parse_candidates, strategy_config
from scalevec.config import ModelConfig
from scalevec.config.presets import get_preset
from scalevec.model.device_path import meta_as_cuda
from scalevec.model.transformer import build_model

COUNT_STRATEGIES = "baseline,unified,unified_foldable"

# ---------------------------------------------------------------------------------------- CUDA's autocast

# CUDA autocast's lists (aten/src/ATen/autocast_mode.h), for the functions a model can reach here by name
AUTOCAST_LOWER = frozenset({"linear", "matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "addmm", "baddbmm", "mv",
                            "addmv", "einsum", "scaled_dot_product_attention"})
AUTOCAST_FP32 = frozenset({"exp", "log", "log1p", "expm1", "rsqrt", "reciprocal", "pow", "__pow__", "softplus",
                           "layer_norm", "logsumexp", "nll_loss", "mse_loss", "binary_cross_entropy_with_logits"})
AUTOCAST_FP32_SUM = frozenset({"sum", "softmax", "log_softmax", "cumsum", "cumprod", "prod", "vector_norm"})
LOW = (torch.float16, torch.bfloat16)


def _flash_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                     scale: float | None = None, enable_gqa: bool = False) -> Tensor:
    """``F.scaled_dot_product_attention`` as CUDA runs it in training (causal, no mask, no dropout): flash
    attention for bf16/fp16, memory-efficient attention for fp32 (whose GQA key/value heads are repeated)."""
    if attn_mask is not None or dropout_p:
        raise ValueError("the count models causal attention without a mask or dropout (training's)")
    if q.dtype in LOW:
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, is_causal, scale=scale)[0]
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(rep, -3), v.repeat_interleave(rep, -3)
    return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, is_causal,
                                                                  scale=scale)[0]


def _fused_rms_norm(x: Tensor, normalized_shape, weight: Tensor | None = None, eps: float | None = None) -> Tensor:
    """``F.rms_norm`` as CUDA runs it: one fused kernel (``scalevec_count::rms_norm``)."""
    if len(normalized_shape) != 1:
        raise ValueError("the count models RMSNorm over the last dim only")
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    return torch.ops.scalevec_count.rms_norm(x, weight, eps)[0]


class CudaRouting(TorchFunctionMode):
    """Run torch functions as a CUDA step would on meta tensors: CUDA's autocast while ``autocast`` is set
    (the forward), CUDA's kernels for ``F.rms_norm`` and SDPA always. ``torch.overrides.TorchFunctionMode`` sees
    the Python-level calls (above the dispatcher), where autocast and these kernel choices are made."""

    def __init__(self, autocast: torch.dtype | None):
        super().__init__()
        self.autocast = autocast
        self.cache: dict[int, Tensor] = {}  # autocast's cache: a leaf weight is cast once per forward
        self.saved: tuple[bool, torch.dtype] | None = None

    def __enter__(self):
        # the model asks torch for CUDA's autocast state (``device_path.autocast_dtype``): set it as torch.autocast
        # would; torch.autocast("cuda") itself turns off without a GPU, and does nothing to meta tensors anyway
        self.saved = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
        torch.set_autocast_enabled("cuda", self.autocast is not None)
        if self.autocast is not None:
            torch.set_autocast_dtype("cuda", self.autocast)
        return super().__enter__()

    def __exit__(self, *exc):
        torch.set_autocast_enabled("cuda", self.saved[0])
        torch.set_autocast_dtype("cuda", self.saved[1])
        return super().__exit__(*exc)

    def cast(self, t, dtype: torch.dtype):
        if not isinstance(t, Tensor) or not t.is_floating_point() or t.dtype == dtype:
            return t
        if t.is_leaf and t.requires_grad:  # autocast caches the casts of leaf tensors that require grad
            if id(t) not in self.cache:
                self.cache[id(t)] = t.to(dtype)
            return self.cache[id(t)]
        return t.to(dtype)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if self.autocast is not None:
            if name in AUTOCAST_LOWER:
                args = tuple(self.cast(a, self.autocast) for a in args)
                kwargs = {k: self.cast(v, self.autocast) for k, v in kwargs.items()}
            elif name in AUTOCAST_FP32 and any(isinstance(a, Tensor) and a.dtype in LOW for a in args):
                args = tuple(self.cast(a, torch.float32) for a in args)
            elif (name in AUTOCAST_FP32_SUM and kwargs.get("dtype") is None and args
                  and isinstance(args[0], Tensor) and args[0].dtype in LOW):
                kwargs = {**kwargs, "dtype": torch.float32}
        if func is F.scaled_dot_product_attention:
            return _flash_attention(*args, **kwargs)
        if func is F.rms_norm:
            return _fused_rms_norm(*args, **kwargs)
        return func(*args, **kwargs)


# --------------------------------------------------------- stand-ins for CUDA's fused RMSNorm kernels

_LIB = torch.library.Library("scalevec_count", "DEF")  # only this module defines ops in it
_LIB.define("rms_norm(Tensor x, Tensor? weight, float eps) -> (Tensor, Tensor)")
_LIB.define("rms_norm_backward_input(Tensor grad, Tensor x, Tensor rstd, Tensor? weight) -> Tensor")
_LIB.define("rms_norm_backward_weight(Tensor grad, Tensor x, Tensor rstd) -> Tensor")


@torch.library.register_fake("scalevec_count::rms_norm", lib=_LIB)
def _rms_norm_fake(x, weight, eps):
    return torch.empty_like(x), x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)


@torch.library.register_fake("scalevec_count::rms_norm_backward_input", lib=_LIB)
def _rms_norm_backward_input_fake(grad, x, rstd, weight):
    return torch.empty_like(x)


@torch.library.register_fake("scalevec_count::rms_norm_backward_weight", lib=_LIB)
def _rms_norm_backward_weight_fake(grad, x, rstd):
    return x.new_empty(x.shape[-1:])


def _rms_norm_setup(ctx, inputs, output):
    x, weight, _ = inputs
    ctx.mark_non_differentiable(output[1])  # rstd, as aten's _fused_rms_norm declares it
    ctx.set_materialize_grads(False)  # no zero-filled gradient for it either
    ctx.save_for_backward(x, output[1], weight)


def _rms_norm_backward(ctx, grad, _grad_rstd):
    x, rstd, weight = ctx.saved_tensors
    gx = torch.ops.scalevec_count.rms_norm_backward_input(grad, x, rstd, weight)
    gw = torch.ops.scalevec_count.rms_norm_backward_weight(grad, x, rstd) if weight is not None else None
    return gx, (gw.to(weight.dtype) if gw is not None else None), None


torch.library.register_autograd("scalevec_count::rms_norm", _rms_norm_backward, setup_context=_rms_norm_setup,
                                lib=_LIB)

# ------------------------------------------------------------------------------------ the count

# operators that launch no kernel: allocations, views and metadata (views are found by ``OpOverload.is_view``)
NOT_KERNELS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "alias",
                         "_unsafe_view", "lift_fresh", "_reshape_alias", "set_", "resize_", "sym_size", "sym_stride",
                         "sym_numel", "sym_storage_offset", "_nested_tensor_size", "device", "squeeze_", "unsqueeze_",
                         "transpose_", "t_", "as_strided_"})
# operators that read only their input's metadata (shape, dtype): they write their output, read nothing
FACTORIES_LIKE = frozenset({"new_zeros", "new_ones", "new_full", "zeros_like", "ones_like", "full_like"})
# compute-bound operators, counted apart from the memory-bound rest
MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "mv", "addmv", "dot", "_grouped_mm", "_scaled_mm",
                        "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
                        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward"})


def _tensor_bytes(x) -> int:
    """Bytes a kernel moves for tensor(s) ``x``: each tensor's elements, at most its storage (an expanded tensor,
    a broadcast gradient, is read from its few stored elements)."""
    if isinstance(x, Tensor):
        return min(x.numel() * x.element_size(), x.untyped_storage().nbytes())
    if isinstance(x, (list, tuple)):
        return sum(_tensor_bytes(t) for t in x)
    return 0


def _kernel_recorder():
    """A mode that calls ``record(op name, bytes read + written)`` for every operator that reaches the device.

    It needs ``torch.utils._python_dispatch.TorchDispatchMode``, a private torch module: the count must see
    every operator below autograd, backward included, with its output tensors (their bytes), and no public
    mechanism does both (``torch.overrides`` sees Python calls only, so no backward formula; ``torch.profiler``
    records inputs without outputs). ``torch.utils.flop_counter.FlopCounterMode``, public, is built on the same
    class. Kept to this one function so that a public replacement changes nothing else."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: list[tuple[str, int]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            outputs = out if isinstance(out, (list, tuple)) else [out]
            if not func.is_view and name not in NOT_KERNELS and any(isinstance(t, Tensor) for t in outputs):
                read = 0 if name in FACTORIES_LIKE else (_tensor_bytes(list(args))
                                                         + _tensor_bytes(list((kwargs or {}).values())))
                self.ops.append((f"{func.namespace}::{name}" if func.namespace != "aten" else name,
                                 read + _tensor_bytes(out)))
            return out

    return Recorder()


def record_step(loss_fn: Callable[[], Tensor], autocast: torch.dtype | None) -> list[tuple[str, int]]:
    """``[(operator, bytes read + written)]`` of every kernel of ``loss_fn()`` (a scalar of meta tensors) and its
    backward, on the CUDA path (``CudaRouting``); ``autocast``: the autocast dtype over the forward, or None."""
    recorder = _kernel_recorder()
    with meta_as_cuda(), recorder:
        with CudaRouting(autocast):
            loss = loss_fn()
        with CudaRouting(None):
            loss.backward()
    return recorder.ops


def step_ops(model: nn.Module, tokens: Tensor, autocast: torch.dtype | None) -> list[tuple[str, int]]:
    """``record_step`` of one training step's forward and backward of ``model`` (meta) on ``tokens (B, T + 1)``: the
    loss is ``Σ CE / n + aux`` as in training."""
    model.zero_grad(set_to_none=True)  # as training leaves them: the first gradient is kept, not added

    def loss() -> Tensor:
        ce, _, aux = model(tokens[:, :-1], tokens[:, 1:])
        return ce / tokens[:, 1:].numel() + aux

    return record_step(loss, autocast)


def summarize(ops: list[tuple[str, int]]) -> dict[str, dict[str, float]]:
    """``{operator: {"kernels": n, "bytes": b}}`` of a list of ``(operator, bytes)``."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: {"kernels": 0, "bytes": 0})
    for name, b in ops:
        out[name]["kernels"] += 1
        out[name]["bytes"] += b
    return dict(out)


def count_strategy(name: str, cfg: ModelConfig, batch_size: int, seq_len: int, dtype: str) -> dict:
    """The count of candidate ``name`` (a strategy or ``STRATEGY:APPLY``) at model shape ``cfg``: per block (see the
    module docstring) the kernels and non-matmul bytes per token, the matmuls apart, and a per-operator breakdown."""
    autocast = torch.bfloat16 if dtype == "bfloat16" else None
    model = build_model(cfg, strategy_config(name), device="meta")
    tokens = torch.zeros(batch_size, seq_len + 1, dtype=torch.long, device="meta")
    whole = summarize(step_ops(model, tokens, autocast))
    params = sum(1 for _ in model.parameters())
    # the same model without its blocks: what is not per block. Built afresh: a model keeps what it learned of its
    # modules on first use (the groups of scale vectors it batches), which must not outlive its blocks
    rest_model = build_model(cfg, strategy_config(name), device="meta")
    rest_model.layers = nn.ModuleList()
    rest = summarize(step_ops(rest_model, tokens, autocast))
    n, ntok = cfg.n_layers, batch_size * seq_len
    per_op = {}
    for op in sorted(set(whole) | set(rest)):
        k = (whole.get(op, {}).get("kernels", 0) - rest.get(op, {}).get("kernels", 0)) / n
        b = (whole.get(op, {}).get("bytes", 0) - rest.get(op, {}).get("bytes", 0)) / n / ntok
        if k or b:
            per_op[op] = {"kernels": k, "bytes_per_token": b, "matmul": op in MATMUL_OPS}
    other = [v for v in per_op.values() if not v["matmul"]]
    mm = [v for v in per_op.values() if v["matmul"]]
    return {
        "name": name,
        "kernels_per_block": sum(v["kernels"] for v in per_op.values()),
        "bytes_per_token": sum(v["bytes_per_token"] for v in other),
        "matmul_kernels_per_block": sum(v["kernels"] for v in mm),
        "matmul_bytes_per_token": sum(v["bytes_per_token"] for v in mm),
        "kernels_per_step": sum(v["kernels"] for v in whole.values()),
        "bytes_per_step": sum(v["bytes"] for op, v in whole.items() if op not in MATMUL_OPS),
        "param_tensors": params,
        "per_op": per_op,
    }


def count(preset: str = "llama-0.12b", strategies: str | None = None, batch_size: int | None = None,
          seq_len: int | None = None, dtype: str = "bfloat16") -> dict:
    """``scalevec bench --count``: the count of every candidate of ``strategies`` (default ``COUNT_STRATEGIES``), the
    first the reference of the ratios. Raises ``ValueError`` for an unknown preset, candidate or dtype, or a bad
    size. A JSON-ready dict (module docstring)."""
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"--dtype {dtype} is unknown; use float32 or bfloat16")
    cfg = get_preset(preset)
    names = parse_candidates(strategies or COUNT_STRATEGIES)
    if any(n in (HF, DENSE) or n.endswith(METRICS) for n in names):
        raise ValueError("--count counts scalevec strategies (STRATEGY or STRATEGY:APPLY); drop hf-llama, "
                         "dense-active and +metrics from --strategies")
    batch_size = 16 if batch_size is None else batch_size  # `or` would turn an asked-for 0 into the default
    seq_len = cfg.max_seq_len if seq_len is None else seq_len
    if batch_size < 1 or not 1 <= seq_len <= cfg.max_seq_len:
        raise ValueError(f"--batch-size {batch_size} / --seq-len {seq_len}: use a batch >= 1 and a sequence length "
                         f"in 1..{cfg.max_seq_len} (preset {preset}'s context)")
    rows = [count_strategy(n, cfg, batch_size, seq_len, dtype) for n in names]
    ref = rows[0]
    for r in rows:
        r["kernels_ratio"] = r["kernels_per_block"] / ref["kernels_per_block"]
        r["bytes_ratio"] = r["bytes_per_token"] / ref["bytes_per_token"]
    return {"preset": preset, "dtype": dtype, "batch_size": batch_size, "seq_len": seq_len, "n_layers": cfg.n_layers,
            "path": "cuda", "torch": torch.__version__, "reference": names[0],
            "kernels_per_block": {r["name"]: r["kernels_per_block"] for r in rows},
            "bytes_per_token": {r["name"]: r["bytes_per_token"] for r in rows},
            "strategies": rows}


def format_count(r: dict, top: int = 0) -> str:
    """The count as a table: one row per candidate, per block of a forward + backward on the CUDA path."""
    lines = [f"bench --count: {r['preset']}, {r['dtype']}, {r['batch_size']} x {r['seq_len']} tokens, CUDA path, "
             f"per block (forward + backward), vs {r['reference']}",
             f"{'candidate':<24}{'kernels':>9}{'ratio':>7}{'KB/token':>10}{'ratio':>7}{'matmuls':>9}{'params':>8}"]
    for s in r["strategies"]:
        lines.append(f"{s['name']:<24}{s['kernels_per_block']:>9.1f}{s['kernels_ratio']:>7.2f}"
                     f"{s['bytes_per_token'] / 1e3:>10.1f}{s['bytes_ratio']:>7.2f}{s['matmul_kernels_per_block']:>9.1f}"
                     f"{s['param_tensors']:>8}")
    lines.append("KB/token: non-matmul bytes read + written per token per block (1 KB = 1000 bytes); matmuls: "
                 "matmul and attention kernels per block; params: the model's parameter tensors")
    return "\n".join(lines)


__all__ = ["count", "count_strategy", "record_step", "step_ops", "summarize", "format_count", "CudaRouting",
           "COUNT_STRATEGIES"]
