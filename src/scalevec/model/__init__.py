"""The model: the Transformer with its scale vectors, and what is computed from a model alone (DESIGN.md §1-§3, §9).

- ``scales``: scale vectors, their parameterizations and placements (``ScaleVector``, ``NormLinear``, ``OutputNorm``)
- ``kernels``: fused autograd functions for the folded, OR and DNP paths (same results as the plain formulas)
- ``transformer``: the Transformer, its blocks, RoPE and the KV cache (``build_model``)
- ``moe``: the mixture-of-experts MLP (router, expert banks, grouped matmuls, auxiliary losses)
- ``fold``: ``fold_scales``, a trained model with its Input-Norm scales folded into the weights
- ``params``: parameter roles and the one parameter count
- ``flops``: FLOPs per token and the peak throughput MFU is measured against

Imports only ``scalevec.config`` (tests/test_layout.py).
"""
