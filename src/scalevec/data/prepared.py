"""Prepared data: a corpus tokenized once into memory-mapped shards and a manifest (DESIGN.md §8).

``scalevec prepare-data SOURCE --tokenizer T --out DIR`` streams the documents of SOURCE
(``documents.iter_documents``, the reader of every format that ``train --data FILE`` also uses; a Hugging Face
dataset with datasets' ``streaming=True``), tokenizes them in ``--workers`` processes and appends them to
token shards::

    DIR/manifest.json             source, tokenizer, dtype, split rule, per shard: tokens, documents, SHA-256, max id
    DIR/tokenizer/                a copy of the tokenizer (tokenizer.json + tokenizer_config.json)
    DIR/train-00000.bin ...       uint16 (vocab <= 65536) or uint32 token ids, documents back to back
    DIR/train-00000.docs.npy      int64 start offset of each document in its shard, then the shard length
    DIR/val-00000.bin ...         the validation split, the same layout

Memory stays flat: documents are read, tokenized and written in chunks of about ``CHUNK_CHARS``
characters, at most ``2 × workers`` chunks in flight; the main process writes chunks in document order,
so any number of workers writes the same bytes. The token stream of a split is what ``data.prepare_data``
writes for the same documents: ``[BOS] + ids + [EOS]`` per document, or documents joined by
``DOC_SEP`` for a tokenizer without EOS (``bytes``).

The validation split is ``split.py``'s rule named by ``--val-split`` (default ``tail``, the plain path's
default too), so one corpus split by one rule holds out the same documents prepared or plain. ``tail`` needs
every document's size before the first is assigned: a first streamed pass counts them (8 bytes per
document); ``strided`` and ``random`` decide while streaming. The manifest records the split
(``split.SplitRecord``). ``bpe:N`` is trained on another streamed pass over the training documents.

Token files another stack already wrote (``nanogpt:DIR``, ``olmo-core:PATH``; ``token_files.py``) are copied into
shards as they are, documents cut after each EOS, with the tokenizer that wrote them (``--tokenizer``, saved in
``tokenizer/``): nothing is re-tokenized; nanoGPT's split is kept, OLMo-core's tail is held out.

``train --data DIR`` opens the shards with ``np.memmap`` (``load_prepared``): nothing is hashed at
start-up; the manifest is checked (``check_manifest``: fields, types, paths inside DIR, the dtype, file
sizes) and each shard's max token id is taken in one vectorized pass, so an id outside the vocabulary is
an error before the run rather than an IndexError in the embedding. ``prepare-data --verify DIR`` checks
every SHA-256 and the max ids. ``ShardedTokens`` presents the shards of a split as one 1-D
array to ``TrainSampler`` and ``val_batches`` without concatenating them, and asks ``TrainSampler`` for
its ``feistel`` order (a permutation computed per index, so memory does not grow with the number of
windows either).
"""

from __future__ import annotations

import argparse
import collections
import errno
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import time
from array import array
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from scalevec.config import VAL_SPLITS
from scalevec.config.files import load_json
from scalevec.config.typed import Fields, is_int, read_kind
from scalevec.data import token_files
from scalevec.data.documents import DOC_SEP, SOURCE_HELP, iter_documents
from scalevec.data.split import Split, SplitRecord, plan_split, split_stream
from scalevec.data.tokenizer import (
    TOKENIZER_HELP,
    ByteTokenizer,
    Tokenizer,
    load_tokenizer,
    load_tokenizer_dir,
    train_bpe,
)
from scalevec.data.tokens import TOKEN_DTYPES, TokenData, token_dtype
from scalevec.outpath import check_out_path, refuse_temporary, temporary_folder

MANIFEST = "manifest.json"
FORMAT = "scalevec-prepared"
VERSION = 1
CHUNK_CHARS = 4 << 20  # characters per task sent to a worker (about 4 MB of text)
CHUNK_DOCS = 4096  # at most this many documents per task
DEFAULT_SHARD_TOKENS = 1 << 28  # a new shard starts after a document once a shard holds 2^28 tokens (512 MB as uint16)


def is_prepared(source: str | os.PathLike) -> bool:
    """True when ``source`` is a folder written by ``prepare-data`` (it holds ``manifest.json``)."""
    p = Path(source).expanduser()
    try:
        return p.is_dir() and (p / MANIFEST).is_file()
    except OSError:  # not a usable path (a name too long for the file system): not prepared data
        return False


# --------------------------------------------------------------------------------------------- chunks


