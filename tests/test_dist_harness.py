"""The 2-process gloo harness itself, and optimizers on sharded parameters without a training run (DESIGN.md §5, §8)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dist_harness import run_distributed

pytestmark = pytest.mark.slow  # each test spawns 2 processes that import torch: ~5-10 s each


def _rank_sum(rank: int, offset: int) -> tuple[int, int, float]:
    t = torch.tensor(float(rank + offset))
    dist.all_reduce(t)
    return rank, dist.get_world_size(), t.item()


def _fail_on_rank_1(rank: int) -> None:
    if rank == 1:
        raise ValueError("rank 1 fails on purpose")


def _sharded_vs_whole(rank: int) -> dict[str, float]:
    """Muon and fused AdamW over FSDP2-style DTensors (rows of a matrix, whole experts of a bank, sharded on
    dim 0 over 2 ranks) against the same optimizers over the whole tensors in this process, 3 steps;
    returns the largest difference of the weights per optimizer."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from scalevec.training.distributed import ShardedMuon, shard_aware_optimizers
    from scalevec.training.optim import Muon

    mesh = init_device_mesh("cpu", (2,))
    out = {}
    for name in ("muon", "adamw-fused"):
        g = torch.Generator().manual_seed(0)  # the same numbers on every rank
        whole = [torch.randn(8, 6, generator=g), torch.randn(4, 5, 3, generator=g)]  # a matrix, a 4-expert bank
        plain = [torch.nn.Parameter(w.clone()) for w in whole]
        sharded = [torch.nn.Parameter(distribute_tensor(w.clone(), mesh, [Shard(0)])) for w in whole]
        if name == "muon":
            kw = dict(lr=0.05, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
            ref = Muon([{"params": plain, "role": "matrix"}], **kw)
            (opt,) = shard_aware_optimizers([Muon([{"params": sharded, "role": "matrix"}], **kw)])
            assert type(opt) is ShardedMuon
        else:
            ref = torch.optim.AdamW(plain, lr=0.05, weight_decay=0.1, fused=True)
            opt = torch.optim.AdamW(sharded, lr=0.05, weight_decay=0.1, fused=True)
        for _ in range(3):
            grads = [torch.randn(w.shape, generator=g) for w in whole]
            for p, q, gr in zip(plain, sharded, grads):
                p.grad = gr.clone()
                q.grad = distribute_tensor(gr.clone(), mesh, [Shard(0)])
            ref.step()
            opt.step()
        out[name] = max((p.detach() - q.detach().full_tensor()).abs().max().item() for p, q in zip(plain, sharded))
    return out


def test_harness_returns_every_rank_result():
    """Two gloo processes see world size 2, reduce across each other, and return their results in rank order."""
    assert run_distributed(_rank_sum, 1) == [(0, 2, 3.0), (1, 2, 3.0)]


def test_harness_reraises_a_rank_failure():
    """An exception on one rank fails the test with that rank's message (no hang: the other rank finishes)."""
    with pytest.raises(Exception, match="rank 1 fails on purpose"):
        run_distributed(_fail_on_rank_1, timeout=120)


def test_sharded_optimizers_equal_whole_ones():
    """ShardedMuon on row-sharded matrices and expert-sharded banks steps as Muon does on the whole tensors,
    and fused AdamW on DTensors as fused AdamW on whole tensors: 3 steps agree to 1e-6 on both ranks.
    Measured: Muon bitwise (the same elementwise steps, the same Newton–Schulz input); fused AdamW 1.2e-7
    (one float32 ulp at |w| ~ 1: its kernel vectorizes a shard differently), against steps of ~5e-2."""
    diffs = run_distributed(_sharded_vs_whole)
    assert all(max(d.values()) <= 1e-6 for d in diffs), diffs
