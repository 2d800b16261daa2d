"""Parameter roles, inits and counts have one home, params.py (DESIGN.md §5, §11)."""

import pytest

from scalevec import ScaleConfig, Transformer, build_model, get_preset, info
from scalevec.config import PRESET_NAMES, OptimConfig
from scalevec.model import moe, params, roles, scales, transformer
from scalevec.model.params import EMBEDDING_ROLES, ROLES, SCALE_ROLES, count_params
from scalevec.training import optim


def test_one_role_list():
    """optim groups by roles.GROUP_ROLES (params.ROLES then a plain model's bias), not a copy; the scale and
    embedding roles are among them."""
    assert optim.GROUP_ROLES is roles.GROUP_ROLES and roles.GROUP_ROLES == (*ROLES, roles.BIAS)
    assert set(SCALE_ROLES) <= set(ROLES) and set(EMBEDDING_ROLES) <= set(ROLES)
    assert len(set(ROLES)) == len(ROLES)
    assert info.count_params is count_params


def test_one_home_for_parameter_bookkeeping():
    """The model modules make, initialize and read parameters with params.py's functions, not copies, and the
    Transformer has no counter of its own beside count_params."""
    for module in (scales, transformer, moe):
        for name in ("new_param", "normal_init", "const_init", "param_roles", "init_params"):
            if hasattr(module, name):
                assert getattr(module, name) is getattr(params, name), f"{module.__name__}.{name} is a copy"
    assert not hasattr(Transformer, "num_params") and not hasattr(Transformer, "active_params")


@pytest.mark.parametrize("strategy", PRESET_NAMES)
def test_groups_follow_the_role_order_and_counts_add_up(strategy):
    """Optimizer groups come in ROLES order; count_params' role totals equal the group sizes."""
    model = build_model(get_preset("tiny"), ScaleConfig.preset(strategy), device="meta")
    groups = optim.param_groups(model, OptimConfig(), model.scfg)
    order = [g.role for g in groups]
    assert order == [r for r in ROLES if r in order]
    figures = count_params(model)
    assert figures["params_by_role"] == {g.role: g.numel for g in groups}
    assert figures["params"] == sum(p.numel() for p in model.parameters())
    assert figures["scale_params"] == sum(g.numel for g in groups if g.role in SCALE_ROLES)
