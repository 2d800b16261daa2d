"""The tokenized corpus every data path returns: ``TokenData`` and the dtype of its token ids (DESIGN.md §8)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from scalevec.data.tokenizer import Tokenizer

# The only dtypes token streams are written in: unsigned, so no id reads back negative. A reader accepts no other
# (a float16 or int16 view of the same bytes is a different stream of ids).
TOKEN_DTYPES = ("uint16", "uint32")


def token_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` when every id fits (vocab_size <= 65536), else ``uint32`` (``TOKEN_DTYPES``)."""
    return np.dtype(TOKEN_DTYPES[0] if vocab_size <= 2**16 else TOKEN_DTYPES[1])


@dataclass
class TokenData:
    """The tokenized corpus (DESIGN.md §8), from ``prepare_data``.

    ``train`` / ``val``: 1-D read-only memmaps (uint16 or uint32) of token ids, documents back to back.
    ``token_bytes``: ``(vocab_size,)`` UTF-8 bytes per token (special tokens 0), for bits-per-byte.
    ``meta``: source, tokenizer spec, split note, document and token counts, and ``validation``, the
    record of the validation split (``split.SplitRecord.as_dict``: rule, documents and tokens on each side,
    which documents) that the trainer writes into meta.json. ``from_cache``: whether the streams were read
    from an existing cache entry at ``cache_path``. ``val_doc_starts``: ``(val documents,)`` int64, where each
    validation document starts in ``val`` (what ``data.val_windows=per_document`` samples from); None where the
    path did not work it out (raw token files; the plain path unless per_document asks).
    """

    train: np.ndarray
    val: np.ndarray
    tokenizer: Tokenizer
    token_bytes: np.ndarray
    meta: dict = field(default_factory=dict)
    cache_path: Path | None = None
    from_cache: bool = False
    val_doc_starts: np.ndarray | None = None

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def describe(self) -> str:
        """One line for the start of a run: corpus, how many documents came out of it and how it is cut into
        documents, tokenizer, token counts and how validation was split."""
        m = self.meta
        docs = (f", {m['documents']:,} documents ({m['documents_from']})" if "documents_from" in m else
                f", {m['documents']:,} documents" if "documents" in m else "")
        return (f"data {m['source']!r}{docs}; tokenizer {m['tokenizer']} (vocab {self.vocab_size}): "
                f"train {len(self.train):,} tokens / {m['train_docs']} docs, val {len(self.val):,} tokens / "
                f"{m['val_docs']} docs; split {m['split']}")
