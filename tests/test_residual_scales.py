"""Output-side scale vectors on the residual writers W_o and W_down (``scale.dual_sites`` with ``o``, ``down``;
DESIGN.md §3): planned, built, trained, folded, exported, imported and counted like every foldable s."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from scalevec import MoEConfig, ScaleConfig, build_model, get_preset
from scalevec.cli import main
from scalevec.config import PRESET_NAMES, RunConfig
from scalevec.config.codec import apply_overrides
from scalevec.hf.export import export_model
from scalevec.hf_format.hf_import import import_hf, load_plain, plain_from_model
from scalevec.info import info
from scalevec.model.fold import fold_scales
from scalevec.model.params import count_params
from scalevec.model.scales import SCALE_KINDS, BranchPlan, ScaleVector, scale_plan
from scalevec.resolve import resolve_config
from scalevec.training.checkpoint.run_model import load_model
from scalevec.training.trainer import train

SITES = ("q", "k", "v", "gate", "up", "o", "down")
MOE = MoEConfig(n_experts=4, top_k=2, d_expert=16, n_shared_experts=1)
MIXTRAL = MoEConfig(n_experts=4, top_k=2, d_expert=16)  # exports as Mixtral: no shared experts
MATRIX_ROLES = ("matrix", "embedding", "lm_head", "router")


def writers(strategy: str = "dp", **switches) -> ScaleConfig:
    """``strategy`` with its output-side s also on o and down."""
    return dataclasses.replace(ScaleConfig.preset(strategy), dual_sites=SITES, **switches)


def writer_vectors(model) -> dict[str, ScaleVector]:
    return {n: m for n, m in model.named_modules()
            if isinstance(m, ScaleVector) and n.endswith(("o.out_scale", "down.out_scale"))}


def test_dual_sites_accepts_o_and_down():
    """The switch: a config value and a key=value override; still refused: a site that is no projection."""
    ScaleConfig(placement="dual", dual_sites=("o", "down")).validate()
    cfg = apply_overrides(RunConfig(), ["scale.placement=dual", "scale.dual_sites=[o, down]"])
    assert cfg.scale.dual_sites == ("o", "down")
    with pytest.raises(ValueError, match=r"scale\.dual_sites.*o, down"):
        ScaleConfig(dual_sites=("router",)).validate()


@pytest.mark.parametrize("strategy", PRESET_NAMES)
def test_writers_are_opt_in(make_cfg, strategy):
    """No named strategy puts a vector on the writers: their plans are empty, so every model is as before."""
    plan = scale_plan(ScaleConfig.preset(strategy), make_cfg(moe=MOE))
    assert plan.o == plan.down == plan.expert_down == BranchPlan()
    assert not [site for site, _, _ in plan.sites() if site.endswith((".o", ".down"))]


@pytest.mark.parametrize("strategy", ["dp", "dnp", "unified_foldable", "unified"])
def test_plan_puts_s_on_the_writers(make_cfg, strategy):
    """Under dual / dual_norm: s on o, down and the experts' down (per expert), never a γ_b nor DNP's norm; a
    foldable input_scale with the strategy's parameterization and its weight decay."""
    scfg = writers(strategy)
    plan = scale_plan(scfg, make_cfg(moe=MOE))
    for b in (plan.o, plan.down, plan.expert_down):
        assert b.gamma is None and not b.normalized
        assert b.s.kind is SCALE_KINDS[scfg.param] and b.s.role == "input_scale"
        assert b.s.weight_decay == (scfg.wd in ("input", "all"))
    assert plan.expert_down.s.per_expert and not plan.down.s.per_expert
    sites = {(site, side) for site, side, _ in plan.sites()}
    assert {("attn.o", "output"), ("mlp.down", "output"), ("moe.experts.down", "output"),
            ("moe.shared_experts.down", "output")} <= sites
    inputs = scale_plan(dataclasses.replace(ScaleConfig.preset("baseline"), dual_sites=SITES), make_cfg())
    assert inputs.o == inputs.down == BranchPlan()  # placement=input: no output side anywhere


def test_model_holds_the_planned_vectors(make_cfg):
    """One s of d_model entries on every W_o and dense / shared W_down, one per expert on the experts' down."""
    cfg = make_cfg(n_layers=2, moe=dataclasses.replace(MOE, first_dense=1))  # layer 0 dense, layer 1 MoE
    model = build_model(cfg, writers(), seed=0)
    shapes = {n: tuple(v().shape) for n, v in writer_vectors(model).items()}
    d = cfg.d_model
    assert shapes == {"layers.0.attn.o.out_scale": (d,), "layers.0.mlp.down.out_scale": (d,),
                      "layers.1.attn.o.out_scale": (d,), "layers.1.mlp.experts.down.out_scale": (4, d),
                      "layers.1.mlp.shared_experts.down.out_scale": (d,)}
    roles = model.param_roles()
    assert {roles[f"{n}.weight"] for n in shapes} == {"input_scale"}


