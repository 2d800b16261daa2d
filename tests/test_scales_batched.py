"""``scales.batched_scales`` (issue 17): a block's OR/ER γ computed in one node per width give the numbers of
one node per vector, bitwise, values and gradients, on whole models (dense and MoE, shared and per expert)."""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext

import pytest
import torch

from scalevec import ScaleConfig, build_model
from scalevec.config import MoEConfig
from scalevec.model.scales import ScaleVector, batched_scales


def loss_and_grads(cfg, scfg, tokens, batched: bool, monkeypatch):
    if not batched:
        monkeypatch.setattr("scalevec.model.transformer.batched_scales", lambda module: nullcontext())
    model = build_model(cfg, scfg, seed=0)
    with torch.no_grad():  # scale parameters away from their init, so that a misplaced γ would show
        g = torch.Generator().manual_seed(5)
        for name, p in model.named_parameters():
            if "scale" in name:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    ce, n, aux = model(tokens[:, :-1], tokens[:, 1:])
    (ce / n + aux).backward()
    monkeypatch.undo()
    return ce.detach(), {k: p.grad for k, p in model.named_parameters()}


@pytest.mark.parametrize("strategy, moe", [("or", False), ("er", False), ("unified_foldable", False),
                                           ("unified", False), ("unified", True), ("unified+per_expert", True)])
def test_batched_scales_are_bitwise_the_per_vector_ones(make_cfg, tokens, strategy, moe, monkeypatch):
    base, _, flag = strategy.partition("+")
    scfg = dataclasses.replace(ScaleConfig.preset(base), per_expert=flag == "per_expert")
    cfg = make_cfg(moe=MoEConfig(n_experts=4, top_k=2, d_expert=16) if moe else None)
    ce_b, grads_b = loss_and_grads(cfg, scfg, tokens, True, monkeypatch)
    ce_v, grads_v = loss_and_grads(cfg, scfg, tokens, False, monkeypatch)
    assert torch.equal(ce_b, ce_v)
    assert grads_b.keys() == grads_v.keys()
    for name in grads_b:
        assert torch.equal(grads_b[name], grads_v[name]), name


def test_batched_scales_groups_and_clears(make_cfg):
    """One group per (OR/ER, width) with 2+ vectors; inside, vectors return the batched γ; outside, a fresh one."""
    model = build_model(make_cfg(), ScaleConfig.preset("unified"), seed=0)
    block = model.layers[0]
    vectors = [m for m in block.modules() if isinstance(m, ScaleVector)]
    with batched_scales(block):
        groups = block.__dict__["_magdir_groups"]
        assert sum(len(g) for g in groups) == len(vectors)  # tiny: every width has 2+ vectors
        inside = [v() for v in vectors]
        assert all(a is b for a, b in zip(inside, [v() for v in vectors]))  # cached: the same tensor
    assert all("_gamma" not in v.__dict__ for v in vectors)
    assert all(torch.equal(a, v()) and a is not v() for a, v in zip(inside, vectors))
