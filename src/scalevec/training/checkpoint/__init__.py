"""A run's checkpoints, whole: their folder, integrity, train state, writing, loading, the run's model (DESIGN.md §8).

The one owner of ``RUN/checkpoints/`` (torchtitan's checkpointer is the model: one component owns the
checkpoint folder), in four modules with one job each, bottom to top::

    layout.py      the names (checkpoints/, step_XXXXXXX, latest, dcp/, model.safetensors, train_state.json,
                   MANIFEST.json) and how checkpoints are found; pathlib only, below rundir
    integrity.py   the manifest (write, verify), the train state (write, read), which checkpoint to
                   resume from and which model export and generate read
    save_load.py   save_checkpoint / load_checkpoint / resume_checkpoint through torch's DCP (all ranks)
    run_model.py   load_model: the model of a run, verified and refused when dead (assert_alive)

    RUN/checkpoints/step_XXXXXXX/
        dcp/*.safetensors      model + optimizer tensors, one file per writing rank, in torch's
                               safetensors-backed DCP format (reshardable to any number of processes)
        model.safetensors      the consolidated model (export, generate)
        train_state.json       step, RNG states, trainer extras, the non-tensor optimizer state
        MANIFEST.json          size and SHA-256 of every file above; written last, before the rename
    RUN/checkpoints/latest     the name of the newest checkpoint (informative; discovery lists step_*)

The run's other files (config, meta, metrics, markers, lock) belong to ``training/rundir.py``, which
``integrity`` builds on while ``layout`` sits below it. This ``__init__`` therefore imports nothing
(importing ``layout`` from ``rundir`` must not come back to ``rundir``).
"""