def _chunks(docs: Iterator[tuple[bool, str]]) -> Iterator[tuple[list[bool], list[str]]]:
    """Consecutive ``(is_val, text)`` documents grouped into ``(flags, texts)`` of about ``CHUNK_CHARS``
    characters (at most ``CHUNK_DOCS`` documents)."""
    flags, texts, size = [], [], 0
    for is_val, d in docs:
        flags.append(is_val)
        texts.append(d)
        size += len(d)
        if size >= CHUNK_CHARS or len(texts) >= CHUNK_DOCS:
            yield flags, texts
            flags, texts, size = [], [], 0
    if texts:
        yield flags, texts


# --------------------------------------------------------------------------------------------- tokenizing workers

_WORKER: dict = {}


def _init_worker(tokenizer_dir: str) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker process: the workers are the parallelism
    _WORKER["tok"] = load_tokenizer_dir(tokenizer_dir)


def _encode_chunk(docs: list[str], tok: Tokenizer | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, lengths)``: every document's ``[BOS] + ids + [EOS]`` back to back (uint32), and their lengths."""
    tok = tok or _WORKER["tok"]
    if isinstance(tok, ByteTokenizer):  # ids are the UTF-8 bytes: no per-token Python objects
        parts = [np.frombuffer(d.encode("utf-8"), dtype=np.uint8) for d in docs]
    else:
        parts = [np.asarray(ids, dtype=np.uint32) for ids in tok.encode_batch(docs)]
    bos = [tok.bos_id] if tok.bos_id is not None else []
    eos = [tok.eos_id] if tok.eos_id is not None else []
    if bos or eos:
        b, e = np.asarray(bos, dtype=np.uint32), np.asarray(eos, dtype=np.uint32)
        parts = [np.concatenate([b, p.astype(np.uint32), e]) for p in parts]
    lengths = np.array([p.size for p in parts], dtype=np.int64)
    ids = np.concatenate(parts).astype(np.uint32) if parts else np.zeros(0, dtype=np.uint32)
    return ids, lengths


def _encoded(chunks: Iterator[tuple[list[bool], list[str]]], tok: Tokenizer, tokenizer_dir: Path,
             workers: int) -> Iterator[tuple[tuple[list[bool], list[str]], np.ndarray, np.ndarray]]:
    """``(chunk, ids, lengths)`` per chunk ``(flags, texts)``, in order; with ``workers > 1`` a process pool with
    at most ``2 × workers`` chunks in flight (``Pool.imap`` would read the whole corpus ahead)."""
    if workers <= 1:
        for chunk in chunks:
            yield (chunk, *_encode_chunk(chunk[1], tok))
        return
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)
    with ctx.Pool(workers, initializer=_init_worker, initargs=(str(tokenizer_dir),)) as pool:
        pending: collections.deque = collections.deque()
        for chunk in chunks:
            pending.append((chunk, pool.apply_async(_encode_chunk, (chunk[1],))))
            if len(pending) >= 2 * workers:
                d, r = pending.popleft()
                yield (d, *r.get())
        while pending:
            d, r = pending.popleft()
            yield (d, *r.get())


# --------------------------------------------------------------------------------------------- shard writing


