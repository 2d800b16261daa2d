"""Folding scale vectors into the linear weights (DESIGN.md §1, §4 expressivity/fold check, §10)."""

from __future__ import annotations

import pytest
import torch

from scalevec import ScaleConfig, build_model, fold_scales
from scalevec.config import PRESET_NAMES
from scalevec.model.params import SCALE_ROLES

FOLDABLE = tuple(n for n in PRESET_NAMES if ScaleConfig.preset(n).foldable)  # every foldable strategy of the table


def _with_apply(strategy: str, apply: str) -> ScaleConfig:
    cfg = ScaleConfig.preset(strategy)
    cfg.apply = apply
    return cfg


@pytest.mark.parametrize("strategy", FOLDABLE)
@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_fold_is_exact(make_cfg, tokens, perturb_scales, strategy, tie, qk_norm):
    """After random perturbation of every scale, the folded model gives the same logits (fp32, 1e-5),
    equal also to the activation-side form; it keeps only QK-norm scales and the embedding bitwise."""
    cfg = make_cfg(tie_embeddings=tie, qk_norm=qk_norm)
    model = build_model(cfg, ScaleConfig.preset(strategy), seed=0)
    unperturbed = model(tokens)
    perturb_scales(model, seed=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    logits = model(tokens)
    if strategy != "none":  # the perturbation must matter, or the test proves nothing
        assert (logits - unperturbed).abs().max() > 1e-3

    folded = fold_scales(model)

    torch.testing.assert_close(folded(tokens), logits, rtol=0, atol=1e-5)
    activation = build_model(cfg, _with_apply(strategy, "activation"), seed=0)
    activation.load_state_dict(model.state_dict())
    torch.testing.assert_close(folded(tokens), activation(tokens), rtol=0, atol=1e-5)

    roles = folded.param_roles()
    kept = {n for n, r in roles.items() if r in SCALE_ROLES}
    expected = {f"layers.{i}.attn.{qk}.scale.weight" for i in range(cfg.n_layers) for qk in ("q_norm", "k_norm")}
    assert kept == (expected if qk_norm else set())
    assert all(roles[n] == "output_scale" for n in kept)
    assert folded.scfg.scale == "none" and folded.scfg.folded
    assert torch.equal(folded.embed.weight, before["embed.weight"])
    assert not folded.cfg.tie_embeddings and "head.branches.lm_head.weight" in roles
    assert folded.head.branches["lm_head"].weight.data_ptr() != folded.embed.weight.data_ptr()
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())  # the input model is untouched


def test_folded_weights_are_diag_s_w_diag_gamma(make_cfg, perturb_scales):
    """The folded matrices are W' = diag(s) W diag(γ_shared γ_branch); the tied head becomes E diag(γ_final)."""
    cfg = make_cfg(tie_embeddings=True, qk_norm=True)
    for strategy in ("dp", "unified_foldable"):
        model = build_model(cfg, ScaleConfig.preset(strategy), seed=0)
        perturb_scales(model, seed=3)
        folded = fold_scales(model)
        with torch.no_grad():
            for i, layer in enumerate(model.layers):
                proj = layer.attn.proj
                for b in ("q", "k", "v"):
                    br = proj.branches[b]
                    g = proj.scale() if proj.scale is not None else br.in_scale()
                    expected = br.out_scale()[:, None] * br.weight * g[None, :]
                    got = folded.layers[i].attn.proj.branches[b].weight
                    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)
                # QK-norm γ is materialized (OR: β α / rms α), not folded
                torch.testing.assert_close(folded.layers[i].attn.q_norm.scale.weight, layer.attn.q_norm.scale())
            expected_head = model.embed.weight * model.head.scale()[None, :]
            torch.testing.assert_close(folded.head.branches["lm_head"].weight, expected_head, rtol=1e-6, atol=1e-7)


def test_fold_is_idempotent(make_cfg, perturb_scales):
    """Folding a folded model changes nothing, bitwise."""
    model = build_model(make_cfg(qk_norm=True), ScaleConfig.preset("unified_foldable"), seed=0)
    perturb_scales(model)
    once = fold_scales(model)
    twice = fold_scales(once)
    assert once.state_dict().keys() == twice.state_dict().keys()
    assert all(torch.equal(v, twice.state_dict()[k]) for k, v in once.state_dict().items())


def test_fold_keeps_dtype_and_leaves_global_rng(make_cfg):
    """The folded model has the input's dtype, and folding does not consume the global RNG."""
    model = build_model(make_cfg(), ScaleConfig.preset("hg"), seed=0).double()
    torch.manual_seed(11)
    state = torch.get_rng_state()
    folded = fold_scales(model)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(p.dtype == torch.float64 for p in folded.parameters())


@pytest.mark.parametrize("strategy", ["dnp", "unified"])
def test_fold_refuses_dnp_naming_the_scales(make_cfg, strategy):
    """fold_scales raises ValueError for DNP, naming the normalized gate/up projections and why."""
    model = build_model(make_cfg(), ScaleConfig.preset(strategy), seed=0)
    with pytest.raises(ValueError) as err:
        fold_scales(model)
    msg = str(err.value)
    assert "layers.0.mlp.proj.branches.gate" in msg and "layers.0.mlp.proj.branches.up" in msg
    assert "DNP" in msg and "unified_foldable" in msg  # why, and what to use instead


@pytest.mark.parametrize("strategy", ["baseline", "none"])
def test_fold_refuses_peri_naming_the_output_norms(make_cfg, tokens, strategy):
    """peri: output norms sit on the residual branch; fold_scales names them (layers.i.attn_out/mlp_out)."""
    model = build_model(make_cfg(layout="peri"), ScaleConfig.preset(strategy), seed=0)
    with pytest.raises(ValueError) as err:
        fold_scales(model)
    msg = str(err.value)
    assert all(f"layers.{i}.{n}" in msg for i in range(2) for n in ("attn_out", "mlp_out"))
    assert "peri" in msg


def test_output_norm_scale_is_not_redundant(make_cfg, tokens):
    """§4: an Output-Norm γ (peri) changes the function when it changes, and there is no fold for it."""
    model = build_model(make_cfg(layout="peri"), ScaleConfig.preset("baseline"), seed=0)
    ref = model(tokens)
    with torch.no_grad():
        model.layers[1].mlp_out.scale.weight.mul_(2.0)  # a uniform γ_out: an Input-Norm γ would fold
    assert (model(tokens) - ref).abs().max() > 1e-3
    with pytest.raises(ValueError, match="layers.1.mlp_out"):
        fold_scales(model)
