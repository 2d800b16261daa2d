"""Training one run into a run directory (DESIGN.md §5-§8, §11).

- ``trainer``: ``scalevec train``: the config of a run, the ``Trainer`` loop, telemetry and the health guard
- ``optim``: parameter groups by role and the optimizers (AdamW, Muon)
- ``schedule``: learning-rate schedules as pure functions of the step
- ``distributed``: devices, DDP / FSDP2 wrapping and the sharded Muon
- ``autocompile``: when ``train.compile: auto`` compiles the blocks
- ``checkpoint``: saving and loading checkpoints (torch distributed checkpoint, atomic)
- ``rundir``: the run directory's layout and every reader and writer of its files
- ``init_from``: ``train --init-from``, a run started from a Hugging Face model or a parent run
- ``tracking``: TensorBoard / Weights & Biases mirrors of metrics.jsonl
- ``probes``: scale-vector spectra and sharpness, for ``--probe-every`` / ``--sharpness-every``
"""
