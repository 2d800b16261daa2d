"""Many runs and what they show: sweeps, studies, reports, statistics, theory (DESIGN.md §4, §11, §12).

- ``sweep``: ``scalevec sweep``, a YAML grid of runs (resumable, parallel)
- ``sweepdir``: a sweep folder's layout (its specs)
- ``progress``: the progress line of a running grid
- ``study``: ``scalevec study``, lr tuned per strategy until the best is inside the grid, then seeds
- ``compare``: ``scalevec compare``, strategies x seeds on one config and the paired table
- ``report``: ``scalevec report``, run folders -> report.md, CSV and figures
- ``stats``: paired comparisons, power-law fits, lr picks, seeds needed
- ``theory/``: the DESIGN.md §4 experiments (``scalevec theory``)

Reads run directories through ``scalevec.training.rundir``; never imports the trainer.
"""
