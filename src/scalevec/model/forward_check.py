"""A forward pass on fixed tokens before any output: refuse a model whose logits are not finite, naming the layer.

Finite weights do not make a finite model: one matrix set to 3e38 (finite in float32) overflows its matmul, and
every logit after it is inf or NaN; ``generate`` then printed NUL bytes and ``eval`` a perplexity of inf, with
exit 0. A check of the stored values cannot see that, one forward can. ``nonfinite_layer`` runs the model once on
``probe_tokens`` with a forward hook on every module and names the first module, in the order they ran, whose
output holds a NaN or an infinity; ``check_forward`` turns that into a one-line ``ValueError``. Used by every
command that loads a model to produce output from it (``generate``, ``eval``, ``convert``, ``export``), for our
``Transformer`` and for a transformers model alike (both take ``(B, T)`` token ids; a transformers model returns
its logits in ``.logits``). This module computes nothing else and changes no weight.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn

PROBE_SHAPE = (2, 16)  # sequences x tokens of the probe: short enough to cost nothing next to loading the model


def probe_tokens(vocab_size: int, context: int, device: torch.device | str = "cpu") -> Tensor:
    """Fixed token ids ``(2, min(16, context))`` in ``[0, vocab_size)``, seeded (the same on every call)."""
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab_size, (PROBE_SHAPE[0], min(PROBE_SHAPE[1], context)), generator=g).to(device)


def _tensors(out) -> Iterator[Tensor]:
    """The floating-point tensors of a module's output: a tensor, the items of a tuple or list, the values of a
    mapping (transformers' ``ModelOutput``); anything else (a KV cache object) is skipped."""
    if isinstance(out, Tensor):
        if out.is_floating_point():
            yield out
    elif isinstance(out, (tuple, list)):
        for item in out:
            yield from _tensors(item)
    elif isinstance(out, dict):
        for item in out.values():
            yield from _tensors(item)


def logits_of(out) -> Tensor:
    """The logits of a forward's result: our ``Transformer``'s tensor, or a transformers output's ``.logits``."""
    return out if isinstance(out, Tensor) else out.logits


def nonfinite_layer(model: nn.Module, tokens: Tensor) -> str | None:
    """``None`` when ``model(tokens)`` (``tokens``: ``(B, T)`` ids) gives finite logits; else the name of the first
    module, in the order the forward ran them, whose output holds a NaN or an infinity (``"the logits"`` when no
    module's output does, which a final op outside every module would mean). Runs in ``eval`` mode without
    gradients and restores the model's mode; the hooks are removed whatever happens."""
    first: list[str] = []

    def hook(name: str):
        def record(_module, _inputs, out):
            if not first and any(not bool(torch.isfinite(t).all()) for t in _tensors(out)):
                first.append(name or type(model).__name__)
        return record

    handles = [m.register_forward_hook(hook(name)) for name, m in model.named_modules()]
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            logits = logits_of(model(tokens))
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    if bool(torch.isfinite(logits).all()):
        return None
    return first[0] if first else "the logits"


def check_forward(model: nn.Module, vocab_size: int, context: int, what: str, fix: str) -> None:
    """Run ``model`` once on ``probe_tokens`` and raise ``ValueError`` (one line: ``what``, the first non-finite
    layer, ``fix``) when its logits are not finite. ``vocab_size`` and ``context`` bound the probe's ids and
    length; the probe runs on the device of the model's first parameter."""
    device = next(model.parameters()).device
    tokens = probe_tokens(vocab_size, context, device)
    layer = nonfinite_layer(model, tokens)
    if layer is not None:
        raise ValueError(f"{what} gives non-finite logits on a {tokens.shape[0]}x{tokens.shape[1]}-token probe, "
                         f"first in {layer} (its weights overflow float32 there although each is finite); {fix}")


__all__ = ["PROBE_SHAPE", "check_forward", "logits_of", "nonfinite_layer", "probe_tokens"]
