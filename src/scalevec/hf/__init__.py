"""Hugging Face: checkpoints in and out, sampling and downstream evaluation (DESIGN.md §10).

- ``names``: our parameter names <-> Hugging Face names per family (the one name map)
- ``hf_import``: Hugging Face checkpoints (and scalevec models) -> any strategy, through the plain form
- ``export``: ``scalevec export``, a run -> a Hugging Face checkpoint, folded or as custom code (``--verify``)
- ``generate``: ``scalevec generate``, sampling from a run or an exported directory
- ``evaluation``: ``scalevec eval``, lm-evaluation-harness on a run or an export
- ``remote/``: the custom architecture copied into exports of strategies that cannot fold

``names`` and ``hf_import`` need only safetensors and sit below training (``train --init-from`` reads Hugging
Face checkpoints); the others read finished runs and use transformers / lm-eval (tests/test_layout.py).
"""
