"""Data parallelism (DESIGN.md §8): DDP and FSDP2 on CPU (gloo) match one process; checkpoints reshard.

Processes are spawned by the tests (``dist_harness.run_distributed``), joined in a gloo group with a
timeout, so a hang fails instead of blocking. To keep the file to about two minutes on two cores, one 2-process
launch (the ``runs`` fixture) trains every case of the file; the tests then compare what it wrote.

Tolerances. AdamW cases accumulate two micro-batches per rank (the ``no_sync`` path) with gradient
clipping on: the 2-process gradient is the 1-process one summed in another order (≈1e-7 relative),
and 10 steps keep the losses within 1e-6. Muon's Newton–Schulz runs in bfloat16 (torch's own), which
turns such reassociation differences into 6e-6–7e-5 loss differences within 10 steps, for DDP and
FSDP2 alike; one process alone moves by 8e-6–4e-3 when its micro-batches go from 4 to 2 sequences
(measured; MoE routing flips add to it). The Muon cases therefore use one micro-batch per rank (the
1-process run uses the same two micro-batches) and no clipping, which makes the gradients
bit-identical; any difference then comes from the distributed Muon path, and the bound stays 1e-5
(plain ``torch.optim.Muon`` on DTensors misses it by 3e-5). Weights and scale statistics after 10
AdamW steps get 5e-5: AdamW divides each update by its running RMS, so where a gradient is nearly
zero (OR's scale-invariant direction α under ``unified``) 1e-7 gradient noise moves a weight by up
to 1e-5 (measured 8e-6; one step moves it by up to lr = 3e-3).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dist_harness import run_distributed
from scalevec.cli import main
from scalevec.config import TrainConfig
from scalevec.model.moe import MoE
from scalevec.model.transformer import build_model
from scalevec.resolve import resolve_config
from scalevec.training import distributed
from scalevec.training.checkpoint.run_model import load_model
from scalevec.training.trainer import Trainer

TOL = 1e-5
W_TOL = 5e-5  # weights and scale statistics after 10 AdamW steps (see the module docstring)
STRATEGIES = ("baseline", "unified")
OPTIMIZERS = ("adamw", "muon")
ARCHS = ("dense", "moe")
PARITY = [(d, s, o, a) for d in ("ddp", "fsdp2") for s in STRATEGIES for o in OPTIMIZERS for a in ARCHS]
RESUME = ("unified", "muon", "moe")  # resume cases: sharded Muon momentum of expert banks + AdamW states

pytestmark = pytest.mark.slow  # spawns process groups and trains ~20 runs: minutes


# ----------------------------------------------------------------------------------------- the cases


def tiny_config(strategy: str, optimizer: str, arch: str, dist_mode: str, cache: str, steps: int = 10):
    """A seconds-long run: 2 blocks of width 32, global batch 8 × 16 tokens, bytes of the bundled corpus."""
    # val 320 tokens = 20 windows = 3 eval batches: uneven over 2 ranks (every rank must still run 2 forwards)
    over = {"train.steps": steps, "train.batch_size": 8, "train.seq_len": 16, "train.eval_every": 100,
            "train.log_every": 1, "train.eval_batch_size": 8, "data.val_tokens": 320, "schedule.warmup": 2,
            "model.n_layers": 2, "model.d_model": 32, "model.n_heads": 2, "model.n_kv_heads": 1,
            "optim.name": optimizer, "train.dist": dist_mode, "data.cache_dir": cache}
    # AdamW: 2 micro-batches per rank (no_sync path), clipping on. Muon: see the module docstring.
    over.update({"train.micro_batch_size": 2} if optimizer == "adamw" else
                {"train.micro_batch_size": 4, "optim.grad_clip": 0})
    if arch == "moe":
        over.update({"moe.n_experts": 4, "moe.d_expert": 16})  # FSDP2 on 2 ranks: 2 whole experts each
    else:
        over["model.d_ff"] = 48
    return resolve_config("moe-tiny" if arch == "moe" else "tiny", strategy, [f"{k}={v}" for k, v in over.items()])


def zero_routers(model: torch.nn.Module) -> None:
    """Router weights 0: uniform probabilities, so top-2 breaks the same tie for every token and two
    experts take them all in the first step; the other two, one rank's whole FSDP2 shard, get none."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, MoE):
                m.router.weight.zero_()


