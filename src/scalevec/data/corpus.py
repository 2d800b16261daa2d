"""``prepare_data(DataConfig) -> TokenData``: the corpus the trainer reads, tokenized once and cached (DESIGN.md §8).

    prepare_data(DataConfig)          -> TokenData   train / val token streams as memmaps, cached on disk
                                                     (or a `prepare-data` folder's shards: prepared.py;
                                                     nanoGPT's / OLMo-core's token files: token_files.py)
    check_source(DataConfig)          -> None        what prepare_data checks before it reads any text

Token streams: every document is ``[BOS] + encode(doc) + [EOS]`` where the tokenizer has those tokens.
A tokenizer without EOS (``bytes``) sees documents joined by ``DOC_SEP``, so the byte stream of a
.txt corpus is the file itself (our choice).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from scalevec.config import DataConfig
from scalevec.config.files import JSONProblem, load_json
from scalevec.data import documents, token_files
from scalevec.data.cache import FORMAT_VERSION, cache_root, content_key, docs_hash
from scalevec.data.documents import DOC_SEP, load_documents, source_note
from scalevec.data.prepared import ShardedTokens, is_prepared, load_prepared, read_manifest
from scalevec.data.split import split_documents
from scalevec.data.tokenizer import Tokenizer, load_tokenizer
from scalevec.data.tokens import TokenData, token_dtype
from scalevec.outpath import one_line, temporary_folder


def prepare_data(cfg: DataConfig) -> TokenData:
    """Load, split, tokenize and cache a corpus (DESIGN.md §8); cheap on a cache hit.

    The cache entry ``<cache>/tokens/<key>/`` (``train.bin``, ``val.bin``, ``meta.json``) is keyed by a
    hash of (document contents, tokenizer identity, val_frac, FORMAT_VERSION; and the split rule unless it
    is the default ``tail``, so the entries of every earlier run stay valid) and written into a temporary
    folder that is renamed into place, so a killed run never leaves a partial entry. The split
    (``split.split_documents``, by ``data.val_split``) is made from the documents on every call, and its
    record (``split.SplitRecord``, with the token counts) is ``meta["validation"]``.
    Documents are still read and hashed on every call (the content is the key); for a large corpus use
    ``scalevec prepare-data`` instead: a ``source`` folder holding its ``manifest.json`` is opened by
    memory map (``prepared.load_prepared``), its tokenizer and split fixed by the manifest. Raises what
    ``load_documents``, ``split_documents`` and ``load_tokenizer`` raise; nothing is written before
    the corpus and tokenizer spec have been validated.
    """
    cfg.validate()

    if is_prepared(cfg.source):  # a `scalevec prepare-data` folder: memory-mapped shards, nothing re-read
        return load_prepared(cfg.source, cfg.tokenizer)
    tf = token_files.parse(cfg.source)
    if tf is not None:  # nanoGPT's / OLMo-core's token files: memory-mapped as they are, nothing re-tokenized
        return load_token_files(tf, cfg)
    cache = cache_root(cfg.cache_dir)
    docs = load_documents(cfg.source)
    train_docs, val_docs, record = split_documents(docs, cfg.val_frac, cfg.val_split, cfg.val_seed, cfg.source)
    tok = load_tokenizer(cfg.tokenizer, train_docs, cache)
    rule = [] if cfg.val_split == "tail" else [cfg.val_split, str(cfg.val_seed)]  # tail: the keys of earlier runs
    key = content_key(FORMAT_VERSION, docs_hash(docs), tok.identity(), repr(float(cfg.val_frac)), *rule)[:24]
    path = cache / "tokens" / key
    from_cache = (path / "meta.json").is_file()
    if not from_cache:
        meta = {"format": FORMAT_VERSION, "source": cfg.source, "tokenizer": tok.spec, "vocab_size": tok.vocab_size,
                "dtype": token_dtype(tok.vocab_size).name, "val_frac": cfg.val_frac, "split": record.note,
                "train_docs": len(train_docs), "val_docs": len(val_docs)}
        _write_cache(path, train_docs, val_docs, tok, meta)
    try:
        meta = load_json(path / "meta.json", "token cache file", "")
        dtype = np.dtype(meta["dtype"])
    except (OSError, ValueError, KeyError, TypeError) as e:  # the cache's own file, damaged
        why = e.problem if isinstance(e, JSONProblem) else one_line(e)
        raise ValueError(f"the token cache {path} is damaged ({path / 'meta.json'}: {why[:120]}); delete "
                         f"that folder and rerun (it is rebuilt from the corpus)") from None
    train, val = (np.memmap(path / f"{split}.bin", dtype=dtype, mode="r") for split in ("train", "val"))
    meta |= {"documents": record.documents, "documents_from": source_note(cfg.source),
             "validation": record.as_dict(len(train), len(val))}
    starts = _doc_starts(val_docs, tok) if cfg.val_windows == "per_document" else None
    return TokenData(train=train, val=val, tokenizer=tok, token_bytes=tok.token_bytes(), meta=meta, cache_path=path,
                     from_cache=from_cache, val_doc_starts=starts)


def load_token_files(tf: token_files.TokenFiles, cfg: DataConfig) -> TokenData:
    """``TokenData`` over nanoGPT's or OLMo-core's token files (``token_files``), memory-mapped as they are and read
    with ``cfg.tokenizer`` (a tokenizer.json: the one that wrote them; recorded in ``meta``). Raises
    ``ValueError`` for ``bpe:N`` (it would be trained on text these files do not hold), a ``data.val_split`` other
    than ``tail`` (``token_files.check_split``) and what
    ``token_files.open_token_files`` and ``load_tokenizer`` raise."""
    if cfg.tokenizer.startswith("bpe:"):
        raise ValueError(f"--data {tf.source} holds token ids, not text: give --tokenizer the tokenizer.json that "
                         f"wrote them, not {cfg.tokenizer}")
    token_files.check_split(cfg.val_split, "data.val_split")
    tok = load_tokenizer(cfg.tokenizer)
    train, val = token_files.open_token_files(tf, tok, cfg.val_frac)
    train_docs = sum(token_files.documents(a, tok.eos_id) for a in train)
    val_docs = sum(token_files.documents(a, tok.eos_id) for a in val)
    n_train, n_val = sum(len(a) for a in train), sum(len(a) for a in val)
    note = ("nanoGPT's own train.bin / val.bin" if tf.layout == "nanogpt" else
            f"tail: the last documents, {n_val / (n_train + n_val):.3f} of the tokens (val_frac {cfg.val_frac})")
    meta = {"format": tf.layout, "source": tf.source, "tokenizer": tok.spec, "vocab_size": tok.vocab_size,
            "dtype": train[0].dtype.name, "val_frac": cfg.val_frac, "split": note, "train_docs": train_docs,
            "val_docs": val_docs, "documents": train_docs + val_docs, "documents_from": f"{tf.layout} token files",
            "validation": {"split_rule": note, "train_docs": train_docs, "val_docs": val_docs,
                           "train_tokens": n_train, "val_tokens": n_val}}
    one = (lambda arrays: arrays[0] if len(arrays) == 1 else ShardedTokens(arrays))
    return TokenData(train=one(train), val=one(val), tokenizer=tok, token_bytes=tok.token_bytes(), meta=meta)


def check_source(cfg: DataConfig) -> None:
    """The checks ``prepare_data`` makes on ``cfg.source`` before it reads any text: a prepared folder's
    manifest (``prepared.read_manifest``), else the path and type (``documents.check_source``). Cheap: what a
    sweep runs on each source before its first run trains (a missing file would fail every run). Raises
    ``FileNotFoundError`` / ``ValueError`` naming the source and the fix."""
    tf = token_files.parse(cfg.source)
    if is_prepared(cfg.source):
        read_manifest(cfg.source)
    elif tf is not None:
        token_files.files(tf)
    else:
        documents.check_source(cfg.source)


def _write_cache(path: Path, train_docs: list[str], val_docs: list[str], tok: Tokenizer, meta: dict) -> None:
    """Tokenize both splits into a temporary folder beside ``path``, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # .NAME.tmp-PID-HEX: a stale one (its writer killed) is removed by the next writer; SIGTERM stays the trainer's
    with temporary_folder(path, "token cache", signals=False) as tmp:
        dtype = np.dtype(meta["dtype"])
        meta["train_tokens"] = _write_stream(tmp / "train.bin", train_docs, tok, dtype)
        meta["val_tokens"] = _write_stream(tmp / "val.bin", val_docs, tok, dtype)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        try:
            os.rename(tmp, path)
        except OSError:
            if not (path / "meta.json").is_file():  # not a concurrent writer that finished first
                raise


