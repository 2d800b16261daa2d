"""The theory lab (DESIGN.md §4): every claim asserted on the number its experiment computes,
plus the training probes ``probe_scales`` and ``sharpness`` on the tiny Transformer."""

from __future__ import annotations

import argparse
import json
import os

import pytest
import torch
from torch import nn
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

from scalevec import MoEConfig, ScaleConfig, build_model
from scalevec.cli import SUBCOMMANDS
from scalevec.experiments.theory import expressivity, lab, magdir, placement, precondition, weight_decay
from scalevec.model.moe import MoE
from scalevec.model.scales import NormLinear, OutputNorm
from scalevec.training.probes import batch_loss, probe_scales, sharpness

# The §4 experiments that train (precondition, weight decay, placement, the subcommand) and the full-model
# Hessian probe are slow; the fold and magdir experiments, the probes and the small Hessian checks (~1 s) are not.

# ------------------------------------------------------------------ experiments (each computed once per module)


@pytest.fixture(scope="module")
def fold_result():
    return expressivity.compute(seed=0)


@pytest.fixture(scope="module")
def precondition_result():
    return precondition.compute(seed=0)


@pytest.fixture(scope="module")
def wd_result():
    return weight_decay.compute(seed=0)


@pytest.fixture(scope="module")
def placement_result():
    return placement.compute(seed=0)


@pytest.fixture(scope="module")
def magdir_result():
    return magdir.compute(seed=0)


def test_fold_matches_logits_for_every_foldable_strategy(fold_result):
    """fold: every foldable strategy folds to logits within 1e-5 (fp32); exactly DNP and unified refuse."""
    folded = {f["strategy"]: f for f in fold_result["folds"] if f["foldable"]}
    refused = {f["strategy"] for f in fold_result["folds"] if not f["foldable"]}
    assert refused == {"dnp", "unified"}
    assert set(folded) == {"none", "baseline", "iwd", "hg", "dp", "or", "er", "unified_foldable"}
    for f in folded.values():
        assert f["max_abs_diff"] <= 1e-5, f
        assert f["n_scale_params_after"] == 0  # no QK-norm in CFG: nothing scale-like survives the fold


def test_fold_output_norm_scale_changes_function_and_cannot_fold(fold_result):
    """fold: γ_out×c with W_o/c changes peri logits far above rounding; the pre Input-Norm analogue does not."""
    pre, peri = fold_result["rescale_pre"], fold_result["rescale_peri"]
    assert pre["max_abs_change"] <= 1e-5
    assert peri["max_abs_change"] > 1e-2
    assert peri["max_abs_change"] > 1e4 * fold_result["max_fold_diff"]
    assert peri["fold"].startswith("refused: cannot fold layers.0.attn_out")


@pytest.mark.slow  # trains a §4 experiment or probes the full model
def test_conserved_quantity_drift_halves_with_the_step(precondition_result):
    """precondition (a): over a fixed time, the drift of γ_j² − ‖w_j‖² halves (±20 %) when the step halves."""
    assert len(precondition_result["drift_ratios"]) == 2
    for ratio in precondition_result["drift_ratios"]:
        assert 0.4 <= ratio <= 0.6, precondition_result["drift_ratios"]
    assert precondition_result["drift"][-1]["norm"] > 0  # a real, measured drift (not a vanishing artefact)


@pytest.mark.slow  # trains a §4 experiment or probes the full model
def test_one_step_matches_preconditioned_gradient_to_first_order(precondition_result):
    """precondition (b): Δ(γ_j w_j) = −η(γ_j² I + w_j w_jᵀ) g_j within 1e-3 relative, error ∝ η."""
    errs = {m["lr"]: m["rel_err"] for m in precondition_result["first_order"]}
    assert errs[1e-4] <= 1e-3 and errs[1e-5] <= 1e-4
    for big, small in ((1e-2, 1e-3), (1e-3, 1e-4), (1e-4, 1e-5)):
        assert 8 <= errs[big] / errs[small] <= 12  # first order: the residual is O(η²), i.e. O(η) relative


