"""Text sources to documents: the one reader of every corpus format and its errors (DESIGN.md §8).

    iter_documents(source)   -> Iterator[str]  bundled corpus, .txt, folder, .jsonl, .parquet, hf:NAME, streamed
    load_documents(source)   -> list[str]      the same stream, collected (the in-memory path)
    source_note(source)      -> str            how that source is cut into documents, for the load-time line
    check_source(source)     -> files | None   the path and type checks alone, before anything is read

``prepare-data`` streams (``iter_documents``); ``train --data FILE`` collects (``load_documents``): both read
every format through the same function, so they see the same documents, in the same order, with the same
errors. The bundled corpora are gzip files in ``corpora/`` beside this module (``corpora/README.md``).

**Documents of a .txt file** (our rule, docs/data.md): every run of three or more newlines (two or more blank
lines) ends a document; the newlines at both ends of a document are dropped, and blank documents are
dropped. Precisely: the text is split at each ``DOC_SEP`` (``"\\n\\n\\n"``) from left to right, as
``str.split`` does, so a run of 3-5 newlines is one cut and a longer run gives blank parts that are dropped;
a file without any such run is one document. A document that must keep two blank lines inside belongs in a
folder (one file per document) or a .jsonl file. The validation split is ``split.py``'s; this module knows
nothing about tokenizers, models or training: it hands out strings.
"""

from __future__ import annotations

import codecs
import gzip
from collections.abc import Iterable, Iterator
from importlib import resources
from pathlib import Path

from scalevec.config.files import JSONProblem, parse_json

BUNDLED = ("shakespeare", "kjv")
DOC_SEP = "\n\n\n"  # document separator inside .txt files (and the joiner when a tokenizer has no EOS)
SOURCE_HELP = ("use 'shakespeare', 'kjv', a .txt/.jsonl/.parquet file, a folder of .txt files, hf:NAME[:CONFIG], "
               "or token files: nanogpt:DIR, olmo-core:PATH")
READ_BYTES = 4 << 20  # a .txt file is read and decoded in pieces of this many bytes
_BOM = codecs.BOM_UTF8


def iter_documents(source: str, hf_streaming: bool = True) -> Iterator[str]:
    """The documents of ``source`` one at a time, in a fixed order, blank ones dropped (DESIGN.md §8).

    ``source``: ``"shakespeare"`` / ``"kjv"`` (bundled, 42 works / 66 books), a ``.txt`` file (documents
    as in the module docstring), a folder (one document per ``*.txt`` file, searched recursively, sorted by
    path), a ``.jsonl`` file (field ``"text"`` of each line), a ``.parquet`` file (column ``"text"``, nulls
    dropped, needs pyarrow) or ``"hf:NAME[:CONFIG]"`` (split ``train`` of a Hugging Face dataset, needs the
    optional ``datasets`` package and a network or a warm HF cache; ``hf_streaming=False`` loads it with
    ``load_dataset`` instead of ``streaming=True``, so a warm cache works offline).

    Memory stays flat: a .txt file is read ``READ_BYTES`` at a time, .jsonl by line, .parquet by batch
    (one document is still held whole). The path and file type are checked now (``FileNotFoundError`` for
    a missing path, ``ValueError`` for an empty file, an empty folder or an unsupported type); the content
    is checked as it is read: ``ValueError`` for non-UTF-8 bytes (with their byte offset), a bad jsonl
    line, a missing ``text`` field or column, non-string text, a missing optional package, and, at the
    end, a source that held no text at all.
    """
    files = check_source(source)
    if source in BUNDLED:
        raw = (resources.files("scalevec.data") / "corpora" / f"{source}.txt.gz").read_bytes()
        docs: Iterable[str] = _split_txt([gzip.decompress(raw).decode("utf-8")])
    elif source.startswith("hf:"):
        docs = _hf_documents(source, hf_streaming)
    elif files is not None:
        docs = (_read_utf8(f) for f in files)
    else:
        path = Path(source).expanduser()
        docs = {".txt": _txt_documents, ".jsonl": _jsonl_documents, ".parquet": _parquet_documents}[path.suffix](path)
    return _non_blank(docs, source)