class _ShardWriter:
    """Appends documents of one split to ``<split>-NNNNN.bin`` shards, hashing as it writes."""

    def __init__(self, directory: Path, split: str, dtype: np.dtype, sep: np.ndarray, shard_tokens: int):
        self.dir, self.split, self.dtype, self.sep, self.shard_tokens = directory, split, dtype, sep, shard_tokens
        self.shards: list[dict] = []
        self.docs = self.tokens = 0
        self._f = None

    def _open(self) -> None:
        name = f"{self.split}-{len(self.shards):05d}"
        self._name, self._f, self._sha = name, open(self.dir / f"{name}.bin", "wb"), hashlib.sha256()
        self._n, self._starts, self._max = 0, [], 0

    def _write(self, arr: np.ndarray) -> None:
        b = arr.astype(self.dtype, copy=False).tobytes()
        self._f.write(b)
        self._sha.update(b)
        self._n += arr.size
        if arr.size:  # recorded so that --verify and the reader can check the ids against the vocabulary
            self._max = max(self._max, int(arr.max()))

    def add(self, ids: np.ndarray) -> None:
        """Append one document (its ``[BOS] + ids + [EOS]``); the separator goes before every document but the first."""
        if self._f is None:
            self._open()
        elif self._n >= self.shard_tokens:
            self._close()
            self._open()
        if self.docs and self.sep.size:
            self._write(self.sep)
        self._starts.append(self._n)
        self._write(ids)
        self.docs += 1

    def _close(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        self._f = None
        starts = np.array([*self._starts, self._n], dtype=np.int64)
        np.save(self.dir / f"{self._name}.docs.npy", starts)
        self.shards.append({"file": f"{self._name}.bin", "tokens": self._n, "docs": len(self._starts),
                            "sha256": self._sha.hexdigest(), "offsets": f"{self._name}.docs.npy",
                            "offsets_sha256": _file_sha256(self.dir / f"{self._name}.docs.npy"), "max_id": self._max})
        self.tokens += self._n

    def finish(self) -> dict:
        if self._f is not None:
            self._close()
        return {"tokens": self.tokens, "docs": self.docs, "shards": self.shards}


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            h.update(block)
    return h.hexdigest()


def prepare_shards(source: str, tokenizer: str, out: str | Path, workers: int = 1, val_frac: float = 0.1,
                   shard_tokens: int = DEFAULT_SHARD_TOKENS, overwrite: bool = False, progress: bool = False,
                   val_split: str = "tail", val_seed: int = 0) -> dict:
    """Tokenize ``source`` into shards and a manifest in ``out`` (module docstring); returns the manifest.

    ``tokenizer``: ``bytes``, ``bpe:N`` (trained on a streamed pass over the training documents) or a
    tokenizer.json path. ``val_split`` / ``val_seed``: the validation split's rule (``split.py``; ``tail``
    first counts the documents' sizes in a streamed pass). Everything is written into a temporary folder
    beside ``out`` that is renamed into place at the end, so an interrupted run leaves nothing. Raises
    ``ValueError`` for bad arguments, a bad source, a source that is already prepared or a split left
    empty, ``FileExistsError`` if ``out`` is not empty (and not prepared data with ``overwrite``),
    ``FileNotFoundError`` for a symbolic link that leads nowhere or loops as ``out`` or a folder above it and
    ``NotADirectoryError`` for an ``out`` under a file (``outpath.check_out_path``, before anything is read or
    written), and what ``iter_documents`` / ``load_tokenizer`` raise.
    """
    if not 0 < val_frac < 1:
        raise ValueError(f"--val-frac {val_frac} must be in (0, 1) (try 0.01 for a large corpus)")
    if val_split not in VAL_SPLITS:
        raise ValueError(f"--val-split {val_split!r} is unknown; use {', '.join(VAL_SPLITS)}")
    if workers < 1 or shard_tokens < 1:
        raise ValueError(f"--workers {workers} and --shard-tokens {shard_tokens} must be >= 1")
    out = Path(out).expanduser()
    check_out_path(out)  # mkdir through a dangling link or below a file: a bare "[Errno 17]" / "[Errno 20]"
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not (overwrite and is_prepared(out)):
            raise FileExistsError(f"{out} exists and is not empty; choose a new --out"
                                  + (" or pass --overwrite" if is_prepared(out) else ""))
    if is_prepared(source):
        raise ValueError(f"{source} is already prepared data (it holds {MANIFEST}); train on it with --data {source}")
    tf = token_files.parse(source)
    if tf is not None:
        token_files.check_split(val_split)
        if tokenizer.startswith("bpe:"):
            raise ValueError(f"{source} holds token ids, not text: give --tokenizer the tokenizer.json that wrote "
                             f"them, not {tokenizer}")
        tok = load_tokenizer(tokenizer)
        arrays = token_files.open_token_files(tf, tok, val_frac)  # every check before anything is written
        write = (lambda tmp: _token_files_into(tmp, tf, tok, arrays, val_frac, shard_tokens))
    else:
        docs = iter_documents(source)  # validates the path / type before anything is written
        write = (lambda tmp: _documents_into(tmp, source, docs, tokenizer, workers, val_frac, shard_tokens, progress,
                                             val_split, val_seed))
    try:
        return _prepare_into(out, write)
    except OSError as e:
        if e.errno not in _DISK_ERRNOS:
            raise
        # a full disk mid-write was a bare "[Errno 28] No space left on device": say where and what to do
        raise OSError(f"cannot write the prepared data for {out} ({e.filename or out.parent}: {e.strerror}); free "
                      f"space there or choose another --out (nothing was left: the partial folder was "
                      f"removed)") from None


_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG)  # writing failed, not reading


def _prepare_into(out: Path, write) -> dict:
    """``prepare_shards``' writing part: ``write(tmp)`` fills a temporary folder beside ``out`` and returns the
    manifest, then the folder is renamed into place; the temporary folder is removed whatever happens."""
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    # .NAME.tmp-PID-HEX: removed on SIGTERM or Ctrl-C, or by the next prepare-data once its process is gone
    with temporary_folder(out, "prepared data") as tmp:
        manifest = write(tmp)
        _write_json(tmp / MANIFEST, manifest)
        if out.exists():
            shutil.rmtree(out) if is_prepared(out) else out.rmdir()
        os.rename(tmp, out)
    manifest["seconds"] = time.perf_counter() - t0
    return manifest


