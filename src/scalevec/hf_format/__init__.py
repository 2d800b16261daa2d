"""The Hugging Face checkpoint format, read and named without transformers (DESIGN.md §10, §12).

- ``names``: our parameter names <-> Hugging Face names, per family and for the custom architecture (the one
  name map)
- ``hf_import``: Hugging Face checkpoints (and scalevec models) -> any strategy, through the plain form

It needs only safetensors and sits below training, because ``train --init-from`` reads Hugging Face
checkpoints; writing them (``scalevec export``), sampling and evaluation live in ``scalevec.hf``, on top
(tests/test_layout.py).
"""
