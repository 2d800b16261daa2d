"""Corpora, tokenizers, the token cache, the validation split and the training sampler (DESIGN.md §8).

Data flows one way:

    load_documents(source)            -> list[str]   bundled corpus, .txt, folder, .jsonl, .parquet, hf:NAME
    split_documents(docs, val_frac)   -> train docs, val docs, a note   (the last documents are held out)
    load_tokenizer(spec, train_docs)  -> Tokenizer   bytes | bpe:N (trained on the train split) | tokenizer.json
    prepare_data(DataConfig)          -> TokenData   train / val token streams as memmaps, cached on disk
                                                     (or a `prepare-data` folder's shards: prepared.py)
    val_batches(data, seq_len, n, B)  -> the fixed validation set and the UTF-8 bytes its targets stand for
    TrainSampler(tokens, T, B, seed).batch(step, rank, world_size)   stateless, so resume needs only the step

Token streams: every document is ``[BOS] + encode(doc) + [EOS]`` where the tokenizer has those tokens.
A tokenizer without EOS (``bytes``) sees documents joined by ``DOC_SEP`` ("\\n\\n\\n", the bundled
files' own separator), so the byte stream of a .txt corpus is the file itself (our choice).

This module knows nothing about models or training; it hands out integer token arrays and tensors.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import shutil
import uuid
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from .config import DataConfig

FORMAT_VERSION = 1  # bump when the token-cache layout or the document rules change: old caches are ignored
BUNDLED = ("shakespeare", "kjv")
DOC_SEP = "\n\n\n"  # document separator inside .txt files (and the joiner when a tokenizer has no EOS)
BOS, EOS = "<|bos|>", "<|eos|>"  # special tokens of bpe:N tokenizers
SOURCE_HELP = "use 'shakespeare', 'kjv', a .txt/.jsonl/.parquet file, a folder of .txt files or hf:NAME[:CONFIG]"
TOKENIZER_HELP = "use 'bytes', 'bpe:N' (e.g. bpe:4096) or a path to a tokenizer.json"

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
        raw = (resources.files("scalevec") / "data" / f"{source}.txt.gz").read_bytes()
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
            raise ValueError(f"data file {path} line {i} is not valid JSON ({e.msg}); fix or remove that line") from None
        if not isinstance(row, dict) or "text" not in row:
            raise ValueError(f'data file {path} line {i} has no "text" field; every line must be an object like {{"text": "..."}}')
        if not isinstance(row["text"], str):
            raise ValueError(f'data file {path} line {i}: "text" is a {type(row["text"]).__name__}, not a string; store the text as a string')
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
        raise ValueError(f"data file {path} is not a readable parquet file ({_first_line(e)}); rewrite it with pyarrow or pandas") from None
    names = pf.schema_arrow.names
    if "text" not in names:
        raise ValueError(f"data file {path} has no 'text' column (columns: {', '.join(names)}); name the text column 'text'")
    return pf


def _parquet_documents(path: Path) -> list[str]:
    pf = open_parquet_text(path)
    return _text_values(pf.read(columns=["text"]).column("text").to_pylist(), f"data file {path} column 'text'")


def _hf_documents(source: str) -> list[str]:
    name, _, config = source[len("hf:"):].partition(":")
    if not name:
        raise ValueError(f"data source {source!r} names no dataset; use hf:NAME[:CONFIG], e.g. hf:roneneldan/TinyStories")
    try:
        import datasets
    except ImportError:
        raise ValueError(f"data source {source!r} needs the optional 'datasets' package; pip install datasets") from None
    try:
        ds = datasets.load_dataset(name, config or None, split="train")
    except Exception as e:  # offline, unknown name, bad config: the library raises many types
        raise ValueError(
            f"could not load Hugging Face dataset {source!r} ({type(e).__name__}: {_first_line(e)}); "
            f"check the name and config, and that the machine is online or the dataset is in the local HF cache"
        ) from None
    if "text" not in ds.column_names:
        raise ValueError(f"Hugging Face dataset {source!r} has no 'text' column (columns: {', '.join(ds.column_names)}); pick a dataset with a 'text' column")
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


def _first_line(e: Exception) -> str:
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


# --------------------------------------------------------------------------------------------- tokenizers


class Tokenizer:
    """Text <-> token ids, one interface for every kind of tokenizer (DESIGN.md §8).

    Backed by a Hugging Face ``tokenizers.Tokenizer`` (``self.hf``), so ``save`` writes a
    ``tokenizer.json`` that ``transformers.PreTrainedTokenizerFast`` loads. Attributes: ``spec``
    (``"bytes"``, ``"bpe:N"`` or the tokenizer.json path), ``vocab_size``, ``bos_id`` and ``eos_id``
    (``None`` where the tokenizer has no such token). ``encode`` never adds special tokens:
    ``prepare_data`` places BOS/EOS around documents itself.
    """

    def __init__(self, hf: HFTokenizer, spec: str, bos_token: str | None = None, eos_token: str | None = None):
        self.hf, self.spec = hf, spec
        self.bos_token, self.eos_token = bos_token, eos_token
        self.bos_id = hf.token_to_id(bos_token) if bos_token else None
        self.eos_id = hf.token_to_id(eos_token) if eos_token else None
        self.vocab_size = hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without special tokens."""
        return self.hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """``[encode(t) for t in texts]``, in parallel (Rust)."""
        return [e.ids for e in self.hf.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (special tokens written out, e.g. ``<|eos|>``)."""
        return self.hf.decode(list(ids), skip_special_tokens=False)

    def token_bytes(self) -> np.ndarray:
        """``(vocab_size,)`` int64: the UTF-8 bytes each token stands for; special tokens count 0.

        Exact for byte-level tokenizers (``bytes``, ``bpe:N``, GPT-2/Llama-3 style tokenizer.json): each
        character of a byte-level token is one byte. For other tokenizers it is the length of the
        token decoded alone, an approximation (a SentencePiece word-start space may be lost).
        """
        added = self.hf.get_added_tokens_decoder()  # {id: AddedToken}
        byte_level = "ByteLevel" in json.dumps(json.loads(self.hf.to_str()).get("decoder"))
        out = np.zeros(self.vocab_size, dtype=np.int64)
        for i in range(self.vocab_size):
            if i in added:
                out[i] = 0 if added[i].special else len(added[i].content.encode("utf-8"))
            elif byte_level:
                out[i] = len(self.hf.id_to_token(i) or "")
            else:
                out[i] = len(self.hf.decode([i]).encode("utf-8"))
        return out

    def identity(self) -> str:
        """A hash of everything that decides the ids: the serialized tokenizer and its BOS/EOS."""
        return _sha256(self.hf.to_str(), self.bos_token, self.eos_token)

    def save(self, directory: str | Path) -> None:
        """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``directory`` (created if needed);
        ``transformers.PreTrainedTokenizerFast.from_pretrained(directory)`` and ``load_tokenizer_dir`` read them."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self.hf.save(str(d / "tokenizer.json"))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "scalevec_tokenizer": self.spec}
        if self.bos_token:
            config["bos_token"] = self.bos_token
        if self.eos_token:
            config["eos_token"] = self.eos_token
        (d / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")

    def __repr__(self) -> str:
        return f"Tokenizer({self.spec!r}, vocab_size={self.vocab_size}, bos_id={self.bos_id}, eos_id={self.eos_id})"


class ByteTokenizer(Tokenizer):
    """``bytes``: ids are the UTF-8 bytes of the text, vocab exactly 256, no BOS/EOS (DESIGN.md §8).

    Our choice: no special tokens, so that the vocabulary is exactly the 256 byte values and every
    target is one byte (bits-per-byte = nats per token / ln 2); documents are joined by ``DOC_SEP``
    instead. Encoding is done in Python (fast, exact); ``self.hf`` is an equivalent HF tokenizer
    (see ``byte_level_hf_tokenizer``) used only by ``save``.
    """

    def __init__(self):
        super().__init__(byte_level_hf_tokenizer(), "bytes")

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(t.encode("utf-8")) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def token_bytes(self) -> np.ndarray:
        return np.ones(256, dtype=np.int64)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, the alphabet of HF's ByteLevel pre-tokenizer."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def byte_level_hf_tokenizer() -> HFTokenizer:
    """An HF tokenizer whose ids are the UTF-8 bytes: a BPE model with no merges over the 256
    byte-level characters (id = byte value), a ByteLevel pre-tokenizer without regex or prefix space
    (text -> one character per byte) and a ByteLevel decoder. Vocab exactly 256."""
    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def load_tokenizer(spec: str, train_docs: list[str] | None = None, cache_dir: str | Path = "") -> Tokenizer:
    """The tokenizer named by ``spec`` (DESIGN.md §8).

    ``"bytes"`` -> ``ByteTokenizer``; ``"bpe:N"`` -> a byte-level BPE with N tokens (including
    ``<|bos|>`` = 0 and ``<|eos|>`` = 1) trained on ``train_docs`` with HF ``tokenizers`` and cached in
    ``cache_dir/tokenizers`` keyed by a hash of (train_docs, N); a small corpus may yield fewer than N
    tokens, see ``vocab_size``. Anything else is a path to a tokenizer.json (or a folder holding one).
    Raises ``ValueError`` for a bad ``bpe:N`` or an invalid file, ``FileNotFoundError`` for a missing one.
    """
    if spec == "bytes":
        return ByteTokenizer()
    if spec.startswith("bpe:"):
        n = spec[len("bpe:"):]
        if not n.isdigit() or int(n) < 258:
            raise ValueError(f"tokenizer {spec!r}: N must be an integer >= 258 (256 bytes + <|bos|> + <|eos|>); e.g. bpe:4096")
        if not train_docs:
            raise ValueError(f"tokenizer {spec!r} is trained on the training documents; pass train_docs (or use prepare_data)")
        return _bpe_tokenizer(int(n), train_docs, cache_root(cache_dir))
    path = Path(spec).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"tokenizer {spec!r} is not 'bytes' or 'bpe:N' and no such file exists; {TOKENIZER_HELP}")
    return _tokenizer_from_file(path / "tokenizer.json" if path.is_dir() else path, spec)


def load_tokenizer_dir(directory: str | Path) -> Tokenizer:
    """The tokenizer that ``Tokenizer.save(directory)`` wrote, with its original ``spec``.
    Raises ``FileNotFoundError`` if ``directory/tokenizer.json`` is missing, ``ValueError`` if invalid."""
    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; pass a folder written by Tokenizer.save (or an exported model)")
    config = _read_tokenizer_config(path.parent)
    return _tokenizer_from_file(path, config.get("scalevec_tokenizer", str(path)))


def _tokenizer_from_file(path: Path, spec: str) -> Tokenizer:
    """A tokenizer.json; BOS/EOS from a ``tokenizer_config.json`` beside it, else by common names."""
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file {path} does not exist; {TOKENIZER_HELP}")
    config = _read_tokenizer_config(path.parent)
    if config.get("scalevec_tokenizer") == "bytes":
        return ByteTokenizer()
    try:
        hf = HFTokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception for malformed files
        raise ValueError(f"tokenizer file {path} is not a valid tokenizer.json ({_first_line(e)}); {TOKENIZER_HELP}") from None

    def special(key: str, candidates: tuple[str, ...]) -> str | None:
        value = config.get(key)
        value = value.get("content") if isinstance(value, dict) else value
        for name in ((value,) if value else candidates):
            if hf.token_to_id(name) is not None:
                return name
        return None

    bos = special("bos_token", (BOS, "<|begin_of_text|>", "<s>", "<bos>"))
    eos = special("eos_token", (EOS, "<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>"))
    return Tokenizer(hf, spec, bos, eos)


def _read_tokenizer_config(directory: Path) -> dict:
    path = directory / "tokenizer_config.json"
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}); fix or delete it") from None
    return config if isinstance(config, dict) else {}