def _manifest(tmp: Path, source: str, tok: Tokenizer, dtype: np.dtype, sep: np.ndarray, val_frac: float,
              split_rule: str, splits: dict, shard_tokens: int, **extra) -> dict:
    return {"format": FORMAT, "version": VERSION, "source": source, "tokenizer": tok.spec, "tokenizer_dir": "tokenizer",
            "tokenizer_sha256": _file_sha256(tmp / "tokenizer" / "tokenizer.json"), "vocab_size": tok.vocab_size,
            "dtype": dtype.name, "bos_id": tok.bos_id, "eos_id": tok.eos_id, "separator": sep.tolist(),
            "val_frac": val_frac, "split_rule": split_rule, **extra, "shard_tokens": shard_tokens,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "train": splits["train"], "val": splits["val"]}


def _documents_into(tmp: Path, source: str, docs, tokenizer: str, workers: int, val_frac: float, shard_tokens: int,
                    progress: bool, val_split: str, val_seed: int) -> dict:
    """Tokenize the documents of ``source`` into shards in ``tmp``; returns the manifest."""
    # tail: the sizes of every document first (one streamed pass; the stream made above is used up here)
    split = plan_split(val_split, val_frac, val_seed, array("q", map(len, docs)) if val_split == "tail" else None)
    if val_split == "tail":
        docs = iter_documents(source)
    tok = _prepare_tokenizer(tokenizer, source, split, tmp / "tokenizer", progress)
    dtype = token_dtype(tok.vocab_size)
    sep = np.asarray(tok.encode(DOC_SEP) if tok.eos_id is None else [], dtype=np.uint32)
    writers = {s: _ShardWriter(tmp, s, dtype, sep, shard_tokens) for s in ("train", "val")}
    bar = _progress_bar(source, progress)
    record = SplitRecord(split)
    for (flags, texts), ids, lengths in _encoded(_chunks(split_stream(docs, split, record)), tok,
                                                 tmp / "tokenizer", workers):
        ends = np.cumsum(lengths)
        for k, end in enumerate(ends):
            writers["val" if flags[k] else "train"].add(ids[end - lengths[k]:end])
        if bar is not None:
            bar.update(sum(len(d) for d in texts))
            n_tokens = writers["train"].tokens + writers["val"].tokens
            bar.set_postfix(docs=f"{record.documents:,}", tokens=f"{n_tokens:,}", refresh=False)
    if bar is not None:
        bar.close()
    splits = {s: w.finish() for s, w in writers.items()}
    record.check(source, fix="raise --val-frac")
    return _manifest(tmp, source, tok, dtype, sep, val_frac, split.describe(), splits, shard_tokens,
                     split=record.as_dict(splits["train"]["tokens"], splits["val"]["tokens"]),
                     documents=record.documents)


def _token_files_into(tmp: Path, tf: token_files.TokenFiles, tok: Tokenizer, arrays: tuple[list, list],
                      val_frac: float, shard_tokens: int) -> dict:
    """nanoGPT's / OLMo-core's token ids into shards in ``tmp`` as they are (documents cut after each EOS; no
    separator added: the files carry their own); returns the manifest."""
    tok.save(tmp / "tokenizer")
    dtype, sep = token_dtype(tok.vocab_size), np.zeros(0, dtype=np.uint32)
    splits = {}
    for split, streams in zip(("train", "val"), arrays):
        writer = _ShardWriter(tmp, split, dtype, sep, shard_tokens)
        for ids in streams:
            for doc in token_files.iter_documents(ids, tok.eos_id):
                writer.add(doc)
        splits[split] = writer.finish()
    rule = ("nanoGPT's own train.bin / val.bin" if tf.layout == "nanogpt" else
            f"tail: the last documents of {tf.layout} token files (val_frac {val_frac})")
    return _manifest(tmp, tf.source, tok, dtype, sep, val_frac, rule, splits, shard_tokens,
                     documents=splits["train"]["docs"] + splits["val"]["docs"])


def _prepare_tokenizer(spec: str, source: str, split: Split, directory: Path, progress: bool = False) -> Tokenizer:
    """The tokenizer of ``spec``, saved into ``directory`` (the prepared copy); ``bpe:N`` is trained here, on
    the training side of ``split`` (a streamed pass of its own), with ``train_bpe``'s progress when asked (bars on
    a terminal, one-line reports in a log)."""
    if spec.startswith("bpe:"):
        n = spec[len("bpe:"):]
        if not n.isdigit() or int(n) < 258:
            raise ValueError(f"tokenizer {spec!r}: N must be an integer >= 258 (256 bytes + <|bos|> + <|eos|>); "
                             f"e.g. bpe:4096")
        train_docs = (d for is_val, d in split_stream(iter_documents(source), split) if not is_val)
        from scalevec.data.tokenizer import BOS, EOS

        tok = Tokenizer(train_bpe(int(n), train_docs, progress=progress), spec, BOS, EOS)
    else:
        tok = load_tokenizer(spec)
    tok.save(directory)
    return load_tokenizer_dir(directory)  # exactly what workers and `train --data DIR` load


