"""torch.distributed plumbing for the trainer: process group, model wrapping, gradient sync (DESIGN.md §8).

Everything here is PyTorch's own engine: ``DistributedDataParallel``, FSDP2 ``fully_shard`` with a
``MixedPrecisionPolicy``, DTensor. One process without ``torchrun`` needs none of it: every helper
degrades to a no-op. Under ``torchrun`` the process group uses nccl on CUDA and gloo on CPU; the model
is wrapped in DDP (``train.dist=ddp``) or sharded with FSDP2 ``fully_shard`` per block and at the root
(``train.dist=fsdp2``), after optional per-block ``torch.compile`` (torchtitan's order).

Data parallelism only: every rank runs the whole model on its slice of the global batch (experts
included; FSDP2 shards expert banks by whole experts, but each rank computes with all of them).
``ShardedMuon`` makes Muon work on FSDP2's sharded parameters; checkpoints live in the ``checkpoint`` package.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from scalevec.config import TrainConfig
from scalevec.training.optim import Muon, zeropower_via_newtonschulz


@dataclass
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    owns_group: bool  # True if setup() created the process group (and teardown() must destroy it)


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``auto`` -> the local CUDA device if there is one, else CPU. ``ValueError`` if CUDA is asked for but absent."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError("train.device=cuda but no CUDA device is available; use train.device=cpu")
        return torch.device("cuda", local_rank if name == "cuda" else int(name.split(":")[1]))
    return torch.device(name)


def setup(cfg: TrainConfig) -> Dist:
    """Join the process group when launched by torchrun; pick the device. Single process: no group.

    ``torchrun`` sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` (env:// rendezvous). A group is made when
    there are several processes, or when one torchrun process asks for ``ddp``/``fsdp2`` (so that
    ``torchrun --nproc_per_node 1 ... --dist fsdp2`` really runs FSDP2). A group that already exists
    (a test harness) is used as is and left to its owner.
    """
    env_world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(cfg.device, local_rank)
    launched = "RANK" in os.environ and "MASTER_ADDR" in os.environ
    owns = False
    if (env_world > 1 or (launched and cfg.dist != "none")) and not dist.is_initialized():
        if env_world > 1 and cfg.dist == "none":
            raise ValueError(f"launched with {env_world} processes but train.dist=none; "
                             f"pass --dist ddp or --dist fsdp2")
        init_group(device)
        owns = True
    if world_size() > 1 and cfg.dist == "none":
        raise ValueError(f"{world_size()} processes but train.dist=none; pass --dist ddp or --dist fsdp2")
    return Dist(rank(), world_size(), local_rank, device, owns)


# A first collective waits for the slowest rank's start: every rank reads its corpus shards (and compiles)
# before the first barrier, which on a cold cache takes longer than NCCL's default 10 minutes.
GROUP_TIMEOUT = timedelta(minutes=30)


def init_group(device: torch.device) -> None:
    """Create the default process group from torchrun's environment: nccl bound to ``device`` (``device_id``, so
    NCCL sets up its communicator eagerly on the right GPU) on CUDA, gloo on CPU, with ``GROUP_TIMEOUT``."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl", device_id=device, timeout=GROUP_TIMEOUT)
    else:
        dist.init_process_group(backend="gloo", timeout=GROUP_TIMEOUT)


def teardown(d: Dist) -> None:
    if d.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: nn.Module, cfg: TrainConfig, d: Dist) -> nn.Module:
    """Compile (per block) and wrap ``model`` for data parallelism; returns the module to call.

    FSDP2 (torchtitan's recipe): ``fully_shard`` each block, then the root (embedding, final norm, LM
    head). Every parameter, scale vectors included, becomes a DTensor sharded on dim 0 (uneven shards,
    even empty ones for tiny vectors, are fine); in forward each block's parameters are all-gathered
    whole, so every scale-vector strategy computes exactly as unsharded. One numerics regime whatever the
    wrapper (DESIGN.md §8): FSDP2 keeps parameters, their all-gathers and gradient reductions in fp32
    (``MixedPrecisionPolicy`` with no ``param_dtype``), and bf16 comes only from the trainer's autocast, as under
    DDP and on one device: matmuls in bf16, the residual stream, every scale vector, its gradient and the
    optimizer state in fp32. (A bf16 ``param_dtype`` would make the residual stream and the scale vectors'
    gradients bf16 under FSDP2 only, so a size ladder that switches wrapper would switch numerics.)
    ``fully_shard`` replaces the parameters with new (DTensor) ones: build optimizers after this.
    """
    from scalevec.config.run_budget import train_steps
    from scalevec.training.autocompile import resolve

    compiled, _ = resolve(cfg.compile, d.device, train_steps(cfg), double_backward=cfg.sharpness_every > 0)
    if compiled:  # train.compile: auto | true | false (autocompile.py)
        for block in model.layers:
            block.compile()
    if cfg.dist == "none" or not dist.is_initialized():
        return model
    if cfg.dist == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[d.device.index] if d.device.type == "cuda" else None)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(d.device.type, (d.world_size,))
    mp = fsdp_policy()
    for block in model.layers:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def fsdp_policy():
    """FSDP2's mixed precision: none (fp32 parameters, all-gathers and reductions; ``wrap``'s docstring says why).
    ``cast_forward_inputs=False`` keeps the fp32 RoPE tables that blocks receive in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=None, reduce_dtype=None, cast_forward_inputs=False)


@contextmanager
def grad_sync(wrapped: nn.Module, last: bool):
    """Wrap forward *and* backward of a micro-batch: gradients are synchronized only on the last one
    (DDP ``no_sync``; FSDP2 ``set_requires_gradient_sync``, which recurses into every sharded block).
    A plain module needs nothing."""
    if last:
        yield
    elif hasattr(wrapped, "no_sync"):
        with wrapped.no_sync():
            yield
    elif hasattr(wrapped, "set_requires_gradient_sync"):
        wrapped.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            wrapped.set_requires_gradient_sync(True)
    else:
        yield


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if world_size() > 1:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor (a collective: every rank must call it); a plain tensor as is."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


# ----------------------------------------------------------------------------------------- Muon under FSDP2


class ShardedMuon(Muon):
    """``optim.Muon`` for FSDP2-sharded parameters: every matrix is orthogonalized whole (DESIGN.md §5, §8).

    Muon's momentum is elementwise, so it runs on each rank's shard and the buffer stays sharded. The
    Newton–Schulz step needs the whole matrix:

    - a 2-D matrix (sharded by rows): its momentum-corrected update is all-gathered
      (``DTensor.full_tensor()``), orthogonalized on every rank, and each rank keeps its own rows
      (``distribute_tensor(..., src_data_rank=None)``: no communication);
    - a 3-D expert bank ``(E, d_out, d_in)`` is sharded on the expert dim, so each rank holds whole
      experts and orthogonalizes its own, one expert at a time, with no communication.

    The arithmetic is ``optim.Muon``'s (``Muon.step``: lerp momentum, Nesterov, NS, decoupled weight
    decay, the lr adjustment on each 2-D matrix's shape); only the unit of the elementwise steps
    differs (a whole bank instead of one expert), so the result equals ``optim.Muon`` on the unsharded
    model (tests/test_distributed.py: losses within 1e-5 over 10 steps). Plain (unsharded) tensors
    take the same path without communication.
    """

    def matrices(self, p, buf):
        """The whole (sharded) parameter as one unit: a bank is split into experts in ``orthogonalize``."""
        return [(p, p.grad, buf)]

    def orthogonalize(self, update: torch.Tensor, group: dict) -> torch.Tensor:
        """Newton–Schulz of each whole 2-D matrix in ``update`` (a matrix or an expert bank), laid out as ``update``."""
        def ns(m: torch.Tensor) -> torch.Tensor:
            if m.ndim == 2:
                return zeropower_via_newtonschulz(m, group["ns_coefficients"], group["ns_steps"], group["eps"])
            return torch.stack([ns(e) for e in m]) if len(m) else m.to(torch.bfloat16)

        if not isinstance(update, DTensor):
            return ns(update)
        if update.ndim == 3 and tuple(update.placements) == (Shard(0),):  # whole experts on each rank
            return DTensor.from_local(ns(update.to_local()), update.device_mesh, update.placements,
                                      shape=update.shape, stride=update.stride())
        return distribute_tensor(ns(update.full_tensor()), update.device_mesh, update.placements, src_data_rank=None)


def shard_aware_optimizers(optimizers: list[torch.optim.Optimizer]) -> list[torch.optim.Optimizer]:
    """Rebuild every ``optim.Muon`` whose parameters are FSDP2 DTensors as a ``ShardedMuon`` over the same
    parameter groups and hyperparameters; other optimizers (AdamW) handle DTensors themselves."""
    out = []
    for opt in optimizers:
        sharded = any(isinstance(p, DTensor) for g in opt.param_groups for p in g["params"])
        if type(opt) is Muon and sharded:
            opt = ShardedMuon(opt.param_groups, **opt.defaults)
        out.append(opt)
    return out