def train_bpe(vocab_size: int, docs: Iterable[str], length: int | None = None) -> HFTokenizer:
    """A byte-level BPE of ``vocab_size`` tokens (``<|bos|>`` = 0, ``<|eos|>`` = 1) trained on ``docs``,
    which may be a generator (HF ``tokenizers`` keeps word counts, not the documents; DESIGN.md §8)."""
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # no invented leading space: exact bytes
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator(docs, trainer, length=length)
    # transformers users get BOS first, as every training document had it
    hf.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, hf.token_to_id(BOS))])
    return hf


def _bpe_tokenizer(vocab_size: int, train_docs: list[str], cache: Path) -> Tokenizer:
    """Train (or load from the cache) a byte-level BPE on ``train_docs``; written atomically."""
    key = _sha256(FORMAT_VERSION, vocab_size, _docs_hash(train_docs))[:16]
    path = cache / "tokenizers" / f"bpe{vocab_size}-{key}.json"
    if path.is_file():
        return Tokenizer(HFTokenizer.from_file(str(path)), f"bpe:{vocab_size}", BOS, EOS)
    hf = train_bpe(vocab_size, train_docs, length=len(train_docs))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        hf.save(str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return Tokenizer(hf, f"bpe:{vocab_size}", BOS, EOS)


# --------------------------------------------------------------------------------------------- token cache


def cache_root(cache_dir: str | Path = "") -> Path:
    """The cache folder: ``cache_dir`` if given, else ``$SCALEVEC_CACHE``, else ``~/.cache/scalevec``."""
    return Path(cache_dir or os.environ.get("SCALEVEC_CACHE") or "~/.cache/scalevec").expanduser()


def token_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` when every id fits (vocab_size <= 65536), else ``uint32``."""
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


@dataclass
class TokenData:
    """The tokenized corpus (DESIGN.md §8), from ``prepare_data``.

    ``train`` / ``val``: 1-D read-only memmaps (uint16 or uint32) of token ids, documents back to back.
    ``token_bytes``: ``(vocab_size,)`` UTF-8 bytes per token (special tokens 0), for bits-per-byte.
    ``meta``: source, tokenizer spec, split note, document and token counts. ``from_cache``: whether
    the streams were read from an existing cache entry at ``cache_path``.
    """

    train: np.ndarray
    val: np.ndarray
    tokenizer: Tokenizer
    token_bytes: np.ndarray
    meta: dict = field(default_factory=dict)
    cache_path: Path | None = None
    from_cache: bool = False

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def describe(self) -> str:
        """One line for logs: corpus, tokenizer, token counts and how validation was split."""
        m = self.meta
        return (f"data {m['source']!r}, tokenizer {m['tokenizer']} (vocab {self.vocab_size}): "
                f"train {len(self.train):,} tokens / {m['train_docs']} docs, val {len(self.val):,} tokens / "
                f"{m['val_docs']} docs; split {m['split']}")


def prepare_data(cfg: DataConfig) -> TokenData:
    """Load, split, tokenize and cache a corpus (DESIGN.md §8); cheap on a cache hit.

    The cache entry ``<cache>/tokens/<key>/`` (``train.bin``, ``val.bin``, ``meta.json``) is keyed by a
    hash of (document contents, tokenizer identity, val_frac, FORMAT_VERSION) and written into a
    temporary folder that is renamed into place, so a killed run never leaves a partial entry.
    Documents are still read and hashed on every call (the content is the key); for a large corpus use
    ``scalevec prepare-data`` instead: a ``source`` folder holding its ``manifest.json`` is opened by
    memory map (``prepared.load_prepared``), its tokenizer and split fixed by the manifest. Raises what
    ``load_documents``, ``split_documents`` and ``load_tokenizer`` raise; nothing is written before
    the corpus and tokenizer spec have been validated.
    """
    cfg.validate()
    from .prepared import is_prepared, load_prepared

    if is_prepared(cfg.source):  # a `scalevec prepare-data` folder: memory-mapped shards, nothing re-read
        return load_prepared(cfg.source, cfg.tokenizer)
    cache = cache_root(cfg.cache_dir)
    docs = load_documents(cfg.source)
    train_docs, val_docs, split = split_documents(docs, cfg.val_frac)
    tok = load_tokenizer(cfg.tokenizer, train_docs, cache)
    key = _sha256(FORMAT_VERSION, _docs_hash(docs), tok.identity(), repr(float(cfg.val_frac)))[:24]
    path = cache / "tokens" / key
    from_cache = (path / "meta.json").is_file()
    if not from_cache:
        meta = {"format": FORMAT_VERSION, "source": cfg.source, "tokenizer": tok.spec, "vocab_size": tok.vocab_size,
                "dtype": token_dtype(tok.vocab_size).name, "val_frac": cfg.val_frac, "split": split,
                "train_docs": len(train_docs), "val_docs": len(val_docs)}
        _write_cache(path, train_docs, val_docs, tok, meta)
    meta = json.loads((path / "meta.json").read_text())
    dtype = np.dtype(meta["dtype"])
    return TokenData(train=np.memmap(path / "train.bin", dtype=dtype, mode="r"),
                     val=np.memmap(path / "val.bin", dtype=dtype, mode="r"),
                     tokenizer=tok, token_bytes=tok.token_bytes(), meta=meta, cache_path=path, from_cache=from_cache)


def _write_cache(path: Path, train_docs: list[str], val_docs: list[str], tok: Tokenizer, meta: dict) -> None:
    """Tokenize both splits into a temporary folder beside ``path``, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.mkdir()
    try:
        dtype = np.dtype(meta["dtype"])
        meta["train_tokens"] = _write_stream(tmp / "train.bin", train_docs, tok, dtype)
        meta["val_tokens"] = _write_stream(tmp / "val.bin", val_docs, tok, dtype)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        try:
            os.rename(tmp, path)
        except OSError:
            if not (path / "meta.json").is_file():  # not a concurrent writer that finished first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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


def _docs_hash(docs: list[str]) -> str:
    h = hashlib.sha256()
    for d in docs:
        b = d.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def _sha256(*parts: object) -> str:
    return hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).hexdigest()


# --------------------------------------------------------------------------------------------- evaluation


def val_batches(data: TokenData, seq_len: int, n_tokens: int, batch_size: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int]:
    """The fixed validation set (DESIGN.md §8): the same for every run with the same data, tokenizer and seq_len.

    Windows of ``seq_len + 1`` tokens at offsets ``0, T, 2T, ...`` of the val stream, so the targets
    are exactly ``val[1 : n_windows * T + 1]``, each once, with ``n_windows = min(n_tokens, len(val) - 1) // T``.
    Returns ``(batches, n_bytes)``: ``batches`` a list of ``(x, y)`` int64 tensors of shape
    ``(<= batch_size, seq_len)``, ``n_bytes`` the UTF-8 bytes those targets stand for (special tokens 0),
    the denominator of ``bits_per_byte``. Raises ``ValueError`` if not even one window fits.
    """
    if seq_len < 1 or batch_size < 1:
        raise ValueError(f"seq_len={seq_len} and batch_size={batch_size} must be positive")
    if n_tokens < seq_len:
        raise ValueError(f"data.val_tokens={n_tokens} is smaller than one window of seq_len={seq_len}; raise data.val_tokens")
    if len(data.val) - 1 < seq_len:
        raise ValueError(f"the validation stream has {len(data.val)} tokens, fewer than one window of seq_len+1={seq_len + 1}; "
                         f"lower --seq-len or raise data.val_frac")
    n_windows = min(n_tokens, len(data.val) - 1) // seq_len
    stream = torch.from_numpy(np.asarray(data.val[: n_windows * seq_len + 1], dtype=np.int64))
    x = stream[:-1].view(n_windows, seq_len)
    y = stream[1:].view(n_windows, seq_len)
    batches = [(x[i:i + batch_size], y[i:i + batch_size]) for i in range(0, n_windows, batch_size)]
    n_bytes = int(data.token_bytes[stream[1:].numpy()].sum())
    return batches, n_bytes


def bits_per_byte(sum_nats: float, n_bytes: int) -> float:
    """``sum_nats / (ln 2 * n_bytes)``: summed cross-entropy (nats) over the validation targets per
    UTF-8 byte they stand for (DESIGN.md §8). Raises ``ValueError`` if ``n_bytes <= 0``."""
    if n_bytes <= 0:
        raise ValueError(f"n_bytes={n_bytes}: the targets stand for no text; evaluate on more validation tokens")
    return sum_nats / (math.log(2) * n_bytes)


# --------------------------------------------------------------------------------------------- training sampler


FEISTEL_ROUNDS = 6


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer (a bijective 64-bit mixer), elementwise on uint64 (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def feistel_permutation(i: np.ndarray, n: int, keys: np.ndarray) -> np.ndarray:
    """``perm(i)`` for a pseudo-random permutation of ``[0, n)`` that is never materialized.

    A balanced Feistel network on ``2h`` bits (the smallest even width holding ``n - 1``), one round per
    uint64 key with SplitMix64 as round function, is a bijection of ``[0, 4^h)``; cycle-walking (apply it
    again while the value is ``>= n``, at most ~4 times on average) restricts it to ``[0, n)`` (Black &
    Rogaway 2002). ``i``: int array with values in ``[0, n)``; returns int64 of the same shape.
    """
    bits = max(2, int(n - 1).bit_length())
    h = (bits + 1) // 2
    mask, shift = np.uint64((1 << h) - 1), np.uint64(h)

    def rounds(y: np.ndarray) -> np.ndarray:
        left, right = y >> shift, y & mask
        for k in keys:
            left, right = right, left ^ (_mix64(right ^ k) & mask)
        return (left << shift) | right

    with np.errstate(over="ignore"):
        y = rounds(np.asarray(i, dtype=np.uint64).ravel())
        out_of_range = y >= n
        while out_of_range.any():
            y[out_of_range] = rounds(y[out_of_range])
            out_of_range = y >= n
    return y.astype(np.int64).reshape(np.shape(i))


class TrainSampler:
    """Stateless, resumable training batches (DESIGN.md §8).

    The stream is cut into ``n_windows = (len(tokens) - 1) // seq_len`` non-overlapping windows of
    ``seq_len + 1`` tokens. Global sample ``g = step * batch_size + b`` is window ``perm_e[g % n_windows]``
    of epoch ``e = g // n_windows``, where ``perm_e`` is a permutation seeded by ``(seed, e)``: no window
    repeats within an epoch, and the global batch of a step depends only on ``(seed, step)``. So resume
    needs only the step, and every strategy trained with the same seed sees the same data in the same
    order. Rank ``r`` of ``W`` takes the disjoint slice ``[r*B/W, (r+1)*B/W)`` of the global batch.
    (Permutations come from numpy's ``default_rng``: reproducible on one install, not promised across
    numpy versions.)

    ``order``: ``"permutation"`` (above; it holds 8 bytes per window in memory, 56 MB for 1 GB of bytes at
    seq_len 128) or ``"feistel"``, where ``perm_e`` is ``feistel_permutation`` keyed by ``(seed, e)``:
    computed per index, O(batch) memory whatever the corpus size. Default: the token container's
    ``sample_order`` attribute (``prepared.ShardedTokens``: ``feistel``), else ``permutation``.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int, order: str | None = None):
        if seq_len < 1 or batch_size < 1 or seed < 0:
            raise ValueError(f"seq_len={seq_len} and batch_size={batch_size} must be positive and seed={seed} >= 0")
        self.tokens, self.seq_len, self.batch_size, self.seed = tokens, seq_len, batch_size, seed
        self.order = order or getattr(tokens, "sample_order", "permutation")
        if self.order not in ("permutation", "feistel"):
            raise ValueError(f"order={self.order!r} is unknown; use permutation or feistel")
        self.n_windows = (len(tokens) - 1) // seq_len
        if self.n_windows < 1:
            raise ValueError(f"the training stream has {len(tokens)} tokens, fewer than one window of seq_len+1={seq_len + 1}; "
                             f"lower --seq-len or use more data")
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) >= 4:
                self._perms.clear()
            self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.n_windows)
        return self._perms[epoch]

    def windows(self, step: int) -> np.ndarray:
        """``(batch_size,)`` int64: the window indices of the global batch of ``step``."""
        if step < 0:
            raise ValueError(f"step={step} must be >= 0")
        g = step * self.batch_size + np.arange(self.batch_size, dtype=np.int64)
        epochs, pos = np.divmod(g, self.n_windows)
        out = np.empty_like(g)
        for e in np.unique(epochs):
            mask = epochs == e
            if self.order == "feistel":
                keys = np.random.default_rng([self.seed, int(e)]).integers(0, 2**64 - 1, size=FEISTEL_ROUNDS,
                                                                          dtype=np.uint64, endpoint=True)
                out[mask] = feistel_permutation(pos[mask], self.n_windows, keys)
            else:
                out[mask] = self._perm(int(e))[pos[mask]]
        return out

    def batch(self, step: int, rank: int = 0, world_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)``: int64 tensors ``(batch_size // world_size, seq_len)``, ``y`` = ``x`` shifted by one.
        Raises ``ValueError`` if batch_size is not divisible by world_size or rank is out of range."""
        if world_size < 1 or self.batch_size % world_size:
            raise ValueError(f"batch_size={self.batch_size} is not divisible by world_size={world_size}; "
                             f"use a global batch that is a multiple of the number of processes")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} is outside [0, world_size={world_size})")
        per_rank = self.batch_size // world_size
        starts = self.windows(step)[rank * per_rank:(rank + 1) * per_rank] * self.seq_len
        idx = starts[:, None] + np.arange(self.seq_len + 1)  # (b, T+1)
        w = torch.from_numpy(np.asarray(self.tokens[idx], dtype=np.int64))
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()


__all__ = [
    "load_documents", "split_documents", "Tokenizer", "ByteTokenizer", "byte_level_hf_tokenizer",
    "load_tokenizer", "load_tokenizer_dir", "cache_root", "token_dtype", "TokenData", "prepare_data",
    "val_batches", "bits_per_byte", "TrainSampler", "feistel_permutation", "BUNDLED", "DOC_SEP", "BOS", "EOS",
]
