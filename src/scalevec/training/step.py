"""The arithmetic of one training step, the loss over a split global batch, and of an evaluation (DESIGN.md §8).

``accumulate_gradients`` runs forward and backward over one rank's micro-batches so that the gradient is
that of the token-mean loss of the *whole* global batch, however it is split over micro-batches and
ranks. The optimizer step, clipping and the health guard are the trainer's (``trainer.Trainer.train_step``).
``accumulate_gradients`` copies nothing to the host: the step's one host sync is the health guard's
(DESIGN.md §8, host syncs).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from scalevec.data.sampler import bits_per_byte
from scalevec.training import distributed


def accumulate_gradients(model: torch.nn.Module, micro_batches: list[tuple[torch.Tensor, torch.Tensor]],
                         autocast=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward and backward over this rank's micro-batches of one global batch (DESIGN.md §8).

    The loss is the cross-entropy summed in nats over every target ``!= -100`` of the *global* batch
    (all micro-batches, all ranks) divided by their count, so the gradient does not depend on how the
    batch is split; MoE aux losses are averaged over micro-batches. DDP/FSDP average gradients over
    ranks, hence each rank's loss carries a factor ``world_size``. Gradients sync on the last
    micro-batch only. Returns the global (loss, aux) as detached scalars.
    """
    world = distributed.world_size()
    device = micro_batches[0][0].device
    # the target count stays on the device (a host copy would stall the step until the device caught up); as
    # fp32, the value torch.tensor(float(count)) gave before, so the normalization is bitwise unchanged
    n_local = sum((y != -100).sum() for _, y in micro_batches)
    n_global = distributed.all_reduce_sum(n_local.float())
    ce_total = torch.zeros((), device=device)
    aux_total = torch.zeros((), device=device)
    for i, (x, y) in enumerate(micro_batches):
        with distributed.grad_sync(model, last=i == len(micro_batches) - 1):
            with autocast or nullcontext():
                ce, _, aux = model(x, y)
            loss = ce * (world / n_global) + aux / len(micro_batches)
            loss.backward()
        ce_total += ce.detach()
        aux_total += aux.detach() / len(micro_batches)
    loss = distributed.all_reduce_sum(ce_total) / n_global
    return loss, distributed.all_reduce_sum(aux_total) / world


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], n_bytes: int,
             device: torch.device, autocast=None) -> tuple[float, float]:
    """``(loss in nats/token, bits per byte)`` of ``model`` over the fixed validation set ``batches`` (DESIGN.md
    §8; ``sampler.val_batches``, whose targets stand for ``n_bytes`` UTF-8 bytes). Rank r of W evaluates batches
    r, r+W, ... and the sums are all-reduced, so every rank calls and gets the same figures; every rank runs the
    same number of forwards (FSDP2 all-gathers in each), a spare one not counted. Leaves ``model`` in train mode."""
    rank, world = distributed.rank(), distributed.world_size()
    model.eval()
    ce_sum = torch.zeros((), device=device, dtype=torch.float64)
    n = torch.zeros((), device=device, dtype=torch.float64)
    mine = batches[rank::world]
    for i in range(-(-len(batches) // world)):
        x, y = mine[i] if i < len(mine) else batches[0]
        with autocast or nullcontext():
            ce, cnt, _ = model(x.to(device), y.to(device))
        if i < len(mine):
            ce_sum += ce.double()
            n += cnt
    ce_sum, n = distributed.all_reduce_sum(ce_sum), distributed.all_reduce_sum(n)
    model.train()
    loss = (ce_sum / n).item()
    return loss, bits_per_byte(ce_sum.item(), n_bytes)


__all__ = ["accumulate_gradients", "evaluate"]
