"""A strategy in a torchtitan-style loop: FSDP2 (``fully_shard`` per decoder layer), warmup-cosine schedule, gradient
clipping, a metrics logger every N steps (docs/integrations.md).

    torchrun --nproc_per_node 2 examples/torchtitan_style.py [--strategy unified] [--steps 20]   # FSDP2, 2 ranks
    python examples/torchtitan_style.py [--out DIR]                                               # one process

A tiny local Mixtral (MoE: the router's γ and the experts' banks get scale vectors too); the three scalevec lines
are marked. The metrics (per scale vector and per layer, one device-to-host transfer per logged step) are gathered
across the FSDP2 shards; rank 0 writes them as JSON lines to OUT/metrics.jsonl, as a torchtitan metrics logger
would hand them to TensorBoard or W&B.
"""

import argparse
import gzip
import json
import math
import os
import tempfile
from importlib import resources
from pathlib import Path

import torch
import torch.distributed as dist
import transformers
from torch.distributed.fsdp import fully_shard

import scalevec

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
p.add_argument("--strategy", default="unified")
p.add_argument("--log-every", type=int, default=5)
p.add_argument("--out", help="rank 0's new or empty folder for metrics.jsonl (default: a fresh one under the "
                                "system temp dir)")
args = p.parse_args()
out = Path(args.out) if args.out else None
# every rank checks before the rendezvous, so a refusal stops them all before any collective
if out is not None and (out.is_file() or (out.is_dir() and any(out.iterdir()))):  # never write over a run's metrics
    raise SystemExit(f"{out} is a file or a non-empty folder; give a new or empty --out (nothing was trained)")

world = int(os.environ.get("WORLD_SIZE", "1"))
if world > 1:
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
rank = dist.get_rank() if world > 1 else 0
torch.manual_seed(0)  # the same initial model on every rank
model = transformers.MixtralForCausalLM(transformers.MixtralConfig(
    vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=128))
model = scalevec.apply_strategy(model, args.strategy)                                       # scalevec 1/3
if world > 1:
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
opt = torch.optim.AdamW(scalevec.param_groups(model, lr=1e-2, weight_decay=0.1))           # scalevec 2/3
metrics = scalevec.scale_metrics(model, opt, every=args.log_every)                         # scalevec 3/3
warmup = 4
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * (
    0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, s / args.steps)))))

text = gzip.decompress(resources.files("scalevec.data.corpora").joinpath("shakespeare.txt.gz").read_bytes())
blocks = torch.tensor(list(text[: 640 * 64]), dtype=torch.long).view(640, 64)[rank::world]
if rank == 0:
    out = out or Path(tempfile.mkdtemp(prefix="titan-style-"))
    out.mkdir(parents=True, exist_ok=True)
    log = (out / "metrics.jsonl").open("x")
for step in range(args.steps):
    x = blocks[8 * step:8 * step + 8]
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad()
    if metrics.latest:  # every rank took part (shards gathered); rank 0 logs
        loss_value = loss.detach()
        if world > 1:
            dist.all_reduce(loss_value)
            loss_value /= world
        if rank == 0:
            row = {"step": step, "loss": loss_value.item(), **metrics.latest}
            log.write(json.dumps(row) + "\n")
            s = metrics.latest["scales"]
            router = s["model.layers.1.mlp.gate.in_scale"]
            experts = s["model.layers.1.mlp.experts.gate.out_scale"]
            print(f"step {step:>3} loss {row['loss']:.4f} | γ_router rms {router['rms']:.4f} update "
                  f"{router['update_norm']:.2e} | experts' DNP gate scale ({experts['role']}) rms {experts['rms']:.4f} "
                  f"min {experts['min']:.3f} max {experts['max']:.3f} | {len(metrics.scalars())} series")
if rank == 0:
    log.close()
    print(f"{world} rank(s){' (FSDP2)' if world > 1 else ''}, strategy {model.scalevec_info.strategy}; "
          f"{out / 'metrics.jsonl'}")
if world > 1:
    dist.destroy_process_group()