def fit(cfg, out: Path, resume: bool = False, stop_at: int | None = None, zero_router: bool = False) -> None:
    distributed.barrier()  # one case at a time on every rank (run directories are checked at start)
    trainer = Trainer(cfg, out, resume=resume, quiet=True)
    if zero_router:
        zero_routers(trainer.model)
    trainer.fit(stop_at=stop_at)


def sync_probe(dist_mode: str) -> dict:
    """Two micro-batches of rank-dependent data under ``grad_sync``: what the gradients look like after the
    first (``last=False``) and after the second (``last=True``)."""
    cfg = tiny_config("baseline", "adamw", "dense", dist_mode, "")
    model = build_model(cfg.model, cfg.scale, seed=0)
    wrapped = distributed.wrap(model, TrainConfig(dist=dist_mode), distributed.setup(TrainConfig(dist=dist_mode)))
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    out = {}
    for i, last in enumerate((False, True)):
        x = torch.randint(0, 256, (2, 8), generator=g)
        with distributed.grad_sync(wrapped, last=last):
            ce, _, _ = wrapped(x, x)
            ce.backward()
        grads = [p.grad for p in model.parameters()]
        embed_grad = distributed.full_tensor(model.embed.weight.grad).clone() if grads[0] is not None else None
        out[i] = {"has_grad": [gr is not None for gr in grads], "embed_grad": embed_grad}
    return out


def two_process_cases(rank: int, root: str) -> dict:
    """Everything the 2-process launch does, in one launch: see ``runs``."""
    root, cache = Path(root), str(Path(root) / "cache")
    for d, s, o, a in PARITY:
        fit(tiny_config(s, o, a, d, cache), root / f"{d}-{s}-{o}-{a}")
    for d in ("ddp", "fsdp2"):
        fit(tiny_config(*RESUME, d, cache), root / f"save2-{d}", stop_at=5)  # resumed by 1 process
        fit(tiny_config("baseline", "muon", "moe", d, cache, steps=3), root / f"zero-{d}", zero_router=True)
    fit(tiny_config(*RESUME, "fsdp2", cache), root / "save1-fsdp2", resume=True)  # saved by 1 process
    return {d: sync_probe(d) for d in ("ddp", "fsdp2")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """1-process references, then one 2-process launch (16 parity runs, two save-at-5 runs, one resume of
    a 1-process checkpoint, two MoE runs with idle experts, the grad_sync probe), then the 1-process
    resumes. Returns ``(root, sync probe results per rank)``."""
    root = tmp_path_factory.mktemp("dist")
    cache = str(root / "cache")
    for s in STRATEGIES:
        for o in OPTIMIZERS:
            for a in ARCHS:
                fit(tiny_config(s, o, a, "none", cache), root / f"ref-{s}-{o}-{a}")
    fit(tiny_config("baseline", "muon", "moe", "none", cache, steps=3), root / "zero-ref", zero_router=True)
    fit(tiny_config(*RESUME, "fsdp2", cache), root / "save1-fsdp2", stop_at=5)
    probes = run_distributed(two_process_cases, str(root))
    for d in ("ddp", "fsdp2"):
        fit(tiny_config(*RESUME, d, cache), root / f"save2-{d}", resume=True)
    return root, probes


def metrics(run: Path, kind: str = "train") -> list[dict]:
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    return [r for r in rows if r["kind"] == kind]


def max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) > 0
    return max(abs(x - y) for x, y in zip(a, b))


