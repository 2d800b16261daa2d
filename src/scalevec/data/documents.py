"""Text sources to documents, and the validation split (DESIGN.md §8).

    load_documents(source)            -> list[str]   bundled corpus, .txt, folder, .jsonl, .parquet, hf:NAME
    split_documents(docs, val_frac)   -> train docs, val docs, a note   (the last documents are held out)

The bundled corpora are gzip files in ``corpora/`` beside this module (``corpora/README.md``). A .txt
corpus separates its documents by ``DOC_SEP`` ("\\n\\n\\n", the bundled files' own separator).
This module knows nothing about tokenizers, models or training; it hands out lists of strings.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import numpy as np

BUNDLED = ("shakespeare", "kjv")
DOC_SEP = "\n\n\n"  # document separator inside .txt files (and the joiner when a tokenizer has no EOS)
SOURCE_HELP = "use 'shakespeare', 'kjv', a .txt/.jsonl/.parquet file, a folder of .txt files or hf:NAME[:CONFIG]"

# --------------------------------------------------------------------------------------------- documents


def load_documents(source: str) -> list[str]:
    """The documents of ``source`` (DESIGN.md §8), in a fixed order, blank documents dropped.

    ``source``: ``"shakespeare"`` / ``"kjv"`` (bundled, 42 works / 66 books), a ``.txt`` file (documents
    separated by ``"\\n\\n\\n"`` if present, else one document), a folder (one document per ``*.txt``
    file, searched recursively, sorted by path), a ``.jsonl`` file (field ``"text"``), a ``.parquet``
    file (column ``"text"``, needs pyarrow) or ``"hf:NAME[:CONFIG]"`` (split ``train`` of a Hugging Face
    dataset, needs the optional ``datasets`` package and a network or a warm HF cache).

    Raises ``FileNotFoundError`` for a missing path and ``ValueError`` for an empty file or folder,
    no text, non-UTF-8 bytes, a bad jsonl line, a missing ``text`` field/column, an unsupported file
    type, or a missing optional package.
    """
    if source in BUNDLED:
        raw = (resources.files("scalevec.data") / "corpora" / f"{source}.txt.gz").read_bytes()
        docs = _split_text(gzip.decompress(raw).decode("utf-8"))
    elif source.startswith("hf:"):
        docs = _hf_documents(source)
    else:
        path = Path(source).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"data source {source!r} does not exist; {SOURCE_HELP}")
        if path.is_dir():
            docs = _folder_documents(path)
        elif path.suffix == ".txt":
            docs = _split_text(_read_utf8(path))
        elif path.suffix == ".jsonl":
            docs = _jsonl_documents(path)
        elif path.suffix == ".parquet":
            docs = _parquet_documents(path)
        else:
            raise ValueError(f"data file {path} has unsupported type {path.suffix!r}; {SOURCE_HELP}")
    docs = [d for d in docs if d.strip()]
    if not docs:
        raise ValueError(f"data source {source!r} contains no text (only empty or blank documents); {SOURCE_HELP}")
    return docs


def _split_text(text: str) -> list[str]:
    """A .txt file's documents: split on ``DOC_SEP`` if present, newlines trimmed at both ends."""
    parts = text.split(DOC_SEP) if DOC_SEP in text else [text]
    return [p.strip("\n") for p in parts]


def _read_utf8(path: Path, allow_empty: bool = False) -> str:
    """The text of ``path``; ``ValueError`` if it is empty (unless allowed) or not UTF-8 (a BOM is dropped)."""
    data = path.read_bytes()
    if not data and not allow_empty:
        raise ValueError(f"data file {path} is empty (0 bytes); point --data at a file with text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"data file {path} is not UTF-8 text (bad byte at offset {e.start}); "
            f"convert it first, e.g. iconv -f latin1 -t utf-8 {path} > fixed.txt"
        ) from None


def _folder_documents(path: Path) -> list[str]:
    files = sorted(f for f in path.rglob("*.txt") if f.is_file())
    if not files:
        raise ValueError(f"folder {path} has no .txt files; put one document per .txt file in it")
    return [_read_utf8(f, allow_empty=True) for f in files]


def _jsonl_documents(path: Path) -> list[str]:
    docs = []
    # split on "\n" only: str.splitlines would also cut at U+2028, which JSON allows inside strings
    for i, line in enumerate(_read_utf8(path).split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"data file {path} line {i} is not valid JSON ({e.msg}); "
                             f"fix or remove that line") from None
        if not isinstance(row, dict) or "text" not in row:
            raise ValueError(f'data file {path} line {i} has no "text" field; every line must be an object like '
                             f'{{"text": "..."}}')
        if not isinstance(row["text"], str):
            raise ValueError(f'data file {path} line {i}: "text" is a {type(row["text"]).__name__}, not a string; '
                             'store the text as a string')
        docs.append(row["text"])
    return docs


