"""Training one run into a run directory (DESIGN.md §5-§8, §11).

- ``trainer``: ``scalevec train``'s ``Trainer``: construction, the step, evaluation, the loop, checkpointing
- ``run_owner``: the run directory during training: lock, checks, create or restart, rank 0's writes
- ``health``: the health guard (its rules and saved state, ``DIVERGED``)
- ``monitors``: callbacks passed to the trainer, their state kept in checkpoints (metrics rows, step lines, probes,
  trackers; the summary)
- ``console``: the one sink of a run's progress lines
- ``optim``: parameter groups by role and the optimizers (AdamW, Muon)
- ``schedule``: learning-rate schedules as pure functions of the step
- ``distributed``: devices, DDP / FSDP2 wrapping and the sharded Muon
- ``autocompile``: when ``train.compile: auto`` compiles the blocks
- ``rundir``: the run directory's own files (config, meta, metrics, summary, markers, lock) and their readers
- ``checkpoint``: ``checkpoints/`` whole: names, manifest and integrity, train state, DCP save / load / resume,
  the model of a run (``checkpoint.run_model.load_model``)
- ``eval_results``: ``eval.json`` (the scores of ``scalevec eval``) and lm-eval's metric names
- ``init_from``: ``train --init-from``, a run started from a Hugging Face model or a parent run
- ``tracking``: TensorBoard / Weights & Biases mirrors of metrics.jsonl
- ``probes``: scale-vector spectra and sharpness, for ``--probe-every`` / ``--sharpness-every``
"""
