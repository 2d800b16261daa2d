#!/usr/bin/env bash
# GPU check (issue 8, DESIGN.md §8): on one CUDA GPU,
#   1. the GPU-marked tests (pytest -m gpu), then
#   2. a 100-step bf16 run with torch.compile and FSDP2 (torchrun --nproc_per_node 1) on a paper-size
#      preset, and prints tokens/s and MFU.
# Usage: scripts/gpu_check.sh [PRESET]            (default llama-0.12b)
# Knobs (environment): STEPS=100 BATCH=32 MICRO=16 SEQ=1024 TOKENIZER=bytes STRATEGY=baseline
#   PEAK_TFLOPS=<the GPU's dense bf16 peak, TFLOP/s> (else looked up from the GPU name)
#   PYTHON=<interpreter> (default .venv/bin/python) TIMEOUT=<seconds per stage, default 1200>
# Tokenizer: bytes (256 ids) trains the preset unchanged (its vocab_size stays 50304, so the FLOPs are
# those of a 50k-vocabulary run); a bpe:N or tokenizer.json must have at most 50304 ids.
# MFU = 6 · N · tokens/s / peak, N = every parameter but the input embedding table (the lookup costs
# no FLOPs; the LM head is a matmul). A second figure adds attention's 12 · n_layers · d_model · seq_len
# FLOPs per token (PaLM, appendix B). tokens/s is the median step after the first 5 (compile excluded).
# Exit status: 0 if both stages passed, 1 if one failed, 2 if no CUDA device is visible.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
PRESET=${1:-llama-0.12b}
STEPS=${STEPS:-100} BATCH=${BATCH:-32} MICRO=${MICRO:-16} SEQ=${SEQ:-1024}
TOKENIZER=${TOKENIZER:-bytes} STRATEGY=${STRATEGY:-baseline} TIMEOUT=${TIMEOUT:-1200}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_check: torch sees no CUDA device (or $PY has no torch); nothing to check" >&2
    exit 2
fi
"$PY" -c "import torch; print(f'torch {torch.__version__} (CUDA {torch.version.cuda}) on {torch.cuda.get_device_name()}, {torch.cuda.device_count()} GPU(s) visible')"

status=0
echo "== 1/2 GPU-marked tests (pytest -m gpu)"
timeout "$TIMEOUT" "$PY" -m pytest -m gpu -q -p no:cacheprovider
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 5 ]; then  # 5: no test collected
    echo "gpu_check: GPU tests failed (exit $rc)" >&2
    status=1
fi

echo "== 2/2 $STEPS steps of $PRESET/$STRATEGY, bf16, FSDP2 + torch.compile, batch $BATCH x $SEQ (micro $MICRO)"
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
import json, os, sys
from pathlib import Path

import torch

from scalevec.model import build_model
from scalevec.train import load_run_config

run = Path(sys.argv[1])
cfg = load_run_config(run)
summary = json.loads((run / "summary.json").read_text())
losses = [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]
model = build_model(cfg.model, cfg.scale, device="meta")
roles = model.param_roles()
n = sum(p.numel() for name, p in model.named_parameters() if roles[name] != "embedding")
if cfg.model.tie_embeddings:  # the tied table is also the LM head's matmul
    n += model.embed.weight.numel()
tokens_per_step = cfg.train.batch_size * cfg.train.seq_len
tok_s = tokens_per_step / summary["step_time_s"]
attn = 12 * cfg.model.n_layers * cfg.model.d_model * cfg.train.seq_len
name = torch.cuda.get_device_name()
PEAKS = {"H200": 989.4, "H100 PCIe": 756.0, "H100": 989.4, "B200": 2250.0, "A100": 312.0, "L40S": 362.0,
         "4090": 165.2}  # dense bf16 TFLOP/s (no sparsity), vendor figures
peak = float(os.environ["PEAK_TFLOPS"]) if os.environ.get("PEAK_TFLOPS") else \
    next((v for k, v in PEAKS.items() if k in name), None)
print(f"run {run}: loss {losses[0]:.3f} -> {losses[-1]:.3f}, final val_loss {summary['final_val_loss']:.4f}")
print(f"N = {n:,} parameters (all but the input embedding) of {summary['params']:,}; "
      f"step {summary['step_time_s'] * 1e3:.1f} ms (median after 5), {tokens_per_step:,} tokens/step")
print(f"tokens/s: {tok_s:,.0f}")
if peak is None:
    print(f"MFU: unknown bf16 peak for {name!r}; rerun with PEAK_TFLOPS=<dense bf16 TFLOP/s>")
else:
    print(f"MFU (6N): {6 * n * tok_s / (peak * 1e12):.1%}   MFU (6N + attention): "
          f"{(6 * n + attn) * tok_s / (peak * 1e12):.1%}   (peak {peak} TFLOP/s dense bf16, {name})")
EOF
[ $? -eq 0 ] || status=1
exit $status
