#!/usr/bin/env bash
# One-command set-up: a virtual environment in .venv with torch and scalevec (+ test extras).
# On a CPU machine, torch==2.13.0 is the CPU wheel; on a GPU machine install your CUDA build of torch first
# (any torch >= 2.9 works) and run this script with SCALEVEC_TORCH=skip.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if [ "${SCALEVEC_TORCH:-}" != "skip" ]; then
  .venv/bin/python -m pip install -q "torch==2.13.0"
fi
.venv/bin/python -m pip install -q -e ".[dev]"
.venv/bin/scalevec info --preset small --strategy unified
echo "ready: activate with 'source .venv/bin/activate'"
