"""Scale vectors and the linear maps that read a normalized input (DESIGN.md §1, §3, §4 Theorem 3.2)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from scalevec import ModelConfig, ScaleConfig
from scalevec.config import PRESET_NAMES
from scalevec.experiments.theory.magdir import make as make_scale_vector
from scalevec.experiments.theory.magdir import perturb, preconditioner, predicted, spectrum
from scalevec.model.kernels import FAST
from scalevec.model.params import init_params, new_param, param_roles
from scalevec.model.scales import (
    PLAIN,
    SCALE_KINDS,
    NormLinear,
    OutputNorm,
    ScaleVector,
    norm_plan,
    rms_norm,
    scale_plan,
    scale_vectors,
)

EPS = 1e-6


def _vector(shape, param: str, role: str) -> ScaleVector:
    """The scale vector class of a ``ScaleConfig.param`` value (direct, OR, ER), built on the fast path."""
    return SCALE_KINDS[param](shape, role, FAST)


def _norm_linear_of(d_in: int, outputs: dict[str, int], cfg: ScaleConfig, ops=FAST) -> NormLinear:
    """A standalone NormLinear whose branch names are their projection sites, placed by ``norm_plan``."""
    return NormLinear(d_in, outputs, norm_plan(cfg, {name: name for name in outputs}), EPS, ops)


def _output_norm(d: int, cfg: ScaleConfig) -> OutputNorm:
    return OutputNorm(d, scale_plan(cfg, ModelConfig(qk_norm=True)).qk_norm, EPS, FAST)


def _ref_norm(x: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """RMSNorm without affine in float64 (DESIGN.md §1), the reference for everything below."""
    x = x.double()
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _perturb(module: nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() == 1 or p.shape[-1] == 1 or isinstance(module, ScaleVector):
                p.add_(0.4 * torch.randn(p.shape, generator=g))


def test_rms_norm_matches_formula():
    """rms_norm(x) = x / sqrt(mean(x²) + eps) over the last dim, fp32 to 1e-6."""
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(0)) * 3
    torch.testing.assert_close(rms_norm(x, EPS), _ref_norm(x).float(), rtol=1e-6, atol=1e-6)


def test_rms_norm_computes_in_float32_and_keeps_dtype():
    """A bf16 input is normalized in float32 and returned as bf16 (DESIGN.md §1)."""
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(1)).bfloat16()
    y = rms_norm(x, EPS)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, _ref_norm(x.float()).float().bfloat16())


@pytest.mark.parametrize("param", ["direct", "magdir", "magdir_exp"])
@pytest.mark.parametrize("shape", [(8,), (3, 8)])
def test_scale_vector_is_one_at_init(param, shape):
    """Every parameterization gives γ = 1 exactly at init, in the requested shape (DESIGN.md §2)."""
    sv = _vector(shape, param, "input_scale")
    init_params(sv)
    assert torch.equal(sv(), torch.ones(shape))


@pytest.mark.parametrize("shape", [(8,), (3, 8)])
def test_magdir_is_beta_alpha_over_rms(shape):
    """OR: γ = β · α / rms(α), rms over the last dim, after random perturbation (fp64 reference)."""
    sv = _vector(shape, "magdir", "input_scale")
    init_params(sv)
    _perturb(sv)
    a, b = sv.direction.double(), sv.magnitude.double()
    expected = b * a / a.pow(2).mean(-1, keepdim=True).sqrt()
    torch.testing.assert_close(sv().double(), expected, rtol=1e-6, atol=1e-7)
    assert sv.magnitude.shape == (*shape[:-1], 1)


@pytest.mark.parametrize("shape", [(8,), (3, 8)])
def test_magdir_exp_is_exp_b_alpha_over_rms(shape):
    """ER: γ = exp(b) · α / rms(α), after random perturbation (fp64 reference)."""
    sv = _vector(shape, "magdir_exp", "output_scale")
    init_params(sv)
    _perturb(sv)
    a, b = sv.direction.double(), sv.log_magnitude.double()
    expected = b.exp() * a / a.pow(2).mean(-1, keepdim=True).sqrt()
    torch.testing.assert_close(sv().double(), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("param, roles", [
    ("direct", {"weight": "output_scale"}),
    ("magdir", {"magnitude": "output_scale", "direction": "scale_direction"}),
    ("magdir_exp", {"log_magnitude": "output_scale", "direction": "scale_direction"}),
])
def test_scale_vector_roles(param, roles):
    """The magnitude carries the scale's role, the direction α the role scale_direction (DESIGN.md §5)."""
    assert param_roles(_vector((4,), param, "output_scale")) == roles


