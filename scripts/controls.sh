#!/usr/bin/env bash
# The lr-matched controls' queue (docs/reproduction.md, "lr-matched controls"), in order of value per CPU-second:
# the WSD cell's first held-out seeds (its stable-phase claim at equal lr), the 10K and 25K 20-token cells (a seed
# costs 1/20 to 1/4 of a WSD seed), the 100-token cells' first 6 held-out seeds, the WSD cell's other seeds, then the
# 100-token cells' other seeds: every cell gets a control before any gets more seeds. (Reordered twice when the
# shared machine gave each run a fraction of a core: at 03:05 and 06:05 UTC.)
# Two runs at a time, one thread each; resumable (rerun it: finished runs are skipped). Each sweep file is written
# by scripts/control_plan.py; its header names the cell, the runs and their estimated single-thread hours.
# Plan (estimates from each cell's median run): WSD 0.44 h + 0.37 h; 20-token cells 0.76 h; 100-token cells
# 0.98 h (seeds 2-7) + 1.30 h (the rest): 3.9 single-thread hours, ~2 h on two idle cores. ladder-cpu-25k-kjv needs
# none: every arm picked the baseline's lr.
set -u
cd "$(dirname "$0")/.."
queue=(
  control-cpu-25k-shakespeare-tpp100-wsd
  control-cpu-10k-prose control-cpu-10k-kjv control-cpu-10k-shakespeare
  control-cpu-25k-prose control-cpu-25k-shakespeare
  control-cpu-10k-prose-tpp100 control-cpu-10k-kjv-tpp100 control-cpu-25k-kjv-tpp100 control-cpu-25k-prose-tpp100
  control-cpu-10k-shakespeare-tpp100 control-cpu-25k-shakespeare-tpp100
  control-cpu-25k-shakespeare-tpp100-wsd-more
  control-cpu-10k-prose-tpp100-more control-cpu-10k-kjv-tpp100-more control-cpu-25k-kjv-tpp100-more
  control-cpu-25k-prose-tpp100-more control-cpu-10k-shakespeare-tpp100-more control-cpu-25k-shakespeare-tpp100-more
)
for s in "${queue[@]}"; do
  [ -f "sweeps/$s.yaml" ] || { echo "skip $s (no sweep file)"; continue; }
  out="results/${s%-more}"
  echo "== $(date -u +%H:%M:%S) $s -> $out"
  python -m scalevec sweep "sweeps/$s.yaml" --out "$out" --jobs 2 || echo "== $s exited $?"
done
echo "== $(date -u +%H:%M:%S) queue done"
