"""Held-out perplexity and bits-per-byte of a token stream, as the trainer's validation defines them (DESIGN.md §8).

    text_stream(text, tok)          -> the ids of one document: [start token] + encode(text) + [EOS]
    perplexity(nll, stream, T, tb)  -> {"nats_per_token", "perplexity", "bits_per_byte", "tokens", "bytes"}

Windows are the trainer's (``data.sampler.val_batches``): ``seq_len + 1`` tokens at offsets ``0, T, 2T, ...``
of the stream, no overlap, each target once; here a last, shorter window scores the tokens that remain, so
every target of the stream counts (the trainer drops that tail). ``nats_per_token`` is the token-weighted
mean cross-entropy (summed in float64), ``perplexity = exp(nats_per_token)`` and ``bits_per_byte`` the
summed nats over ``ln 2`` times the UTF-8 bytes the targets stand for (``data.sampler.bits_per_byte``,
special tokens 0 bytes) or, for a text file, the UTF-8 bytes of the text: the same number for one document
with a start token and a byte-level tokenizer (``bytes``, ``bpe:N``).

This module knows no model format: the caller passes ``nll(x, y) -> summed nats`` for a batch of windows.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from scalevec.data.sampler import bits_per_byte, val_batches
from scalevec.data.tokenizer import Tokenizer, start_token
from scalevec.data.tokens import TokenData

NllFn = Callable[[Tensor, Tensor], Tensor]  # (x (B, T), y (B, T)) int64 -> summed cross-entropy (nats), a scalar


def text_stream(text: str, tok: Tokenizer) -> np.ndarray:
    """int64 ids of ``text`` laid out as one training document (``data.corpus``): the tokenizer's BOS (a
    ``bytes`` tokenizer: the token of ``BYTES_PREFIX``, the newline that precedes every training document,
    ``tokenizer.start_token``) + ``encode(text)`` + its EOS, if any. With a start token every token of the
    text is a target. Raises ``ValueError`` for a text that gives fewer than 2 ids."""
    start = start_token(tok)
    eos = [tok.eos_id] if tok.eos_id is not None else []
    ids = ([start] if start is not None else []) + tok.encode(text) + eos
    if len(ids) < 2:
        raise ValueError(f"the text gives {len(ids)} token(s), nothing to predict; pass a longer text")
    return np.asarray(ids, dtype=np.int64)


def windows(stream: np.ndarray, seq_len: int, token_bytes: np.ndarray,
            batch_size: int) -> tuple[list[tuple[Tensor, Tensor]], int]:
    """``(batches, n_bytes)``: the trainer's validation windows of ``stream`` (``val_batches`` over every full
    window) and a last window of the ``r < seq_len`` targets left, so the targets are ``stream[1:]``, each
    once; ``n_bytes`` the UTF-8 bytes they stand for."""
    if seq_len < 1:
        raise ValueError(f"seq_len={seq_len} must be positive")
    n_targets = len(stream) - 1
    n_full = n_targets // seq_len
    batches, n_bytes = [], 0
    if n_full:
        data = TokenData(train=stream[:0], val=stream, tokenizer=None, token_bytes=token_bytes)
        batches, n_bytes = val_batches(data, seq_len, n_full * seq_len, batch_size)
    tail = np.asarray(stream[n_full * seq_len:], dtype=np.int64)
    if len(tail) > 1:
        t = torch.from_numpy(tail)
        batches.append((t[None, :-1], t[None, 1:]))
        n_bytes += int(token_bytes[tail[1:]].sum())
    return batches, n_bytes


@torch.no_grad()
def perplexity(nll: NllFn, stream: np.ndarray, seq_len: int, token_bytes: np.ndarray, batch_size: int = 8,
               n_bytes: int | None = None) -> dict:
    """Score every target of ``stream`` with ``nll`` over ``windows``; return ``nats_per_token``, ``perplexity``,
    ``bits_per_byte``, ``tokens`` (targets scored), ``bytes`` and ``seq_len``. ``n_bytes``: the denominator of
    bits-per-byte when the text is known (its UTF-8 bytes; the same number for a byte-level tokenizer, more
    for one that drops characters it lacks), else the bytes the targets stand for. Raises ``ValueError`` for
    a stream with no target, ids outside ``token_bytes`` (the model's tokenizer) or no bytes."""
    stream = np.asarray(stream)
    if len(stream) < 2:
        raise ValueError(f"the token stream has {len(stream)} token(s), nothing to predict; pass a longer text")
    if int(stream.max()) >= len(token_bytes) or int(stream.min()) < 0:
        raise ValueError(f"the token stream holds ids outside the tokenizer's {len(token_bytes)} ids; evaluate "
                         f"data tokenized with the model's tokenizer")
    batches, target_bytes = windows(stream, seq_len, token_bytes, batch_size)
    n_bytes = target_bytes if n_bytes is None else n_bytes
    total, n = 0.0, 0
    for x, y in batches:
        total += float(nll(x, y).double())
        n += y.numel()
    mean = total / n
    return {"nats_per_token": mean, "perplexity": math.exp(mean) if mean < 700 else math.inf,
            "bits_per_byte": bits_per_byte(total, n_bytes), "tokens": n, "bytes": n_bytes, "seq_len": seq_len}