def test_or_jacobian_preconditioner_at_init():
    """Theorem 3.2: at init the real OR ScaleVector's J Jᵀ (Jacobian of its own forward in its own
    parameters, theory.magdir.preconditioner) is 11ᵀ + (I - 11ᵀ/d): radial eigenvalue d, tangential 1."""
    d = 6
    sv = _vector((d,), "magdir", "input_scale").double()
    init_params(sv)
    gamma, P = preconditioner(sv)
    ones = torch.ones(d, d, dtype=torch.float64)
    torch.testing.assert_close(P, ones + torch.eye(d, dtype=torch.float64) - ones / d, rtol=0, atol=1e-12)
    eig = torch.linalg.eigvalsh(P)
    torch.testing.assert_close(eig, torch.tensor([1.0] * (d - 1) + [float(d)], dtype=torch.float64))
    assert torch.equal(gamma, torch.ones(d, dtype=torch.float64))


@pytest.mark.parametrize("param", ["magdir", "magdir_exp"])
def test_preconditioner_away_from_init_matches_theorem(param):
    """Off init, the real module's P = J Jᵀ has γ̂ as an eigenvector with the radial and tangential
    eigenvalues of the library's closed forms (theory.magdir.predicted: OR radial d, tangential β²/rms(α)²;
    ER radial d·e^{2b}), in float64 to 1e-9 (eigvalsh of a 16×16 matrix)."""
    vec = make_scale_vector(param, 16)
    perturb(vec, torch.Generator().manual_seed(3))
    got, want = spectrum(*preconditioner(vec)), predicted(param, vec)
    assert got["eigvec_residual"] < 1e-9
    assert got["radial"] == pytest.approx(want["radial"], rel=1e-9)
    assert got["tangential_min"] == pytest.approx(want["tangential"], rel=1e-9)
    assert got["tangential_max"] == pytest.approx(want["tangential"], rel=1e-9)


def _norm_linear(strategy: str, apply: str, seed: int = 0, d_in: int = 16):
    cfg = ScaleConfig.preset(strategy)
    torch.manual_seed(seed)
    m = _norm_linear_of(d_in, {"q": 8, "k": 4, "gate": 12, "up": 12}, cfg, FAST if apply == "weight" else PLAIN)
    init_params(m)
    _perturb_all_scales(m, seed)
    return m


def _perturb_all_scales(m: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed + 1)
    roles = param_roles(m)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if roles[name] != "matrix":
                p.copy_(1.0 + 0.4 * torch.randn(p.shape, generator=g).clamp(-2, 2))


def _reference_outputs(m: NormLinear, x: torch.Tensor) -> list[torch.Tensor]:
    """y_b = s_b ⊙ [n](W_b diag(γ_shared γ_b) n(x)) in float64, written from DESIGN.md §3."""
    u = _ref_norm(x)
    shared = m.scale().double() if m.scale is not None else 1.0
    out = []
    for b in m.branches.values():
        g = shared * (b.in_scale().double() if b.in_scale is not None else 1.0)
        y = (u * g) @ b.weight.double().T
        if b.out_norm:
            y = _ref_norm(y)
        if b.out_scale is not None:
            y = y * b.out_scale().double()
        out.append(y)
    return out


@pytest.mark.parametrize("strategy", PRESET_NAMES)
@pytest.mark.parametrize("apply", ["weight", "activation"])
def test_norm_linear_matches_reference_formula(strategy, apply):
    """NormLinear computes s ⊙ [n](W diag(γ_shared γ_b) n(x)) per branch, both apply modes, fp32 to 1e-5."""
    m = _norm_linear(strategy, apply)
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(3))
    for y, ref in zip(m(m.norm(x)), _reference_outputs(m, x), strict=True):
        torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("strategy", [n for n in PRESET_NAMES if ScaleConfig.preset(n).scale != "none"])  # has scales
