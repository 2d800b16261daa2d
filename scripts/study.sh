#!/usr/bin/env bash
# The reproduction study (docs/reproduction.md), in the order its claims are answered: C6 and C1 on the
# main cell (AdamW + cosine, two sizes, both corpora) first. Resumable: rerun the same command after an
# interruption; finished runs are skipped and failed ones retried (a second pass does that too). One
# run at a time, one thread each (STUDY_JOBS=2 on an idle 2-core machine trains two at once).
# `scripts/study.sh ladder` runs only issue 23's ladder (the 0.12B init regime, rung by rung, both corpora);
# `scripts/study.sh first` only the first protocol's cells below; no argument: the ladder, then those.
set -uo pipefail
cd "$(dirname "$0")/.."
SV=${SCALEVEC:-.venv/bin/scalevec}
JOBS=${STUDY_JOBS:-1}
# A study that finished is marked by results/OUT/.study-NAME.done, holding its study file's sha256: run folders
# (results/*/runs/) are not committed, so a later session would retrain it from scratch; a marked study whose
# file is unchanged is skipped (REDO=1 retrains it anyway; MARKS=0 writes no marker).
study() {  # study NAME OUT: sweeps/study-NAME.yaml into results/OUT
    local mark="results/$2/.study-$1.done" sum
    sum=$(sha256sum "sweeps/study-$1.yaml" | cut -d' ' -f1)
    if [ -z "${REDO:-}" ] && [ -f "$mark" ] && [ "$(cat "$mark")" = "$sum" ]; then
      echo "== $1: finished before ($mark); REDO=1 retrains it"
      return
    fi
    echo "== $(date -u +%H:%M:%S) $1 -> results/$2"
    if "$SV" study "sweeps/study-$1.yaml" --out "results/$2" --jobs "$JOBS"; then
      [ "${MARKS:-1}" = 0 ] || echo "$sum" > "$mark"
    else
      echo "!! $1 exited $?"
    fi
}
PART=${1:-all}
case "$PART" in all|ladder|first) ;; *) echo "usage: scripts/study.sh [all|ladder|first]" >&2; exit 2;; esac
if [ "$PART" != first ]; then
  rung() {  # rung RUNG: the ladder's study of RUNG on both corpora, where its study file exists
    for corpus in shakespeare kjv; do
      [ -f "sweeps/study-ladder-$1-$corpus.yaml" ] && study "ladder-$1-$corpus" "ladder-$1-$corpus"
    done
  }
  for pass in 1 2; do
    rung cpu-10k; rung cpu-25k
    for r in cpu-10k cpu-25k; do study "ladder-suspects-$r-shakespeare" "ladder-$r-shakespeare"; done  # the suspects
    rung cpu-80k; rung cpu-200k; rung cpu-550k  # their study files come from scripts/ladder_plan.py
  done
  [ "$PART" = ladder ] && exit 0
fi
for pass in 1 2; do
  for size in cpu-25k cpu-80k; do
    for corpus in shakespeare kjv; do study "c6-$size-$corpus" "$size-$corpus"; done
  done
  study c6-cpu-10k-shakespeare cpu-10k-shakespeare                 # the third size of C8 (with 25k, 80k)
  study c5-cpu-25k-shakespeare cpu-25k-shakespeare                 # C5 shares C6's baseline runs
  study c4-cpu-25k-shakespeare c4-cpu-25k-shakespeare              # peri + QK-norm, wd on which scales
  for combo in adamw-wsd muon-cosine muon-wsd; do study "c7-cpu-25k-shakespeare-$combo" "c7-cpu-25k-shakespeare-$combo"; done
  for cell in cpu-10k-shakespeare cpu-25k-shakespeare cpu-25k-kjv; do study "c6-$cell-seeds" "$cell"; done  # 10 seeds
  study c6-moe-cpu-60k-shakespeare moe-cpu-60k-shakespeare
  study why-lrpick-cpu-25k-shakespeare why-lrpick-cpu-25k-shakespeare   # lr picked on 3 seeds: winner's curse?
  study c6-cpu-10k-shakespeare-tpp100 cpu-10k-shakespeare-tpp100
  study c6-cpu-25k-shakespeare-tpp100 cpu-25k-shakespeare-tpp100
  study why-variants-cpu-25k-shakespeare why-variants-cpu-25k-shakespeare   # unified with one part changed
  study why-variants2-cpu-25k-shakespeare why-variants-cpu-25k-shakespeare  # decay on α instead of β
  study why-heldout-cpu-25k-kjv cpu-25k-kjv                        # the two variants chosen above, on KJV
  study c6-cpu-25k-shakespeare-bpe4096 cpu-25k-shakespeare-bpe4096  # the second tokenizer
  study c6-cpu-25k-shakespeare-bpe4096-seeds cpu-25k-shakespeare-bpe4096  # 5 seeds
  study c6-cpu-25k-kjv-bpe4096 cpu-25k-kjv-bpe4096                  # its held-out test, 5 seeds
  study why-lrpick-cpu-25k-shakespeare-bpe4096 why-lrpick-cpu-25k-shakespeare-bpe4096  # its lr picked on 3 seeds
  study c6-cpu-80k-shakespeare-seeds cpu-80k-shakespeare           # 10 seeds in the main job's cell
  study c6-moe-cpu-60k-shakespeare-seeds moe-cpu-60k-shakespeare   # 10 seeds for the MoE
  study c6-cpu-200k-shakespeare cpu-200k-shakespeare               # a fourth size (~10 min a run)
done
