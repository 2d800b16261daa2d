#!/usr/bin/env bash
# The model ladder continued upward on one GPU (the packages-corpus ladder in slices: scripts/gpu_slice.sh):
# the CPU ladder's protocol (the 0.12B init regime,
# warmup 5 %, 20 tokens per parameter, baseline / none / unified, bytes) on cpu-1m, gpu-3m, gpu-6m, ... with
# several runs at once on the one GPU. Each rung's study file is written here by scripts/ladder_plan.py from
# the committed smaller rungs (a line in log lr against log N, × √(batch ratio) for the GPU's 8× larger
# batch, Adam's square-root rule, our choice), 3 lrs ×2 around it on seed 0-1, grown at an edge, no more
# seeds; results land in results/ladder-RUNG-CORPUS/ in the format of the CPU rungs, so
# scripts/reproduction.py puts them on the same table, trend and figure.
# Usage: scripts/gpu_ladder.sh [RUNG ...]       (default: cpu-1m gpu-3m gpu-6m)
# Knobs (environment): JOBS=9 (runs at once on the GPU), BUDGET_S=540 (no rung starts after this many seconds,
#   and a rung still training then is stopped with SIGTERM: its finished runs stay, the rest resume on a rerun;
#   so the whole fits in 10 minutes of one H200 with the smallest rungs first), CORPUS=shakespeare,
#   DEVICE=cuda, TPP=20 (tokens per parameter), BATCH=64, SEQ=256, SEEDS=2, RESULTS=results,
#   PREDICTED_ONLY=1 (each strategy at its predicted lr alone, no grid), VAL_TOKENS (default 131,072),
#   PYTHON=.venv/bin/python, DEST=<where the rung folders go, default RESULTS> (scripts/gpu_check.sh keeps
#   them in its output folder while reading the smaller rungs from results/). On CPU (DEVICE=cpu, a small TPP) the smallest rung runs as a test
#   (tests/test_ladder.py).
# Exit status: 0 when every rung started finished, 1 if a run failed, 2 on bad input.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
JOBS=${JOBS:-9} BUDGET_S=${BUDGET_S:-540} CORPUS=${CORPUS:-shakespeare} DEVICE=${DEVICE:-cuda} TPP=${TPP:-20}
BATCH=${BATCH:-64} SEQ=${SEQ:-256} SEEDS=${SEEDS:-2} RESULTS=${RESULTS:-results}
DEST=${DEST:-$RESULTS}
GRID=(--grid-factor 2)
[ "${PREDICTED_ONLY:-0}" = 1 ] && GRID=(--predicted-only)
[ -n "${VAL_TOKENS:-}" ] && GRID+=(--val-tokens "$VAL_TOKENS")
RUNGS=("$@")
[ ${#RUNGS[@]} -gt 0 ] || RUNGS=(cpu-1m gpu-3m gpu-6m)
if [ "$DEVICE" = cuda ] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_ladder: torch sees no CUDA device; run with DEVICE=cpu for the CPU smoke version" >&2
  exit 2
fi
LR_SCALE=$("$PY" -c "import math; print(math.sqrt(($BATCH * $SEQ) / (16 * 128)))")
start=$(date +%s) status=0
for rung in "${RUNGS[@]}"; do
  elapsed=$(( $(date +%s) - start ))
  if [ "$elapsed" -ge "$BUDGET_S" ]; then
    echo "gpu_ladder: ${elapsed}s spent (BUDGET_S=$BUDGET_S); $rung and later rungs not started"
    break
  fi
  out="$DEST/ladder-$rung-$CORPUS"
  mkdir -p "$out"
  spec="$out/study-ladder-$rung-$CORPUS.yaml"
  if [ ! -f "$spec" ]; then  # written once: a rerun resumes the same grid
    "$PY" scripts/ladder_plan.py "$rung" "$CORPUS" --results "$RESULTS" --out "$spec" --device "$DEVICE" \
      --tokens-per-param "$TPP" --batch-size "$BATCH" --seq-len "$SEQ" --tuning-seeds "$SEEDS" --no-confirm \
      "${GRID[@]}" --lr-scale "$LR_SCALE" || exit 2
  fi
  echo "== $(date -u +%H:%M:%S) $rung -> $out ($JOBS at once on $DEVICE)"
  # a hard deadline: SIGTERM stops the study where it is (resumable), so the whole fits the window it was given
  # (the study's own --budget-s first: it starts no run it cannot finish and checkpoints the running ones)
  timeout --signal=TERM --kill-after=30 "$(( BUDGET_S - elapsed + 30 ))" "$PY" -m scalevec study "$spec" --out "$out" \
    --jobs "$JOBS" --budget-s "$(( BUDGET_S - elapsed ))" || status=1
done
exit $status
