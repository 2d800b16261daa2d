"""``model/device_path.py``: which tensors take the CUDA code path, and what that path does differently.

The CUDA path is walked on meta tensors (``meta_as_cuda``, as ``bench --count`` does): CUDA's fused RMSNorm for
the norms and the Input-Norm's output cast once to the autocast dtype; CPU tensors never take it.
"""

from __future__ import annotations

import torch

from scalevec import ScaleConfig, build_model
from scalevec.bench.count import CudaRouting, count_strategy
from scalevec.config.presets import get_preset
from scalevec.model.device_path import autocast_dtype, meta_as_cuda, on_cuda_path


def test_only_cuda_tensors_and_meta_inside_the_count_take_the_cuda_path():
    """A CPU tensor never takes the CUDA path; a meta tensor only inside ``meta_as_cuda``."""
    cpu, meta = torch.zeros(2), torch.empty(2, device="meta")
    assert not on_cuda_path(cpu) and not on_cuda_path(meta)
    with meta_as_cuda():
        assert on_cuda_path(meta) and not on_cuda_path(cpu)
    assert not on_cuda_path(meta)


def test_cuda_path_norms_are_one_fused_kernel_each():
    """On the CUDA path each of a block's two Input-Norms is one fused RMSNorm kernel forward and, with its γ, one
    kernel for the input gradient and one for γ's backward (the count's stand-ins for CUDA's)."""
    ops = count_strategy("baseline", get_preset("tiny"), 2, 16, "bfloat16")["per_op"]
    assert ops["scalevec_count::rms_norm"]["kernels"] == 2
    assert ops["scalevec_count::rms_norm_backward_input"]["kernels"] == 2
    assert ops["scalevec_count::rms_norm_backward_weight"]["kernels"] == 2


def test_cuda_path_casts_the_norm_output_once_and_cpu_leaves_it():
    """Under bf16 autocast the Input-Norm's output is bf16 on the CUDA path (cast once, read by q, k and v) and
    stays float32 on CPU (each branch's autocast casts it, so the gradients sum in float32 as before)."""
    cfg = get_preset("tiny")
    model = build_model(cfg, ScaleConfig.preset("baseline"), seed=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert autocast_dtype(torch.zeros(1)) == torch.bfloat16
        assert model.layers[0].attn.norm(torch.randn(2, 3, cfg.d_model)).dtype == torch.float32
    meta = build_model(cfg, ScaleConfig.preset("baseline"), device="meta")
    with meta_as_cuda(), CudaRouting(torch.bfloat16):
        assert meta.layers[0].attn.norm(torch.empty(2, 3, cfg.d_model, device="meta")).dtype == torch.bfloat16