@pytest.mark.slow  # trains a §4 experiment or probes the full model
def test_preconditioner_lambda_min_is_at_least_gamma_squared(precondition_result):
    """precondition (c): λ_min(γ_j² I + w_j w_jᵀ) ≥ γ_j² on every column at every snapshot (rounding 1e-12)."""
    bound = precondition_result["lambda_min"]
    assert bound["pairs_checked"] >= 16 * 10
    assert bound["min_rel_gap"] >= -1e-12
    assert bound["max_rel_err_lambda_max"] <= 1e-12  # and λ_max = γ_j² + ‖w_j‖²


@pytest.mark.slow  # trains a §4 experiment or probes the full model
def test_gamma_reaches_target_in_fewer_steps_on_least_squares(precondition_result):
    """precondition (d): from the same effective weight, GD with γ reaches the target loss in fewer steps."""
    ls = precondition_result["least_squares"]
    assert ls["loss_with_gamma"][0] == pytest.approx(ls["loss_without_gamma"][0], rel=1e-12)  # same start
    assert ls["steps_with_gamma"] is not None and ls["steps_without_gamma"] is not None
    assert ls["steps_with_gamma"] < ls["steps_without_gamma"]


@pytest.mark.slow  # trains a §4 experiment or probes the full model
def test_gamma_reaches_target_in_fewer_steps_on_two_layer_net(precondition_result):
    """precondition (d): the same holds on the two-layer Pre-Norm network (seed 0)."""
    net = precondition_result["two_layer"]
    assert net["loss_with_gamma"][0] == pytest.approx(net["loss_without_gamma"][0], rel=1e-12)
    assert net["steps_with_gamma"] is not None and net["steps_without_gamma"] is not None
    assert net["steps_with_gamma"] < net["steps_without_gamma"]


@pytest.mark.slow  # trains a §4 experiment or probes the full model
def test_weight_decay_on_input_norm_balances_and_lowers_sharpness(wd_result):
    """weight-decay: with wd on γ and W, |γ_j| = ‖w_j‖ and the sharpness at matched loss is lower."""
    inp = wd_result["input_norm"]
    runs, matched = inp["runs"], inp["matched_loss"]
    assert runs["iwd"]["final"]["imbalance"] <= 1e-3
    for name in ("none", "matrix"):
        m = runs[name]["matched"]
        assert m is not None and m["imbalance"] > 0.5
        assert abs(m["loss"] - matched) <= 0.1 * matched  # matched: first step at or below the IWD loss
        assert runs["iwd"]["matched"]["power"] < m["power"]
        assert m["power"] == pytest.approx(m["exact"], rel=1e-2)  # power iteration vs the dense Hessian
    assert runs["iwd"]["final"]["power"] == pytest.approx(runs["iwd"]["final"]["exact"], rel=1e-6)


@pytest.mark.slow  # trains a §4 experiment or probes the full model
def test_weight_decay_on_output_norm_raises_the_loss(wd_result):
    """weight-decay: on the Output-Norm toy, wd on γ leaves a loss floor the run without wd goes below."""
    out = wd_result["output_norm"]
    with_wd, without = out["runs"]["wd"]["final_loss"], out["runs"]["none"]["final_loss"]
    assert with_wd > 100 * without
    assert with_wd == pytest.approx(out["floor"], rel=0.05)  # the analytic floor γ_j = c_j m_j / (m_j + λ)


def test_output_floor_formula():
    """weight-decay: output_floor is 0 without decay and ½ Σ m (cλ/(m+λ))² with it."""
    m, c = torch.tensor([1.0, 0.5], dtype=torch.float64), torch.tensor([3.0, 2.0], dtype=torch.float64)
    assert weight_decay.output_floor(m, c, 0.0) == 0.0
    expected = 0.5 * (1.0 * (3 * 0.1 / 1.1) ** 2 + 0.5 * (2 * 0.1 / 0.6) ** 2)
    assert weight_decay.output_floor(m, c, 0.1) == pytest.approx(expected, rel=1e-12)


