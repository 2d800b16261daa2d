"""The placement plan (``scales.scale_plan``), the fast path against the plain formulas, and no strategy flags
in ``forward`` (DESIGN.md §3)."""

from __future__ import annotations

import ast
import dataclasses
import inspect

import pytest
import torch
from torch import nn

from scalevec import ScaleConfig, build_model
from scalevec.config import PRESET_NAMES, MoEConfig, OptimConfig
from scalevec.model import moe as moe_module
from scalevec.model import scales as scales_module
from scalevec.model import transformer as model_module
from scalevec.model.kernels import FAST
from scalevec.model.params import SCALE_ROLES, init_params, param_roles
from scalevec.model.scales import PLAIN, DirectScale, ERScale, ORScale, fold_weight, norm_plan, scale_plan
from scalevec.training.optim import role_weight_decay

EPS = 1e-6
STRATEGIES = PRESET_NAMES  # every strategy of the table (TABLE below must then have its row)

# DESIGN.md §3, written out for a dense pre model: which sites carry which vector. "norm": the Input-Norm's own
# γ; "input": a branch's γ_b (HG); "output": a branch's s (DP/DNP). The final norm feeds one branch only, so
# under HG it keeps its own γ. Every vector is input_scale except DNP's s on gate (it feeds SiLU).
SHARED = {("attn", "norm"), ("mlp", "norm"), ("head", "norm")}
HG = {(f"attn.{b}", "input") for b in "qkv"} | {(f"mlp.{b}", "input") for b in ("gate", "up")} | {("head", "norm")}
DUAL = {(f"attn.{b}", "output") for b in "qkv"} | {(f"mlp.{b}", "output") for b in ("gate", "up")}
TABLE = {  # strategy: (sites, kind, decayed roles, DNP-normalized branches)
    "none": (set(), None, set(), set()),
    "baseline": (SHARED, DirectScale, set(), set()),
    "iwd": (SHARED, DirectScale, {"input_scale"}, set()),
    "hg": (HG, DirectScale, set(), set()),
    "dp": (SHARED | DUAL, DirectScale, set(), set()),
    "dnp": (SHARED | DUAL, DirectScale, set(), {"mlp.gate", "mlp.up"}),
    "or": (SHARED, ORScale, set(), set()),
    "er": (SHARED, ERScale, set(), set()),
    "unified": (HG | DUAL, ORScale, {"input_scale"}, {"mlp.gate", "mlp.up"}),
    "unified_foldable": (HG | DUAL, ORScale, {"input_scale"}, set()),
}


def _normalized(plan) -> set[str]:
    return {f"{where}.{name}" for where, norm in (("attn", plan.attn), ("mlp", plan.mlp), ("head", plan.head))
            for name, b in norm.branches.items() if b.normalized}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_plan_follows_the_design_table(make_cfg, strategy):
    """scale_plan puts each strategy's vectors where DESIGN.md §3 says, with its parameterization, role and wd."""
    sites, kind, decayed, normalized = TABLE[strategy]
    plan = scale_plan(ScaleConfig.preset(strategy), make_cfg())
    rows = plan.sites()
    assert {(site, side) for site, side, _ in rows} == sites and len(rows) == len(sites)
    assert _normalized(plan) == normalized
    for site, side, spec in rows:
        assert spec.kind is kind
        dnp_gate = site == "mlp.gate" and side == "output" and normalized
        assert spec.role == ("output_scale" if dnp_gate else "input_scale"), (site, side)
        assert spec.weight_decay == (spec.role in decayed), (site, side)
    assert plan.qk_norm is None and plan.peri is None and plan.moe is None and plan.fast


@pytest.mark.parametrize("wd", ["none", "input", "output", "all"])
def test_plan_output_norms_and_weight_decay(make_cfg, wd):
    """QK-norm and peri Output-Norms carry output_scale γ; the wd switch decays exactly the roles it names,
    and the optimizer's per-role decay equals the plan's (one rule)."""
    scfg = dataclasses.replace(ScaleConfig.preset("baseline"), wd=wd)
    plan = scale_plan(scfg, make_cfg(qk_norm=True, layout="peri"))
    assert plan.qk_norm.gamma.role == plan.peri.gamma.role == "output_scale"
    want = {"none": set(), "input": {"input_scale"}, "output": {"output_scale"},
            "all": {"input_scale", "output_scale"}}[wd]
    for _, _, spec in plan.sites():
        assert spec.weight_decay == (spec.role in want)
        assert (role_weight_decay(spec.role, OptimConfig(), scfg) > 0) == spec.weight_decay
    assert role_weight_decay("scale_direction", OptimConfig(), dataclasses.replace(scfg, param="magdir")) == 0.0
    none = scale_plan(ScaleConfig.preset("none"), make_cfg(qk_norm=True, layout="peri"))
    assert none.qk_norm.gamma is None and none.peri.gamma is None and none.sites() == []