def _doc_starts(docs: list[str], tok: Tokenizer) -> np.ndarray:
    """Where each of ``docs`` starts in the stream ``_write_stream`` writes of them (int64); the documents are
    tokenized again (only ``data.val_windows=per_document`` asks, and only for the validation side)."""
    extra = (tok.bos_id is not None) + (tok.eos_id is not None)
    sep = 0 if tok.eos_id is not None else len(tok.encode(DOC_SEP))
    lengths = np.array([len(ids) + extra + sep for ids in tok.encode_batch(docs)], dtype=np.int64)
    return np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)


def _write_stream(path: Path, docs: list[str], tok: Tokenizer, dtype: np.dtype, chunk: int = 512) -> int:
    """Append ``[BOS] + ids + [EOS]`` per document (``DOC_SEP`` between documents if no EOS); returns the length."""
    bos = [tok.bos_id] if tok.bos_id is not None else []
    eos = [tok.eos_id] if tok.eos_id is not None else []
    sep = tok.encode(DOC_SEP) if tok.eos_id is None else []
    n = 0
    with open(path, "wb") as f:
        for start in range(0, len(docs), chunk):
            for i, ids in enumerate(tok.encode_batch(docs[start:start + chunk]), start):
                arr = np.array(bos + ids + eos + (sep if i < len(docs) - 1 else []), dtype=dtype)
                f.write(arr.tobytes())
                n += arr.size
        f.flush()
        os.fsync(f.fileno())
    return n
