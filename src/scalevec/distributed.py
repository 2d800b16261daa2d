"""torch.distributed plumbing for the trainer: process group, model wrapping, gradient sync (DESIGN.md §8).

One process without ``torchrun`` needs none of it: every helper here degrades to a no-op. Under
``torchrun`` (env ``WORLD_SIZE`` > 1) the process group uses nccl on CUDA and gloo on CPU; the model
is wrapped in DDP (``train.dist=ddp``) or sharded with FSDP2 ``fully_shard`` per block and at the root
(``train.dist=fsdp2``), after optional per-block ``torch.compile`` (torchtitan's order).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from .config import TrainConfig


@dataclass
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    owns_group: bool  # True if setup() created the process group (and teardown() must destroy it)


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


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
    """Join the process group when launched by torchrun; pick the device. Single process: no group."""
    env_world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(cfg.device, local_rank)
    if env_world > 1 and cfg.dist == "none":
        raise ValueError(f"launched with {env_world} processes but train.dist=none; pass --dist ddp or --dist fsdp2")
    owns = False
    if env_world > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        owns = True
    rank = dist.get_rank() if dist.is_initialized() else 0
    return Dist(rank, world_size(), local_rank, device, owns)


def teardown(d: Dist) -> None:
    if d.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: nn.Module, cfg: TrainConfig, d: Dist) -> nn.Module:
    """Compile (per block) and wrap ``model`` for data parallelism; returns the module to call."""
    if cfg.compile:
        for block in model.layers:
            block.compile()
    if d.world_size == 1 or cfg.dist == "none":
        return model
    if cfg.dist == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[d.device.index] if d.device.type == "cuda" else None)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if d.device.type == "cuda" and cfg.dtype != "float32" else MixedPrecisionPolicy())
    for block in model.layers:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model


@contextmanager
def grad_sync(wrapped: nn.Module, last: bool):
    """Wrap forward *and* backward of a micro-batch: gradients are synchronized only on the last one
    (DDP ``no_sync``; FSDP2 ``set_requires_gradient_sync``). A plain module needs nothing."""
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


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()