def test_plan_moe_sites_and_per_expert(make_cfg):
    """MoE: HG gives γ to router, experts' gate/up and shared experts' gate/up (per expert with per_expert);
    s is always per expert on the experts, never on the router; DNP normalizes the experts' gate and up."""
    cfg = make_cfg(moe=MoEConfig(n_experts=4, top_k=2, d_expert=16, n_shared_experts=1))
    scfg = dataclasses.replace(ScaleConfig.preset("unified"), per_expert=True)
    moe = scale_plan(scfg, cfg).moe
    assert moe.gamma is None and set(moe.branches) == {"router", "experts.gate", "experts.up", "shared_experts.gate",
                                                       "shared_experts.up"}
    router = moe.branches["router"]
    assert router.gamma is not None and router.s is None and not router.normalized
    for name in ("experts.gate", "experts.up"):
        b = moe.branches[name]
        assert b.gamma.per_expert and b.s.per_expert and b.normalized
    for name in ("shared_experts.gate", "shared_experts.up"):
        b = moe.branches[name]
        assert not b.gamma.per_expert and not b.s.per_expert and b.normalized
    assert moe.branches["experts.gate"].s.role == "output_scale" and moe.branches["experts.up"].s.role == "input_scale"
    baseline = scale_plan(ScaleConfig.preset("baseline"), cfg).moe
    assert baseline.gamma is not None and all(b.gamma is None and b.s is None for b in baseline.branches.values())


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_model_is_built_as_planned(make_cfg, strategy):
    """The built model holds exactly the plan's vectors: one ScaleVector module per planned site and layer, of the
    planned class, its magnitude (or itself) with the planned role and the optimizer's wd."""
    scfg = ScaleConfig.preset(strategy)
    cfg = make_cfg(qk_norm=True)
    model = build_model(cfg, scfg, seed=0)
    plan = model.plan
    where = {"attn": "layers.{i}.attn.proj", "mlp": "layers.{i}.mlp.proj", "head": "head",
             "qk_norm": "layers.{i}.attn.{qk}_norm"}
    expected = {}
    for site, side, spec in plan.sites():
        top, _, branch = site.partition(".")
        for i in range(cfg.n_layers if top != "head" else 1):
            for qk in ("q", "k") if top == "qk_norm" else ("",):
                base = where[top].format(i=i, qk=qk)
                name = {"norm": f"{base}.scale", "output_norm": f"{base}.scale",
                        "input": f"{base}.branches.{branch}.in_scale", "output": f"{base}.branches.{branch}.out_scale"}
                expected[name[side]] = spec
    vectors = {n: m for n, m in model.named_modules() if isinstance(m, scales_module.ScaleVector)}
    assert set(vectors) == set(expected)
    roles = model.param_roles()
    for name, vec in vectors.items():
        spec = expected[name]
        assert type(vec) is spec.kind
        for pname, _ in vec.named_parameters():
            role = roles[f"{name}.{pname}"]
            assert role == (spec.role if pname != "direction" else "scale_direction")
            assert (role_weight_decay(role, OptimConfig(), scfg) > 0) == (spec.weight_decay and pname != "direction")


# ------------------------------------------------------------------------------------ fast path == plain formulas
# In float64 the two paths differ only by the order of their floating-point operations (a fold before or after the
# matmul, a hand-written backward): relative differences ~1e-15. 1e-10 leaves room for accumulation over the
# reductions and catches any wrong formula (those move results by O(1e-2) and more).

F64 = dict(rtol=1e-10, atol=1e-12)


