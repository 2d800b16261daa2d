#!/usr/bin/env bash
# One-command set-up: a virtual environment in .venv with torch and scalevec (+ test extras).
# torch==2.13.0 comes from pip's configured index: the CPU wheel on the project's CI machines. Elsewhere PyPI's
# Linux wheel is the CUDA build (GBs); for the CPU build set SCALEVEC_TORCH_INDEX=https://download.pytorch.org/whl/cpu.
# On a GPU machine install your CUDA build of torch first (torch >= 2.11: the oldest the suite has passed on) and set SCALEVEC_TORCH=skip.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# constraints.txt pins the releases the golden losses and committed results were made with (torch, numpy,
# transformers, tokenizers, ...); with SCALEVEC_TORCH=skip the machine's own torch is kept (its line and triton's dropped)
constraints=constraints.txt
if [ "${SCALEVEC_TORCH:-}" != "skip" ]; then
  .venv/bin/python -m pip install -q "torch==2.13.0" -c "$constraints" ${SCALEVEC_TORCH_INDEX:+--index-url "$SCALEVEC_TORCH_INDEX"}
else
  constraints=.venv/constraints-without-torch.txt
  grep -v -e '^torch==' -e '^triton==' constraints.txt > "$constraints"  # a CUDA torch pins its own triton
fi
.venv/bin/python -m pip install -q -e ".[dev]" -c "$constraints"
# torchtitan and OLMo-core (with its cached-path) declare pins that conflict with transformers 5.25's (pyproject's
# frameworks extra says which); their own imports are in that extra, so they go in without their declared deps
# (`pip check` then reports those five pins of theirs: expected, harmless for what scalevec calls)
.venv/bin/python -m pip install -q --no-deps torchtitan ai2-olmo-core cached-path -c "$constraints"
.venv/bin/scalevec info --preset small --strategy unified
echo "ready: activate with 'source .venv/bin/activate'"
