"""The lr multiplier as a pure function of the step (DESIGN.md §7), with exact values."""

import math

import pytest

from scalevec.config import ScheduleConfig
from scalevec.training.schedule import lr_multiplier


def test_cosine_warmup_exact_values():
    """warmup 2, total 10, cosine to 0: step 0 is half the peak, step 1 the peak, the last step the floor."""
    cfg = ScheduleConfig(name="cosine", warmup=2, min_lr_ratio=0.0)
    ms = [lr_multiplier(s, 10, cfg) for s in range(10)]
    assert ms[0] == 0.5
    assert ms[1] == 1.0
    assert ms[9] == 0.0
    # halfway through the decay (steps 1..9, span 8) the cosine is at exactly half
    assert ms[5] == pytest.approx(0.5, abs=1e-15)
    assert all(a >= b for a, b in zip(ms[1:], ms[2:]))


def test_cosine_floor_ratio():
    """The cosine floor is min_lr_ratio and is reached at the last step; the first step is at 1."""
    cfg = ScheduleConfig(name="cosine", warmup=0, min_lr_ratio=0.1)
    assert lr_multiplier(0, 100, cfg) == 1.0
    assert lr_multiplier(99, 100, cfg) == pytest.approx(0.1, rel=1e-12)


@pytest.mark.parametrize("shape", ["linear", "cosine", "1-sqrt"])
def test_wsd_ends_at_floor(shape):
    """WSD with decay over the last 10 % and floor ratio 0.01 ends at exactly 0.01, stable at 1 before."""
    cfg = ScheduleConfig(name="wsd", warmup=5, min_lr_ratio=0.01, decay_frac=0.1, decay_shape=shape)
    ms = [lr_multiplier(s, 100, cfg) for s in range(100)]
    assert ms[99] == 0.01
    assert ms[4] == 1.0 and ms[89] == 1.0  # warmup done; stable until the decay starts
    assert ms[90] < 1.0
    assert all(a >= b for a, b in zip(ms[89:], ms[90:]))


def test_wsd_1_sqrt_shape():
    """1-sqrt decay: a quarter of the way through the decay the multiplier is 1 - sqrt(1/4) = 0.5."""
    cfg = ScheduleConfig(name="wsd", warmup=0, min_lr_ratio=0.0, decay_frac=0.2, decay_shape="1-sqrt")
    # 100 steps, 20 decay steps, peak last at step 79; step 84 is 5/20 into the decay
    assert lr_multiplier(84, 100, cfg) == pytest.approx(1 - math.sqrt(0.25), abs=1e-15)


def test_linear_and_constant():
    """linear decays linearly to the floor; constant stays at 1 after warmup."""
    lin = ScheduleConfig(name="linear", warmup=0, min_lr_ratio=0.0)
    assert lr_multiplier(5, 11, lin) == pytest.approx(0.5)
    const = ScheduleConfig(name="constant", warmup=4)
    assert [lr_multiplier(s, 10, const) for s in (0, 3, 9)] == [0.25, 1.0, 1.0]


def test_every_group_gets_its_peak_lr_times_the_multiplier(make_cfg):
    """optim.set_lr: each torch param group's lr is its own peak lr (role multipliers and Muon's included) times
    the schedule's multiplier, exactly; the multiplier equals the old absolute lr / peak up to rounding."""
    from scalevec import ScaleConfig, build_model
    from scalevec.config import OptimConfig
    from scalevec.training.optim import build_optimizers, param_groups, set_lr

    scfg = ScaleConfig.preset("unified")
    model, ocfg = build_model(make_cfg(), scfg), OptimConfig(name="muon", muon_lr=0.02)  # two peak lrs
    opts = build_optimizers(param_groups(model, ocfg, scfg, model.param_roles()), ocfg)
    cfg = ScheduleConfig(name="cosine", warmup=5, min_lr_ratio=0.1)
    m = lr_multiplier(7, 20, cfg)
    set_lr(opts, m)
    groups = [g for opt in opts for g in opt.param_groups]
    assert len({g["peak_lr"] for g in groups}) > 1 and all(g["lr"] == g["peak_lr"] * m for g in groups)
    peak = 1e-2  # the trainer used to compute lr(step) at the peak and divide by it: the same number, rounded
    old = peak * 0.1 + (peak - peak * 0.1) * 0.5 * (1 + math.cos(math.pi * (7 - 4) / 15))
    assert m == pytest.approx(old / peak, rel=1e-15)


def test_out_of_range_step():
    """Asking for a step outside the run is an error, not an extrapolation."""
    with pytest.raises(ValueError, match="outside"):
        lr_multiplier(10, 10, ScheduleConfig())
