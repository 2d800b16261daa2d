"""``scales.batched_scales`` (fewer kernels per step): a block's OR/ER γ computed in one node per width give the
numbers of one node per vector, bitwise, values and gradients, on whole models
(dense and MoE, shared and per expert)."""

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


def test_whole_model_gamma_is_one_formula_call_per_width_per_step(make_cfg, tokens, monkeypatch):
    """A training step computes every OR γ of the model (all blocks and the head) in one formula call per width,
    not one per block: one call per distinct width (tiny GQA: d_model, the k/v width, d_ff) at any depth."""
    from scalevec.model import kernels

    calls = []
    real = kernels._MagDir.apply  # OR's formula on the fast path: one call per γ computation
    monkeypatch.setattr(kernels._MagDir, "apply", staticmethod(lambda m, a, e: calls.append(a.shape) or real(m, a, e)))
    for n_layers in (2, 3):
        calls.clear()
        model = build_model(make_cfg(n_layers=n_layers), ScaleConfig.preset("unified"), seed=0)
        ce, n, _ = model(tokens[:, :-1], tokens[:, 1:])
        (ce / n).backward()
        vectors = [m for m in model.modules() if isinstance(m, ScaleVector)]
        assert len(calls) == len({v.shape[-1] for v in vectors}) == 3, calls
        assert sum(rows for rows, _ in calls) == len(vectors)


def test_a_checkpointed_block_recomputes_its_gamma_bitwise(make_cfg, tokens):
    """With every block checkpointed (recomputed in the backward, outside the model's γ batch) the loss and every
    gradient equal the plain step's to the bit."""
    def step(checkpointed: bool):
        model = build_model(make_cfg(), ScaleConfig.preset("unified"), seed=0)
        if checkpointed:
            model.set_memory_options(checkpoint_blocks=range(model.cfg.n_layers))
        ce, n, _ = model(tokens[:, :-1], tokens[:, 1:])
        (ce / n).backward()
        return ce.detach(), {k: p.grad for k, p in model.named_parameters()}

    (ce_a, grads_a), (ce_b, grads_b) = step(False), step(True)
    assert torch.equal(ce_a, ce_b)
    assert all(torch.equal(grads_a[k], grads_b[k]) for k in grads_a)
