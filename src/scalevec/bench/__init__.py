"""``scalevec bench``: what each scale-vector strategy costs, and our speed against Hugging Face Llama
(docs/performance.md).

A measuring tool at the top (cli) layer of the package (DESIGN.md §12): the model, data and training code
never import it, and but for the GPU check's resume stage it trains nothing and writes no run. One module
per job:

- ``candidates``: the models under test (a strategy, ``STRATEGY:APPLY``, ``hf-llama``, ``dense-active``),
  each with its optimizers and its training-step / forward closures, all from the same matrices;
- ``harness``: timing (interleaved rounds, paired ratios, median and IQR) and the matmul peak MFU divides by;
- ``memory``: the persistent state and the peak a training step allocates on top of it;
- ``step``: the training-step benchmark (``bench``), with the issue's targets;
- ``inference``: forward-only speed before and after ``fold_scales``;
- ``generate``: greedy generation speed of ``scalevec generate`` against transformers' ``generate()``;
- ``report``: the markdown tables of a result;
- ``command``: the ``scalevec bench`` flags and their dispatch;
- ``gpu_stages``: the GPU check's in-process stages (env, CUDA-vs-CPU parity, GPU-busy fraction, FSDP2 resume,
  torchtitan in ``gpu_torchtitan``), each ``python -m scalevec.bench.gpu_stages NAME`` on its own; the check that
  runs them all is the checkout's ``scripts/gpu_check.sh``;
- ``run_speed``: a finished run's speed figures (MFU against the peak of its matmul dtype).

Speed is a measured figure, never asserted by a test. How to read the figures: docs/performance.md.
"""