def open_parquet_text(path: Path):
    """A ``pyarrow.parquet.ParquetFile`` with a ``text`` column; ``ValueError`` naming the fix for an empty or
    unreadable file, a missing pyarrow or a missing column (shared by the in-memory and the prepared path)."""
    if path.stat().st_size == 0:
        raise ValueError(f"data file {path} is empty (0 bytes); point --data at a file with text")
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"reading {path} needs pyarrow, which is not installed; pip install pyarrow") from None
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises its own ArrowInvalid / OSError types for a corrupt file
        raise ValueError(f"data file {path} is not a readable parquet file ({first_line(e)}); rewrite it with pyarrow "
                         "or pandas") from None
    names = pf.schema_arrow.names
    if "text" not in names:
        raise ValueError(f"data file {path} has no 'text' column (columns: {', '.join(names)}); name the text column "
                         "'text'")
    return pf


def _parquet_documents(path: Path) -> list[str]:
    pf = open_parquet_text(path)
    return _text_values(pf.read(columns=["text"]).column("text").to_pylist(), f"data file {path} column 'text'")


def _hf_documents(source: str) -> list[str]:
    name, _, config = source[len("hf:"):].partition(":")
    if not name:
        raise ValueError(f"data source {source!r} names no dataset; use hf:NAME[:CONFIG], e.g. "
                         "hf:roneneldan/TinyStories")
    try:
        import datasets
    except ImportError:
        raise ValueError(f"data source {source!r} needs the optional 'datasets' package; "
                         f"pip install datasets") from None
    try:
        ds = datasets.load_dataset(name, config or None, split="train")
    except Exception as e:  # offline, unknown name, bad config: the library raises many types
        raise ValueError(
            f"could not load Hugging Face dataset {source!r} ({type(e).__name__}: {first_line(e)}); "
            f"check the name and config, and that the machine is online or the dataset is in the local HF cache"
        ) from None
    if "text" not in ds.column_names:
        raise ValueError(f"Hugging Face dataset {source!r} has no 'text' column (columns: "
                         f"{', '.join(ds.column_names)}); pick a dataset with a 'text' column")
    return _text_values(ds["text"], f"Hugging Face dataset {source!r} column 'text'")


def _text_values(values: Sequence, where: str) -> list[str]:
    """Strings of a text column (nulls dropped); ``ValueError`` for any other type."""
    docs = []
    for v in values:
        if v is None:
            continue
        if not isinstance(v, str):
            raise ValueError(f"{where} holds {type(v).__name__} values, not strings; store the text as strings")
        docs.append(v)
    return docs


def first_line(e: Exception) -> str:
    """The first line of an exception's message (its type name if empty), for one-line errors."""
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


# --------------------------------------------------------------------------------------------- split


def split_documents(docs: list[str], val_frac: float) -> tuple[list[str], list[str], str]:
    """Hold out the last documents for validation, deterministically (DESIGN.md §8).

    With several documents, validation is the shortest run of *last* documents holding at least
    ``val_frac`` of the characters (at least one document stays in training); for the bundled
    Shakespeare at 0.1 that is the last 4 plays (10.4 %), whole plays never seen in training. A single
    document is cut at the line boundary before the ``1 - val_frac`` point of its characters.
    Returns ``(train_docs, val_docs, note)``, ``note`` saying how the split was made.
    Raises ``ValueError`` if ``val_frac`` is not in (0, 1) or a single document has no line break to cut at.
    """
    if not 0 < val_frac < 1:
        raise ValueError(f"val_frac={val_frac} must be in (0, 1) (try 0.1)")
    if len(docs) == 1:
        return _split_one_document(docs[0], val_frac)
    sizes = np.array([len(d) for d in docs], dtype=np.int64)
    tail = np.cumsum(sizes[::-1])  # characters held by the last k documents, k = 1..n
    n_val = min(int(np.searchsorted(tail, val_frac * sizes.sum())) + 1, len(docs) - 1)
    note = (f"by document: the last {n_val} of {len(docs)} documents "
            f"({tail[n_val - 1] / sizes.sum():.1%} of characters) are validation")
    return docs[:-n_val], docs[-n_val:], note


def _split_one_document(text: str, val_frac: float) -> tuple[list[str], list[str], str]:
    target = round(len(text) * (1 - val_frac))
    cut = text.rfind("\n", 0, target) + 1  # start of the line that holds the target character
    if cut == 0:
        cut = text.find("\n", target) + 1
    if cut == 0 or not text[:cut].strip() or not text[cut:].strip():
        raise ValueError("the corpus is one document without a line break to split at for validation; "
                         "add line breaks, or separate documents with two blank lines")
    line = text.count("\n", 0, cut) + 1
    note = (f"one document only: split at line {line} of {text.count(chr(10)) + 1}; "
            f"the last {1 - cut / len(text):.1%} of characters are validation")
    return [text[:cut]], [text[cut:]], note