def check_source(source: str) -> list[Path] | None:
    """The checks ``iter_documents`` makes before it reads a byte: the path exists, a file's type is one it
    reads and the file is not empty, a folder holds .txt files (returned, sorted; ``None`` for any other
    source); a bundled name passes, and ``hf:NAME`` when it names a dataset (the dataset itself is checked
    when it is read). What a sweep runs on every source before it trains (``corpus.check_source``). Raises
    ``FileNotFoundError`` / ``ValueError`` as ``iter_documents`` does."""
    if source in BUNDLED:
        return None
    if source.startswith("hf:"):
        if not source[len("hf:"):].partition(":")[0]:
            raise ValueError(f"data source {source!r} names no dataset; use hf:NAME[:CONFIG], e.g. "
                             "hf:roneneldan/TinyStories")
        return None
    path = Path(source).expanduser()
    try:
        exists = path.exists()
    except OSError as e:  # a name too long for the file system, ...
        raise ValueError(f"data source {source[:80]!r}{'...' if len(source) > 80 else ''} is not a usable path "
                         f"({e.strerror}); {SOURCE_HELP}") from None
    if not exists:
        raise FileNotFoundError(f"data source {source!r} does not exist; {SOURCE_HELP}")
    if not path.is_dir() and not path.is_file():
        raise ValueError(f"data source {path} is not a regular file (a FIFO, socket or device would never end or "
                         f"hang); {SOURCE_HELP}")
    if path.is_dir():
        files = sorted(f for f in path.rglob("*.txt") if f.is_file())
        if not files:
            raise ValueError(f"folder {path} has no .txt files; put one document per .txt file in it")
        return files
    if path.suffix not in (".txt", ".jsonl", ".parquet"):
        raise ValueError(f"data file {path} has unsupported type {path.suffix!r}; {SOURCE_HELP}")
    if path.stat().st_size == 0:
        raise ValueError(f"data file {path} is empty (0 bytes); point --data at a file with text")
    return None


def load_documents(source: str) -> list[str]:
    """``iter_documents(source)`` as a list (a Hugging Face dataset through ``load_dataset``, not streamed,
    so a warm HF cache works offline). Raises what ``iter_documents`` raises."""
    return list(iter_documents(source, hf_streaming=False))


def source_note(source: str) -> str:
    """How ``source`` is cut into documents, in words (``prepare_data`` puts it in the load-time line)."""
    path = Path(source).expanduser()
    if source in BUNDLED or (path.suffix == ".txt" and not path.is_dir()):
        return "a .txt file: a new document after every run of 3+ newlines, i.e. 2+ blank lines"
    if source.startswith("hf:") or path.suffix == ".parquet":
        return "one document per row of column 'text'"
    if path.suffix == ".jsonl":
        return "one document per line"
    return "one document per .txt file"


def _non_blank(docs: Iterable[str], source: str) -> Iterator[str]:
    n = 0
    for d in docs:
        if d.strip():
            n += 1
            yield d
    if not n:
        raise ValueError(f"data source {source!r} contains no text (only empty or blank documents); {SOURCE_HELP}")


# --------------------------------------------------------------------------------------------- formats


def _not_utf8(path: Path, offset: int) -> ValueError:
    return ValueError(f"data file {path} is not UTF-8 text (bad byte at offset {offset}); "
                      f"convert it first, e.g. iconv -f latin1 -t utf-8 {path} > fixed.txt")


def _read_utf8(path: Path) -> str:
    """The whole text of ``path`` (a byte-order mark dropped); ``ValueError`` if it is not UTF-8."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise _not_utf8(path, e.start + (len(_BOM) if data.startswith(_BOM) else 0)) from None


def _decoded_pieces(path: Path) -> Iterator[str]:
    """The text of ``path`` in pieces of about ``READ_BYTES`` bytes, a byte-order mark dropped; a bad byte is
    a ``ValueError`` naming its offset in the file, found when its piece is read."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0  # bytes of the file handed to the decoder so far
    with open(path, "rb") as f:
        while raw := f.read(READ_BYTES):
            if offset == 0 and raw.startswith(_BOM):
                raw, offset = raw[len(_BOM):], len(_BOM)
            pending = len(decoder.getstate()[0])  # the bytes of a character cut by the previous read
            try:
                yield decoder.decode(raw)
            except UnicodeDecodeError as e:
                raise _not_utf8(path, offset - pending + e.start) from None
            offset += len(raw)
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError as e:  # the file ends inside a character
        raise _not_utf8(path, offset - len(decoder.getstate()[0]) + e.start) from None


