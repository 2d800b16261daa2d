"""The model of a run: built from its config, loaded from its checkpoint, refused when dead (DESIGN.md §8).

What ``scalevec export``, ``generate`` and ``eval`` start from. The weights are the ``model.safetensors``
of ``integrity.model_checkpoint`` (the newest checkpoint, or for a diverged run the newest from before
the trouble), verified against its manifest; ``assert_alive`` refuses a model whose weights or logits
are not finite or whose logits do not depend on the token (the uniform-loss state of a run whose lr blew
it up). Every problem is a one-line ``rundir.RunDirError``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model as st_load_model

from scalevec.model.forward_check import nonfinite_layer, probe_tokens
from scalevec.model.transformer import build_model
from scalevec.training.checkpoint.integrity import model_checkpoint
from scalevec.training.checkpoint.layout import MANIFEST, MODEL_FILE, is_legacy
from scalevec.training.rundir import RunDirError, load_config, one_line


def load_model(run_dir: str | Path, device: str = "cpu", check_alive: bool = True, quiet: bool = False):
    """``(config, model, checkpoint)`` of a run: weights from ``model_checkpoint`` (verified against its
    manifest), and, with ``check_alive``, refused when the model is dead (``assert_alive``).

    Raises ``RunDirError`` for every problem with the run directory: no config, no intact checkpoint,
    a damaged or mismatched ``model.safetensors``, a dead model.
    """
    run_dir = Path(run_dir)
    cfg = load_config(run_dir)
    ckpt, skipped = model_checkpoint(run_dir)
    if not quiet:
        for line in skipped:
            print(f"note: skipped checkpoint {line}", file=sys.stderr)
        if is_legacy(ckpt):
            print(f"note: {ckpt} has no {MANIFEST} (older scalevec or made by hand); its integrity is not checked",
                  file=sys.stderr)
    model = build_model(cfg.model, cfg.scale, device=device)
    path = ckpt / MODEL_FILE
    try:
        st_load_model(model, str(path), device=str(device))
    except (SafetensorError, OSError, RuntimeError, ValueError, KeyError) as e:
        raise RunDirError(f"{path} does not hold this run's model ({one_line(e).split('. ')[0][:200]}); "
                          f"restore the checkpoint or retrain the run") from None
    if check_alive:
        assert_alive(model, cfg, path)
    return cfg, model, ckpt


def assert_alive(model, cfg, path: Path | str = "the model") -> None:
    """Refuse a dead model: non-finite weights, or logits that do not depend on the token (every
    position gives the same distribution over the vocabulary: the uniform-loss state of a run whose lr
    blew it up). One forward of 2 × 16 fixed tokens. Raises ``RunDirError``."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not torch.isfinite(p).all():
                raise RunDirError(f"{path} holds non-finite weights ({name}); it is not a usable model, "
                                  f"use an earlier checkpoint or retrain with a lower lr")
        x = probe_tokens(cfg.model.vocab_size, cfg.model.max_seq_len, next(model.parameters()).device)
        layer = nonfinite_layer(model, x)  # finite weights may still overflow a matmul
        if layer is not None:
            raise RunDirError(f"{path} gives non-finite logits on a {x.shape[0]}x{x.shape[1]}-token probe, first in "
                              f"{layer}; it is not a usable model, use an earlier checkpoint or retrain with a "
                              f"lower lr")
        was_training = model.training
        model.eval()
        logits = model(x).float()
        model.train(was_training)
    spread = (logits - logits[..., :1]).abs().amax().item()
    if spread <= 1e-6 * max(1.0, logits.abs().amax().item()):
        raise RunDirError(f"{path} is a dead model (its logits are equal over the whole vocabulary: loss ln(vocab)); "
                          f"use an earlier checkpoint or retrain with a lower lr")


__all__ = ["assert_alive", "load_model"]
