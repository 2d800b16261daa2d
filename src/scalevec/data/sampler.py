"""The fixed validation set, bits per byte and the stateless training sampler (DESIGN.md §8).

    val_window_starts(data, T, n, rule)   -> where the fixed validation windows start in the val stream
    val_batches(data, T, n, B, rule)      -> the fixed validation set and the UTF-8 bytes its targets stand for
    val_window_record(starts, rule, data) -> what meta.json records of those windows
    TrainSampler(tokens, T, B, seed).batch(step, rank, world_size)   stateless, so resume needs only the step

This module knows nothing about models or training; it hands out integer token tensors.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch

from scalevec.config import VAL_WINDOWS
from scalevec.data.tokens import TokenData


def val_window_starts(data: TokenData, seq_len: int, n_tokens: int, rule: str = "head") -> np.ndarray:
    """``(n_windows,)`` int64: where each window of ``seq_len + 1`` tokens of the fixed validation set starts in
    ``data.val`` (DESIGN.md §8, ``data.val_windows``; the same for every run with the same data, tokenizer,
    seq_len, val_tokens and rule). ``W = n_tokens // seq_len`` windows at most:

    - ``head``: offsets ``0, T, 2T, ...``: the first ``min(n_tokens, len(val) - 1) // T`` windows, every target
      once. What every study made before ``per_document`` existed scored (on a one-book validation set, the
      first pages of that book).
    - ``per_document``: every validation document (``data.val_doc_starts``) gets one window and the other
      ``W - D`` are shared out in proportion to how many more whole windows each document holds
      (``L_d // T - 1``, floors, so at most ``W`` in all); a document's ``k`` windows start ``L_d // k`` tokens
      apart from its first token, so they do not overlap; a document shorter than a window is scored by the one
      window that ends where it ends (its targets hold the whole document and the next stream token). Our rule:
      a loss that weighs documents by their length, as ``head`` does, but sees every document.

    Raises ``ValueError`` for an unknown rule, a window that does not fit, ``per_document`` on data without
    document boundaries (raw token files: prepare them with ``scalevec prepare-data``) or with fewer windows
    than validation documents (naming the ``data.val_tokens`` that would do).
    """
    if rule not in VAL_WINDOWS:
        raise ValueError(f"data.val_windows={rule!r} is unknown; use {', '.join(VAL_WINDOWS)}")
    if seq_len < 1:
        raise ValueError(f"seq_len={seq_len} must be positive")
    if n_tokens < seq_len:
        raise ValueError(f"data.val_tokens={n_tokens} is smaller than one window of seq_len={seq_len}; raise "
                         "data.val_tokens")
    n_val = len(data.val)
    if n_val - 1 < seq_len:
        raise ValueError(f"the validation stream has {n_val} tokens, fewer than one window of "
                         f"seq_len+1={seq_len + 1}; lower --seq-len or raise data.val_frac")
    if rule == "head":
        return np.arange(min(n_tokens, n_val - 1) // seq_len, dtype=np.int64) * seq_len
    if data.val_doc_starts is None:
        raise ValueError("data.val_windows=per_document needs the validation documents' boundaries, which these "
                         "token files do not record; prepare them with `scalevec prepare-data` or use head")
    starts = np.asarray(data.val_doc_starts, dtype=np.int64)
    n_docs, n_windows = len(starts), n_tokens // seq_len
    if n_windows < n_docs:
        raise ValueError(f"data.val_tokens={n_tokens} gives {n_windows} windows of seq_len={seq_len}, fewer than the "
                         f"{n_docs} validation documents; raise data.val_tokens to at least {n_docs * seq_len}")
    lengths = np.diff(np.append(starts, n_val))
    spare = np.maximum(lengths // seq_len - 1, 0)  # whole windows a document holds beyond its first
    extra = (np.zeros(n_docs, dtype=np.int64) if not spare.sum() else
             np.minimum(spare, (spare * (n_windows - n_docs)) // spare.sum()))
    counts = 1 + extra
    out = []
    for s, length, k in zip(starts.tolist(), lengths.tolist(), counts.tolist()):
        if length < seq_len + 1:  # the window that ends with this document (and the stream's next token)
            out.append(max(s + length - seq_len, 0))
        else:
            out.extend(s + j * (length // k) for j in range(k))
    return np.minimum(np.asarray(out, dtype=np.int64), n_val - 1 - seq_len)


def val_batches(data: TokenData, seq_len: int, n_tokens: int, batch_size: int,
                rule: str = "head") -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int]:
    """The fixed validation set (DESIGN.md §8): the windows of ``val_window_starts(data, seq_len, n_tokens, rule)``
    (``head``: offsets ``0, T, 2T, ...``, so the targets are exactly ``val[1 : n_windows * T + 1]``, each once).

    Returns ``(batches, n_bytes)``: ``batches`` a list of ``(x, y)`` int64 tensors of shape
    ``(<= batch_size, seq_len)``, ``n_bytes`` the UTF-8 bytes those targets stand for (special tokens 0),
    the denominator of ``bits_per_byte``. Raises ``ValueError`` if not even one window fits, and what
    ``val_window_starts`` raises.
    """
    if seq_len < 1 or batch_size < 1:
        raise ValueError(f"seq_len={seq_len} and batch_size={batch_size} must be positive")
    starts = val_window_starts(data, seq_len, n_tokens, rule)
    if rule == "head":  # one contiguous read: the stream the golden losses were recorded on
        stream = torch.from_numpy(np.asarray(data.val[: len(starts) * seq_len + 1], dtype=np.int64))
        x = stream[:-1].view(len(starts), seq_len)
        y = stream[1:].view(len(starts), seq_len)
    else:
        windows = torch.from_numpy(np.asarray(data.val[starts[:, None] + np.arange(seq_len + 1)], dtype=np.int64))
        x, y = windows[:, :-1], windows[:, 1:]
    batches = [(x[i:i + batch_size], y[i:i + batch_size]) for i in range(0, len(starts), batch_size)]
    n_bytes = int(data.token_bytes[y.numpy()].sum())
    return batches, n_bytes


def val_window_record(starts: np.ndarray, rule: str, data: TokenData, seq_len: int) -> dict:
    """What a run records of its validation windows (meta.json's ``validation_split.windows``): the rule, seq_len,
    how many windows, how many validation documents they touch (``per_document``: all) and
    ``starts_sha256``, the SHA-256 of the window starts as decimal lines, so two runs can be checked to score the
    same tokens."""
    out = {"rule": rule, "seq_len": int(seq_len), "windows": int(len(starts)),
           "tokens_scored": int(len(starts)) * seq_len,
           "starts_sha256": hashlib.sha256("".join(f"{int(i)}\n" for i in starts).encode()).hexdigest()}
    if data.val_doc_starts is not None:
        # the last input token of a window lies in the document it scores (its last target may open the next one)
        doc = np.searchsorted(np.asarray(data.val_doc_starts), starts + seq_len - 1, side="right") - 1
        out |= {"val_docs": int(len(data.val_doc_starts)), "docs_scored": int(len(np.unique(doc)))}
    return out


def bits_per_byte(sum_nats: float, n_bytes: int) -> float:
    """``sum_nats / (ln 2 * n_bytes)``: summed cross-entropy (nats) over the validation targets per
    UTF-8 byte they stand for (DESIGN.md §8). Raises ``ValueError`` if ``n_bytes <= 0``."""
    if n_bytes <= 0:
        raise ValueError(f"n_bytes={n_bytes}: the targets stand for no text; evaluate on more validation tokens")
    return sum_nats / (math.log(2) * n_bytes)


# --------------------------------------------------------------------------------------------- training sampler


FEISTEL_ROUNDS = 6


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer (a bijective 64-bit mixer), elementwise on uint64 (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def feistel_permutation(i: np.ndarray, n: int, keys: np.ndarray) -> np.ndarray:
    """``perm(i)`` for a pseudo-random permutation of ``[0, n)`` that is never materialized.

    A balanced Feistel network on ``2h`` bits (the smallest even width holding ``n - 1``), one round per
    uint64 key with SplitMix64 as round function, is a bijection of ``[0, 4^h)``; cycle-walking (apply it
    again while the value is ``>= n``, at most ~4 times on average) restricts it to ``[0, n)`` (Black &
    Rogaway 2002). ``i``: int array with values in ``[0, n)``; returns int64 of the same shape.
    """
    bits = max(2, int(n - 1).bit_length())
    h = (bits + 1) // 2
    mask, shift = np.uint64((1 << h) - 1), np.uint64(h)

    def rounds(y: np.ndarray) -> np.ndarray:
        left, right = y >> shift, y & mask
        for k in keys:
            left, right = right, left ^ (_mix64(right ^ k) & mask)
        return (left << shift) | right

    with np.errstate(over="ignore"):
        y = rounds(np.asarray(i, dtype=np.uint64).ravel())
        out_of_range = y >= n
        while out_of_range.any():
            y[out_of_range] = rounds(y[out_of_range])
            out_of_range = y >= n
    return y.astype(np.int64).reshape(np.shape(i))


class TrainSampler:
    """Stateless, resumable training batches (DESIGN.md §8).

    The stream is cut into ``n_windows = (len(tokens) - 1) // seq_len`` non-overlapping windows of
    ``seq_len + 1`` tokens. Global sample ``g = step * batch_size + b`` is window ``perm_e[g % n_windows]``
    of epoch ``e = g // n_windows``, where ``perm_e`` is a permutation seeded by ``(seed, e)``: no window
    repeats within an epoch, and the global batch of a step depends only on ``(seed, step)``. So resume
    needs only the step, and every strategy trained with the same seed sees the same data in the same
    order. Rank ``r`` of ``W`` takes the disjoint slice ``[r*B/W, (r+1)*B/W)`` of the global batch.
    (Permutations come from numpy's ``default_rng``: reproducible on one install, not promised across
    numpy versions.)

    ``order``: ``"permutation"`` (above; it holds 8 bytes per window in memory, 56 MB for 1 GB of bytes at
    seq_len 128) or ``"feistel"``, where ``perm_e`` is ``feistel_permutation`` keyed by ``(seed, e)``:
    computed per index, O(batch) memory whatever the corpus size. Default: the token container's
    ``sample_order`` attribute (``prepared.ShardedTokens``: ``feistel``), else ``permutation``.

    ``pin_memory``: batches in page-locked memory (needs CUDA), so that ``.to(cuda, non_blocking=True)``
    copies them without stalling the host; the values are the same.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int, order: str | None = None,
                 pin_memory: bool = False):
        self.pin_memory = pin_memory  # page-locked batches, for non_blocking copies to a CUDA device
        if seq_len < 1 or batch_size < 1 or seed < 0:
            raise ValueError(f"seq_len={seq_len} and batch_size={batch_size} must be positive and seed={seed} >= 0")
        self.tokens, self.seq_len, self.batch_size, self.seed = tokens, seq_len, batch_size, seed
        self.order = order or getattr(tokens, "sample_order", "permutation")
        if self.order not in ("permutation", "feistel"):
            raise ValueError(f"order={self.order!r} is unknown; use permutation or feistel")
        self.n_windows = (len(tokens) - 1) // seq_len
        if self.n_windows < 1:
            raise ValueError(f"the training stream has {len(tokens)} tokens, fewer than one window of "
                             f"seq_len+1={seq_len + 1}; "
                             f"lower --seq-len or use more data")
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) >= 4:
                self._perms.clear()
            self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.n_windows)
        return self._perms[epoch]

    def windows(self, step: int) -> np.ndarray:
        """``(batch_size,)`` int64: the window indices of the global batch of ``step``."""
        if step < 0:
            raise ValueError(f"step={step} must be >= 0")
        g = step * self.batch_size + np.arange(self.batch_size, dtype=np.int64)
        epochs, pos = np.divmod(g, self.n_windows)
        out = np.empty_like(g)
        for e in np.unique(epochs):
            mask = epochs == e
            if self.order == "feistel":
                keys = np.random.default_rng([self.seed, int(e)]).integers(0, 2**64 - 1, size=FEISTEL_ROUNDS,
                                                                          dtype=np.uint64, endpoint=True)
                out[mask] = feistel_permutation(pos[mask], self.n_windows, keys)
            else:
                out[mask] = self._perm(int(e))[pos[mask]]
        return out

    def batch(self, step: int, rank: int = 0, world_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)``: int64 tensors ``(batch_size // world_size, seq_len)``, ``y`` = ``x`` shifted by one (pinned
        with ``pin_memory``). Raises ``ValueError`` if batch_size is not divisible by world_size or rank is out of
        range."""
        if world_size < 1 or self.batch_size % world_size:
            raise ValueError(f"batch_size={self.batch_size} is not divisible by world_size={world_size}; "
                             f"use a global batch that is a multiple of the number of processes")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} is outside [0, world_size={world_size})")
        per_rank = self.batch_size // world_size
        starts = self.windows(step)[rank * per_rank:(rank + 1) * per_rank] * self.seq_len
        idx = starts[:, None] + np.arange(self.seq_len + 1)  # (b, T+1)
        w = torch.from_numpy(np.asarray(self.tokens[idx], dtype=np.int64))
        x, y = w[:, :-1].contiguous(), w[:, 1:].contiguous()
        return (x.pin_memory(), y.pin_memory()) if self.pin_memory else (x, y)
