"""The research object on an ``apply_strategy`` user's dashboard (DESIGN.md §8): the per-scale-vector metrics of
``training/telemetry.py`` as an HF ``TrainerCallback`` and as a function for any training loop.

- ``scale_metrics(model, optimizer, every=N)``: a ``telemetry.ScaleTelemetry`` hooked to ``optimizer`` (step
  pre- and post-hooks): on every N-th optimizer step (0, N, 2N, ...) ``.latest`` holds the row part
  (``scales``: per vector role, rms/min/max/mean/std, grad_norm, update_norm; ``grad_norms``: per layer) and
  ``.scalars()`` the same flattened into the series names TensorBoard and W&B get
  (``scales.<role>/<stat>/<vector>``, ``grad_norm.layers/<layer>``; ``tracking.flatten_row``). Any loop:
  accelerate, torchtitan-style, nanoGPT-style.
- ``ScaleMetricsCallback``: the same for ``transformers.Trainer``, every ``logging_steps`` (or ``every``)
  optimizer steps: it captures in ``on_pre_optimizer_step`` (gradients after clipping), collects in
  ``on_optimizer_step`` and adds the scalars to the next ``on_log``'s ``logs``. Callbacks see ``logs`` in list
  order and transformers puts a user's callbacks after its reporters, so ``add_scale_metrics(trainer)`` puts
  it first: then ``report_to`` (TensorBoard, W&B, ...) gets every series, which it takes out again before the
  console's progress printer. transformers' reporters prefix every training series with ``train/``.
"""

from __future__ import annotations

import math

from torch import nn

from scalevec.config.typed import read_int
from scalevec.training.telemetry import ScaleTelemetry
from scalevec.training.tracking import flatten_row

try:
    from transformers import TrainerCallback
except ImportError:  # transformers is optional: the callback needs it, scale_metrics does not
    TrainerCallback = object


def _scalars(row_part: dict | None) -> dict[str, float]:
    """The per-vector and per-layer series of a ``collect()`` result (``tracking.flatten_row``'s names)."""
    if not row_part:
        return {}
    return {k: v for k, v in flatten_row({"kind": "train", **row_part}).items() if not k.startswith("train/")}


class LoopMetrics(ScaleTelemetry):
    """``ScaleTelemetry`` with ``scalars()``: the latest collected metrics as dashboard series (module docstring)."""

    def scalars(self) -> dict[str, float]:
        """``{series: value}`` of ``latest`` (empty on steps that were not collected)."""
        return _scalars(self.latest)


def scale_metrics(model: nn.Module, optimizer=None, every: int = 1) -> LoopMetrics:
    """Per-scale-vector and per-layer metrics for any loop (module docstring). ``model``: the unwrapped model (not
    the DDP/FSDP wrapper: the names are its own); ``optimizer``: one or a list (the hooks go on the first and
    the last); without one, call ``capture()`` after backward and ``collect()`` after the step yourself.
    ``every``: collect on optimizer steps 0, every, 2·every, ... Raises ``ValueError`` for a bad ``every``."""
    from scalevec.integrations.groups import model_roles

    m = LoopMetrics(model, model_roles(model))
    if optimizer is not None:
        m.attach(optimizer, every=every, collect=True)
    return m


class ScaleMetricsCallback(TrainerCallback):
    """Per-scale-vector and per-layer metrics for ``transformers.Trainer`` (module docstring). ``every``: optimizer
    steps between two collections (default: ``args.logging_steps``); collected on the steps whose count after
    the step is a multiple of it (the steps the Trainer logs), and on the first with ``logging_first_step``."""

    def __init__(self, every: int | None = None):
        if TrainerCallback is object:
            raise ImportError("ScaleMetricsCallback needs transformers; pip install 'scalevec[hf]'")
        if every is not None:
            read_int(every, "every", least=1, fix="it counts optimizer steps (None: args.logging_steps)")
        self.every = every
        self.telemetry: ScaleTelemetry | None = None
        self.pending: dict[str, float] = {}

    def _every(self, args, state) -> int:
        if self.every is not None:
            return self.every
        steps = args.logging_steps
        return max(1, math.ceil(state.max_steps * steps) if steps < 1 else int(steps))

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        step = state.global_step + 1  # the step count the Trainer logs this step under
        first = state.global_step == 0 and getattr(args, "logging_first_step", False)
        if model is not None and (step % self._every(args, state) == 0 or first):
            if self.telemetry is None:
                from scalevec.integrations.groups import model_roles

                self.telemetry = ScaleTelemetry(model, model_roles(model))
            self.telemetry.capture()

    def on_optimizer_step(self, args, state, control, **kwargs):
        if self.telemetry is not None and self.telemetry._captured is not None:
            self.pending = _scalars(self.telemetry.collect())

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.added = []
        if self.pending and logs is not None and "loss" in logs:
            logs.update(self.pending)
            self.added = list(self.pending)
            self.pending = {}


class _StripScaleMetrics(TrainerCallback):
    """Takes the series ``ScaleMetricsCallback`` added to ``logs`` out again, after the reporters and before the
    console printers (``ProgressCallback`` / ``PrinterCallback`` would print every series of every vector)."""

    def __init__(self, source: ScaleMetricsCallback):
        self.source = source

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None:
            for key in getattr(self.source, "added", []):
                logs.pop(key, None)


def add_scale_metrics(trainer, every: int | None = None) -> ScaleMetricsCallback:
    """Add a ``ScaleMetricsCallback`` to ``trainer`` (a ``transformers.Trainer``) first in its callback list, so that
    the reporters of ``report_to`` (TensorBoard, W&B, ...) log its series too, and take the series out of the logs
    again before the console's progress printer; returns the callback."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    cb = ScaleMetricsCallback(every)
    callbacks = trainer.callback_handler.callbacks
    printers = [i for i, c in enumerate(callbacks) if isinstance(c, (PrinterCallback, ProgressCallback))]
    callbacks.insert(printers[0] if printers else len(callbacks), _StripScaleMetrics(cb))
    callbacks.insert(0, cb)
    return cb


__all__ = ["LoopMetrics", "ScaleMetricsCallback", "add_scale_metrics", "scale_metrics"]
