#!/usr/bin/env bash
# One slice of the GPU ladder (so that a cell finishes across short GPU windows): the committed plan files'
# studies, resumed from the committed results, trained inside a budget, their runs brought home in OUT in the
# results/ layout.
#
#   OUT=DIR bash scripts/gpu_slice.sh [PLAN.yaml ...]     (default: sweeps/ladder-packages/study-*.yaml)
#
# For each plan (a study file, written before the ladder ran), in the order given: the study runs in WORK/NAME,
# which starts as a copy of its committed folder RESULTS/NAME (config.yaml, summary.json, DONE, ... of the runs
# so far), so finished runs are skipped and the study makes the decisions it made before; WORK stays on the
# machine, so a later slice there resumes the checkpointed runs too. Every strategy's runs are in
# flight at once (`scalevec study`: one sweep per step, in turn by strategy) and JOBS runs share the GPU. The
# slice ends BUDGET_S seconds after it starts: no run starts that the folder's measured rate says would end after
# that, and the running ones checkpoint then (`study --budget-s`); they resume when the next slice runs on the
# same machine, or start again from the committed results on a fresh one. OUT/results/NAME then receives the
# folder in results/ format (the files git keeps of it: no checkpoints, metrics.jsonl or logs), ready to be copied
# into results/ and tabled by scripts/reproduction.py as it is.
# OUT/slice.json records the slice: budget and seconds used, runs finished per plan, runs per hour, and on CUDA the
# GPU's busy fraction (nvidia-smi's utilization.gpu sampled every second) and the packing rule's JOBS for the next
# slice (packing_jobs in reproduction/slices.py).
# Knobs (environment): OUT (required, new or empty), JOBS=4, BUDGET_S=480, DEVICE=cuda|cpu, RESULTS=results,
#   WORK=.slices (kept between slices, ignored by git), PYTHON (default .venv/bin/python, else python3).
# Exit status: 0 when the slice ran (finished or out of budget), 1 if a run failed, 2 on bad input.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY=${PYTHON:-}
[ -n "$PY" ] || { [ -x "$ROOT/.venv/bin/python" ] && PY="$ROOT/.venv/bin/python" || PY=python3; }
JOBS=${JOBS:-4} BUDGET_S=${BUDGET_S:-480} DEVICE=${DEVICE:-cuda} RESULTS=${RESULTS:-$ROOT/results}
WORK=${WORK:-$ROOT/.slices}
# whole seconds and a count, checked before anything is written: 0 ran a slice that started nothing and exited 0,
# and 1.5 or nan broke the shell's arithmetic part-way
for var in BUDGET_S:480 JOBS:4; do
  name=${var%%:*} like=${var#*:}
  if ! [[ ${!name} =~ ^[1-9][0-9]*$ ]]; then
    echo "gpu_slice: $name must be a whole number > 0, like $like; got '${!name}'" >&2
    exit 2
  fi
done
if [ -z "${OUT:-}" ]; then
  echo "gpu_slice: set OUT to a new or empty folder (the runs come home there)" >&2
  exit 2
fi
if [ -e "$OUT" ] && [ -n "$(ls -A "$OUT" 2>/dev/null)" ]; then
  echo "gpu_slice: OUT=$OUT is not empty; give a new folder (nothing is overwritten)" >&2
  exit 2
fi
PLANS=("$@")
[ ${#PLANS[@]} -gt 0 ] || PLANS=("$ROOT"/sweeps/ladder-packages/study-*.yaml)
for plan in "${PLANS[@]}"; do
  [ -f "$plan" ] || { echo "gpu_slice: plan $plan does not exist" >&2; exit 2; }
done
if [ "$DEVICE" = cuda ] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_slice: torch sees no CUDA device; DEVICE=cpu rehearses a slice on the CPU" >&2
  exit 2
fi
export PYTHONPATH="$ROOT/src:$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # scalevec and reproduction/
mkdir -p "$OUT/results"
start=$(date +%s)
sampler=""
if [ "$DEVICE" = cuda ] && command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -l 1 > "$OUT/gpu_busy.txt" 2>/dev/null &
  sampler=$!
fi
status=0
for plan in "${PLANS[@]}"; do
  name=$("$PY" -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))['name'])" "$plan") || exit 2
  dest="$WORK/$name"
  if [ ! -d "$dest" ]; then
    mkdir -p "$WORK"
    if [ -d "$RESULTS/$name" ]; then cp -r "$RESULTS/$name" "$dest"; else mkdir -p "$dest"; fi
  fi
  left=$(( start + BUDGET_S - $(date +%s) ))
  if [ "$left" -le 0 ]; then
    echo "gpu_slice: budget spent; $name not started"
    continue
  fi
  echo "== $(date -u +%H:%M:%S) $name -> $dest ($JOBS at once on $DEVICE, ${left}s left)"
  # the study's own deadline stops it cleanly; timeout is the backstop should a trainer not answer SIGTERM
  timeout --signal=TERM --kill-after=30 "$(( left + 60 ))" "$PY" -m scalevec study "$plan" --out "$dest" \
    --jobs "$JOBS" --budget-s "$left" || status=1
done
[ -n "$sampler" ] && kill "$sampler" 2>/dev/null
"$PY" -m reproduction.slices "$OUT" --work "$WORK" --results "$RESULTS" --budget-s "$BUDGET_S" \
  --seconds "$(( $(date +%s) - start ))" --jobs "$JOBS" "${PLANS[@]}" || status=1
exit $status
