#!/usr/bin/env bash
# The CPU tables of docs/performance.md: `scalevec bench` at small and medium, the two ways of
# applying scales, and torch.compile. Writes benchmarks/results/<name>.json (full results) and .md (tables).
# One torch thread: on a shared 2-core machine a 2-thread step stalls whenever another process takes a
# core, and the medians then measure the neighbours. Takes about 15 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH=".venv/bin/scalevec bench --threads ${THREADS:-1}"
OUT=benchmarks/results
mkdir -p "$OUT"
run() {  # run NAME ARGS...: tables to NAME.md, JSON to NAME.json, the command and load on top
  local name=$1; shift
  { echo "\$ scalevec bench --threads ${THREADS:-1} $*"; echo "uptime before: $(uptime)"; echo; } > "$OUT/$name.md"
  $BENCH "$@" --save "$OUT/$name.json" 2>/dev/null | tee -a "$OUT/$name.md"
}
run small  --preset small  --steps 20
run medium --preset medium --steps 20
run small-apply --preset small --steps 20 --no-inference \
  --strategies baseline,baseline:activation,hg,hg:activation,dp,dp:activation,unified_foldable,unified_foldable:activation,unified,unified:activation
run small-compile --preset small --steps 10 --compile --no-inference --strategies baseline,unified_foldable,unified,hf-llama
