#!/usr/bin/env bash
# The GPU check (DESIGN.md §8): the one script to run on a fresh GPU machine. It needs nothing but
# that machine's own python3 with a CUDA torch >= 2.11 and numpy, scipy, matplotlib, PyYAML, tokenizers,
# safetensors, tqdm, pytest (transformers for the HF Llama candidate): scalevec runs from this checkout
# (PYTHONPATH=src), no network, no install. Everything it learns lands in OUT (summary.json, summary.md,
# gpu_check.log, stages.json, runs.tar.gz); the stages and their sizes are in scripts/gpu_check.py (the
# in-process ones in src/scalevec/bench/gpu_stages.py).
#
#   bash scripts/gpu_check.sh OUT                 # on one CUDA GPU, about 6 minutes: room to rerun in 15
#   DEVICE=cpu bash scripts/gpu_check.sh OUT      # the rehearsal: every stage at tiny sizes on CPU, ~5 minutes
#   ONLY=bench,bench_compiled DEVICE=cpu bash scripts/gpu_check.sh OUT   # a short rehearsal of some stages
#
# Knobs (environment): DEVICE=cuda|cpu, BUDGET_S=<wall seconds, default 360>, ONLY=<stages; torchtitan and
#   ladder_rung only when named>, PYTHON=<interpreter; default .venv/bin/python if there is one, else python3>.
# Exit status: 0 when every stage is ok (or "not run": torchtitan absent), 1 when one failed, was skipped or gave an
# implausible figure, 2 for bad input (no CUDA device, an OUT that is not empty, a PYTHON without torch), 130 after
# Ctrl-C, 75 after SIGTERM (the running stage and all it started killed, the summary of the stages so far written);
# never 0 without a summary.
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
# a python that imports torch prints it; anything else (a program that ignores its arguments: /bin/true) does not
if [ "$("$PY" -c "import torch; print('torch imported')" 2>/dev/null)" != "torch imported" ]; then
  echo "gpu_check: $PY cannot import torch; set PYTHON to a python3 with torch (>= 2.11)" >&2
  exit 2
fi
export PYTHON="$PY" PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
# The check runs as a job of its own (set -m), so that Ctrl-C and SIGTERM reach it once, through these traps, and
# this script still sees its end: it exits non-zero when no summary was written, whatever the check returned.
set -m
"$PY" "$ROOT/scripts/gpu_check.py" "$1" --device "${DEVICE:-cuda}" ${BUDGET_S:+--budget-s "$BUDGET_S"} \
  ${ONLY:+--only "$ONLY"} &
child=$!
trap 'kill -INT "$child" 2>/dev/null' INT
trap 'kill -TERM "$child" 2>/dev/null' TERM
while kill -0 "$child" 2>/dev/null; do
  wait "$child"  # returns early when a trapped signal arrives; the check then stops on its own
done
wait "$child"
rc=$?
if [ ! -s "$1/summary.json" ] && [ "$rc" -ne 2 ]; then
  echo "gpu_check: no summary was written into $1 (the check exited $rc); see the output above" >&2
  [ "$rc" -eq 0 ] && rc=1
fi
exit "$rc"