# ----------------------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("dist_mode,strategy,optimizer,arch", PARITY)
def test_two_processes_match_one(runs, dist_mode, strategy, optimizer, arch):
    """2 processes (DDP or FSDP2) give the 1-process per-step losses, grad norms and val loss for the same
    global batch within 1e-5 over 10 steps, and its scale statistics within 5e-5."""
    root, _ = runs
    ref_run, run = root / f"ref-{strategy}-{optimizer}-{arch}", root / f"{dist_mode}-{strategy}-{optimizer}-{arch}"
    ref, got = metrics(ref_run), metrics(run)
    assert [r["step"] for r in got] == list(range(10))
    assert max_diff([r["loss"] for r in ref], [r["loss"] for r in got]) <= TOL
    assert max_diff([r["grad_norm"] for r in ref], [r["grad_norm"] for r in got]) <= TOL
    if optimizer == "adamw":
        assert max(r["grad_norm"] for r in ref) > 1.0, "gradient clipping (at 1.0) should act in this test"
    ref_val, got_val = metrics(ref_run, "eval"), metrics(run, "eval")
    assert max_diff([r["val_loss"] for r in ref_val], [r["val_loss"] for r in got_val]) <= TOL
    ref_scales, got_scales = ref[-1]["scales"], got[-1]["scales"]
    assert set(ref_scales) == set(got_scales) and ref_scales
    stats = ("mean", "std", "min", "max", "rms", "grad_norm", "update_norm")  # FSDP2: shards gathered / summed
    assert max(abs(ref_scales[k][s] - got_scales[k][s]) for k in ref_scales for s in stats) <= W_TOL
    ref_layers, got_layers = ref[-1]["grad_norms"], got[-1]["grad_norms"]  # per-layer matrix gradient norms
    assert set(ref_layers) == set(got_layers) and max(abs(ref_layers[k] - got_layers[k]) for k in ref_layers) <= TOL


@pytest.mark.parametrize("dist_mode", ["ddp", "fsdp2"])
def test_consolidated_checkpoint_is_the_trained_model(runs, dist_mode):
    """The model.safetensors written by 2 processes loads with run_model.load_model and equals the 1-process model
    (5e-5)."""
    root, _ = runs
    for s in STRATEGIES:
        for o in OPTIMIZERS:
            for a in ARCHS:
                _, ref, _ = load_model(root / f"ref-{s}-{o}-{a}")
                _, got, _ = load_model(root / f"{dist_mode}-{s}-{o}-{a}")
                ref_sd, got_sd = ref.state_dict(), got.state_dict()
                assert set(ref_sd) == set(got_sd)
                assert max((ref_sd[k] - got_sd[k]).abs().max().item() for k in ref_sd) <= W_TOL, (s, o, a)


@pytest.mark.parametrize("saved_by", ["save2-ddp", "save2-fsdp2", "save1-fsdp2"])
def test_resume_with_another_number_of_processes(runs, saved_by):
    """Saved at step 5 by 2 processes (DDP, FSDP2) and resumed by 1, or saved by 1 and resumed by 2 (FSDP2):
    the 10 losses and the final val loss equal an uninterrupted 1-process run (1e-5)."""
    root, _ = runs
    ref, run = root / f"ref-{'-'.join(RESUME)}", root / saved_by
    assert [r["step"] for r in metrics(run)] == list(range(10))
    assert max_diff([r["loss"] for r in metrics(ref)], [r["loss"] for r in metrics(run)]) <= TOL
    assert max_diff([r["val_loss"] for r in metrics(ref, "eval")], [r["val_loss"] for r in metrics(run, "eval")]) <= TOL
    assert (run / "DONE").is_file()
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_0000005", "step_0000010"]


@pytest.mark.parametrize("dist_mode", ["ddp", "fsdp2"])
def test_experts_without_tokens_neither_hang_nor_error(runs, dist_mode):
    """With the routers zeroed, experts 0-1 or 2-3 (one rank's FSDP2 shard) get no token in step 0 on any
    rank; the 2-process run finishes (Muon, idle expert shards) with the 1-process losses (1e-5)."""
    root, _ = runs
    got, ref = metrics(root / f"zero-{dist_mode}"), metrics(root / "zero-ref")
    for layer in got[0]["moe"].values():
        counts = layer["tokens_per_expert"]  # mean over ranks of each rank's last micro-batch (4 x 16 tokens, top-2)
        assert sorted([counts[:2], counts[2:]]) == [[0.0, 0.0], [64.0, 64.0]]
    assert max_diff([r["loss"] for r in ref], [r["loss"] for r in got]) <= TOL


