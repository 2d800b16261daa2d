"""This repository's reproduction study of the paper, apart from the installed library (docs/reproduction.md).

The library (``src/scalevec``) trains, sweeps, tunes and reports any study; this package is the one study this
checkout runs and what it concludes, read by ``scripts/reproduction.py``, ``scripts/ladder_plan.py``,
``scripts/study.sh`` and the tests (the repository root on ``sys.path``: the scripts insert it, pytest's
``pythonpath`` setting adds it). No module of ``scalevec`` imports it (tests/test_layout.py).

- ``claims``: the studies, the results folders (cells) they fill and the paper's claims read in them
- ``ladder``: the model ladder's rungs, lr prediction up the ladder, Δ's trend with N, the data arithmetic
- ``protocol3``: the third protocol's cells (tuning seeds apart from held-out seeds) read from ``results/``
- ``ndfit``: the (N, D) regression of held-out Δ across the protocol's cells
- ``slices``: the end of a GPU-ladder slice (``scripts/gpu_slice.sh``): its runs copied into ``results/``' layout, its
  record and the packing rule's jobs for the next slice
"""
