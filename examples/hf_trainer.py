"""A strategy in Hugging Face ``Trainer``: a tiny local Llama trained with ``unified`` (docs/integrations.md).

    python examples/hf_trainer.py [--steps 20] [--strategy unified] [--out DIR]

The three scalevec lines are marked. The model is built from a config (no download); the data is the bundled
Shakespeare as bytes (vocabulary 256). The per-scale-vector series go to every ``report_to`` reporter (here
TensorBoard, in OUT/runs) and the logged rows; the model is saved as ``scalevec export`` would save it.
"""

import argparse
import gzip
import tempfile
from importlib import resources
from pathlib import Path

import torch
import transformers

import scalevec

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
p.add_argument("--strategy", default="unified")
p.add_argument("--out", help="a new or empty folder (default: a fresh one under the system temp dir)")
args = p.parse_args()
if args.out is None:
    args.out = tempfile.mkdtemp(prefix="hf-trainer-")
elif Path(args.out).is_dir() and any(Path(args.out).iterdir()) or Path(args.out).is_file():
    raise SystemExit(f"{args.out} is a file or a non-empty folder; give a new or empty --out (nothing was trained)")

torch.manual_seed(0)
model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
    vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=172, max_position_embeddings=128))
text = gzip.decompress(resources.files("scalevec.data.corpora").joinpath("shakespeare.txt.gz").read_bytes())
blocks = torch.tensor(list(text[: 400 * 64]), dtype=torch.long).view(400, 64)
data = [{"input_ids": b, "labels": b} for b in blocks]

model = scalevec.apply_strategy(model, args.strategy)                                         # scalevec 1/3
optimizer = torch.optim.AdamW(scalevec.param_groups(model, lr=1e-2, weight_decay=0.1))      # scalevec 2/3
print(scalevec.param_groups(model, lr=1e-2, weight_decay=0.1).table())

targs = transformers.TrainingArguments(output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=8,
                                       logging_steps=5, report_to=["tensorboard"], use_cpu=True, save_strategy="no",
                                       lr_scheduler_type="constant", disable_tqdm=True)
trainer = transformers.Trainer(model=model, args=targs, train_dataset=data, optimizers=(optimizer, None))
scalevec.add_scale_metrics(trainer)                                                            # scalevec 3/3
trainer.train()
for row in trainer.state.log_history:
    if "loss" in row:
        print(f"step {row['step']:>3} loss {row['loss']:.4f}")
scalevec.save(model, f"{args.out}/export")
print(f"saved {args.out}/export ({model.scalevec_info.strategy}: "
      f"{'plain Llama' if model.scalevec_info.scale.foldable else 'ScalevecForCausalLM, trust_remote_code=True'})")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

acc = EventAccumulator(str(next(iter(sorted((__import__("pathlib").Path(args.out) / "runs").iterdir())))),
                       size_guidance={"scalars": 0})
acc.Reload()
tags = acc.Tags()["scalars"]
print(f"tensorboard: {len(tags)} series, {sum('/rms/' in t for t in tags)} of them rms(γ) of one scale vector, e.g. "
      f"{next(t for t in tags if '/rms/' in t)}")
