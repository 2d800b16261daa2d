"""The theory lab: DESIGN.md §4 made runnable and checked, plus probes for training.

- ``probes``: ``probe_scales(model)`` (the preconditioner spectrum every norm's scale vector induces,
  Theorem 2.2) and ``sharpness(model, loss_fn)`` (top Hessian eigenvalue by power iteration), for the
  trainer's ``--probe-every`` / ``--sharpness-every``.
- ``expressivity`` (``fold``), ``precondition``, ``weight_decay``, ``placement``, ``magdir``: one §4
  experiment each, ``compute(seed) -> dict``, ``summarize``, ``plot``. The toys are float64
  (``toys``); ``fold`` uses the real model.
- ``lab``: the ``scalevec theory NAME --out DIR`` subcommand and ``run_experiment``.

This package trains no language model and never touches a run directory.
"""

from .probes import batch_loss, probe_scales, sharpness, top_hessian_eigenvalue

__all__ = ["batch_loss", "probe_scales", "sharpness", "top_hessian_eigenvalue"]