def _split_txt(pieces: Iterable[str]) -> Iterator[str]:
    """The documents of a text given in consecutive pieces: split at ``DOC_SEP`` exactly as ``str.split``
    would split the whole text, each part's newlines trimmed at both ends (module docstring).

    Only the current document is kept: each piece is searched once, plus the ``len(DOC_SEP) - 1`` characters
    carried over from the previous one (a separator may straddle two pieces)."""
    parts: list[str] = []  # the current document, piece by piece
    carry = ""
    keep = len(DOC_SEP) - 1
    for piece in pieces:
        buf = carry + piece
        start = 0
        while (cut := buf.find(DOC_SEP, start)) >= 0:
            parts.append(buf[start:cut])
            yield "".join(parts).strip("\n")
            parts, start = [], cut + len(DOC_SEP)
        # no separator starts in buf[start:]; one may start in its last `keep` characters and end in the next piece
        end = max(start, len(buf) - keep)
        parts.append(buf[start:end])
        carry = buf[end:]
    parts.append(carry)
    yield "".join(parts).strip("\n")


def _txt_documents(path: Path) -> Iterator[str]:
    return _split_txt(_decoded_pieces(path))


def _jsonl_documents(path: Path) -> Iterator[str]:
    with open(path, "rb") as f:  # binary lines, split on b"\n" only: JSON strings may hold U+2028
        offset = 0
        for i, raw in enumerate(f, 1):
            skip = len(_BOM) if i == 1 and raw.startswith(_BOM) else 0
            try:
                line = raw[skip:].decode("utf-8")
            except UnicodeDecodeError as e:
                raise _not_utf8(path, offset + skip + e.start) from None
            offset += len(raw)
            if not line.strip():
                continue
            try:
                row = parse_json(line)
            except JSONProblem as e:  # not JSON, a 5,000-digit integer, 100,000 nested '[', "text" set twice
                raise ValueError(f"data file {path} line {i} {e.problem}; fix or remove that line") from None
            if not isinstance(row, dict) or "text" not in row:
                raise ValueError(f'data file {path} line {i} has no "text" field; every line must be an object like '
                                 f'{{"text": "..."}}')
            if not isinstance(row["text"], str):
                raise ValueError(f'data file {path} line {i}: "text" is a {type(row["text"]).__name__}, not a string; '
                                 'store the text as a string')
            yield row["text"]


def _parquet_documents(path: Path) -> Iterator[str]:
    """The ``text`` column of a parquet file, read 1,024 rows at a time; ``ValueError`` naming the fix for an
    unreadable file, a missing pyarrow or a missing column."""
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
    for batch in pf.iter_batches(columns=["text"], batch_size=1024):
        yield from _text_values(batch.column(0).to_pylist(), f"data file {path} column 'text'")


def _hf_documents(source: str, streaming: bool) -> Iterator[str]:
    """Column ``text`` of split ``train`` of a Hugging Face dataset: rows streamed
    (``load_dataset(..., streaming=True)``) or the loaded dataset's column (``streaming=False``)."""
    name, _, config = source[len("hf:"):].partition(":")  # a name: check_source
    try:
        import datasets
    except ImportError:
        raise ValueError(f"data source {source!r} needs the optional 'datasets' package; "
                         f"pip install datasets") from None
    try:
        if streaming:
            rows = iter(datasets.load_dataset(name, config or None, split="train", streaming=True))
            first = next(rows, None)
            columns = [] if first is None else list(first)
        else:
            ds = datasets.load_dataset(name, config or None, split="train")
            columns = list(ds.column_names)
    except Exception as e:  # offline, unknown name, bad config: the library raises many types
        raise ValueError(
            f"could not load Hugging Face dataset {source!r} ({type(e).__name__}: {first_line(e)}); "
            f"check the name and config, and that the machine is online or the dataset is in the local HF cache"
        ) from None
    if streaming and first is None:
        return  # an empty dataset: _non_blank says it holds no text
    if "text" not in columns:
        raise ValueError(f"Hugging Face dataset {source!r} has no 'text' column (columns: "
                         f"{', '.join(columns)}); pick a dataset with a 'text' column")
    values = (row.get("text") for row in _chain(first, rows)) if streaming else ds["text"]
    yield from _text_values(values, f"Hugging Face dataset {source!r} column 'text'")


def _chain(first, rest):
    yield first
    yield from rest


def _text_values(values: Iterable, where: str) -> Iterator[str]:
    """Strings of a text column (nulls dropped); ``ValueError`` for any other type."""
    for v in values:
        if v is None:
            continue
        if not isinstance(v, str):
            raise ValueError(f"{where} holds {type(v).__name__} values, not strings; store the text as strings")
        yield v


def first_line(e: Exception) -> str:
    """The first line of an exception's message (its type name if empty), for one-line errors."""
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


__all__ = ["BUNDLED", "DOC_SEP", "SOURCE_HELP", "first_line", "iter_documents", "load_documents", "source_note"]
