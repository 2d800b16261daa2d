"""Learning-rate schedules as pure functions of the step (DESIGN.md §7).

``lr_multiplier(step, total_steps, cfg)`` is the factor every optimizer group's peak lr is multiplied
by at that step (group lr = its peak lr × multiplier; ``optim.set_lr``): linear warmup from
``1/warmup`` (never 0) to 1 at step ``warmup - 1``, then ``cosine`` / ``linear`` decay reaching the
floor exactly at the last step, ``wsd`` (stable at 1, then decay over the last ``decay_frac`` of the
steps with a ``linear``, ``cosine`` or ``1-sqrt`` shape, ending exactly at the floor), or ``constant``.
Floor = ``min_lr_ratio``. Only the step is checkpointed; the schedule has no state.
"""

from __future__ import annotations

import math

from scalevec.config import ScheduleConfig


def _shape(p: float, shape: str) -> float:
    """Decay multiplier in [0, 1] for progress ``p`` in [0, 1]: 1 at p=0, 0 at p=1."""
    if shape == "linear":
        return 1.0 - p
    if shape == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * p))
    if shape == "1-sqrt":
        return 1.0 - math.sqrt(p)
    raise ValueError(f"unknown decay shape {shape!r}; use linear, cosine or 1-sqrt")


def lr_multiplier(step: int, total_steps: int, cfg: ScheduleConfig) -> float:
    """The multiplier of every group's peak lr at optimizer step ``step`` (0-based) of ``total_steps``:
    ``(step + 1) / warmup`` during warmup, 1 at the peak, ``cfg.min_lr_ratio`` at the last step of a decay.

    Raises ``ValueError`` if ``step`` is outside ``[0, total_steps)`` (the trainer checks a checkpoint's
    step against its run first, ``Trainer.load``, so a user meets that message, naming the file, instead).
    """
    if not 0 <= step < total_steps:
        raise ValueError(f"step {step} is outside [0, {total_steps}): a run of {total_steps} steps (train.steps, or "
                         f"train.tokens over the tokens of a step) takes the optimizer steps 0 to {total_steps - 1}")
    warmup = min(cfg.warmup_steps(total_steps), total_steps)
    if step < warmup:
        return (step + 1) / warmup
    floor = cfg.min_lr_ratio
    if cfg.name == "constant":
        return 1.0
    if cfg.name == "wsd":
        n_decay = max(1, round(cfg.decay_frac * total_steps))
        start = total_steps - n_decay - 1  # last step at the peak; the decay ends at total_steps - 1
        if step <= start:
            return 1.0
        return floor + (1.0 - floor) * _shape((step - start) / n_decay, cfg.decay_shape)
    top = max(warmup - 1, 0)  # the step at which the peak is reached
    span = total_steps - 1 - top
    p = 1.0 if span <= 0 else (step - top) / span
    return floor + (1.0 - floor) * _shape(p, "cosine" if cfg.name == "cosine" else "linear")


def warmup_warning(total_steps: int, cfg: ScheduleConfig) -> str | None:
    """A one-line warning when the warmup does not fit the run, else None: ``lr_multiplier`` then
    ramps over the run's own steps (the warmup is cut to the run: from 1/steps of the peak to the peak at the
    last step) and never decays, and the warning names that ramp, not only the setting."""
    warmup = cfg.warmup_steps(total_steps)
    if cfg.name != "constant" and warmup >= total_steps:
        setting = (f"schedule.warmup_frac={cfg.warmup_frac:g} ({warmup} steps)" if cfg.warmup_frac is not None
                   else f"schedule.warmup={warmup}")
        return (f"{setting} is not below the run's {total_steps} steps: the lr ramps over all {total_steps} steps "
                f"(from 1/{total_steps} of its peak to the peak at the last step) and never decays; pass --warmup N "
                f"with N < {total_steps} (e.g. {max(1, total_steps // 10)})")
    return None


__all__ = ["lr_multiplier", "warmup_warning"]
