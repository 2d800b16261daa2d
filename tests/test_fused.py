"""The opt-in fused path (``scale.apply=fused``, model/fused.py) computes the exact path's function (DESIGN.md §2, §3).

``fused_mlp`` (the MLP) and ``fused_project`` (a norm's branches as one matmul), against the composed formulas
in float64: values to 1e-12, first derivatives (``gradcheck``) and second
derivatives (``gradgradcheck``, theory/probes.py's Hessian-vector products). Against the exact path in a
model (fp32): the same loss and gradients to rounding, since the fused path merges the gate and up matmuls
and moves DNP's ``r_up, s_up`` past W_down; the tolerance is 1e-5 of each gradient's norm (measured: ≤ 1.4e-6
of it at `tiny`; an fp32 sum of ~2 d_ff terms carries ~1e-7 relative error per term, and a dropped
scale vector or a wrong sign moves gradients by O(1) of their norm). Gradients that are zero in theory (the
magnitude β of a branch whose output DNP normalizes: ``n(W diag(β α) u)`` does not depend on β) are rounding
noise in both paths and are held to 1e-8 of the whole gradient's norm instead (measured 8e-10). Not bitwise,
hence never the default.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

from scalevec import ScaleConfig, build_model
from scalevec.bench.candidates import parse_candidates, strategy_config
from scalevec.model.fused import fused_mlp, mlp_reference

EPS = 1e-6
GRAD_TOL = 1e-5  # of each gradient tensor's norm; see the module docstring
ZERO_TOL = 1e-8  # of the whole gradient's norm, for gradients that are zero in theory (below)


def _args(dnp: bool, hg: bool, dp: bool, d: int = 6, f: int = 5):
    g = torch.Generator().manual_seed(int(dnp) + 2 * int(hg) + 4 * int(dp))

    def t(*shape, offset=0.0):
        return (offset + torch.randn(*shape, generator=g, dtype=torch.float64)).requires_grad_()

    u, wg, wu, wd = t(2, 3, d), t(f, d), t(f, d), t(d, f)
    cg, cu = (t(d, offset=1.0), t(d, offset=1.0)) if hg else (None, None)
    sg, su = (t(f, offset=1.0), t(f, offset=1.0)) if dnp or dp else (None, None)
    return [u, wg, wu, wd, cg, cu, sg, su]


CASES = [(dnp, hg, dp) for dnp in (False, True) for hg in (False, True) for dp in (False, True) if not (dnp and dp)]
# the fast loop keeps the fullest form (DNP with HG, unified's MLP); the rest are slow (~1 s each)
CASES = [c if c == (True, True, False) else pytest.param(*c, marks=pytest.mark.slow) for c in CASES]


@pytest.mark.parametrize("dnp, hg, dp", CASES)
def test_fused_mlp_matches_composed_formula_with_derivatives(dnp, hg, dp):
    """fused_mlp = mlp_reference (float64), with first and second derivatives (gradcheck, gradgradcheck)."""
    args = _args(dnp, hg, dp)
    torch.testing.assert_close(fused_mlp(*args, EPS, dnp), mlp_reference(*args, EPS, dnp), rtol=1e-12, atol=1e-12)
    inputs = [a for a in args if a is not None]
    where = [i for i, a in enumerate(args) if a is not None]

    def fn(*xs):
        full = list(args)
        for i, x in zip(where, xs):
            full[i] = x
        return fused_mlp(*full, EPS, dnp)

    assert gradcheck(fn, inputs)
    assert gradgradcheck(fn, inputs)


def test_fused_mlp_needs_both_output_scales_under_dnp():
    """DNP without s_gate / s_up is refused with ValueError (DNP always has them)."""
    args = _args(False, True, False)
    with pytest.raises(ValueError, match="s_gate and s_up"):
        fused_mlp(*args, EPS, True)


def _loss_and_grads(cfg, scfg, perturb_seed=1):
    model = build_model(cfg, scfg, seed=0)
    g = torch.Generator().manual_seed(perturb_seed)
    with torch.no_grad():  # scale vectors away from 1, so that a dropped or misplaced one shows
        for name, p in model.named_parameters():
            if p.ndim == 1 or "scale" in name:
                p.mul_(1 + 0.3 * torch.randn(p.shape, generator=g))
    data = torch.randint(0, cfg.vocab_size, (2, 17), generator=torch.Generator().manual_seed(2))
    ce, _, _ = model(data[:, :-1], data[:, 1:])
    ce.backward()
    return ce.detach(), {n: p.grad for n, p in model.named_parameters()}


STRATEGIES = ["baseline", "dp", "hg", "dnp", "unified_foldable", "unified", "unified-gate-norm"]
STRATEGIES = [s if s in ("unified", "unified-gate-norm") else pytest.param(s, marks=pytest.mark.slow)
              for s in STRATEGIES]  # the fast loop keeps unified and the gate-only DNP that builds exact


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_fused_model_equals_exact_path_to_rounding(strategy, make_cfg):
    """A model with apply=fused gives the exact path's loss and every gradient to rounding (fp32). With DNP on
    the gate only (``unified-gate-norm``) the MLP has no fused form and is built exact (``fused.mlp_fusable``)."""
    cfg = make_cfg()
    if strategy == "unified-gate-norm":
        scfg = dataclasses.replace(ScaleConfig.preset("unified"), norm_sites=("gate",))
    else:
        scfg = ScaleConfig.preset(strategy)
    loss, grads = _loss_and_grads(cfg, scfg)
    loss_f, grads_f = _loss_and_grads(cfg, dataclasses.replace(scfg, apply="fused"))
    assert abs(loss_f - loss) <= 1e-6 * abs(loss)
    total = torch.stack([g.norm() for g in grads.values()]).norm()
    for name, want in grads.items():
        err = (grads_f[name] - want).norm()
        assert err <= GRAD_TOL * want.norm() + ZERO_TOL * total, f"{name}: |Δ| {err:.2e} vs |grad| {want.norm():.2e}"


def test_fused_is_opt_in_and_a_bench_candidate():
    """The default apply is the exact 'weight' path; 'unified:fused' is a bench candidate with apply=fused."""
    assert ScaleConfig().apply == "weight" and ScaleConfig.preset("unified").apply == "weight"
    assert parse_candidates("baseline:fused,unified:fused") == ["baseline:fused", "unified:fused"]
    assert strategy_config("unified:fused").apply == "fused"


def test_fused_path_is_chosen_at_build(make_cfg):
    """apply=fused builds the fused attention projection and MLP; DNP on the gate only builds the exact MLP (no
    fused form, ``fused.mlp_fusable``); apply=weight builds neither."""
    from scalevec.model.fused import FusedNormLinear
    from scalevec.model.transformer import MLP, FusedMLP

    cfg = make_cfg()
    unified = ScaleConfig.preset("unified")
    block = build_model(cfg, dataclasses.replace(unified, apply="fused"), seed=0).layers[0]
    assert isinstance(block.attn.proj, FusedNormLinear) and isinstance(block.mlp, FusedMLP) and block.mlp.dnp
    gate_only = dataclasses.replace(unified, apply="fused", norm_sites=("gate",))
    block = build_model(cfg, gate_only, seed=0).layers[0]
    assert isinstance(block.attn.proj, FusedNormLinear) and type(block.mlp) is MLP
    block = build_model(cfg, unified, seed=0).layers[0]
    assert not isinstance(block.attn.proj, FusedNormLinear) and type(block.mlp) is MLP


def test_fused_mlp_under_bf16_autocast_stays_close(make_cfg):
    """Under CPU bf16 autocast the fused MLP returns bf16 and agrees with the exact path to bf16 rounding."""
    cfg = make_cfg()
    x = torch.randn(2, 16, cfg.d_model, generator=torch.Generator().manual_seed(0))
    outs = []
    for apply in ("weight", "fused"):
        mlp = build_model(cfg, dataclasses.replace(ScaleConfig.preset("unified"), apply=apply), seed=0).layers[0].mlp
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs.append(mlp(x)[0])
    assert outs[1].dtype == torch.bfloat16
    want = outs[0].float()
    torch.testing.assert_close(outs[1].float(), want, rtol=0.05, atol=0.05 * want.abs().max().item())


@pytest.mark.slow  # trains three times
def test_training_with_fused_resumes_exactly(tmp_path):
    """A `unified` run with scale.apply=fused: 6 steps straight = 3 + resume + 3, bitwise (deterministic kernels)."""
    import json

    from scalevec.resolve import resolve_config
    from scalevec.training.trainer import train

    items = {"train.steps": 6, "train.batch_size": 4, "train.seq_len": 32, "train.eval_every": 6,
             "train.log_every": 1, "train.eval_batch_size": 8, "data.val_tokens": 2048, "schedule.warmup": 2,
             "train.threads": 1, "data.cache_dir": str(tmp_path / "cache"), "scale.apply": "fused"}
    cfg = resolve_config("tiny", "unified", [f"{k}={v}" for k, v in items.items()])
    straight, split = tmp_path / "straight", tmp_path / "split"
    train(cfg, straight, quiet=True)
    train(cfg, split, stop_at=3, quiet=True)
    train(cfg, split, resume=True, quiet=True)

    def losses(run):
        lines = (run / "metrics.jsonl").read_text().splitlines()
        return [r.get("loss", r.get("val_loss")) for r in map(json.loads, lines)]

    assert len(losses(straight)) == 7 and losses(straight) == losses(split)


@pytest.mark.parametrize("hg, dp", [pytest.param(False, False, marks=pytest.mark.slow), (True, True)])
def test_fused_project_matches_per_branch_linear_with_derivatives(hg, dp):
    """fused_project = [F.linear(u, diag(s) W diag(c))] per branch (float64, unequal widths, one output unused
    by the loss too), with first and second derivatives."""
    from scalevec.model.fused import fused_project

    g = torch.Generator().manual_seed(3)

    def t(*shape, offset=0.0):
        return (offset + torch.randn(*shape, generator=g, dtype=torch.float64)).requires_grad_()

    u = t(2, 3, 5)
    triples = [(t(d_out, 5), t(5, offset=1.0) if hg else None, t(d_out, offset=1.0) if dp else None)
               for d_out in (4, 3, 2)]
    flat = [x for tr in triples for x in tr]
    where = [i for i, x in enumerate(flat) if x is not None]

    def fn(u, *xs, used=(0, 1, 2)):
        full = list(flat)
        for i, x in zip(where, xs):
            full[i] = x
        outs = fused_project(u, [tuple(full[i:i + 3]) for i in range(0, len(full), 3)])
        return tuple(outs[i] for i in used)

    ref = [torch.nn.functional.linear(u, (s.unsqueeze(-1) if s is not None else 1) * (w * c if c is not None else w))
           for w, c, s in triples]
    for got, want in zip(fn(u, *(flat[i] for i in where)), ref):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    inputs = [u, *(flat[i] for i in where)]
    assert gradcheck(fn, inputs) and gradgradcheck(fn, inputs)
    assert gradcheck(lambda *a: fn(*a, used=(1,)), inputs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fused_model_on_cuda_bf16_matches_exact_path(make_cfg):
    """On CUDA under bf16 autocast, apply=fused gives the exact path's loss and gradients to bf16 rounding
    (both run bf16 matmuls with fp32 accumulation; rtol 5e-2 of each gradient's norm: a few bf16 ulps)."""
    cfg = make_cfg()
    data = torch.randint(0, cfg.vocab_size, (4, 33), generator=torch.Generator().manual_seed(0)).cuda()
    out = []
    for apply in ("weight", "fused"):
        model = build_model(cfg, dataclasses.replace(ScaleConfig.preset("unified"), apply=apply), seed=0,
                            device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            ce, _, _ = model(data[:, :-1], data[:, 1:])
        ce.backward()
        out.append((ce.detach().float(), {n: p.grad.float() for n, p in model.named_parameters()}))
    (loss, grads), (loss_f, grads_f) = out
    assert abs(loss_f - loss) <= 1e-2 * abs(loss)
    total = torch.stack([g.norm() for g in grads.values()]).norm()
    for name, want in grads.items():
        assert (grads_f[name] - want).norm() <= 5e-2 * want.norm() + 1e-3 * total, name
