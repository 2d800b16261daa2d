"""Optimizer groups from roles (DESIGN.md §5): coverage, weight decay per role, Muon per expert."""

import copy
import json

import pytest
import torch

from scalevec import ScaleConfig, build_model
from scalevec.config import PRESET_NAMES, OptimConfig
from scalevec.training.optim import (
    Group,
    Muon,
    adamw_fused,
    build_optimizers,
    group_table,
    param_groups,
    set_lr,
    zeropower_via_newtonschulz,
)


@pytest.fixture
def tiny_cfg(make_cfg):
    return make_cfg()


@pytest.mark.parametrize("strategy", PRESET_NAMES)
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_every_param_in_exactly_one_group(tiny_cfg, strategy, optimizer):
    """Groups cover every parameter exactly once, and each group holds a single role."""
    model = build_model(tiny_cfg, ScaleConfig.preset(strategy), seed=0)
    groups = param_groups(model, OptimConfig(name=optimizer), model.scfg)
    names = [n for g in groups for n in g.names]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())
    assert len(names) == len(set(names))
    roles = model.param_roles()
    for g in groups:
        assert {roles[n] for n in g.names} == {g.role}
        assert g.optimizer == ("muon" if optimizer == "muon" and g.role == "matrix" else "adamw")


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
@pytest.mark.parametrize("strategy,decayed", [("baseline", set()), ("iwd", {"input_scale"}),
                                              ("unified", {"input_scale"}), ("or", set())])
def test_zero_grad_step_decays_exactly_by_role(tiny_cfg, optimizer, strategy, decayed):
    """With zero gradients one step leaves undecayed scales exactly at their value and shrinks decayed
    tensors by exactly (1 - lr·wd)."""
    model = build_model(tiny_cfg, ScaleConfig.preset(strategy), seed=0)
    cfg = OptimConfig(name=optimizer, lr=0.01, weight_decay=0.1)
    groups = param_groups(model, cfg, model.scfg)
    opts = build_optimizers(groups, cfg)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    for o in opts:
        o.step()
    roles = model.param_roles()
    shrink = torch.tensor(1 - 0.01 * 0.1, dtype=torch.float32)
    for n, p in model.named_parameters():
        role = roles[n]
        if role in ("matrix", "lm_head") or role in decayed:
            torch.testing.assert_close(p.detach(), before[n] * shrink, rtol=1e-6, atol=0)
        else:
            assert torch.equal(p.detach(), before[n]), n
            if role in ("input_scale", "output_scale", "scale_direction") and strategy != "er":
                assert torch.all(p == 1.0)


def test_group_table_lists_roles_and_counts(tiny_cfg):
    """The printed table has one line per role with tensor and parameter counts adding up."""
    model = build_model(tiny_cfg, ScaleConfig.preset("unified"), seed=0)
    groups = param_groups(model, OptimConfig(name="muon"), model.scfg)
    table = group_table(groups)
    for g in groups:
        assert g.role in table
    assert f"{sum(p.numel() for p in model.parameters()):,}" in table.splitlines()[-1]


def test_set_lr_scales_every_group():
    """set_lr multiplies each group's peak lr."""
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.AdamW([{"params": [p], "lr": 0.2, "peak_lr": 0.2}])
    set_lr([opt], 0.25)
    assert opt.param_groups[0]["lr"] == 0.05


