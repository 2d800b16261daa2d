"""The validation split: which documents are held out, by one of three rules (DESIGN.md §8, docs/data.md).

    plan_split(rule, val_frac, seed, sizes)       -> Split      the rule, ready to apply while documents stream
    split_stream(docs, split, record)             -> (is_val, text) per document (or part), in order
    split_documents(docs, val_frac, rule, seed)   -> train docs, val docs, SplitRecord   (the in-memory path)
    SplitRecord.as_dict()                         -> what meta.json and a prepared manifest record of the split

Both data paths (``train --data FILE``: ``corpus.prepare_data``; ``scalevec prepare-data``: ``prepared.py``)
split through these functions, so one corpus with one rule gives the same validation documents on both. The
rules (``data.val_split`` / ``prepare-data --val-split``; our choices), over the documents in the order
``documents.iter_documents`` gives them, numbered from 0, blank ones not counted:

- ``tail`` (the default, what the golden losses and every committed result use): the shortest run of *last*
  documents holding at least ``val_frac`` of the characters, at least one document left for training: for
  the bundled Shakespeare at 0.1, its last 4 plays (10.4 %), whole plays never seen in training. A corpus of
  one document is cut at the line boundary before the ``1 - val_frac`` point of its characters. It needs
  every document's size before the first is assigned (prepare-data counts them in a first pass). On a corpus
  sorted by path, date or topic it holds out one contiguous slice: use ``strided`` or ``random`` there.
- ``strided``: document ``i`` is validation when ``floor((i+1)·val_frac) > floor(i·val_frac)``: every
  ``1/val_frac``-th document (i = 9, 19, 29, ... at 0.1), spread evenly; ``val_frac`` is a share of documents.
- ``random``: document ``i`` is validation when ``u(seed, i) < val_frac``, with ``u`` the first 8 bytes of
  BLAKE2b(``"{seed}:{i}"``) read as a fraction of 2^64: each document on its own, so about ``val_frac`` of the
  documents (binomially many) and a document's side does not depend on the rest of the corpus.

``SplitRecord`` counts what a split did and names the validation documents: their number, the first and last
index and ``val_index_sha256``, the SHA-256 of their indices written as decimal lines
(``"".join(f"{i}\\n" for i in val)``), so two runs can be checked to hold out the same documents.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from scalevec.config import VAL_SPLITS


@dataclass(frozen=True)
class Split:
    """One split rule with its parameters; for ``tail``, also the corpus's document count and how many of its
    last documents are validation (``n_val``; 0 when its one document is cut instead)."""

    rule: str
    val_frac: float
    seed: int = 0
    n_docs: int = 0  # tail only
    n_val: int = 0  # tail only
    tail_note: str = ""  # tail only: how the last documents came out (the one-document cut writes its own)

    def is_val(self, i: int) -> bool:
        """Whether document ``i`` (0-based, blank documents not counted) is validation (module docstring)."""
        if self.rule == "tail":
            return i >= self.n_docs - self.n_val
        if self.rule == "strided":
            return math.floor((i + 1) * self.val_frac) > math.floor(i * self.val_frac)
        u = int.from_bytes(hashlib.blake2b(f"{self.seed}:{i}".encode(), digest_size=8).digest(), "little")
        return u / 2**64 < self.val_frac

    @property
    def cuts_one_document(self) -> bool:
        return self.rule == "tail" and self.n_docs == 1

    def describe(self) -> str:
        """The rule in words, with its parameters (what a prepared manifest stores as ``split_rule``)."""
        if self.rule == "tail":
            return (f"tail: the shortest run of last documents holding >= {self.val_frac:g} of the characters "
                    f"(one document: cut at a line)")
        if self.rule == "strided":
            return f"strided: document i is validation when floor((i+1)*{self.val_frac:g}) > floor(i*{self.val_frac:g})"
        return f"random: document i is validation when u(seed {self.seed}, i) < {self.val_frac:g}"


def plan_split(rule: str, val_frac: float, seed: int = 0, sizes: Sequence[int] | None = None) -> Split:
    """The ``Split`` of ``rule`` at ``val_frac`` (``seed``: ``random`` only). ``tail`` needs ``sizes``, every
    document's length in characters, in order; the other rules ignore it.

    Raises ``ValueError`` for an unknown rule, a ``val_frac`` outside (0, 1), or ``tail`` without sizes.
    """
    if rule not in VAL_SPLITS:
        raise ValueError(f"validation split {rule!r} is unknown; use {', '.join(VAL_SPLITS)}")
    if not 0 < val_frac < 1:
        raise ValueError(f"val_frac={val_frac} must be in (0, 1) (try 0.1)")
    if rule != "tail":
        return Split(rule, val_frac, seed)
    if sizes is None or not len(sizes):
        raise ValueError("the tail split needs the size of every document (count them first)")
    n = len(sizes)
    if n == 1:
        return Split(rule, val_frac, seed, n_docs=1)
    sizes = np.asarray(sizes, dtype=np.int64)
    tail = np.cumsum(sizes[::-1])  # characters held by the last k documents, k = 1..n
    n_val = min(int(np.searchsorted(tail, val_frac * sizes.sum())) + 1, n - 1)
    note = (f"by document: the last {n_val} of {n} documents "
            f"({tail[n_val - 1] / sizes.sum():.1%} of characters) are validation")
    return Split(rule, val_frac, seed, n_docs=n, n_val=n_val, tail_note=note)


class SplitRecord:
    """What a split did, counted while its documents go by (``split_stream`` fills it): documents and
    characters on each side, the first and last validation index and the hash of all of them (module
    docstring). ``note``: one line saying how the split came out."""

    def __init__(self, split: Split):
        self.split = split
        self.documents = 0
        self.docs = {False: 0, True: 0}  # is_val -> documents (a cut document counts on both sides)
        self.chars = {False: 0, True: 0}
        self.val_first: int | None = None
        self.val_last: int | None = None
        self._sha = hashlib.sha256()
        self.cut_note = ""

    def add(self, i: int, is_val: bool, n_chars: int) -> None:
        self.docs[is_val] += 1
        self.chars[is_val] += n_chars
        if is_val and self.val_last != i:
            self.val_first = i if self.val_first is None else self.val_first
            self.val_last = i
            self._sha.update(f"{i}\n".encode())

    @property
    def note(self) -> str:
        s = self.split
        if s.rule == "tail":
            return self.cut_note or s.tail_note
        total = sum(self.chars.values()) or 1
        how = f"every {1 / s.val_frac:g}th document" if s.rule == "strided" else f"seed {s.seed}"
        return (f"{s.rule} ({how}): {self.docs[True]} of {self.documents} documents "
                f"({self.chars[True] / total:.1%} of characters) are validation")

    def check(self, source: str, fix: str = "raise val_frac") -> None:
        """``ValueError`` when a side came out empty (``strided`` / ``random`` on few documents), naming the fix."""
        if self.docs[False] and self.docs[True]:
            return
        empty = "training" if not self.docs[False] else "validation"
        raise ValueError(f"data source {source!r} has {self.documents} document(s): the {empty} split would be empty "
                         f"under the {self.split.rule} split at val_frac={self.split.val_frac:g} "
                         f"({self.split.describe()}); use more documents, {fix}, or the tail split")

    def as_dict(self, train_tokens: int | None = None, val_tokens: int | None = None) -> dict:
        """The record for meta.json / a prepared manifest (JSON types only); token counts when given."""
        out = {"rule": self.split.rule, "val_frac": self.split.val_frac,
               **({"seed": self.split.seed} if self.split.rule == "random" else {}),
               "note": self.note, "documents": self.documents,
               "train_docs": self.docs[False], "val_docs": self.docs[True],
               "train_chars": self.chars[False], "val_chars": self.chars[True],
               "val_first_doc": self.val_first, "val_last_doc": self.val_last,
               "val_index_sha256": self._sha.hexdigest()}
        if train_tokens is not None:
            out |= {"train_tokens": int(train_tokens), "val_tokens": int(val_tokens)}
        return out


def split_stream(docs: Iterable[str], split: Split, record: SplitRecord | None = None) -> Iterator[tuple[bool, str]]:
    """``(is_val, text)`` for each document of ``docs`` in order, by ``split``; the one document of a ``tail``
    split over one document comes out as two parts, training then validation. ``record`` (optional) counts
    them. Raises ``ValueError`` when that one document has no line break to cut at."""
    for i, doc in enumerate(docs):
        if record is not None:
            record.documents = i + 1
        if split.cuts_one_document:
            parts = _cut_one_document(doc, split.val_frac, record)
        else:
            parts = ((split.is_val(i), doc),)
        for is_val, text in parts:
            if record is not None:
                record.add(i, is_val, len(text))
            yield is_val, text


def split_documents(docs: list[str], val_frac: float, rule: str = "tail", seed: int = 0,
                    source: str = "corpus") -> tuple[list[str], list[str], SplitRecord]:
    """Split a list of documents by ``rule`` (module docstring): ``(train_docs, val_docs, record)``;
    ``source`` names the corpus in an error.

    Raises ``ValueError`` for a bad rule or ``val_frac``, a one-document corpus without a line break to cut
    at (``tail``), or a side left empty (``strided`` / ``random``, ``SplitRecord.check``)."""
    split = plan_split(rule, val_frac, seed, [len(d) for d in docs] if rule == "tail" else None)
    record = SplitRecord(split)
    train, val = [], []
    for is_val, text in split_stream(docs, split, record):
        (val if is_val else train).append(text)
    record.check(source, fix="raise data.val_frac")
    return train, val, record


def _cut_one_document(text: str, val_frac: float, record: SplitRecord | None) -> tuple[tuple[bool, str], ...]:
    target = round(len(text) * (1 - val_frac))
    cut = text.rfind("\n", 0, target) + 1  # start of the line that holds the target character
    if cut == 0:
        cut = text.find("\n", target) + 1
    if cut == 0 or not text[:cut].strip() or not text[cut:].strip():
        raise ValueError("the corpus is one document without a line break to split at for validation; "
                         "add line breaks, or separate documents with two blank lines")
    if record is not None:
        line = text.count("\n", 0, cut) + 1
        record.cut_note = (f"one document only: split at line {line} of {text.count(chr(10)) + 1}; "
                           f"the last {1 - cut / len(text):.1%} of characters are validation")
    return (False, text[:cut]), (True, text[cut:])


__all__ = ["Split", "SplitRecord", "plan_split", "split_documents", "split_stream"]
