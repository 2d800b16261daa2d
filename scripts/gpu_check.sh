#!/usr/bin/env bash
# GPU check (issue 8, DESIGN.md §8; issue 17): on one CUDA GPU,
#   1. the GPU-marked tests (pytest -m gpu: among them MoE's grouped bf16 GEMM against the per-expert loop),
#   2. a 100-step bf16 run with torch.compile and FSDP2 (torchrun --nproc_per_node 1) on a paper-size
#      preset, and prints tokens/s and MFU (the trainer's mfu / flops_per_s metrics),
#   3. `scalevec bench` on the preset, bf16, eager and compiled (step times, MFU against the measured bf16
#      matmul peak and the GPU's spec): the figures for docs/performance.md and for autocompile's threshold;
#      then eager with the opt-in fused path (scale.apply=fused, the `:fused` candidates) beside the exact one,
#   4. the MoE row: moe-small against its dense twin with the same active parameters, compiled.
# Stages 3-4 are skipped with BENCH=0.
# Usage: scripts/gpu_check.sh [PRESET]            (default llama-0.12b)
# Knobs (environment): STEPS=100 BATCH=32 MICRO=16 SEQ=1024 TOKENIZER=bytes STRATEGY=baseline
#   PEAK_TFLOPS=<the GPU's dense bf16 peak, TFLOP/s> (else looked up from the GPU name)
#   PYTHON=<interpreter> (default .venv/bin/python) TIMEOUT=<seconds per stage, default 1200>
# Tokenizer: bytes (256 ids) trains the preset unchanged (its vocab_size stays 50304, so the FLOPs are
# those of a 50k-vocabulary run); a bpe:N or tokenizer.json must have at most 50304 ids.
# MFU = FLOPs per token · tokens/s / peak, FLOPs per token from scalevec.model.flops (6 · the matmul parameters
# a token uses, LM head included, embedding lookup excluded, + attention's 12 · n_layers · seq_len ·
# n_heads · head_dim, PaLM appendix B). tokens/s is the median step after the first 5 (compile excluded).
# Exit status: 0 if both stages passed, 1 if one failed, 2 if no CUDA device is visible.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
PRESET=${1:-llama-0.12b}
STEPS=${STEPS:-100} BATCH=${BATCH:-32} MICRO=${MICRO:-16} SEQ=${SEQ:-1024}
TOKENIZER=${TOKENIZER:-bytes} STRATEGY=${STRATEGY:-baseline} TIMEOUT=${TIMEOUT:-1200} BENCH=${BENCH:-1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_check: torch sees no CUDA device (or $PY has no torch); nothing to check" >&2
    exit 2
fi
"$PY" -c "import torch; print(f'torch {torch.__version__} (CUDA {torch.version.cuda}) on {torch.cuda.get_device_name()}, {torch.cuda.device_count()} GPU(s) visible')"

status=0
echo "== 1/4 GPU-marked tests (pytest -m gpu)"
timeout "$TIMEOUT" "$PY" -m pytest -m gpu -q -p no:cacheprovider
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 5 ]; then  # 5: no test collected
    echo "gpu_check: GPU tests failed (exit $rc)" >&2
    status=1
fi

echo "== 2/4 $STEPS steps of $PRESET/$STRATEGY, bf16, FSDP2 + torch.compile, batch $BATCH x $SEQ (micro $MICRO)"
RUN=$(mktemp -d)/run
timeout "$TIMEOUT" "$PY" -m torch.distributed.run --standalone --nproc_per_node 1 -m scalevec train \
    --preset "$PRESET" --strategy "$STRATEGY" --steps "$STEPS" --warmup 10 --batch-size "$BATCH" \
    --micro-batch-size "$MICRO" --seq-len "$SEQ" --tokenizer "$TOKENIZER" --device cuda --dtype bfloat16 \
    --dist fsdp2 --compile --eval-every "$STEPS" --quiet train.log_every=10 data.val_tokens=65536 --out "$RUN"
rc=$?
if [ $rc -ne 0 ]; then
    echo "gpu_check: the training run failed (exit $rc)" >&2
    exit 1
fi

"$PY" - "$RUN" <<'EOF'
import json, statistics, sys
from pathlib import Path

import torch

from scalevec.model.flops import flops_per_token, peak_flops
from scalevec.config import tokens_per_step
from scalevec.training.rundir import load_config

run = Path(sys.argv[1])
cfg = load_config(run)
summary = json.loads((run / "summary.json").read_text())
rows = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]
tok_s = tokens_per_step(cfg) / summary["step_time_s"]
fpt = flops_per_token(cfg.model, cfg.train.seq_len)
peak, source = peak_flops(torch.device("cuda"), torch.bfloat16, cfg.train.peak_flops)
mfu = [r["mfu"] for r in rows if r["step"] >= 5 and r.get("mfu") is not None]
print(f"run {run}: loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}, final val_loss {summary['final_val_loss']:.4f}")
print(f"step {summary['step_time_s'] * 1e3:.1f} ms (median after 5), {tokens_per_step:,} tokens/step, "
      f"compiled: {summary.get('compiled')}")
print(f"tokens/s: {tok_s:,.0f}; FLOPs/token {fpt:,.0f}; {fpt * tok_s / 1e12:.1f} TFLOP/s")
print(f"MFU: {fpt * tok_s / peak:.1%} of {peak / 1e12:.0f} TFLOP/s ({source}, {torch.cuda.get_device_name()})"
      + (f"; the trainer's logged mfu, median after step 5: {statistics.median(mfu):.1%}" if mfu else ""))
EOF
[ $? -eq 0 ] || status=1

if [ "$BENCH" != "0" ]; then
    echo "== 3/4 scalevec bench $PRESET, bf16, eager, compiled, then eager with the opt-in fused path"
    for FLAG in "" --compile; do
        timeout "$TIMEOUT" "$PY" -m scalevec bench --device cuda --dtype bfloat16 --preset "$PRESET" $FLAG \
            --steps 10 --warmup 3 --no-inference || status=1
    done
    timeout "$TIMEOUT" "$PY" -m scalevec bench --device cuda --dtype bfloat16 --preset "$PRESET" --steps 10 --warmup 3 \
        --no-inference --strategies baseline,baseline:fused,unified_foldable,unified_foldable:fused,unified,unified:fused \
        || status=1
    echo "== 4/4 MoE step time vs a dense model with the same active parameters (moe-small, bf16, compiled)"
    timeout "$TIMEOUT" "$PY" -m scalevec bench --device cuda --dtype bfloat16 --preset moe-small --compile \
        --strategies baseline,unified,dense-active --steps 10 --warmup 3 --no-inference || status=1
fi
exit $status
