"""Optimizer groups from roles (DESIGN.md §5): coverage, weight decay per role, Muon per expert."""

import pytest
import torch

from scalevec import ScaleConfig, build_model
from scalevec.config import OptimConfig, PRESET_NAMES
from scalevec.optim import Muon, build_optimizers, group_table, param_groups, set_lr


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
