#!/usr/bin/env bash
# The GPU check (issue 34; DESIGN.md §8): the one script to run on a fresh GPU machine. It needs nothing but
# that machine's own python3 with a CUDA torch >= 2.11 and numpy, scipy, matplotlib, PyYAML, tokenizers,
# safetensors, tqdm, pytest (transformers for the HF Llama candidate): scalevec runs from this checkout
# (PYTHONPATH=src), no network, no install. Everything it learns lands in OUT (summary.json, summary.md,
# gpu_check.log, stages.json, runs.tar.gz); the stages and their sizes are in src/scalevec/bench/gpu_check.py.
#
#   bash scripts/gpu_check.sh OUT                 # on one CUDA GPU, about 9 minutes
#   DEVICE=cpu bash scripts/gpu_check.sh OUT      # the rehearsal: every stage at tiny sizes on CPU, ~3 minutes
#
# Knobs (environment): DEVICE=cuda|cpu, BUDGET_S=<wall seconds, default 510 on cuda, 240 on cpu>, ONLY=<stages>,
#   PYTHON=<interpreter; default .venv/bin/python if there is one, else python3>.
# Exit status: 0 when every stage is ok, 1 when one failed or was skipped, 2 for bad input (no CUDA device,
# an OUT that is not empty, a PYTHON without torch), 130 after Ctrl-C, 75 after SIGTERM (the running stage and all
# it started killed, the summary of the stages so far written).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [ $# -ne 1 ]; then
  echo "usage: [DEVICE=cuda|cpu] bash scripts/gpu_check.sh OUT" >&2
  exit 2
fi
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
fi
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  echo "gpu_check: $PY cannot import torch; set PYTHON to a python3 with torch (>= 2.11)" >&2
  exit 2
fi
export PYTHON="$PY" PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}" SCALEVEC_CHECKOUT="$ROOT"
exec "$PY" -m scalevec.bench.gpu_check "$1" --device "${DEVICE:-cuda}" ${BUDGET_S:+--budget-s "$BUDGET_S"} ${ONLY:+--only "$ONLY"}