@pytest.mark.slow  # trains a §4 experiment or probes the full model
def test_dual_placement_rate_gain_is_grad_s_squared(placement_result):
    """placement: rate_dual − rate_single = ‖∂L/∂s‖² (1e-6 relative) and ≥ 0 at every random point."""
    points = placement_result["points"]
    assert len(points) == placement.N_POINTS
    assert placement_result["max_rel_err"] <= 1e-6
    assert all(p["rate_dual"] - p["rate_single"] >= 0 for p in points)
    assert placement_result["min_rate_difference"] > 0


def test_magdir_preconditioner_eigenvalues_at_init(magdir_result):
    """magdir: at init J Jᵀ has radial eigenvalue d and tangential 1 (OR and ER), all 1 for plain γ (1e-5)."""
    for row in magdir_result["rows"]:
        s, d = row["init"], row["d"]
        radial = 1.0 if row["param"] == "direct" else d
        assert abs(s["radial"] - radial) <= 1e-5, row
        assert abs(s["tangential_min"] - 1) <= 1e-5 and abs(s["tangential_max"] - 1) <= 1e-5, row
        assert s["eigvec_residual"] <= 1e-8  # γ̂ is an eigenvector
    assert {r["param"] for r in magdir_result["rows"]} == {"direct", "magdir", "magdir_exp"}


def test_magdir_preconditioner_matches_formula_off_init(magdir_result):
    """magdir: off init OR's radial stays d, ER's is ‖γ‖² = d e^{2b}, tangential β²/rms(α)² (e^{2b}/rms(α)²)."""
    assert magdir_result["max_rel_err_random"] <= 1e-10
    er = next(r for r in magdir_result["rows"] if r["param"] == "magdir_exp" and r["d"] == 16)["random"]
    assert abs(er["radial"] - 16) > 1  # ER's radial eigenvalue has moved with b, OR's has not
    orr = next(r for r in magdir_result["rows"] if r["param"] == "magdir" and r["d"] == 16)["random"]
    assert orr["radial"] == pytest.approx(16, rel=1e-12)


# ------------------------------------------------------------------ CLI


@pytest.mark.slow  # trains a §4 experiment or probes the full model
def test_theory_subcommand_writes_json_and_png_deterministically(tmp_path):
    """CLI: `theory magdir --out DIR --seed 1` writes magdir.json and magdir.png; same seed, same JSON."""
    assert ("theory", "scalevec.experiments.theory.lab") in [(n, m) for n, m, _ in SUBCOMMANDS]
    parser = argparse.ArgumentParser()
    lab.add_arguments(parser)
    outputs = []
    for out in (tmp_path / "a", tmp_path / "b"):
        assert lab.run(parser.parse_args(["magdir", "--out", str(out), "--seed", "1"])) == 0
        assert (out / "magdir.png").stat().st_size > 1000
        outputs.append((out / "magdir.json").read_text())
    assert outputs[0] == outputs[1]
    result = json.loads(outputs[0])
    assert result["experiment"] == "magdir" and result["seed"] == 1 and result["summary"]


def test_theory_subcommand_rejects_a_file_as_out(tmp_path):
    """CLI: --out naming an existing file is a one-line ValueError naming the fix."""
    parser = argparse.ArgumentParser()
    lab.add_arguments(parser)
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match="give a directory"):
        lab.run(parser.parse_args(["magdir", "--out", str(f)]))
    with pytest.raises(ValueError, match="unknown theory experiment"):
        lab.run_experiment("nope", tmp_path)


