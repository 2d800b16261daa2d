"""The theory lab: DESIGN.md §4 made runnable and checked.

- ``expressivity`` (``fold``), ``precondition``, ``weight_decay``, ``placement``, ``magdir``: one §4
  experiment each, ``compute(seed) -> dict``, ``summarize``, ``plot``. The toys are float64
  (``toys``); ``fold`` uses the real model.
- ``lab``: the ``scalevec theory NAME --out DIR`` subcommand and ``run_experiment``.

The probes the trainer also uses (``probe_scales``: the preconditioner spectrum of every scale vector,
Theorem 2.2; ``sharpness``: the top Hessian eigenvalue) live in ``scalevec.training.probes``.
This package trains no language model and never touches a run directory.
"""