def _progress_bar(source: str, enabled: bool):
    """A tqdm bar over characters (total = file size for a local source, else unknown), or None."""
    if not enabled or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    p = Path(source).expanduser()
    total = (p.stat().st_size if p.is_file() else
             sum(f.stat().st_size for f in p.rglob("*.txt")) if p.is_dir() else None)
    return tqdm(total=total, unit="char", unit_scale=True, dynamic_ncols=True, desc="tokenizing")


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------- reading


class ShardedTokens:
    """The shards of one split as a single read-only 1-D token array, never concatenated in memory.

    Supports ``len``, ``dtype``, integer indexing, slices (a copy of that range) and integer arrays of
    any shape (``TrainSampler``'s ``(B, T+1)`` windows; a window may cross a shard boundary). Every
    shard is an ``np.memmap``: only the pages a batch touches are read. ``sample_order = "feistel"``
    makes ``TrainSampler`` shuffle windows without holding a permutation of them in memory.
    """

    sample_order = "feistel"

    def __init__(self, shards: list[np.ndarray]):
        if not shards:
            raise ValueError("a split needs at least one shard")
        self.shards = shards
        self.dtype = shards[0].dtype
        self.ends = np.cumsum([len(s) for s in shards]).astype(np.int64)  # exclusive end of each shard
        self.starts = self.ends - np.array([len(s) for s in shards], dtype=np.int64)

    def __len__(self) -> int:
        return int(self.ends[-1])

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                return self[np.arange(start, stop, step)]
            if stop <= start:
                return np.zeros(0, dtype=self.dtype)
            first, last = np.searchsorted(self.ends, [start, stop - 1], side="right")
            parts = [np.asarray(self.shards[k][max(start - self.starts[k], 0):
                                               min(stop - self.starts[k], len(self.shards[k]))])
                     for k in range(first, last + 1)]
            return np.concatenate(parts) if len(parts) > 1 else parts[0].copy()
        if isinstance(key, (int, np.integer)):
            k = int(key) + (len(self) if key < 0 else 0)
            if not 0 <= k < len(self):
                raise IndexError(f"index {key} is out of range for {len(self)} tokens")
            s = int(np.searchsorted(self.ends, k, side="right"))
            return self.shards[s][k - self.starts[s]]
        idx = np.asarray(key, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"indices outside [0, {len(self)})")
        which = np.searchsorted(self.ends, idx, side="right")
        out = np.empty(idx.shape, dtype=self.dtype)
        for s in np.unique(which):
            mask = which == s
            out[mask] = self.shards[s][idx[mask] - self.starts[s]]
        return out

    def __array__(self, dtype=None, copy=None):
        arr = self[:]
        return arr.astype(dtype) if dtype is not None else arr


def read_manifest(path: str | Path) -> dict:
    """The manifest of a prepared folder, checked by ``check_manifest`` before anything reads a shard.

    Raises ``FileNotFoundError`` if the folder has no manifest, ``ValueError`` (one line naming the file and
    the field) if it is no regular file of at most ``MAX_MANIFEST_BYTES``, not valid JSON (too deep a nesting
    too), not one this version reads, or fails ``check_manifest``.
    """
    root = Path(path).expanduser()
    refuse_temporary(root, "prepared data")  # an interrupted prepare-data's folder, maybe incomplete
    p = root / MANIFEST
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist; "
                                f"write prepared data with `scalevec prepare-data SOURCE --out {path}`")
    m = load_json(p, "manifest", _REDO, MAX_MANIFEST_BYTES)  # a FIFO or a directory: one line, no hang
    return check_manifest(root, m)


MAX_MANIFEST_BYTES = 1 << 26  # a manifest holds ~300 bytes per shard: 64 MB is 200,000 shards


# The manifest fields a reader uses and their kinds (``int``: a whole number >= 0; ``float``: a number, NaN
# included; ``object``: any value, checked by its own rule); the others (bos_id, created, ...) are informative only.
_TOP_FIELDS = {"source": str, "tokenizer": str, "tokenizer_dir": str, "tokenizer_sha256": str, "vocab_size": int,
               "dtype": object, "val_frac": float, "split_rule": str, "train": dict, "val": dict}
_SPLIT_FIELDS = {"tokens": int, "docs": int, "shards": list}
_SHARD_FIELDS = {"file": str, "tokens": int, "docs": int, "sha256": str, "offsets": str, "offsets_sha256": str}
_REDO = "prepare the data again with `scalevec prepare-data SOURCE --out DIR`"