@pytest.mark.parametrize("moe", [None, MOE], ids=["dense", "moe"])
def test_same_matrices_and_function_at_init(make_cfg, tokens, moe):
    """Same seed, same matrices (scale vectors draw nothing); s = 1 at init, so the same logits, to the bit."""
    cfg = make_cfg(moe=moe)
    a, b = build_model(cfg, ScaleConfig.preset("dp"), seed=0), build_model(cfg, writers(), seed=0)
    ref, roles = a.state_dict(), b.param_roles()
    for name, p in b.named_parameters():
        if roles[name] in MATRIX_ROLES:
            assert torch.equal(p, ref[name]), name
    with torch.no_grad():
        assert torch.equal(a(tokens), b(tokens))


@pytest.mark.parametrize("moe", [None, MOE], ids=["dense", "moe"])
def test_fast_path_equals_the_plain_formulas(make_cfg, tokens, perturb_scales, moe):
    """apply=weight (s folded into W on the fly, kernels.FAST) and apply=activation (s on the activations) agree
    in float64, values and gradients; every writer's s gets a gradient."""
    cfg = make_cfg(moe=moe)
    fast = build_model(cfg, writers("unified_foldable"), seed=0).double()
    perturb_scales(fast)
    plain = build_model(cfg, writers("unified_foldable", apply="activation"), seed=0).double()
    plain.load_state_dict(fast.state_dict())
    grads = []
    for model in (fast, plain):
        ce, n, aux = model(tokens[:, :-1], tokens[:, 1:])
        (ce / n + aux).backward()
        grads.append({k: p.grad for k, p in model.named_parameters()})
    for name, g in grads[0].items():
        torch.testing.assert_close(g, grads[1][name], rtol=1e-10, atol=1e-12, msg=name)
    for name, vec in writer_vectors(fast).items():
        assert any(p.grad.abs().sum() > 0 for p in vec.parameters()), name


def test_fused_mlp_folds_the_down_scale(make_cfg, tokens, perturb_scales):
    """apply=fused (W_down's s folded into the fused MLP's W_down) equals apply=weight to fp32 rounding."""
    cfg = make_cfg()
    exact = build_model(cfg, writers("dnp"), seed=0)
    perturb_scales(exact)
    fused = build_model(cfg, writers("dnp", apply="fused"), seed=0)
    fused.load_state_dict(exact.state_dict())
    assert type(fused.layers[0].mlp).__name__ == "FusedMLP"
    grads = []
    for model in (exact, fused):
        ce, n, _ = model(tokens[:, :-1], tokens[:, 1:])
        (ce / n).backward()
        grads.append(model.layers[0].mlp.down.out_scale.weight.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-6)


def test_trains(tmp_path):
    """``scale.dual_sites=[q, k, v, gate, up, o, down]`` trains end to end: the writers' s move, the loss is finite,
    and the run loads back with them."""
    items = {"train.steps": 4, "train.batch_size": 4, "train.seq_len": 32, "train.eval_every": 4,
             "train.log_every": 1, "train.eval_batch_size": 8, "data.val_tokens": 2048, "schedule.warmup": 2,
             "data.cache_dir": str(tmp_path / "cache"), "scale.dual_sites": "[q, k, v, gate, up, o, down]"}
    cfg = resolve_config("tiny", "dp", [f"{k}={v}" for k, v in items.items()])
    summary = train(cfg, tmp_path / "run", quiet=True)
    assert torch.isfinite(torch.tensor(summary["final_val_loss"]))
    _, model, _ = load_model(tmp_path / "run")
    vectors = writer_vectors(model)
    assert len(vectors) == 2 * model.cfg.n_layers
    assert all(not torch.equal(v(), torch.ones_like(v())) for v in vectors.values())


@pytest.mark.parametrize("strategy, moe", [("dp", None), ("unified_foldable", None), ("unified_foldable", MOE)],
                         ids=["dp", "unified_foldable", "unified_foldable-moe"])
