"""Activation checkpointing and the chunked cross-entropy: same gradients, less memory (docs/performance.md).

Checkpointing re-runs the same CPU operations on the same inputs, so its gradients are bitwise those of
the plain path. The chunked loss sums the cross-entropy chunk by chunk, which reorders fp32 additions:
its gradients agree to 1e-6 of the whole gradient's norm (entries that are zero in theory, like the
magnitude gradients of scale-invariant directions at init, are compared against that norm, not
themselves; measured ~1e-7). Peak memory is measured as ``scalevec bench`` does on CPU: the bytes
torch's allocator hands out during the step (profiler memory events; deterministic).
"""

from __future__ import annotations

import types

import pytest
import torch

from scalevec import MoEConfig, ScaleConfig, build_model
from scalevec.bench.memory import step_peak_bytes
from scalevec.config import RunConfig, checkpoint_blocks
from scalevec.config.codec import apply_overrides


def _grads(cfg, strategy, blocks, chunk, x, y):
    model = build_model(cfg, ScaleConfig.preset(strategy), seed=0)
    model.set_memory_options(blocks, chunk)
    ce, n, aux = model(x, y)
    (ce / n + aux).backward()
    return ce.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])


@pytest.mark.parametrize("moe", [False, True])
@pytest.mark.parametrize("strategy", ["baseline", "unified"])
def test_memory_options_keep_the_gradients(make_cfg, moe, strategy):
    """Checkpointing: bitwise the plain gradients; chunked CE (chunks not dividing the tokens): within 1e-6."""
    cfg = make_cfg(n_layers=3, moe=MoEConfig(n_experts=4, top_k=2, d_expert=16) if moe else None)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 64, (3, 16), generator=g), torch.randint(0, 64, (3, 16), generator=g)
    y[0, :5] = -100  # ignored targets inside a chunk
    ce0, ref = _grads(cfg, strategy, (), 0, x, y)
    ce1, ckpt = _grads(cfg, strategy, (0, 1, 2), 0, x, y)
    assert torch.equal(ce0, ce1) and torch.equal(ckpt, ref)
    for blocks in ((), (1,)):
        ce2, chunked = _grads(cfg, strategy, blocks, 7, x, y)
        assert abs(ce2 - ce0).item() <= 1e-6 * ce0.item()
        assert ((chunked - ref).norm() / ref.norm()).item() <= 1e-6


def test_chunked_loss_without_grad_equals_plain(make_cfg, tokens):
    """Under no_grad (evaluation) the chunked loss equals the plain one (up to summation order)."""
    model = build_model(make_cfg(), ScaleConfig.preset("hg"), seed=0)
    y = tokens.roll(-1, 1)
    with torch.no_grad():
        plain = model(tokens, y)[0]
        model.set_memory_options((), 5)
        chunked = model(tokens, y)[0]
    assert abs(plain - chunked).item() <= 1e-6 * plain.item()


@pytest.mark.slow  # peak-memory measurement: ~1.5 s
def test_memory_options_lower_the_peak(make_cfg):
    """Checkpointing every block and chunking the loss each lower one step's peak allocation on CPU."""
    cfg = make_cfg(d_model=64, n_heads=4, n_kv_heads=4, d_ff=128, n_layers=4, vocab_size=4096, max_seq_len=64)
    model = build_model(cfg, ScaleConfig.preset("baseline"), seed=0)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 4096, (4, 64), generator=g), torch.randint(0, 4096, (4, 64), generator=g)

    def step():
        model.zero_grad(set_to_none=False)
        ce, n, _ = model(x, y)
        (ce / n).backward()

    peaks = {}
    for name, blocks, chunk in (("plain", (), 0), ("ckpt", range(4), 0), ("chunk", (), 64), ("both", range(4), 64)):
        model.set_memory_options(blocks, chunk)
        step()
        peaks[name] = step_peak_bytes(types.SimpleNamespace(step=step), torch.device("cpu"))
    logits = 4 * 64 * 4096 * 4  # bytes of one fp32 copy of the full logits
    assert peaks["ckpt"] < 0.9 * peaks["plain"]
    assert peaks["plain"] - peaks["chunk"] > logits  # more than one full copy of the logits is never made
    assert peaks["both"] < peaks["ckpt"] and peaks["both"] < peaks["chunk"]


@pytest.mark.parametrize("spec, blocks", [("none", []), ("all", [0, 1, 2, 3, 4]), ("every_2", [0, 2, 4]),
                                          ("1,3", [1, 3]), ("[0, 4]", [0, 4])])
def test_checkpoint_block_specs(spec, blocks):
    """train.activation_checkpointing spellings name the right blocks."""
    assert checkpoint_blocks(spec, 5) == blocks


@pytest.mark.parametrize("item, message", [("train.activation_checkpointing=some", "unknown"),
                                           ("train.activation_checkpointing=0,9", "blocks 0..4"),
                                           ("train.loss_chunk_tokens=-1", "loss_chunk_tokens")])
def test_bad_memory_options_are_refused(item, message):
    """A malformed block list or a negative chunk size is one ValueError naming the field."""
    cfg = apply_overrides(RunConfig(), ["model.n_layers=5", item])
    with pytest.raises(ValueError, match=message):
        cfg.validate()