def test_muon_bank_equals_per_expert_steps():
    """Muon on a 3-D expert bank equals torch.optim.Muon on each expert matrix separately (two steps)."""
    torch.manual_seed(0)
    bank = torch.nn.Parameter(torch.randn(3, 8, 5))
    mats = [torch.nn.Parameter(bank.detach()[e].clone()) for e in range(3)]
    ours = Muon([{"params": [bank]}], lr=0.05, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    ref = torch.optim.Muon(mats, lr=0.05, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    for _ in range(2):
        g = torch.randn(3, 8, 5)
        bank.grad = g.clone()
        for e in range(3):
            mats[e].grad = g[e].clone()
        ours.step()
        ref.step()
    for e in range(3):
        assert torch.equal(bank.detach()[e], mats[e].detach())


def test_muon_rejects_vectors():
    """Muon takes matrices and banks only; a vector is a configuration error."""
    with pytest.raises(ValueError, match="2-D"):
        Muon([{"params": [torch.nn.Parameter(torch.zeros(4))]}], lr=0.1)


@pytest.mark.parametrize("shape", [(8, 5), (5, 8), (6, 6)])
@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("adjust_lr_fn", ["match_rms_adamw", "original", None])
def test_muon_equals_torch_muon_on_matrices(shape, nesterov, adjust_lr_fn):
    """Our Muon steps a 2-D weight as torch.optim.Muon does (tall, wide, square; Nesterov on/off; each lr
    adjustment; weight decay on), over three steps."""
    torch.manual_seed(0)
    ours_w = torch.nn.Parameter(torch.randn(shape))
    ref_w = torch.nn.Parameter(ours_w.detach().clone())
    kw = dict(lr=0.05, weight_decay=0.1, momentum=0.9, nesterov=nesterov, adjust_lr_fn=adjust_lr_fn)
    ours, ref = Muon([ours_w], **kw), torch.optim.Muon([ref_w], **kw)
    for _ in range(3):
        g = torch.randn(shape)
        ours_w.grad, ref_w.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    # Measured: bitwise equal with torch 2.13 (the same operations in the same order). 1e-6 is far below
    # one step's move (lr·0.2·√8 ≈ 3e-2 per entry) and below a bf16 rounding of the update (≈ 1e-4).
    torch.testing.assert_close(ours_w.detach(), ref_w.detach(), rtol=0, atol=1e-6)
    torch.testing.assert_close(ours.state[ours_w]["momentum_buffer"], ref.state[ref_w]["momentum_buffer"],
                               rtol=0, atol=1e-6)


def test_muon_loads_torch_muon_state():
    """A torch.optim.Muon state dict (older checkpoints were written by a subclass of it) loads into our Muon,
    which then continues exactly as torch's does."""
    torch.manual_seed(1)
    a = torch.nn.Parameter(torch.randn(4, 7))
    b = torch.nn.Parameter(a.detach().clone())
    ref = torch.optim.Muon([a], lr=0.02, adjust_lr_fn="match_rms_adamw")
    a.grad = torch.randn(4, 7)
    ref.step()
    b.data.copy_(a.detach())
    ours = Muon([b], lr=0.02, adjust_lr_fn="match_rms_adamw")
    ours.load_state_dict(copy.deepcopy(ref.state_dict()))  # load_state_dict keeps the tensors: no sharing
    g = torch.randn(4, 7)
    a.grad, b.grad = g.clone(), g.clone()
    ref.step()
    ours.step()
    assert torch.equal(a.detach(), b.detach())


def test_newton_schulz_orthogonalizes():
    """NS maps a matrix to one whose singular values lie in the quintic's band (about 0.5 to 1.5, Keller
    Jordan's post); a 3-D input is refused."""
    torch.manual_seed(2)
    g = torch.randn(16, 8) @ torch.diag(torch.logspace(-1, 0, 8))  # condition number ~40: 5 steps lift all to >= 0.5
    o = zeropower_via_newtonschulz(g).float()
    s = torch.linalg.svdvals(o)
    assert o.shape == g.shape and s.min() > 0.5 and s.max() < 1.5, s
    with pytest.raises(ValueError, match="2-D"):
        zeropower_via_newtonschulz(torch.zeros(2, 3, 4))


def test_adamw_kernel_choice():
    """optim.fused: auto is foreach on CPU (the study's numerics) and fused on CUDA; true/false force one."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert (adamw_fused("auto", cpu), adamw_fused("auto", cuda)) == (False, True)
    assert adamw_fused("true", cpu) and adamw_fused(True, cpu) and not adamw_fused("false", cuda)
    w = torch.nn.Parameter(torch.ones(3, 3))
    groups = [Group("matrix", "adamw", 1e-2, 0.1, ["w"], [w])]
    for fused in ("auto", "true", "false"):
        (opt,) = build_optimizers(groups, OptimConfig(fused=fused))
        assert bool(opt.param_groups[0]["fused"]) == (fused == "true")
        assert bool(opt.param_groups[0]["foreach"]) == (fused != "true")
    with pytest.raises(ValueError, match="optim.fused"):
        OptimConfig(fused="sometimes").validate()


@pytest.mark.slow  # three tiny trainings: ~3 s
def test_resume_is_bitwise_exact_under_fused_adamw(tmp_path):
    """With optim.fused=true (CPU fused AdamW), 8 steps straight equal 4 steps + resume + 4 steps, bitwise,
    and the run differs from foreach only by rounding (measured 1e-6 nats over 8 steps; bound 1e-4)."""
    from scalevec.resolve import resolve_config
    from scalevec.training.trainer import train

    def cfg(fused):
        items = {"train.steps": 8, "train.batch_size": 4, "train.seq_len": 32, "train.eval_every": 4,
                 "train.log_every": 1, "train.eval_batch_size": 8, "data.val_tokens": 1024, "schedule.warmup": 2,
                 "data.cache_dir": str(tmp_path / "cache"), "optim.fused": fused}
        return resolve_config("tiny", "unified", [f"{k}={v}" for k, v in items.items()])

    def losses(run, kind="train", key="loss"):
        return [r[key] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]

    train(cfg("true"), tmp_path / "straight", quiet=True)
    assert train(cfg("true"), tmp_path / "split", stop_at=4, quiet=True) == {"stopped_at": 4}
    train(cfg("true"), tmp_path / "split", resume=True, quiet=True)
    assert losses(tmp_path / "straight") == losses(tmp_path / "split") and len(losses(tmp_path / "split")) == 8
    assert losses(tmp_path / "straight", "eval", "val_loss") == losses(tmp_path / "split", "eval", "val_loss")
    train(cfg("false"), tmp_path / "foreach", quiet=True)
    assert max(abs(a - b) for a, b in zip(losses(tmp_path / "straight"), losses(tmp_path / "foreach"))) < 1e-4


@pytest.mark.parametrize("wd, coef", [("input", 0.01), ("all", 0.5), ("none", 0.5), ("direction", 0.5)])
def test_scale_weight_decay_sets_the_decayed_scales_coefficient_only(tiny_cfg, wd, coef):
    """``scale.weight_decay`` replaces ``optim.weight_decay`` on the scale roles the ``wd`` switch decays
    (the study's variant knob); matrices keep the optimizer's coefficient and undecayed roles stay at 0."""
    scfg = ScaleConfig(scale="branch", placement="dual_norm", param="magdir", wd=wd, weight_decay=coef)
    model = build_model(tiny_cfg, scfg, seed=0)
    by_role = {g.role: g.weight_decay for g in param_groups(model, OptimConfig(weight_decay=0.1), scfg)}
    decayed = {"input": {"input_scale"}, "all": {"input_scale", "output_scale"}, "none": set(),
               "direction": {"scale_direction"}}[wd]
    assert by_role["matrix"] == by_role["lm_head"] == 0.1 and by_role["embedding"] == 0.0
    for role in ("input_scale", "output_scale", "scale_direction"):
        assert by_role[role] == (coef if role in decayed else 0.0), role


def test_scale_weight_decay_must_be_non_negative():
    with pytest.raises(ValueError, match="scale.weight_decay=-0.1 must be a finite number >= 0"):
        ScaleConfig(weight_decay=-0.1).validate()


def test_wd_direction_decays_every_direction_and_leaves_every_gamma(tiny_cfg):
    """``wd: direction`` (DESIGN.md §3): with zero gradients one AdamW step shrinks every OR direction α by
    exactly (1 - lr·wd) and no magnitude β; γ = β α / rms(α) does not depend on α's norm, so every γ of the
    model stays where it was (to float32 rounding of the rms: rtol 1e-6)."""
    scfg = ScaleConfig(scale="branch", placement="dual_norm", param="magdir", wd="direction")
    model = build_model(tiny_cfg, scfg, seed=0)
    with torch.no_grad():  # a direction that is not all ones, so that its rms is not trivially 1
        for n, p in model.named_parameters():
            if n.endswith("direction"):
                p.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(len(n)))
    gammas = lambda: {n: m.gamma().detach().clone() for n, m in model.named_modules() if hasattr(m, "parts")}
    before, gamma_before = {n: p.detach().clone() for n, p in model.named_parameters()}, gammas()
    opts = build_optimizers(param_groups(model, OptimConfig(lr=0.01, weight_decay=0.1), scfg), OptimConfig(lr=0.01))
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    for o in opts:
        o.step()
    shrink = torch.tensor(1 - 0.01 * 0.1, dtype=torch.float32)
    roles = model.param_roles()
    directions = [n for n in before if roles[n] == "scale_direction"]
    assert directions and gamma_before
    for n, p in model.named_parameters():
        if roles[n] == "scale_direction":
            torch.testing.assert_close(p.detach(), before[n] * shrink, rtol=1e-6, atol=0)
        elif roles[n] in ("input_scale", "output_scale"):
            assert torch.equal(p.detach(), before[n]), n
    for n, g in gammas().items():
        torch.testing.assert_close(g, gamma_before[n], rtol=1e-6, atol=0)


def test_wd_direction_needs_a_direction():
    with pytest.raises(ValueError, match="scale.wd='direction' decays OR/ER's direction"):
        ScaleConfig(wd="direction").validate()


def test_direction_init_keeps_gamma_and_scales_the_first_adam_turn(tiny_cfg):
    """``scale.direction_init`` (DESIGN.md §3, OR's initialization): α starts at the constant c, γ = 1 all the
    same (c = 1/4, a power of two: the first loss is bitwise that of c = 1), the gradient on α is 1/c times as
    large with the same signs, so AdamW's first step (eps ~0, so that it is lr · sign(g) exactly) moves α by the
    same amount and α/rms(α) c⁻¹ = 4 times as far, to first order in lr / c (lr 1e-4: the second-order part and
    float32 rounding stay below the 1e-3 tolerance; at lr 1e-2 the ratio falls to ~3.97)."""
    x = torch.randint(0, tiny_cfg.vocab_size, (2, 17), generator=torch.Generator().manual_seed(0))
    turns, losses = {}, {}
    for c in (1.0, 0.25):
        scfg = ScaleConfig(scale="branch", placement="dual_norm", param="magdir", wd="input", direction_init=c)
        model = build_model(tiny_cfg, scfg, seed=0)
        directions = {n: p for n, p in model.named_parameters() if n.endswith("direction")}
        assert directions and all(torch.all(p == c) for p in directions.values())
        def unit(directions=directions):
            return {n: (p / p.pow(2).mean(-1, keepdim=True).sqrt()).detach().clone() for n, p in directions.items()}

        before = unit()
        ce, n, _ = model(x[:, :-1], x[:, 1:])
        loss = ce / n
        losses[c] = loss.item()
        loss.backward()
        cfg = OptimConfig(lr=1e-4, weight_decay=0.0, eps=1e-30)  # eps ~0: a step is lr · sign(g); small lr: 1st order
        for o in build_optimizers(param_groups(model, cfg, scfg), cfg):
            o.step()
        after = unit()
        turns[c] = torch.stack([(after[n] - before[n]).norm() for n in before])
    assert losses[0.25] == losses[1.0]
    assert torch.all(turns[1.0] > 0)
    torch.testing.assert_close(turns[0.25] / turns[1.0], torch.full_like(turns[1.0], 4.0), rtol=1e-3, atol=0)


def test_direction_init_is_checked():
    with pytest.raises(ValueError, match="direction_init=0.0 must be a positive number"):
        ScaleConfig(param="magdir", direction_init=0.0).validate()
    with pytest.raises(ValueError, match="scale.direction_init sets OR/ER's direction"):
        ScaleConfig(direction_init=0.5).validate()
