"""The fixed validation set, bits per byte and the stateless training sampler (DESIGN.md §8).

    val_batches(data, seq_len, n, B)  -> the fixed validation set and the UTF-8 bytes its targets stand for
    TrainSampler(tokens, T, B, seed).batch(step, rank, world_size)   stateless, so resume needs only the step

This module knows nothing about models or training; it hands out integer token tensors.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from scalevec.data.tokens import TokenData


def val_batches(data: TokenData, seq_len: int, n_tokens: int,
                batch_size: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int]:
    """The fixed validation set (DESIGN.md §8): the same for every run with the same data, tokenizer and seq_len.

    Windows of ``seq_len + 1`` tokens at offsets ``0, T, 2T, ...`` of the val stream, so the targets
    are exactly ``val[1 : n_windows * T + 1]``, each once, with ``n_windows = min(n_tokens, len(val) - 1) // T``.
    Returns ``(batches, n_bytes)``: ``batches`` a list of ``(x, y)`` int64 tensors of shape
    ``(<= batch_size, seq_len)``, ``n_bytes`` the UTF-8 bytes those targets stand for (special tokens 0),
    the denominator of ``bits_per_byte``. Raises ``ValueError`` if not even one window fits.
    """
    if seq_len < 1 or batch_size < 1:
        raise ValueError(f"seq_len={seq_len} and batch_size={batch_size} must be positive")
    if n_tokens < seq_len:
        raise ValueError(f"data.val_tokens={n_tokens} is smaller than one window of seq_len={seq_len}; raise "
                         "data.val_tokens")
    if len(data.val) - 1 < seq_len:
        raise ValueError(f"the validation stream has {len(data.val)} tokens, fewer than one window of "
                         f"seq_len+1={seq_len + 1}; "
                         f"lower --seq-len or raise data.val_frac")
    n_windows = min(n_tokens, len(data.val) - 1) // seq_len
    stream = torch.from_numpy(np.asarray(data.val[: n_windows * seq_len + 1], dtype=np.int64))
    x = stream[:-1].view(n_windows, seq_len)
    y = stream[1:].view(n_windows, seq_len)
    batches = [(x[i:i + batch_size], y[i:i + batch_size]) for i in range(0, n_windows, batch_size)]
    n_bytes = int(data.token_bytes[stream[1:].numpy()].sum())
    return batches, n_bytes


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