def check_manifest(root: Path, m: object) -> dict:
    """``m``, the parsed manifest of the folder ``root``, if a reader can trust it; the one home of its rules.

    Checked, in this order, before any shard is opened: format and version; every field a reader uses is
    present with its type (counts non-negative integers); ``vocab_size >= 1``; ``dtype`` is the one
    prepare-data writes for ``vocab_size`` (``tokens.token_dtype``); every shard, offsets and tokenizer path
    is relative and resolves (symlinks followed) inside ``root``; each split has shards whose tokens and
    documents add up to the split's; each shard file exists and is ``tokens × itemsize`` bytes. Raises
    ``ValueError``: one line naming the manifest, the field and the fix.
    """
    p = root / MANIFEST
    if not isinstance(m, dict) or m.get("format") != FORMAT or m.get("version") != VERSION:
        raise ValueError(f"{p} is not a {FORMAT} v{VERSION} manifest; prepare the data again with this scalevec")

    def bad(name: str, problem: str) -> ValueError:
        return ValueError(f"{p}: field {name} {problem}; {_REDO}")

    def field(obj: dict, key: str, kind: type, name: str):
        fields = Fields(obj, f"{p}: field {name.removesuffix(key)}", fix=_REDO)
        if kind is int:
            return fields.int(key, least=0)
        if kind is float:  # val_frac, the one number: a share in (0, 1) (NaN went into meta.json as it was)
            return fields.number(key, above=0, most=1)
        return fields.get(key)[0] if kind is object else fields.kind(key, kind)

    def inside(rel: str, name: str) -> Path:
        # a manifest is data, not trusted code: following `../x`, `/etc/x` or a symlink out of the folder would
        # read (and train on, or hash) any file the user can read
        f = root / rel
        try:
            outside = Path(rel).is_absolute() or not f.resolve().is_relative_to(root.resolve())
        except (OSError, RuntimeError, ValueError):  # a symlink loop, a NUL byte
            outside = True
        if outside:
            raise bad(name, f"names {_show(rel)}, which is or resolves (symlinks followed) outside {root}: "
                            f"a manifest may name only files inside its folder")
        return f

    for key, kind in _TOP_FIELDS.items():
        field(m, key, kind, key)
    if m["vocab_size"] < 1:
        raise bad("vocab_size", "is 0, not a vocabulary size")
    if m["dtype"] != token_dtype(m["vocab_size"]).name:
        raise bad("dtype", f"is {_show(m['dtype'])}, not {token_dtype(m['vocab_size']).name}, what prepare-data "
                           f"writes for vocab_size {m['vocab_size']} (ids are stored only as "
                           f"{' or '.join(TOKEN_DTYPES)}; another dtype reads the bytes as other ids)")
    for rel in (m["tokenizer_dir"], f"{m['tokenizer_dir']}/tokenizer.json",
                f"{m['tokenizer_dir']}/tokenizer_config.json"):  # the files load_tokenizer_dir reads
        inside(rel, "tokenizer_dir")
    sizes = []
    for split in ("train", "val"):
        sp = m[split]
        for key, kind in _SPLIT_FIELDS.items():
            field(sp, key, kind, f"{split}.{key}")
        if not sp["shards"]:
            raise bad(f"{split}.shards", "is empty (a split has at least one shard)")
        for k, s in enumerate(sp["shards"]):
            name = f"{split}.shards[{k}]"
            read_kind(s, f"{p}: field {name}", dict, fix=_REDO)
            for key, kind in _SHARD_FIELDS.items():
                field(s, key, kind, f"{name}.{key}")
            if "max_id" in s:  # older manifests lack it (written only since the id check)
                field(s, "max_id", int, f"{name}.max_id")
            sizes.append((name, inside(s["file"], f"{name}.file"), s["tokens"]))
            inside(s["offsets"], f"{name}.offsets")
        for key in ("tokens", "docs"):
            total = sum(s[key] for s in sp["shards"])
            if sp[key] != total:
                raise bad(f"{split}.{key}", f"is {sp[key]}, but its shards' {key} add up to {total}")
    itemsize = np.dtype(m["dtype"]).itemsize
    for name, f, tokens in sizes:
        if not f.is_file():
            raise bad(f"{name}.file", f"names shard {f}, which is missing")
        expected = tokens * itemsize
        if f.stat().st_size != expected:
            raise bad(f"{name}.tokens", f"is {tokens}, so the manifest says {expected} bytes of {m['dtype']}, but "
                                        f"shard {f} is {f.stat().st_size} bytes")
    return m


