"""Where the data caches live and how their entries are keyed (DESIGN.md §8).

Shared by the trained-BPE cache (``tokenizer.py``) and the token cache (``corpus.py``): entries are
named by a content hash, so a changed corpus, tokenizer or ``FORMAT_VERSION`` never reuses a stale entry.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

FORMAT_VERSION = 1  # bump when the token-cache layout or the document rules change: old caches are ignored


def cache_root(cache_dir: str | Path = "") -> Path:
    """The cache folder: ``cache_dir`` if given, else ``$SCALEVEC_CACHE``, else ``~/.cache/scalevec``."""
    return Path(cache_dir or os.environ.get("SCALEVEC_CACHE") or "~/.cache/scalevec").expanduser()



def docs_hash(docs: list[str]) -> str:
    """SHA-256 (hex) of the documents, each length-prefixed so that document boundaries count."""
    h = hashlib.sha256()
    for d in docs:
        b = d.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def content_key(*parts: object) -> str:
    """SHA-256 (hex) of ``parts`` by their ``str``: a cache key."""
    return hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).hexdigest()