def test_theory_threads_apply_to_the_experiment_only(tmp_path, monkeypatch, capsys):
    """`theory --threads 1` runs the experiment on 1 thread and restores torch's count after; --threads 0 is a
    one-line error (exit 2) before anything is written."""
    from scalevec.cli import main

    seen = []
    monkeypatch.setattr(lab, "run_experiment", lambda name, out, seed=0: (seen.append(torch.get_num_threads()),
                                                                        {"summary": []})[1])
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert main(["theory", "magdir", "--out", str(tmp_path / "a"), "--threads", "1"]) == 0
        assert seen == [1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert main(["theory", "magdir", "--out", str(tmp_path / "b"), "--threads", "0"]) == 2
    assert "--threads 0 must be >= 1" in capsys.readouterr().err and not (tmp_path / "b").exists()


def test_theory_refuses_a_dangling_link_above_out(tmp_path, capsys, monkeypatch):
    """--out below a symbolic link that leads nowhere was mkdir's bare '[Errno 17] File exists': one line (exit 2)
    naming the link, where it leads and the fix, before any experiment runs; nothing is created."""
    from scalevec.cli import main

    monkeypatch.setattr(lab, "run_experiment", lambda *a, **k: pytest.fail("the experiment ran"))
    link = tmp_path / "dang"
    os.symlink(tmp_path / "nowhere", link)
    out = link / "sub"
    assert main(["theory", "magdir", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"scalevec theory: error: --out {out}: {link} is a symbolic link that leads nowhere (to "
                   f"{os.path.realpath(tmp_path / 'nowhere')}); remove it or choose another --out")
    assert "Errno" not in err and [p.name for p in tmp_path.iterdir()] == ["dang"] and link.is_symlink()


# ------------------------------------------------------------------ probes


def _norm_modules(model: nn.Module) -> set[str]:
    return {n for n, m in model.named_modules() if isinstance(m, (NormLinear, OutputNorm, MoE))}


def test_probe_scales_covers_every_norm(make_cfg):
    """probe_scales: one entry per NormLinear / MoE / OutputNorm (peri + QK-norm + MoE model), JSON-ready."""
    cfg = make_cfg(layout="peri", qk_norm=True, moe=MoEConfig(n_experts=4, top_k=2, d_expert=16, n_shared_experts=1))
    model = build_model(cfg, ScaleConfig.preset("unified"), seed=0)
    probe = probe_scales(model)
    assert set(probe) == _norm_modules(model)
    assert probe["layers.0.attn_out"]["kind"] == "output_norm"
    assert set(probe["layers.0.mlp"]["branches"]) == {"router", "gate", "up", "shared_gate", "shared_up"}
    json.dumps(probe, allow_nan=False)


def test_probe_scales_reports_effective_gamma_and_column_norms(make_cfg, perturb_scales):
    """probe_scales: γ² is the effective (OR-reparameterized, HG branch) gain squared; ‖w_j‖ the column norms."""
    model = build_model(make_cfg(), ScaleConfig.preset("unified_foldable"), seed=0)
    perturb_scales(model, seed=3)
    probe = probe_scales(model)["layers.1.mlp.proj"]["branches"]["up"]
    branch = model.layers[1].mlp.proj.branches["up"]
    a = branch.in_scale.direction.detach()
    gamma = branch.in_scale.magnitude.detach() * a / a.pow(2).mean().sqrt()  # γ = β α / rms(α), by hand
    col = branch.weight.detach().pow(2).sum(0).sqrt()  # ‖w_j‖ over d_out
    assert probe["gamma_sq"]["min"] == pytest.approx(gamma.pow(2).min().item(), rel=1e-5)
    assert probe["gamma_sq"]["max"] == pytest.approx(gamma.pow(2).max().item(), rel=1e-5)
    assert probe["col_norm"]["median"] == pytest.approx(col.median().item(), rel=1e-5)
    assert probe["lambda_max"]["max"] == pytest.approx((gamma.pow(2) + col.pow(2)).max().item(), rel=1e-5)
    s = branch.out_scale().detach()
    assert probe["out_scale_sq"]["max"] == pytest.approx(s.pow(2).max().item(), rel=1e-5)
    assert probe["gamma_sq"]["min"] < 0.9 and probe["gamma_sq"]["max"] > 1.1  # perturbed: not the init value


def test_probe_scales_without_scale_vectors(make_cfg):
    """probe_scales: strategy none has no γ, so no induced preconditioner (None), but column norms."""
    probe = probe_scales(build_model(make_cfg(), ScaleConfig.preset("none"), seed=0))
    head = probe["head"]["branches"]["lm_head"]
    assert head["gamma_sq"] is None and head["lambda_max"] is None and head["col_norm"]["max"] > 0


class _Quadratic(nn.Module):
    """``L(x) = ½ xᵀ A x + bᵀ x`` with a known spectrum (float64)."""

    def __init__(self, eigenvalues: list[float], seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        q, _ = torch.linalg.qr(torch.randn(len(eigenvalues), len(eigenvalues), generator=g, dtype=torch.float64))
        self.a = q @ torch.diag(torch.tensor(eigenvalues, dtype=torch.float64)) @ q.T
        self.b = torch.randn(len(eigenvalues), generator=g, dtype=torch.float64)
        self.x = nn.Parameter(torch.randn(len(eigenvalues), generator=g, dtype=torch.float64))

    def loss(self) -> torch.Tensor:
        return 0.5 * self.x @ self.a @ self.x + self.b @ self.x


def test_sharpness_equals_top_eigenvalue_of_a_quadratic():
    """sharpness: 20 power iterations give the top Hessian eigenvalue of a quadratic (gap 2×) to 1e-9."""
    model = _Quadratic([4.0, 2.0, 1.0, 0.5, -0.3, 0.1])
    assert sharpness(model, lambda m: m.loss(), n_iters=20) == pytest.approx(4.0, rel=1e-9)
    assert model.x.grad is None  # the probe leaves .grad alone


def test_sharpness_is_the_top_eigenvalue_when_a_negative_one_dominates():
    """sharpness: with eigenvalue −6 larger in magnitude than the top 4, the shifted second pass returns 4."""
    model = _Quadratic([-6.0, 4.0, 1.0, 0.5])
    assert sharpness(model, lambda m: m.loss(), n_iters=40) == pytest.approx(4.0, rel=1e-6)


def test_sharpness_through_attention_matches_the_exact_hessian(make_cfg):
    """sharpness: on the tiny Transformer (double backward through SDPA) it equals the dense Hessian's top
    eigenvalue in one scale vector (1e-4 relative, fp32)."""
    model = build_model(make_cfg(init_std=0.3), ScaleConfig.preset("hg"), seed=0)
    name = "layers.0.attn.proj.branches.q.in_scale.weight"
    for n, p in model.named_parameters():
        p.requires_grad_(n == name)
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    loss_fn = batch_loss(tokens[:, :-1], tokens[:, 1:])
    gamma = dict(model.named_parameters())[name].detach().clone()

    def loss_of_gamma(g: torch.Tensor) -> torch.Tensor:
        return loss_fn(lambda *a: functional_call(model, {name: g}, a))

    with sdpa_kernel(SDPBackend.MATH):
        eig = torch.linalg.eigvalsh(torch.autograd.functional.hessian(loss_of_gamma, gamma).double())
    top = eig[eig.abs().argmax()].item()
    assert abs(top) > 1.0  # attention matters at this init, so the check is not vacuous
    assert sharpness(model, loss_fn, n_iters=20) == pytest.approx(top, rel=1e-4)


@pytest.mark.slow  # trains a §4 experiment or probes the full model
def test_sharpness_on_the_full_tiny_model_converges_from_below(make_cfg, tokens):
    """sharpness: on all parameters of a tiny MoE + QK-norm model at init (a negative eigenvalue competes, so
    the shifted pass runs) 20 iterations land within 10 % below 60 iterations' estimate, both positive."""
    cfg = make_cfg(qk_norm=True, moe=MoEConfig(n_experts=4, top_k=2, d_expert=16))
    model = build_model(cfg, ScaleConfig.preset("unified"), seed=0)
    loss_fn = batch_loss(tokens[:, :-1], tokens[:, 1:])
    short, long = sharpness(model, loss_fn, n_iters=20), sharpness(model, loss_fn, n_iters=60)
    assert 0 < long < float("inf")
    assert 0.9 * long <= short <= long * (1 + 1e-4)  # Rayleigh quotients: lower bounds that rise with iterations