def _leaf(*shape, seed, offset=0.0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (offset + scale * torch.randn(*shape, generator=g, dtype=torch.float64)).requires_grad_()


def _check(fn_fast, fn_plain, leaves):
    """Values and the gradients of every leaf agree between the two implementations (float64, ``F64``)."""
    out_f, out_p = fn_fast(*leaves), fn_plain(*leaves)
    torch.testing.assert_close(out_f, out_p, **F64)
    probe = torch.randn(out_p.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    g_f = torch.autograd.grad((out_f * probe).sum(), leaves)
    g_p = torch.autograd.grad((out_p * probe).sum(), leaves)
    for a, b in zip(g_f, g_p):
        torch.testing.assert_close(a, b, **F64)


@pytest.mark.parametrize("with_weight", [False, True])
def test_fast_rms_norm_is_the_plain_formula(with_weight):
    """kernels rms_norm == scales.rms_norm (DNP's normalization too): values and gradients."""
    leaves = [_leaf(3, 4, 8, seed=1, scale=2.0)] + ([_leaf(8, seed=2, offset=1.0, scale=0.3)] if with_weight else [])
    _check(lambda x, *w: FAST.rms_norm(x, EPS, *w), lambda x, *w: PLAIN.rms_norm(x, EPS, *w), leaves)


@pytest.mark.parametrize("which", ["or_gamma", "er_gamma"])
@pytest.mark.parametrize("shape", [(8,), (3, 8)])
def test_fast_magdir_is_the_plain_formula(which, shape):
    """OR γ = β α/rms(α) and ER γ = exp(b) α/rms(α): fast == plain, one vector and per expert (rows)."""
    mag, direction = _leaf(*shape[:-1], 1, seed=3, offset=0.5, scale=0.3), _leaf(*shape, seed=4, offset=1.0, scale=0.5)
    _check(getattr(FAST, which), getattr(PLAIN, which), [mag, direction])


@pytest.mark.parametrize("c, s", [(True, False), (False, True), (True, True), (False, False)])
def test_fast_linear_is_the_plain_formula(c, s):
    """The folded linear map u fold_weight(W, c, s)ᵀ (fast) == s ⊙ (W (c ⊙ u)) (plain), with the fold's own formula."""
    leaves = [_leaf(2, 3, 5, seed=5), _leaf(4, 5, seed=6)]
    leaves += [_leaf(5, seed=7, offset=1.0, scale=0.3)] if c else []
    leaves += [_leaf(4, seed=8, offset=1.0, scale=0.3)] if s else []

    def split(u, w, *rest):
        it = iter(rest)
        return u, w, next(it) if c else None, next(it) if s else None

    _check(lambda *t: FAST.linear(*split(*t)), lambda *t: PLAIN.linear(*split(*t)), leaves)
    u, w, cv, sv = split(*leaves)
    torch.testing.assert_close(PLAIN.linear(u, w, cv, sv), u @ fold_weight(w, cv, sv).T, **F64)


@pytest.mark.parametrize("norm_gate, norm_up", [(True, True), (True, False), (False, True)])
def test_fast_dnp_swiglu_is_the_plain_formula(norm_gate, norm_up):
    """DNP's SwiGLU silu(s_g ⊙ n(y_g)) ⊙ (s_u ⊙ n(y_u)) (either side alone too): fast == plain."""
    yg, yu = _leaf(3, 6, seed=10, scale=2.0), _leaf(3, 6, seed=11, scale=2.0)
    sg, su = _leaf(6, seed=12, offset=1.0, scale=0.3), _leaf(6, seed=13, offset=1.0, scale=0.3)

    leaves = [yg, yu] + ([sg] if norm_gate else []) + ([su] if norm_up else [])

    def call(ops):
        def fn(yg, yu, *s):
            it = iter(s)
            return ops.dnp_swiglu(yg, yu, next(it) if norm_gate else None, next(it) if norm_up else None, EPS)
        return fn

    _check(call(FAST), call(PLAIN), leaves)


def _perturbed_model(cfg, scfg, fast: bool):
    model = build_model(cfg, dataclasses.replace(scfg, apply="weight" if fast else "activation"), seed=0).double()
    roles = model.param_roles()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # every scale off 1, so that each one matters
        for name, p in model.named_parameters():
            if roles[name] in SCALE_ROLES:
                p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=torch.float64))
    return model


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("shape", ["pre", "peri+qk", "moe"])
def test_fast_model_is_the_plain_model(make_cfg, strategy, shape):
    """Every parameterization and placement, in a whole model: built on the fast path (kernels.FAST) and on the plain
    formulas (scales.PLAIN), the same parameters give the same loss and gradients (float64, ``F64``)."""
    if shape == "moe" and strategy in ("unified",):
        scfg = dataclasses.replace(ScaleConfig.preset(strategy), per_expert=True)
    else:
        scfg = ScaleConfig.preset(strategy)
    cfg = make_cfg(qk_norm=shape == "peri+qk", layout="peri" if shape == "peri+qk" else "pre",
                   moe=MoEConfig(n_experts=4, top_k=2, d_expert=16, n_shared_experts=1) if shape == "moe" else None)
    tokens = torch.randint(0, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(2))
    results = []
    for fast in (True, False):
        model = _perturbed_model(cfg, scfg, fast)
        ce, n, aux = model(tokens[:, :-1], tokens[:, 1:])
        (ce / n + aux).backward()
        results.append((ce.detach(), {k: p.grad for k, p in model.named_parameters()}))
    (ce_f, g_f), (ce_p, g_p) = results
    torch.testing.assert_close(ce_f, ce_p, **F64)
    assert g_f.keys() == g_p.keys()
    for name in g_f:
        torch.testing.assert_close(g_f[name], g_p[name], **F64, msg=name)


