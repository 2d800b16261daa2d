"""The model: the Transformer with its scale vectors, and what is computed from a model alone (DESIGN.md §1-§3, §9).

- ``scales``: the research object: the plain formulas (``PLAIN``), the placement plan (``scale_plan``), one class per
  parameterization (``DirectScale``, ``ORScale``, ``ERScale``) and per placement (``NormLinear``, ``OutputNorm``, ...)
- ``kernels``: ``FAST``, the same formulas with hand-written backward passes (tested equal to the plain ones)
- ``transformer``: the Transformer, its blocks, RoPE and the KV cache (``build_model``)
- ``moe``: the mixture-of-experts MLP (router, expert banks, grouped matmuls, auxiliary losses)
- ``fold``: ``fold_scales``, a trained model with its Input-Norm scales folded into the weights
- ``params``: parameter bookkeeping: the roles, ``new_param`` (role and init), ``init_params``, the one count
- ``flops``: FLOPs per token and the peak throughput MFU is measured against

Imports only ``scalevec.config`` (tests/test_layout.py).
"""
