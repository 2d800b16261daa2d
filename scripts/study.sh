#!/usr/bin/env bash
# The reproduction study (docs/reproduction.md): every study declared in reproduction.claims, in its
# order (`python -m reproduction.claims ladder|first` lists them: NAME CELL OPTIONAL), each
# sweeps/study-NAME.yaml into results/CELL. Resumable: rerun the same command after an interruption; finished
# runs are skipped and failed ones retried (a second pass does that too). One run at a time, one thread each
# (STUDY_JOBS=2 on an idle 2-core machine trains two at once, measured 2x the throughput).
# `scripts/study.sh ladder` runs only the model ladder (the 0.12B init regime, rung by rung, both corpora; a
# rung's file, written by scripts/ladder_plan.py, may not exist yet); `scripts/study.sh first` only the first
# protocol's cells; `scripts/study.sh horizon` only the horizon cells (the ladder's rungs at 100 and 400
# tokens per parameter, files written by scripts/ladder_plan.py --tokens-per-param D; absent ones are skipped);
# no argument: the ladder, then the horizon cells, then the first protocol's.
set -uo pipefail
cd "$(dirname "$0")/.."
SV=${SCALEVEC:-.venv/bin/scalevec}
PY=${PYTHON:-.venv/bin/python}
JOBS=${STUDY_JOBS:-1}
# A study that finished is marked by results/CELL/.study-NAME.done, holding its study file's sha256: a study
# whose file is unchanged and marked is skipped (REDO=1 retrains it anyway; MARKS=0 writes no marker). Its
# runs are kept in git as their small files (rundir.KEPT), so an unfinished study resumes in a later session.
study() {  # study NAME CELL: sweeps/study-NAME.yaml into results/CELL
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
part() {  # part ladder|horizon|first: run its declared studies (an optional one only where its file exists)
    local plan name cell optional
    plan=$("$PY" -m reproduction.claims "$1") || { echo "!! cannot list the studies of $1" >&2; exit 2; }
    while read -r name cell optional; do
      if [ "$optional" = 1 ] && [ ! -f "sweeps/study-$name.yaml" ]; then continue; fi
      study "$name" "$cell"
    done <<< "$plan"
}
built() {  # built FILE: the horizon cells' corpora are not committed; build data/corpora/FILE.txt once, when missing (a
  # build that fails, e.g. without npm or a registry, leaves its studies to stop with a one-line data error)
    # BUILD=0 builds nothing (the tests, which stub scalevec)
    [ "${BUILD:-1}" = 0 ] || [ -f "data/corpora/$1.txt" ] || "$PY" "data/corpora/build_${1//-/_}.py" \
      || echo "!! could not build data/corpora/$1.txt"
}
[ $# -le 1 ] || { echo "usage: scripts/study.sh [all|ladder|horizon|first] (one part, got $#)" >&2; exit 2; }
PART=${1-all}  # an empty argument is a mistake, not "all": it would start every study
case "$PART" in all|ladder|horizon|first) ;; *) echo "usage: scripts/study.sh [all|ladder|horizon|first]" >&2; exit 2;; esac
for pass in 1 2; do
  case "$PART" in all|ladder) part ladder;; esac
  case "$PART" in all|horizon) built shakespeare-quarter; built gutenberg-sotu; part horizon;; esac
  case "$PART" in all|first) part first;; esac
done
