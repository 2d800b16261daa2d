"""Token files other pre-training stacks already wrote, read as they are: no re-tokenizing (DESIGN.md §8).

Two layouts, named by a prefix of ``--data`` and read with the tokenizer that wrote them (``--tokenizer``, a
tokenizer.json; recorded in the run's meta and in a prepared folder's copy):

- ``nanogpt:DIR``: nanoGPT's ``data/<name>/prepare.py`` output: ``DIR/train.bin`` and ``DIR/val.bin``, raw
  ``uint16`` token ids (``np.memmap(..., dtype=np.uint16, mode="w+")``), each document followed by the tokenizer's
  end-of-text token (``ids.append(enc.eot_token)``). Its own train/val split is kept.
- ``olmo-core:PATH``: OLMo-core's numpy token files (the Dolma toolkit's ``.npy`` output that ``NumpyDatasetConfig``
  reads): raw token ids without a numpy header, read with ``np.memmap(path, dtype=dtype, mode="r")``, each
  document ending with the EOS token (OLMo-core finds document boundaries as ``ids == eos_token_id``). ``dtype``
  is OLMo-core's default rule, the smallest of uint8/16/32/64 that holds ``vocab_size - 1``
  (``NumpyDatasetConfig.get_dtype``). ``PATH``: one ``.npy`` file or a folder of them (sorted by name, one
  stream). Validation: the last documents holding ``val_frac`` of the tokens (cut after an EOS), like
  ``split.py``'s ``tail``.

``open_token_files`` memory-maps them (``train --data``: nothing is copied); ``prepared.prepare_shards`` writes
them into a prepared folder (``prepare-data``: copied into shards as they are). Checked before a run: the file is
whole ids (its byte length a multiple of the dtype's size), every id is below the tokenizer's vocabulary (one
vectorized pass, as ``prepared.load_prepared``), and a uint16 read of uint32 ids (every odd id 0) is named as the
wrong dtype. Each check fails in one line (``ValueError``; exit 2 from the CLI) naming the file and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scalevec.data.tokenizer import Tokenizer

LAYOUTS = ("nanogpt", "olmo-core")
OLMO_DTYPES = ("uint8", "uint16", "uint32", "uint64")  # NumpyDatasetDType, smallest first
NPY_MAGIC = b"\x93NUMPY"  # np.save's header: a real .npy file, not OLMo-core's raw ids
DTYPE_PROBE = 4096  # ids read to tell uint32 ids read as uint16 (every odd one 0)


@dataclass
class TokenFiles:
    """A ``--data`` value naming token files: ``layout`` (``LAYOUTS``) and ``path``."""

    layout: str
    path: Path

    @property
    def source(self) -> str:
        return f"{self.layout}:{self.path}"


def parse(source: str) -> TokenFiles | None:
    """``TokenFiles`` for ``nanogpt:DIR`` / ``olmo-core:PATH``; ``None`` for any other source. Raises ``ValueError``
    when the prefix is there but no path follows it."""
    layout, sep, rest = source.partition(":")
    if not sep or layout not in LAYOUTS:
        return None
    if not rest:
        raise ValueError(f"data source {source!r} names no path; use nanogpt:DIR (train.bin, val.bin) or "
                         f"olmo-core:PATH (a .npy token file or a folder of them)")
    return TokenFiles(layout, Path(rest).expanduser())


def check_split(val_split: str, flag: str = "--val-split") -> None:
    """Refuse a validation split rule other than ``tail`` (``ValueError`` naming ``flag``): token files keep
    nanoGPT's own split or cut OLMo-core's tail (module docstring), so another rule would be ignored silently."""
    if val_split != "tail":
        raise ValueError(f"{flag} {val_split}: token files keep nanoGPT's own split or cut OLMo-core's tail; "
                         f"drop {flag}")


def olmo_core_dtype(vocab_size: int) -> np.dtype:
    """OLMo-core's default token dtype: the smallest unsigned type holding ``vocab_size - 1``."""
    return next(np.dtype(d) for d in OLMO_DTYPES if vocab_size - 1 <= np.iinfo(d).max)


def files(tf: TokenFiles) -> dict[str, list[Path]]:
    """``{"train": [...], "val": [...]}``: the files of each split (OLMo-core's all in ``train``: the split is cut
    from its tail), each a regular file (or a link to one). Raises ``FileNotFoundError`` / ``ValueError`` naming
    what is missing or not a regular file (a FIFO would block the read)."""
    p = tf.path
    if not p.exists():
        raise FileNotFoundError(f"data source {tf.source!r}: {p} does not exist")
    if tf.layout == "nanogpt":
        if not p.is_dir():
            raise ValueError(f"data source {tf.source!r}: nanogpt: takes the folder holding train.bin and val.bin")
        missing = [n for n in ("train.bin", "val.bin") if not (p / n).exists()]
        if missing:
            raise FileNotFoundError(f"data source {tf.source!r}: {p} has no {' or '.join(missing)} (nanoGPT's "
                                    f"prepare.py writes both)")
        split_files = {"train": [p / "train.bin"], "val": [p / "val.bin"]}
    else:
        found = sorted(f for f in p.glob("*.npy") if not f.is_dir()) if p.is_dir() else [p]
        if not found:
            raise ValueError(f"data source {tf.source!r}: folder {p} has no .npy token files")
        split_files = {"train": found, "val": []}
    for f in (f for fs in split_files.values() for f in fs):
        # opening a FIFO blocks until something writes to it, and a device or socket is no token file: name it
        if not f.is_file():
            raise ValueError(f"data source {tf.source!r}: {f} is not a regular file (a folder, FIFO, socket or "
                             f"device); give the token file itself")
    return split_files


