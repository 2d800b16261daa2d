"""Hugging Face: checkpoints in and out, sampling and downstream evaluation (DESIGN.md §10).

- ``export``: ``scalevec export``, a run -> a Hugging Face checkpoint, folded or as custom code
- ``tokenizer_files``: an export's tokenizer files, with the BOS/EOS/pad that outside tools need declared
- ``verify``: ``scalevec export --verify``, the export loaded by transformers and compared with our model
- ``generate``: ``scalevec generate``, sampling from a run or an exported directory
- ``evaluation``: ``scalevec eval``, lm-evaluation-harness on a run or an export
- ``remote/``: the custom architecture copied into exports of strategies that cannot fold

They read finished runs and use transformers / lm-eval. The checkpoint format itself (the name map,
reading Hugging Face checkpoints) is ``scalevec.hf_format``, below training, because ``train --init-from``
reads Hugging Face checkpoints (tests/test_layout.py).
"""
