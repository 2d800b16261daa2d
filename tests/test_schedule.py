"""lr(step) as a pure function (DESIGN.md §7), with exact values."""

import math

import pytest

from scalevec.config import ScheduleConfig
from scalevec.training.schedule import lr_at


def test_cosine_warmup_exact_values():
    """warmup 2, total 10, cosine to 0: step 0 is half the peak, step 1 the peak, the last step the floor."""
    cfg = ScheduleConfig(name="cosine", warmup=2, min_lr_ratio=0.0)
    lrs = [lr_at(s, 10, 1.0, cfg) for s in range(10)]
    assert lrs[0] == 0.5
    assert lrs[1] == 1.0
    assert lrs[9] == 0.0
    # halfway through the decay (steps 1..9, span 8) the cosine is at exactly half
    assert lrs[5] == pytest.approx(0.5, abs=1e-15)
    assert all(a >= b for a, b in zip(lrs[1:], lrs[2:]))


def test_cosine_floor_ratio():
    """The cosine floor is min_lr_ratio · peak and is reached at the last step."""
    cfg = ScheduleConfig(name="cosine", warmup=0, min_lr_ratio=0.1)
    assert lr_at(0, 100, 3e-3, cfg) == 3e-3
    assert lr_at(99, 100, 3e-3, cfg) == pytest.approx(3e-4, rel=1e-12)


@pytest.mark.parametrize("shape", ["linear", "cosine", "1-sqrt"])
def test_wsd_ends_at_floor(shape):
    """WSD with decay over the last 10 % and floor ratio 0.01 ends at exactly 0.01 × peak, stable before."""
    cfg = ScheduleConfig(name="wsd", warmup=5, min_lr_ratio=0.01, decay_frac=0.1, decay_shape=shape)
    lrs = [lr_at(s, 100, 2.0, cfg) for s in range(100)]
    assert lrs[99] == 0.01 * 2.0
    assert lrs[4] == 2.0 and lrs[89] == 2.0  # warmup done; stable until the decay starts
    assert lrs[90] < 2.0
    assert all(a >= b for a, b in zip(lrs[89:], lrs[90:]))


def test_wsd_1_sqrt_shape():
    """1-sqrt decay: a quarter of the way through the decay the multiplier is 1 - sqrt(1/4) = 0.5."""
    cfg = ScheduleConfig(name="wsd", warmup=0, min_lr_ratio=0.0, decay_frac=0.2, decay_shape="1-sqrt")
    # 100 steps, 20 decay steps, peak last at step 79; step 84 is 5/20 into the decay
    assert lr_at(84, 100, 1.0, cfg) == pytest.approx(1 - math.sqrt(0.25), abs=1e-15)


def test_linear_and_constant():
    """linear decays linearly to the floor; constant stays at the peak after warmup."""
    lin = ScheduleConfig(name="linear", warmup=0, min_lr_ratio=0.0)
    assert lr_at(5, 11, 1.0, lin) == pytest.approx(0.5)
    const = ScheduleConfig(name="constant", warmup=4)
    assert [lr_at(s, 10, 1.0, const) for s in (0, 3, 9)] == [0.25, 1.0, 1.0]


def test_out_of_range_step():
    """Asking for a step outside the run is an error, not an extrapolation."""
    with pytest.raises(ValueError, match="outside"):
        lr_at(10, 10, 1.0, ScheduleConfig())