def test_norm_linear_apply_modes_give_same_gradients(strategy):
    """apply='weight' and 'activation' give the same parameter gradients (DESIGN.md §3 note), 1e-5 relative."""
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(4))
    grads = []
    for apply in ("weight", "activation"):
        m = _norm_linear(strategy, apply)
        loss = sum((y * torch.linspace(-1, 1, y.shape[-1])).sum() for y in m(m.norm(x)))
        loss.backward()
        grads.append({n: p.grad for n, p in m.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    # fp32 rounding scales with the whole gradient, not with one tiny entry: under DNP the magnitude of
    # γ_gate/γ_up is scale-invariant through n(·), so its gradient is only the eps term (~1e-4 of the rest).
    total = torch.cat([g.flatten() for g in grads[1].values()]).norm()
    for name in grads[0]:
        a, b = grads[0][name], grads[1][name]
        assert (a - b).norm() <= 1e-5 * b.norm() + 1e-6 * total, name


def test_norm_linear_scale_placement():
    """shared: one γ; branch (HG): one γ per branch and none shared; dual: s on the dual sites only."""
    hg = _norm_linear_of(16, {"q": 8, "k": 4}, ScaleConfig.preset("hg"))
    assert hg.scale is None and all(b.in_scale is not None and b.out_scale is None for b in hg.branches.values())
    single = _norm_linear_of(16, {"lm_head": 8}, ScaleConfig.preset("hg"))
    assert single.scale is not None and single.branches["lm_head"].in_scale is None  # one branch: HG = shared
    cfg = ScaleConfig(placement="dual", dual_sites=("q",))
    dp = _norm_linear_of(16, {"q": 8, "k": 4}, cfg)
    assert dp.branches["q"].out_scale is not None and dp.branches["k"].out_scale is None
    none = _norm_linear_of(16, {"q": 8, "k": 4}, ScaleConfig.preset("none"))
    assert [n for n, _ in none.named_parameters()] == ["branches.q.weight", "branches.k.weight"]


def test_dnp_gate_scale_is_output_scale_up_scale_is_input_scale():
    """DNP: s on W_gate feeds SiLU (output_scale), s on W_up folds into W_down (input_scale) (DESIGN.md §3)."""
    m = _norm_linear_of(16, {"gate": 12, "up": 12}, ScaleConfig.preset("dnp"))
    roles = param_roles(m)
    assert roles["branches.gate.out_scale.weight"] == "output_scale"
    assert roles["branches.up.out_scale.weight"] == "input_scale"
    assert roles["scale.weight"] == "input_scale"
    dp_roles = param_roles(_norm_linear_of(16, {"gate": 12, "up": 12}, ScaleConfig.preset("dp")))
    assert dp_roles["branches.gate.out_scale.weight"] == "input_scale"  # DP's s folds into W_gate's rows


def test_folded_state_is_diag_s_w_diag_gamma():
    """folded_state gives W' = diag(s) W diag(γ_shared γ_b) for every branch (the §4 fold)."""
    m = _norm_linear("unified_foldable", "weight")
    assert m.scale is None  # HG: branch scales only
    state = m.folded_state()
    for name, b in m.branches.items():
        expected = b.out_scale().unsqueeze(-1) * b.weight * b.in_scale()
        torch.testing.assert_close(state[f"branches.{name}.weight"], expected, rtol=1e-6, atol=1e-7)
    m2 = _norm_linear("dp", "weight")
    for name, b in m2.branches.items():
        expected = b.out_scale().unsqueeze(-1) * b.weight * m2.scale()
        torch.testing.assert_close(m2.folded_state()[f"branches.{name}.weight"], expected, rtol=1e-6, atol=1e-7)


def test_folded_state_refuses_dnp_naming_branches():
    """folded_state raises ValueError naming the DNP-normalized branches (gate, up), which cannot fold."""
    m = _norm_linear("dnp", "weight")
    with pytest.raises(ValueError, match=r"gate, up"):
        m.folded_state()


def test_output_norm_variants():
    """OutputNorm: γ ⊙ n(x) with role output_scale; no γ under 'none'; a direct γ under 'folded'."""
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(5))
    plain = _output_norm(8, ScaleConfig.preset("none"))
    assert list(plain.parameters()) == []
    torch.testing.assert_close(plain(x), rms_norm(x, EPS))
    orn = _output_norm(8, ScaleConfig.preset("or"))
    init_params(orn)
    _perturb(orn.scale)
    torch.testing.assert_close(orn(x), rms_norm(x, EPS) * orn.scale())
    assert set(param_roles(orn).values()) == {"output_scale", "scale_direction"}
    folded = _output_norm(8, ScaleConfig(scale="none", folded=True))
    assert param_roles(folded) == {"scale.weight": "output_scale"}
    torch.testing.assert_close(orn.folded_state()["scale.weight"], orn.scale())


def test_param_without_role_fails_loudly():
    """A parameter not made by new_param has no role/init: param_roles and init_params raise KeyError."""
    m = nn.Module()
    new_param(m, "ok", (2,), "matrix", lambda t: t.zero_())
    m.rogue = nn.Parameter(torch.zeros(2))
    with pytest.raises(KeyError):
        param_roles(m)
    with pytest.raises(KeyError, match="rogue"):
        init_params(m)


def test_new_param_rejects_unknown_role():
    """new_param only accepts the seven roles of DESIGN.md §5."""
    with pytest.raises(AssertionError):
        new_param(nn.Module(), "w", (2,), "bias", lambda t: t.zero_())


def test_scale_vectors_reports_effective_gamma():
    """scale_vectors returns the effective γ (not the raw parameters) of every ScaleVector, detached."""
    m = _norm_linear("unified_foldable", "weight")
    got = scale_vectors(m)
    assert set(got) == {f"branches.{b}.{side}" for b in ("q", "k", "gate", "up") for side in ("in_scale", "out_scale")}
    for name, g in got.items():
        assert not g.requires_grad
        torch.testing.assert_close(g, m.get_submodule(name)())
