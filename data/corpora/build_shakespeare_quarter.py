"""Build ``shakespeare-quarter.txt``: the bundled Shakespeare's first training plays holding about a quarter of its
training text, then its four validation plays unchanged: the repetition test, the same N and D over a quarter of
the text, so that the data repeats about four times as often (docs/reproduction.md, "The repetition test").

    python data/corpora/build_shakespeare_quarter.py     # writes data/corpora/shakespeare-quarter.txt, checks it

The bundled corpus (``src/scalevec/data/corpora/shakespeare.txt.gz``, 42 works separated by two blank lines) is
split by the default rule (``tail``, ``val_frac`` 0.1): its last 4 plays are validation. This file keeps the first
plays, in order, while they hold at most 1/4 of the training characters, and appends those same 4 plays, so that
with ``data.val_frac: VAL_FRAC`` (printed, and written in the study file) the tail rule again picks exactly those 4
as validation: the validation tokens are the full corpus's, and a run of D tokens makes ~4× the passes over
training text. Deterministic; prints the SHA-256 of the text (recorded in data/corpora/README.md).
"""

from __future__ import annotations

import gzip
import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from scalevec.data import split  # noqa: E402

OUT = Path(__file__).resolve().parent / "shakespeare-quarter.txt"
SHARE = 0.25


def build() -> tuple[str, float, int]:
    """The text, the ``val_frac`` that makes the tail rule pick the 4 validation plays, and its training chars."""
    text = gzip.open(ROOT / "src/scalevec/data/corpora/shakespeare.txt.gz", "rt", encoding="utf-8").read()
    docs = text.split("\n\n\n")
    full = split.plan_split("tail", 0.1, sizes=[len(d) for d in docs])
    train, val = docs[:full.n_docs - full.n_val], docs[full.n_docs - full.n_val:]
    budget, kept, used = SHARE * sum(len(d) for d in train), [], 0
    for d in train:
        if used + len(d) > budget:
            break
        kept.append(d)
        used += len(d)
    out = kept + val
    sizes = [len(d) for d in out]
    total, last = sum(sizes), sorted(range(len(out)))[-len(val):]
    v4 = sum(sizes[i] for i in last)
    v3 = v4 - sizes[last[0]]
    val_frac = round((v3 + v4) / 2 / total, 4)  # more than the last 3 plays hold, less than the last 4
    check = split.plan_split("tail", val_frac, sizes=sizes)
    assert check.n_val == len(val), (check.n_val, len(val))
    return "\n\n\n".join(out), val_frac, used


if __name__ == "__main__":
    text, val_frac, used = build()
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}: {len(text.encode()):,} bytes, training chars {used:,}, val_frac {val_frac}, sha256 "
          f"{hashlib.sha256(text.encode()).hexdigest()}")