def test_norm_linear_fast_and_plain_on_a_standalone_map():
    """A standalone NormLinear (shared γ, HG γ_b, DP s, DNP n on two of its branches) built with either Ops gives the
    same outputs and gradients (float64, ``F64``)."""
    scfg = ScaleConfig.preset("unified")
    plan = norm_plan(scfg, {"q": "q", "k": "k", "gate": "gate", "up": "up"})
    outs = []
    for ops in (FAST, PLAIN):
        torch.manual_seed(0)
        m = scales_module.NormLinear(16, {"q": 8, "k": 4, "gate": 12, "up": 12}, plan, EPS, ops).double()
        init_params(m)
        with torch.no_grad():
            g = torch.Generator().manual_seed(3)
            for name, p in m.named_parameters():
                if param_roles(m)[name] != "matrix":
                    p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=torch.float64))
        x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
        ys = m(m.norm(x))
        sum((y * torch.linspace(-1, 1, y.shape[-1], dtype=torch.float64)).sum() for y in ys).backward()
        outs.append((ys, {n: p.grad for n, p in m.named_parameters()}))
    for a, b in zip(outs[0][0], outs[1][0]):
        torch.testing.assert_close(a, b, **F64)
    for name in outs[0][1]:
        torch.testing.assert_close(outs[0][1][name], outs[1][1][name], **F64, msg=name)


# ------------------------------------------------------------------------------------ no strategy flags in forward

# The methods a forward pass runs through, in the modules that hold the scale vectors and the blocks.
FORWARD_METHODS = {"forward", "norm", "project", "linear", "finish", "fold_vectors", "folded_weight", "gamma",
                   "formula", "parts", "dnp_scale"}


def _compares_a_string(node: ast.AST) -> bool:
    def is_str(n):
        if isinstance(n, ast.Constant):
            return isinstance(n.value, str)
        return isinstance(n, (ast.Tuple, ast.List, ast.Set)) and any(is_str(e) for e in n.elts)

    return any(isinstance(n, ast.Compare) and any(is_str(c) for c in [n.left, *n.comparators]) for n in ast.walk(node))


@pytest.mark.parametrize("module", [scales_module, moe_module, model_module], ids=lambda m: m.__name__)
def test_no_forward_compares_strings(module):
    """Variants are chosen when a block is built: no method a forward pass runs (forward, norm, project, linear,
    finish, the γ formulas, ...) of any nn.Module in scales.py, moe.py, transformer.py compares with a string."""
    tree = ast.parse(inspect.getsource(module))
    modules = {name for name, obj in vars(module).items() if inspect.isclass(obj) and issubclass(obj, nn.Module)}
    checked = 0
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in modules):
        for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in FORWARD_METHODS):
            checked += 1
            assert not _compares_a_string(fn), f"{module.__name__}.{cls.name}.{fn.name} compares a string"
    assert checked >= 5


def test_the_string_check_would_catch_a_flag():
    """The check above is not vacuous: a forward that dispatches on a string is flagged."""
    src = "def forward(self, x):\n    if self.param == 'direct':\n        return x\n    return x * 2\n"
    assert _compares_a_string(ast.parse(src))
    assert not _compares_a_string(ast.parse("def forward(self, x):\n    return x if self.w is None else x * self.w\n"))