def _show(v: object) -> str:
    """A manifest value for a one-line message: as JSON, cut to 60 characters."""
    s = json.dumps(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _open_split(root: Path, m: dict, split: str) -> ShardedTokens:
    """The shards of ``split`` by memory map; ``m`` passed ``check_manifest`` (file sizes included)."""
    dtype = np.dtype(m["dtype"])
    return ShardedTokens([np.memmap(root / s["file"], dtype=dtype, mode="r") if s["tokens"] else
                          np.zeros(0, dtype=dtype) for s in m[split]["shards"]])


def _id_problem(shard: dict, tokens: np.ndarray, vocab_size: int) -> str | None:
    """What is wrong with the token ids of one shard, or None: its max id must be below ``vocab_size`` (else the
    embedding raises an IndexError mid-run) and equal the ``max_id`` the manifest records, if it records one."""
    if not len(tokens):
        return None
    top = int(tokens.max())  # one vectorized pass over the memory map
    if top >= vocab_size:
        return (f"{shard['file']}: max token id {top} is not below the vocabulary size {vocab_size}; the shard was "
                f"written with another tokenizer or is damaged: {_REDO}")
    if shard.get("max_id", top) != top:
        return (f"{shard['file']}: max token id {top}, but the manifest records max_id {shard['max_id']}; the shard "
                f"changed after prepare-data: {_REDO}")
    return None


def _vocab_problem(tok: Tokenizer, m: dict) -> str | None:
    """The tokenizer's vocabulary must be the manifest's ``vocab_size``: the dtype and id checks rely on it."""
    if tok.vocab_size == m["vocab_size"]:
        return None
    return (f"{m['tokenizer_dir']}/tokenizer.json has {tok.vocab_size} ids, but the manifest's vocab_size is "
            f"{m['vocab_size']}: {_REDO}")


def load_prepared(path: str | Path, tokenizer: str = "bytes") -> TokenData:
    """``TokenData`` over a prepared folder, by memory map: reads the manifest, stats the shards and takes each
    shard's max token id (nothing is hashed; ``verify`` does that).

    ``tokenizer`` is the run's ``data.tokenizer``: the manifest's tokenizer is used; a different value
    other than the default ``bytes`` is an error (the data was tokenized with the manifest's one).
    Raises ``FileNotFoundError`` / ``ValueError`` for a missing or inconsistent folder (``read_manifest``),
    a tokenizer whose vocabulary is not the manifest's, or a shard holding an id outside the vocabulary.
    """
    root = Path(path).expanduser()
    m = read_manifest(root)
    if tokenizer not in ("bytes", m["tokenizer"]):
        raise ValueError(f"prepared data {root} was tokenized with {m['tokenizer']!r}, not {tokenizer!r}; "
                         f"drop --tokenizer or prepare the data again with --tokenizer {tokenizer}")
    tok = load_tokenizer_dir(root / m["tokenizer_dir"])
    train, val = _open_split(root, m, "train"), _open_split(root, m, "val")
    # checked here, at start-up, because an id >= vocab is otherwise an IndexError inside the embedding mid-run
    problems = [_vocab_problem(tok, m)]
    for split, data in (("train", train), ("val", val)):
        problems += [_id_problem(s, arr, tok.vocab_size) for s, arr in zip(m[split]["shards"], data.shards)]
    problem = next(filter(None, problems), None)
    if problem:
        raise ValueError(f"prepared data {root}: {problem}")
    record = m.get("split") if isinstance(m.get("split"), dict) else {}  # absent from older manifests
    note = record.get("note") or f"{m['split_rule']} (val_frac {m['val_frac']})"
    meta = {"format": m["version"], "source": str(path), "prepared_from": m["source"], "tokenizer": m["tokenizer"],
            "vocab_size": m["vocab_size"], "dtype": m["dtype"], "val_frac": m["val_frac"],
            "split": f"prepared: {note}", "train_docs": m["train"]["docs"],
            "val_docs": m["val"]["docs"], "train_tokens": m["train"]["tokens"], "val_tokens": m["val"]["tokens"],
            **({"documents": m["documents"]} if is_int(m.get("documents")) else {}),
            "validation": {**record, "split_rule": m["split_rule"], "train_docs": m["train"]["docs"],
                           "val_docs": m["val"]["docs"], "train_tokens": m["train"]["tokens"],
                           "val_tokens": m["val"]["tokens"]},
            "manifest_sha256": hashlib.sha256((root / MANIFEST).read_bytes()).hexdigest()}
    return TokenData(train=train, val=val, tokenizer=tok, token_bytes=tok.token_bytes(), meta=meta,
                     cache_path=root, from_cache=True, val_doc_starts=_doc_starts(root, m, "val"))


def _doc_starts(root: Path, m: dict, split: str) -> np.ndarray:
    """Where each document of ``split`` starts in the split's stream (the shards' offsets files, shifted by the
    tokens of the shards before), int64."""
    parts, base = [], 0
    for s in m[split]["shards"]:
        offsets = np.load(root / s["offsets"])
        parts.append(offsets[:-1].astype(np.int64) + base)
        base += s["tokens"]
    return np.concatenate(parts)


def verify(path: str | Path) -> list[str]:
    """Re-hash every shard, offsets file and the tokenizer against the manifest and check every shard's token ids
    (``_id_problem``, against the manifest's ``vocab_size``); returns the problems, one line each (empty = fine).

    Raises what ``read_manifest`` raises: a malformed manifest, a path outside the folder or a shard whose size
    is not the manifest's leaves nothing to check against.
    """
    root = Path(path).expanduser()
    m = read_manifest(root)
    problems = []
    tokenizer_json = m["tokenizer_dir"] + "/tokenizer.json"
    files = [(tokenizer_json, m["tokenizer_sha256"])]
    for split in ("train", "val"):
        for s in m[split]["shards"]:
            files += [(s["file"], s["sha256"]), (s["offsets"], s["offsets_sha256"])]
    for name, sha in files:
        f = root / name
        if not f.is_file():
            problems.append(f"{name}: missing")
        elif _file_sha256(f) != sha:
            problems.append(f"{name}: SHA-256 differs from the manifest")
    if not any(q.startswith(f"{tokenizer_json}:") for q in problems):  # the tokenizer prepare-data wrote: load it
        problems.append(_vocab_problem(load_tokenizer_dir(root / m["tokenizer_dir"]), m))
    for split in ("train", "val"):
        for s, arr in zip(m[split]["shards"], _open_split(root, m, split).shards):
            problems.append(_id_problem(s, arr, m["vocab_size"]))
    return [q for q in problems if q]


def document_offsets(path: str | Path, split: str, shard: int) -> np.ndarray:
    """``(docs + 1,)`` int64: where each document of a shard starts, then the shard's length (tokens)."""
    m = read_manifest(path)
    return np.load(Path(path).expanduser() / m[split]["shards"][shard]["offsets"])


# --------------------------------------------------------------------------------------------- CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", nargs="?", help=SOURCE_HELP.replace("use ", "corpus: ", 1))
    p.add_argument("--tokenizer", default="bytes", help=f"{TOKENIZER_HELP} (default bytes)")
    p.add_argument("--out", help="folder to write (must be new or empty)")
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 1) - 1),
                   help="tokenizing processes (default: CPU cores - 1)")
    p.add_argument("--val-frac", type=float, default=0.1,
                   help="share held out for validation: of the characters (tail), else of the documents (default 0.1)")
    p.add_argument("--val-split", choices=VAL_SPLITS, default="tail",
                   help="which documents are validation: the last ones (tail, default, as train --data FILE), "
                        "every 1/val-frac-th (strided) or a seeded random choice (random); docs/data.md")
    p.add_argument("--val-seed", type=int, default=0, help="the seed of --val-split random (default 0)")
    p.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS,
                   help=f"tokens a shard holds before the next one starts, after a document "
                        f"(default {DEFAULT_SHARD_TOKENS:,})")
    p.add_argument("--overwrite", action="store_true", help="replace existing prepared data in --out")
    p.add_argument("--verify", metavar="DIR",
                   help="re-hash the shards of a prepared folder against its manifest, write nothing")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")


