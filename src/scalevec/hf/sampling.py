"""scalevec's own sampling loop: what ``scalevec generate`` ran before it used transformers' ``generate()``, kept
as the reference (DESIGN.md §10).

``sample`` decodes from any ``(1, T) -> (1, T, V)`` logits function, with or without a KV cache; ``export
--verify`` compares an export's greedy tokens with it, ``bench --generate`` times it against transformers'
``generate()`` (which ``scalevec generate`` now uses, ``generate.py``), and the tests hold the two equal.
Its own module so that export (which verifies with it) and generate (which loads exports) need not import
each other. ``check_sampling`` is the one validation of the sampling flags.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

LogitsFn = Callable[[Tensor], Tensor]  # tokens (1, T) -> logits (1, T, V)
# (new tokens (1, T), cache or None to start) -> (logits (1, T, V), the cache extended by those tokens)
CachedFn = Callable[[Tensor, object], tuple[Tensor, object]]


def check_sampling(max_new_tokens: int, temperature: float, top_k: int | None, top_p: float = 1.0,
                   repetition_penalty: float = 1.0, stop: tuple[str, ...] | list[str] = ()) -> None:
    """Raise ``ValueError`` for ``max_new_tokens < 1``, ``temperature < 0`` (or NaN, or infinite), ``top_k < 1``,
    ``top_p`` outside (0, 1], ``repetition_penalty <= 0`` (or NaN, or infinite) or an empty stop string."""
    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens={max_new_tokens} must be >= 1 (default 200)")
    if not 0 <= temperature < float("inf"):
        raise ValueError(f"--temperature={temperature} must be >= 0 and finite (0 = greedy; an infinite one samples "
                         f"uniformly)")
    if top_k is not None and top_k < 1:
        raise ValueError(f"--top-k={top_k} must be >= 1 (or leave it out for the full distribution)")
    if not 0 < top_p <= 1:
        raise ValueError(f"--top-p={top_p} must be in (0, 1] (1 = the full distribution, the default)")
    if not 0 < repetition_penalty < float("inf"):
        raise ValueError(f"--repetition-penalty={repetition_penalty} must be > 0 and finite (1 = none, the default; "
                         f"> 1 discourages repeating tokens)")
    if any(not st for st in stop):
        raise ValueError("--stop '' is empty and would stop before the first token; pass a non-empty string")


def sample(logits_fn: LogitsFn, prompt: list[int], max_new_tokens: int, temperature: float = 1.0,
           top_k: int | None = None, seed: int = 0, context: int | None = None,
           eos_id: int | None = None, cached: CachedFn | None = None) -> list[int]:
    """Autoregressively sample up to ``max_new_tokens`` token ids after ``prompt``; return the new ids.

    ``logits_fn`` maps ``(1, T)`` ids to ``(1, T, V)`` logits; each step feeds the last ``context`` ids.
    With ``cached`` (a ``CachedFn``) the prompt is fed once and then one new id per step, while the text
    fits in ``context``; past it every step reruns the last ``context`` ids through ``logits_fn``.
    ``temperature == 0``: greedy (argmax of the last position's logits). Otherwise the next id is drawn
    from ``softmax(logits / temperature)`` restricted to the ``top_k`` largest logits when given, with a
    ``torch.Generator`` seeded by ``seed``. Stops after emitting ``eos_id``. Raises ``ValueError`` for an
    empty prompt, ``max_new_tokens < 0``, ``temperature < 0`` or ``top_k < 1``.
    """
    check_sampling(max_new_tokens, temperature, top_k)
    if not prompt:
        raise ValueError("the prompt encodes to no tokens and the tokenizer has no BOS; pass a non-empty --prompt")
    gen = torch.Generator().manual_seed(seed)
    ids = list(prompt)
    cache, n_cached = None, 0
    with torch.no_grad():
        for _ in range(max_new_tokens):
            if cached is not None and (not context or len(ids) <= context):
                out, cache = cached(torch.tensor([ids[n_cached:]]), cache)  # only the tokens not yet cached
                n_cached = len(ids)
            else:
                out = logits_fn(torch.tensor([ids[-context:] if context else ids]))
            logits = out[0, -1].float().cpu()  # (V,)
            if temperature == 0:
                nxt = int(logits.argmax())
            else:
                logits = logits / temperature
                if top_k is not None and top_k < logits.numel():
                    kth = torch.topk(logits, top_k).values[-1]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                nxt = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
            ids.append(nxt)
            if nxt == eos_id:
                break
    return ids[len(prompt):]


__all__ = ["CachedFn", "LogitsFn", "check_sampling", "sample"]