def _memmap(path: Path, dtype: np.dtype, fix: str) -> np.ndarray:
    size = path.stat().st_size
    with open(path, "rb") as f:
        if f.read(len(NPY_MAGIC)) == NPY_MAGIC:
            raise ValueError(f"{path} is a numpy .npy file with a header (np.save), not raw token ids; write the ids "
                             f"with np.memmap as OLMo-core and nanoGPT do")
    if size == 0 or size % dtype.itemsize:
        raise ValueError(f"{path} is {size} bytes, not a whole number of {dtype.name} ids; {fix}")
    return np.memmap(path, dtype=dtype, mode="r")


def check_ids(path: Path, ids: np.ndarray, tok: Tokenizer, fix: str) -> None:
    """Every id below the vocabulary, and not uint32 ids read as uint16 (``ValueError`` naming ``path``)."""
    probe = np.asarray(ids[:DTYPE_PROBE])
    if ids.dtype == np.uint16 and probe.size >= 64 and not probe[1::2].any() and probe[0::2].any():
        raise ValueError(f"{path}: every odd id is 0, as uint32 ids read as uint16 are; {fix}")
    top = int(ids.max())
    if top >= tok.vocab_size:
        raise ValueError(f"{path}: token id {top} is not below the tokenizer's vocabulary ({tok.vocab_size}, "
                         f"{tok.spec}); {fix}")


def open_token_files(tf: TokenFiles, tok: Tokenizer, val_frac: float) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The ``(train, val)`` token arrays of ``tf`` read with ``tok``'s vocabulary (memory maps or views of them,
    in file order; module docstring). Raises ``ValueError`` for a bad file (module docstring), a tokenizer too big
    for nanoGPT's uint16, a stream too short to hold out ``val_frac`` at a document boundary."""
    split_files = files(tf)
    if tf.layout == "nanogpt":
        if tok.vocab_size > 2**16:
            raise ValueError(f"data source {tf.source!r}: nanoGPT's .bin files are uint16, but tokenizer {tok.spec} "
                             f"has {tok.vocab_size} ids; give the tokenizer that wrote them")
        dtype, fix = np.dtype(np.uint16), "nanoGPT's files are uint16 ids of the tokenizer that wrote them"
    else:
        dtype = olmo_core_dtype(tok.vocab_size)
        fix = (f"OLMo-core's files are raw {dtype.name} ids for a vocabulary of {tok.vocab_size}; give --tokenizer "
               f"the tokenizer that wrote them")
    arrays = {s: [_memmap(f, dtype, fix) for f in fs] for s, fs in split_files.items()}
    for s, fs in split_files.items():
        for f, ids in zip(fs, arrays[s]):
            check_ids(f, ids, tok, fix)
    if tf.layout == "nanogpt":
        return arrays["train"], arrays["val"]
    return _tail_split(tf, arrays["train"], tok, val_frac)


def _tail_split(tf: TokenFiles, streams: list[np.ndarray], tok: Tokenizer,
                val_frac: float) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The last documents holding about ``val_frac`` of the tokens as validation, cut after the last file's first
    EOS at or past the cut point; views, nothing copied."""
    if tok.eos_id is None:
        raise ValueError(f"data source {tf.source!r}: tokenizer {tok.spec} has no EOS token, which OLMo-core's files "
                         f"end each document with; give the tokenizer that wrote them")
    last = streams[-1]
    total = sum(len(s) for s in streams)
    cut = len(last) - int(round(val_frac * total))
    first = _first_index(last, tok.eos_id, cut - 1) if cut > 0 else None  # the EOS at or past the cut point
    if first is None or first + 1 >= len(last):
        raise ValueError(f"data source {tf.source!r}: the last file ({len(last):,} tokens) has no document boundary "
                         f"leaving {val_frac:g} of the tokens for validation; lower --val-frac or add a file")
    at = first + 1  # one past the EOS that ends the last training document of this file
    return [*streams[:-1], last[:at]], [last[at:]]


def _first_index(ids: np.ndarray, value: int, start: int, chunk: int = 1 << 24) -> int | None:
    """The first index ``>= start`` of ``value`` in ``ids`` (``None``: none), read ``chunk`` ids at a time."""
    for lo in range(start, len(ids), chunk):
        hits = np.flatnonzero(np.asarray(ids[lo:lo + chunk]) == value)
        if len(hits):
            return lo + int(hits[0])
    return None


def iter_documents(ids: np.ndarray, eos_id: int | None, chunk: int = 1 << 24):
    """The documents of a stream that ends each with EOS, as views of ``ids`` (EOS included; an unterminated tail
    is the last); the whole stream as one without an EOS token. Scans ``chunk`` ids at a time (flat memory)."""
    if eos_id is None:
        yield ids
        return
    start = 0
    for lo in range(0, len(ids), chunk):
        for e in np.flatnonzero(np.asarray(ids[lo:lo + chunk]) == eos_id):
            yield ids[start:lo + int(e) + 1]
            start = lo + int(e) + 1
    if start < len(ids):
        yield ids[start:]


def documents(ids: np.ndarray, eos_id: int | None, chunk: int = 1 << 24) -> int:
    """Documents in a stream that ends each with EOS: its EOS count, plus one for an unterminated tail; 0 without
    an EOS token. Counts ``chunk`` ids at a time: ``ids == eos_id`` over a whole memory map would allocate a byte
    per token (20 GB for a 20B-token file)."""
    if eos_id is None or not len(ids):
        return 0
    n = sum(int(np.count_nonzero(np.asarray(ids[lo:lo + chunk]) == eos_id)) for lo in range(0, len(ids), chunk))
    return n + int(ids[-1] != eos_id)


__all__ = ["LAYOUTS", "TokenFiles", "check_ids", "check_split", "documents", "files", "iter_documents",
           "olmo_core_dtype", "open_token_files", "parse"]
