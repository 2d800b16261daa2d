#!/usr/bin/env bash
# The reproduction study (docs/reproduction.md), in the order its claims are answered. Resumable: rerun
# the same command after an interruption; finished runs are skipped. One run at a time, one thread each
# (STUDY_JOBS=2 on an idle 2-core machine trains two at once).
set -uo pipefail
cd "$(dirname "$0")/.."
SV=${SCALEVEC:-.venv/bin/scalevec}
JOBS=${STUDY_JOBS:-1}
study() {  # study FILE OUT
    echo "== $(date -u +%H:%M:%S) $1 -> $2"
    "$SV" study "$1" --out "$2" --jobs "$JOBS" || echo "!! $1 exited $?"
}
for size in cpu-25k cpu-80k; do
  for corpus in shakespeare kjv; do
    study "sweeps/study-c6-$size-$corpus.yaml" "results/$size-$corpus"
  done
done
