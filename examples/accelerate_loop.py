"""A strategy in an accelerate loop (DDP on any number of processes, CPU or GPU; docs/integrations.md).

    torchrun --nproc_per_node 2 examples/accelerate_loop.py [--strategy unified] [--steps 20]   # DDP (gloo on CPU)
    accelerate launch examples/accelerate_loop.py     # with your accelerate config (GPUs, FSDP, ...)
    python examples/accelerate_loop.py                # one process

A tiny local Qwen3 (QK-norm: an Output-Norm scale too); the three scalevec lines are marked. Each rank reads
its own slice of the bundled Shakespeare; rank 0 prints the loss and a few of the per-vector metrics, which
``scale_metrics`` collects every 5 optimizer steps in one device-to-host transfer.
"""

import argparse
import gzip
from importlib import resources

import torch
import transformers
from accelerate import Accelerator

import scalevec

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
p.add_argument("--strategy", default="unified")
args = p.parse_args()

acc = Accelerator(cpu=not torch.cuda.is_available())
torch.manual_seed(0)  # the same initial model on every rank
model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
    vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    intermediate_size=172, max_position_embeddings=128))
text = gzip.decompress(resources.files("scalevec.data.corpora").joinpath("shakespeare.txt.gz").read_bytes())
blocks = torch.tensor(list(text[: 640 * 64]), dtype=torch.long).view(640, 64)[acc.process_index::acc.num_processes]

model = scalevec.apply_strategy(model, args.strategy)                                       # scalevec 1/3
opt = torch.optim.AdamW(scalevec.param_groups(model, lr=1e-2, weight_decay=0.1))           # scalevec 2/3
metrics = scalevec.scale_metrics(model, opt, every=5)                                      # scalevec 3/3
ddp_model, opt = acc.prepare(model, opt)
for step in range(args.steps):
    x = blocks[8 * step:8 * step + 8].to(acc.device)
    loss = ddp_model(input_ids=x, labels=x).loss
    acc.backward(loss)
    acc.clip_grad_norm_(ddp_model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
    if metrics.latest and acc.is_main_process:
        s = metrics.latest["scales"]
        q = s["model.layers.1.self_attn.q_proj.in_scale"]
        qk = s["model.layers.1.self_attn.q_norm.scale"]
        print(f"step {step:>3} loss {loss.item():.4f} | {len(s)} vectors; layer 1 γ_q rms {q['rms']:.4f} "
              f"grad {q['grad_norm']:.2e} update {q['update_norm']:.2e}; QK-norm γ ({qk['role']}) rms {qk['rms']:.4f} "
              f"| layer grad norms {', '.join(f'{v:.3f}' for v in metrics.latest['grad_norms'].values())} "
              f"| {len(metrics.scalars())} series")
if acc.is_main_process:
    print(f"{acc.num_processes} process(es) ({acc.distributed_type}), strategy {model.scalevec_info.strategy}")