def run(args: argparse.Namespace) -> int:
    if args.verify:
        if args.source or args.out:
            raise ValueError("--verify DIR checks a prepared folder; give no SOURCE or --out with it")
        problems = verify(args.verify)
        for p in problems:
            print(f"{args.verify}: {p}")
        if not args.quiet and not problems:
            m = read_manifest(args.verify)
            n = sum(len(m[s]["shards"]) for s in ("train", "val"))
            print(f"{args.verify}: {n} shards, "
                  f"{m['train']['tokens'] + m['val']['tokens']:,} tokens: every SHA-256 matches the manifest")
        return 1 if problems else 0
    if not args.source or not args.out:
        raise ValueError("give a SOURCE and --out DIR "
                         "(e.g. scalevec prepare-data corpus.jsonl --tokenizer bpe:4096 --out data/corpus)")
    m = prepare_shards(args.source, args.tokenizer, args.out, workers=args.workers, val_frac=args.val_frac,
                       shard_tokens=args.shard_tokens, overwrite=args.overwrite, progress=not args.quiet,
                       val_split=args.val_split, val_seed=args.val_seed)
    if not args.quiet:
        print(f"wrote {args.out}: {m['documents']:,} documents, tokenizer {m['tokenizer']} (vocab {m['vocab_size']}, "
              f"{m['dtype']}); train {m['train']['tokens']:,} tokens / {m['train']['docs']:,} docs in "
              f"{len(m['train']['shards'])} shard(s), val {m['val']['tokens']:,} tokens / {m['val']['docs']:,} docs; "
              f"{m['seconds']:.1f} s with {args.workers} worker(s)\nsplit {m['split']['note']}")
    return 0


__all__ = ["ShardedTokens", "check_manifest", "document_offsets", "is_prepared", "load_prepared", "prepare_shards",
           "read_manifest", "verify"]
