"""What a run logs about its own state, besides the loss: scale-vector and MoE statistics (DESIGN.md §8).

Every ``train.log_every`` steps the trainer puts ``scale_stats`` (mean, std, min, max of every effective
γ) and, for an MoE model, ``moe_stats`` (load balance, router entropy) into its ``metrics.jsonl`` row.
Both gather across ranks, so every rank must call them. Reads the model; changes nothing.
"""

from __future__ import annotations

import torch

from scalevec.model.scales import scale_vectors
from scalevec.training import distributed


def scale_stats(model: torch.nn.Module) -> dict[str, dict[str, float]]:
    """Mean, std, min, max of every effective scale vector (DESIGN.md §8 telemetry)."""
    out = {}
    for name, g in scale_vectors(model).items():
        g = distributed.full_tensor(g).float().flatten()  # FSDP2: gather the sharded vector (every rank calls)
        out[name] = {"mean": g.mean().item(), "std": g.std(unbiased=False).item(), "min": g.min().item(),
                     "max": g.max().item()}
    return out


def moe_stats(model: torch.nn.Module) -> dict:
    """Per-layer MoE telemetry that ``moe.MoE`` leaves in ``last_stats`` (load balance, entropy); with
    several processes every tensor is averaged over ranks (each rank's last micro-batch; every rank calls)."""
    out = {}
    world = distributed.world_size()
    for name, m in model.named_modules():
        stats = getattr(m, "last_stats", None)
        if stats:
            if world > 1:
                stats = {k: distributed.all_reduce_sum(v.float()) / world if torch.is_tensor(v) else v
                         for k, v in stats.items()}
            out[name] = {k: (v.tolist() if torch.is_tensor(v) else v) for k, v in stats.items()}
    return out


__all__ = ["moe_stats", "scale_stats"]