@pytest.mark.parametrize("dist_mode", ["ddp", "fsdp2"])
def test_gradients_sync_only_on_the_last_micro_batch(runs, dist_mode):
    """grad_sync(last=False) keeps gradients local (DDP: ranks differ; FSDP2: no sharded grad yet);
    the last micro-batch synchronizes them (DDP: ranks agree; FSDP2: every sharded grad is set)."""
    _, probes = runs
    first = [p[dist_mode][0] for p in probes]
    last = [p[dist_mode][1] for p in probes]
    if dist_mode == "ddp":
        assert all(all(r["has_grad"]) for r in first)
        assert not torch.allclose(first[0]["embed_grad"], first[1]["embed_grad"])
        torch.testing.assert_close(last[0]["embed_grad"], last[1]["embed_grad"], rtol=0, atol=0)
    else:
        assert not any(any(r["has_grad"]) for r in first)
        assert all(all(r["has_grad"]) for r in last)
        torch.testing.assert_close(last[0]["embed_grad"], last[1]["embed_grad"], rtol=0, atol=0)


def test_torchrun_cli_fsdp2(tmp_path):
    """``torchrun --nproc_per_node 2 -m scalevec train --dist fsdp2`` trains, rank 0 alone writes the run
    directory, and its losses equal a 1-process ``scalevec train`` (1e-5)."""
    args = ["train", "--preset", "tiny", "--steps", "3", "--batch-size", "4", "--seq-len", "16", "--eval-every", "100",
            "--quiet", "train.log_every=1", "data.val_tokens=128", "model.n_layers=1",
            f"data.cache_dir={tmp_path / 'cache'}"]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "scalevec", *args, "--dist", "fsdp2", "--out", str(tmp_path / "two")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    two = metrics(tmp_path / "two")
    assert [r["step"] for r in two] == [0, 1, 2]  # one row per step: rank 1 wrote nothing
    assert max_diff([r["loss"] for r in metrics(tmp_path / "one")], [r["loss"] for r in two]) <= TOL
    assert json.loads((tmp_path / "two" / "summary.json").read_text())["world_size"] == 2


# ----------------------------------------------------------------------------------------- GPU


def cuda_cases(rank: int, root: str, dtype: str) -> None:
    cfg = tiny_config("unified", "adamw", "dense", "fsdp2", str(Path(root) / "cache"))
    cfg.train.device, cfg.train.dtype = "cuda", dtype
    fit(cfg, Path(root) / f"fsdp2-{dtype}")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fsdp2_on_cuda(tmp_path):
    """FSDP2 over nccl (every visible GPU, at most 2): fp32 matches 1 process on the GPU within 1e-4 (CUDA's
    atomics reorder sums); bf16 (bf16 params, fp32 reduction) trains: finite, and the loss goes down."""
    world = min(2, torch.cuda.device_count())
    ref_cfg = tiny_config("unified", "adamw", "dense", "none", str(tmp_path / "cache"))
    ref_cfg.train.device, ref_cfg.train.dtype = "cuda", "float32"
    Trainer(ref_cfg, tmp_path / "ref", quiet=True).fit()
    for dtype in ("float32", "bfloat16"):
        run_distributed(cuda_cases, str(tmp_path), dtype, world_size=world, backend="nccl")
    ref, fp32, bf16 = (metrics(tmp_path / n) for n in ("ref", "fsdp2-float32", "fsdp2-bfloat16"))
    assert max_diff([r["loss"] for r in ref], [r["loss"] for r in fp32]) <= 1e-4
    losses = [r["loss"] for r in bf16]
    assert all(map(torch.isfinite, torch.tensor(losses))) and losses[-1] < losses[0]
