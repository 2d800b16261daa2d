"""MoE dispatch without host syncs: segment ends on the device, grouped expert matmuls.

``moe.grouped_linear_offsets`` (what ``Experts`` runs) must give the numbers of the reference
``moe.grouped_linear`` on host counts, bitwise on CPU (the golden losses of ``moe-unified`` depend on it),
values and gradients; the whole MoE block must trace as one graph under ``torch.compile``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from scalevec import ModelConfig, ScaleConfig
from scalevec.config import MoEConfig
from scalevec.model.kernels import FAST
from scalevec.model.moe import MoE, grouped_linear, grouped_linear_offsets
from scalevec.model.params import init_params
from scalevec.model.scales import scale_plan

STRATEGIES = ["baseline", "hg+per_expert", "dp", "unified"]


def moe_layer(strategy: str, n_shared: int = 0) -> MoE:
    base, _, flag = strategy.partition("+")
    scfg = dataclasses.replace(ScaleConfig.preset(base), per_expert=flag == "per_expert")
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48, vocab_size=64, max_seq_len=16,
                      init_std=0.2, moe=MoEConfig(n_experts=4, top_k=2, d_expert=16, n_shared_experts=n_shared))
    torch.manual_seed(0)
    layer = MoE(cfg, scale_plan(scfg, cfg), FAST)
    init_params(layer)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # scale vectors away from 1, so that a misplaced one would show
        for name, p in layer.named_parameters():
            if p.dim() == 1 or "scale" in name:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    return layer


def reference_offsets(x, weight, offsets):
    """The loop on host counts that Experts ran before the dispatch moved to the device."""
    return grouped_linear(x, weight, torch.diff(offsets, prepend=offsets.new_zeros(1)).tolist())


@pytest.mark.parametrize("d_out", [12, 6])  # 6 fp32 = 24 bytes per row: not grouped_mm's 16-byte rule, the fallback
def test_grouped_linear_offsets_matches_the_loop_bitwise(d_out):
    """Segments of 7, 0 (an idle expert: zero gradient) and 13 rows; values and both gradients to the bit."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20, 8, generator=g, requires_grad=True)
    w = torch.randn(3, d_out, 8, generator=g, requires_grad=True)
    offsets = torch.tensor([7, 7, 20], dtype=torch.int32)
    y, ref = grouped_linear_offsets(x, w, offsets), reference_offsets(x, w, offsets)
    assert torch.equal(y, ref)
    gy = torch.randn(y.shape, generator=g)
    grads = torch.autograd.grad(y, (x, w), gy)
    for a, b in zip(grads, torch.autograd.grad(ref, (x, w), gy)):
        assert torch.equal(a, b)
    assert grads[1][1].abs().max() == 0


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_moe_block_same_numbers_as_the_loop(strategy, monkeypatch):
    """The MoE block's output, aux loss and every parameter gradient are bitwise those of the old dispatch."""
    x = torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(1))

    def run():
        layer = moe_layer(strategy, n_shared=1)
        y, aux = layer(layer.norm(x))
        (y.square().mean() + aux).backward()
        return y.detach(), aux.detach(), {n: p.grad for n, p in layer.named_parameters()}

    new = run()
    monkeypatch.setattr("scalevec.model.moe.grouped_linear_offsets", reference_offsets)
    old = run()
    assert torch.equal(new[0], old[0]) and torch.equal(new[1], old[1])
    assert new[2].keys() == old[2].keys()
    for name in new[2]:
        assert torch.equal(new[2][name], old[2][name]), name


@pytest.mark.slow  # torch.compile
def test_moe_block_is_one_graph_under_compile():
    """No host sync, no graph break: under bf16 autocast (how the trainer runs on a GPU) the block compiles
    with fullgraph=True, and a counting backend sees one graph (the ``.tolist()`` dispatch made 9). In fp32
    under compile the dispatch falls back to host counts (grouped_mm traces bf16 only): docs/performance.md.
    backend="eager" traces without inductor, so the compiled block runs the same aten ops as eager."""
    layer = moe_layer("unified")
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch.compiler.reset()
    compiled = torch.compile(layer, backend=counting, fullgraph=True)
    x = torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, aux = compiled(layer.norm(x))
        ref_y, ref_aux = layer(layer.norm(x))
    assert len(graphs) == 1
    assert torch.equal(y, ref_y) and torch.equal(aux, ref_aux)
    torch.compiler.reset()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_grouped_mm_on_cuda_bf16_matches_the_loop():
    """On CUDA bf16 the grouped GEMM replaces the loop; both accumulate in fp32 and round to bf16 once, so
    they agree to bf16 rounding (rtol 1.6e-2 = 2 ulp of bf16's 8-bit mantissa)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(96, 64, device="cuda", generator=g, dtype=torch.bfloat16)
    w = torch.randn(4, 128, 64, device="cuda", generator=g, dtype=torch.bfloat16)
    offsets = torch.tensor([16, 16, 64, 96], dtype=torch.int32, device="cuda")
    torch.testing.assert_close(grouped_linear_offsets(x, w, offsets), reference_offsets(x, w, offsets),
                               rtol=1.6e-2, atol=1e-2)
