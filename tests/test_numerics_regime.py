"""One numerics regime for the research object whatever the wrapper (DESIGN.md §8): bf16 only from
autocast; fp32 parameters, scale vectors and their gradients under DDP and FSDP2 alike."""

from __future__ import annotations

import pytest

from dist_harness import run_distributed
from scalevec.resolve import resolve_config
from scalevec.training import distributed
from scalevec.training.rundir import read_metrics
from scalevec.training.trainer import Trainer


def test_fsdp2_keeps_parameters_and_reductions_in_fp32():
    """FSDP2's policy casts nothing: a bf16 param_dtype would make the residual stream and the scale vectors'
    gradients bf16 under FSDP2 only."""
    mp = distributed.fsdp_policy()
    assert mp.param_dtype is None and mp.reduce_dtype is None and mp.cast_forward_inputs is False


def _bf16_runs(rank: int, root: str) -> dict:
    """20 bf16-autocast steps of a tiny unified model under DDP, then FSDP2, on the same global batches;
    every scale vector's dtype and its gradient's dtype under FSDP2 after the last step."""
    from pathlib import Path

    out = {}
    for mode in ("ddp", "fsdp2"):
        cfg = resolve_config("tiny", "unified", {
            "train.steps": 20, "train.batch_size": 8, "train.micro_batch_size": 4, "train.seq_len": 16,
            "train.eval_every": 100, "train.log_every": 1, "train.dtype": "bfloat16", "train.dist": mode,
            "data.val_tokens": 256, "schedule.warmup": 2, "model.n_layers": 2, "model.d_model": 32, "model.n_heads": 2,
            "model.n_kv_heads": 1, "model.d_ff": 48, "data.cache_dir": str(Path(root) / "cache")})
        distributed.barrier()
        trainer = Trainer(cfg, Path(root) / mode, quiet=True)
        trainer.fit()
        if mode == "fsdp2":
            roles = trainer.model.param_roles()
            out["scale_dtypes"] = sorted({str(p.dtype) for n, p in trainer.model.named_parameters()
                                          if "scale" in roles.get(n, "")})
    if rank == 0:
        out.update({m: [r["loss"] for r in read_metrics(Path(root) / m, "train")] for m in ("ddp", "fsdp2")})
    return out


@pytest.mark.slow
def test_ddp_and_fsdp2_in_bf16_agree(tmp_path):
    """Two gloo ranks, bf16 autocast, 20 steps: DDP and FSDP2 losses within 2e-3 nats at every step. Both run the
    same fp32 parameters through the same autocast; they differ only in how the gradient is reduced (all-reduce vs
    reduce-scatter) and how the clipping norm is summed, which reorders fp32 sums (~1e-7 relative), and bf16
    matmuls amplify such a difference to at most ~1e-3 over 20 steps (bf16 has 8 bits of mantissa: a flipped
    rounding moves a product by 2^-8 relative, the loss by far less). A regime that made the FSDP2 residual
    stream bf16 differs by ~1e-2."""
    got = run_distributed(_bf16_runs, str(tmp_path), world_size=2)[0]
    assert len(got["ddp"]) == len(got["fsdp2"]) == 20
    diffs = [abs(a - b) for a, b in zip(got["ddp"], got["fsdp2"])]
    assert max(diffs) <= 2e-3, diffs
    assert got["scale_dtypes"] == ["torch.float32"]