def test_fold_absorbs_the_writers_scales(make_cfg, tokens, perturb_scales, strategy, moe):
    """An output-side diag on W_o / W_down folds into the matrix rows: the folded model has no scale vector left
    and the same logits (fp32, 1e-5)."""
    model = build_model(make_cfg(moe=moe), writers(strategy), seed=0)
    perturb_scales(model)
    folded = fold_scales(model)
    assert count_params(folded)["scale_params"] == 0
    with torch.no_grad():
        torch.testing.assert_close(folded(tokens), model(tokens), rtol=0, atol=1e-5)
        o = model.layers[0].attn.o
        torch.testing.assert_close(folded.layers[0].attn.o.weight, o.out_scale()[:, None] * o.weight)


@pytest.mark.parametrize("moe", [None, MIXTRAL], ids=["llama", "mixtral"])
def test_exports_as_a_plain_family(tmp_path, make_cfg, tokens, perturb_scales, moe):
    """Folded, the model is a plain Llama / Mixtral: export verifies logits, loss and greedy ids in transformers."""
    model = build_model(make_cfg(moe=moe), writers("unified_foldable"), seed=0)
    perturb_scales(model)
    out = export_model(model, tmp_path / "hf", verify_tokens=tokens)
    arch = json.loads((out / "config.json").read_text())["architectures"]
    assert arch == ["MixtralForCausalLM" if moe else "LlamaForCausalLM"]


def test_unfoldable_strategy_exports_as_custom_code(tmp_path, make_cfg, tokens, perturb_scales):
    """Under DNP (unified) the writers' s still fold, into the custom architecture's o_proj and down_proj
    (experts and shared experts included); export verifies."""
    model = build_model(make_cfg(moe=dataclasses.replace(MOE, first_dense=1)), writers("unified"), seed=0)
    perturb_scales(model)
    out = export_model(model, tmp_path / "hf", verify_tokens=tokens)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["ScalevecForCausalLM"]


def test_hf_import_into_the_writers_scales(hf_llama):
    """A Hugging Face Llama converts into a strategy with writer scales (s = 1) and keeps its logits."""
    path, hf = hf_llama
    _, model = import_hf(path, writers("unified_foldable"))
    assert all(torch.allclose(v(), torch.ones(())) for v in writer_vectors(model).values())
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(input_ids=tokens).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("moe", [None, MOE], ids=["dense", "moe"])
def test_converts_to_and_from_other_strategies(make_cfg, tokens, perturb_scales, moe):
    """Through the plain form: a trained-like writer model converts into baseline, and back into the writers'
    strategy, with the same logits (fp32, 1e-5)."""
    cfg = make_cfg(moe=moe)
    src = build_model(cfg, writers("dp"), seed=0)
    perturb_scales(src)
    base = build_model(cfg, ScaleConfig.preset("baseline"), seed=1)
    load_plain(base, plain_from_model(src))
    back = build_model(cfg, writers("unified_foldable"), seed=2)
    load_plain(back, plain_from_model(base))
    with torch.no_grad():
        ref = src(tokens)
        torch.testing.assert_close(base(tokens), ref, rtol=0, atol=1e-5)
        torch.testing.assert_close(back(tokens), ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("preset", ["tiny", "moe-tiny"])
def test_info_counts_them(preset, capsys):
    """``scalevec info ... scale.dual_sites=...`` counts d_model per W_o and dense or shared W_down, E·d_model per
    expert down bank, all input_scale; the baseline it compares with is unchanged."""
    cfg = get_preset(preset)
    d, moe = cfg.d_model, cfg.moe
    per_layer = [d + (d if moe is None or i < moe.first_dense else moe.n_experts * d + d * bool(moe.n_shared_experts))
                 for i in range(cfg.n_layers)]
    dp = info(preset, "dp")
    ours = info(preset, "dp", ["scale.dual_sites=[q, k, v, gate, up, o, down]"])
    assert ours["scale_params"] - dp["scale_params"] == sum(per_layer)
    assert ours["scale_params_by_role"]["input_scale"] - dp["scale_params_by_role"]["input_scale"] == sum(per_layer)
    assert ours["overhead_params"] - dp["overhead_params"] == sum(per_layer)
    if moe is not None:  # the experts' down s is per expert: a token uses top_k of the E rows
        inactive = sum(n - d - d * bool(moe.n_shared_experts) for i, n in enumerate(per_layer) if i >= moe.first_dense)
        assert (ours["params"] - ours["active_params"]) - (dp["params"] - dp["active_params"]) == \
            inactive // moe.n_experts * (moe.n_experts - moe.top_k)
    assert main(["info", "--preset", preset, "--strategy", "dp", "--json",
                 "scale.dual_sites=[q, k, v, gate, up, o, down]"]) == 0
    assert json.loads(capsys.readouterr().out)["scale_params"] == ours["scale_params"]
