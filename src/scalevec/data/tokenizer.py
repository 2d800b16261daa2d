"""Tokenizers: text <-> token ids, one interface for bytes, trained BPE and any tokenizer.json (DESIGN.md §8).

    load_tokenizer(spec, train_docs)  -> Tokenizer   bytes | bpe:N (trained on the train split, cached) | tokenizer.json
    load_tokenizer_dir(directory)     -> Tokenizer   the tokenizer saved in a run or export directory

``encode`` never adds special tokens; the token streams (``corpus.py``, ``prepared.py``) place BOS/EOS
around documents themselves.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from scalevec.config.files import load_json
from scalevec.data.cache import FORMAT_VERSION, cache_root, content_key, docs_hash
from scalevec.data.documents import first_line
from scalevec.outpath import read_regular, replace_file

BOS, EOS = "<|bos|>", "<|eos|>"  # special tokens of bpe:N tokenizers
TOKENIZER_HELP = "use 'bytes', 'bpe:N' (e.g. bpe:4096) or a path to a tokenizer.json"
SAVED_FILES = ("tokenizer.json", "tokenizer_config.json")  # what Tokenizer.save writes (--overwrite deletes those)


# A tokenizer without special tokens (``bytes``) starts documents after this text: the training stream joins
# documents with documents.DOC_SEP ("\n\n\n"), so a newline is what precedes every document's first byte.
# Generation puts it before a prompt and export declares it as BOS (hf/tokenizer_files.py ``tokenizer_specials``).
BYTES_PREFIX = "\n"


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
        return content_key(self.hf.to_str(), self.bos_token, self.eos_token)

    def save(self, directory: str | Path) -> None:
        """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``directory`` (created if needed);
        ``transformers.PreTrainedTokenizerFast.from_pretrained(directory)`` and ``load_tokenizer_dir`` read them."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        # replace_file: a restarted run rewrites these, never through a link left in their place
        replace_file(d / SAVED_FILES[0], self.hf.to_str())
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "scalevec_tokenizer": self.spec}
        if self.bos_token:
            config["bos_token"] = self.bos_token
        if self.eos_token:
            config["eos_token"] = self.eos_token
        replace_file(d / SAVED_FILES[1], json.dumps(config, indent=2) + "\n")

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


def start_token(tok: Tokenizer) -> int | None:
    """The id put before a prompt: the tokenizer's BOS, or for a tokenizer without special tokens
    (``bytes``) the single token of ``BYTES_PREFIX``, as its export declares
    (hf/tokenizer_files.py ``tokenizer_specials``)."""
    if tok.bos_id is not None or tok.eos_id is not None:
        return tok.bos_id
    ids = tok.encode(BYTES_PREFIX)
    return ids[0] if len(ids) == 1 else None


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
            raise ValueError(f"tokenizer {spec!r}: N must be an integer >= 258 (256 bytes + <|bos|> + <|eos|>); e.g. "
                             "bpe:4096")
        if not train_docs:
            raise ValueError(f"tokenizer {spec!r} is trained on the training documents; pass train_docs (or use "
                             "prepare_data)")
        return _bpe_tokenizer(int(n), train_docs, cache_root(cache_dir))
    path = Path(spec).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"tokenizer {spec!r} is not 'bytes' or 'bpe:N' and no such file exists; "
                                f"{TOKENIZER_HELP}")
    return _tokenizer_from_file(path / "tokenizer.json" if path.is_dir() else path, spec)


def declared_vocab_size(spec: str) -> int:
    """The vocabulary a tokenizer spec declares, without training or loading data: 256 for ``bytes``, N for
    ``bpe:N`` (an upper bound: a small corpus may yield fewer), the file's size for a tokenizer.json. What a
    sweep counts parameters with before the trainer fits the model's vocabulary (``resolve.fit_vocab``).
    Raises as ``load_tokenizer`` does for a bad spec or a missing file."""
    if spec == "bytes":
        return 256
    if spec.startswith("bpe:"):
        n = spec[len("bpe:"):]
        if not n.isdigit() or int(n) < 258:
            raise ValueError(f"tokenizer {spec!r}: N must be an integer >= 258; e.g. bpe:4096")
        return int(n)
    return load_tokenizer(spec).vocab_size


def load_tokenizer_dir(directory: str | Path) -> Tokenizer:
    """The tokenizer that ``Tokenizer.save(directory)`` wrote, with its original ``spec``.
    Raises ``FileNotFoundError`` if ``directory/tokenizer.json`` is missing, ``ValueError`` if invalid."""
    path = Path(directory) / "tokenizer.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; pass a folder written by Tokenizer.save "
                                f"(or an exported model)")
    config = _read_tokenizer_config(path.parent)
    return _tokenizer_from_file(path, config.get("scalevec_tokenizer", str(path)))


def _tokenizer_from_file(path: Path, spec: str) -> Tokenizer:
    """A tokenizer.json; BOS/EOS from a ``tokenizer_config.json`` beside it, else by common names."""
    if not path.exists():  # a FIFO or device is read_regular's "not a regular file", never "does not exist"
        raise FileNotFoundError(f"tokenizer file {path} does not exist; {TOKENIZER_HELP}")
    config = _read_tokenizer_config(path.parent)
    if config.get("scalevec_tokenizer") == "bytes":
        return ByteTokenizer()
    try:
        text = read_regular(path, TOKENIZER_HELP).decode("utf-8")
    except UnicodeDecodeError:  # a ValueError, but Python's words alone named neither the file nor the fix
        raise ValueError(f"tokenizer file {path} is not UTF-8 text, so no tokenizer.json; {TOKENIZER_HELP}") from None
    try:
        hf = HFTokenizer.from_str(text)
    except Exception as e:  # tokenizers raises a bare Exception for malformed files
        raise ValueError(f"tokenizer file {path} is not a valid tokenizer.json ({first_line(e)}); "
                         f"{TOKENIZER_HELP}") from None

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
    if not path.exists():
        return {}
    config = load_json(path, "tokenizer config", "fix or delete it")
    return config if isinstance(config, dict) else {}


BPE_PROGRESS_EVERY = 10.0  # seconds between BPE progress lines in a log (90 s of a 300 MB job: 9 lines)


def train_bpe(vocab_size: int, docs: Iterable[str], length: int | None = None, progress: bool = False,
              every: float = BPE_PROGRESS_EVERY, stream=None) -> HFTokenizer:
    """A byte-level BPE of ``vocab_size`` tokens (``<|bos|>`` = 0, ``<|eos|>`` = 1) trained on ``docs``,
    which may be a generator (HF ``tokenizers`` keeps word counts, not the documents; DESIGN.md §8).

    ``progress``: on a terminal (``stream``, default stderr) tokenizers' own progress bars; elsewhere
    (a log) ``_BPEProgress``'s one-line reports every ``every`` seconds and a last one. The result does not
    depend on it."""
    stream = stream if stream is not None else sys.stderr
    bars = progress and stream.isatty()
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # no invented leading space: exact bytes
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS], show_progress=bars,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    if progress and not bars:
        with _BPEProgress(vocab_size, stream, every) as report:
            hf.train_from_iterator(report.counted(docs), trainer, length=length)
            report.finish(hf.get_vocab_size())
    else:
        hf.train_from_iterator(docs, trainer, length=length)
    # transformers users get BOS first, as every training document had it
    hf.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, hf.token_to_id(BOS))])
    return hf


class _BPEProgress:
    """One-line progress of a BPE training for a log: a thread prints, every ``every`` seconds, the documents and
    characters read so far while tokenizers counts words, then how long the merges have been running once the
    documents are read (tokenizers releases the GIL while it trains, so the thread runs), and a last line with
    the result. Tokenizers reads ahead of its counting, so "read" is what it has taken from the stream."""

    def __init__(self, vocab_size: int, stream, every: float):
        self.vocab_size, self.stream, self.every = vocab_size, stream, every
        self.docs = self.chars = 0
        self.read_s: float | None = None
        self.t0 = time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="scalevec-bpe-progress", daemon=True)

    def counted(self, docs: Iterable[str]) -> Iterator[str]:
        """``docs``, counted as tokenizers takes them."""
        for d in docs:
            self.docs += 1
            self.chars += len(d)
            yield d
        self.read_s = time.perf_counter() - self.t0

    def line(self) -> str:
        t = time.perf_counter() - self.t0
        read = f"{self.docs:,} documents, {self.chars / 1e6:.1f}M characters"
        if self.read_s is None:
            return f"bpe: counting words: {read} read ({t:.0f} s)"
        return f"bpe: computing merges to {self.vocab_size:,} tokens: {read} counted in {self.read_s:.0f} s ({t:.0f} s)"

    def _say(self, text: str) -> None:
        try:
            print(text, file=self.stream, flush=True)
        except (OSError, ValueError):  # a closed pipe must not stop the training
            pass

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self._say(self.line())

    def __enter__(self) -> _BPEProgress:
        self._say(f"bpe: training {self.vocab_size:,} tokens")
        self._thread.start()
        return self

    def finish(self, n_tokens: int) -> None:
        """Stop the reports and say what was trained (a small corpus may give fewer tokens than asked)."""
        self.__exit__()
        self._say(f"bpe: trained {n_tokens:,} tokens on {self.docs:,} documents ({self.chars / 1e6:.1f}M characters) "
                  f"in {time.perf_counter() - self.t0:.1f} s")

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def _bpe_tokenizer(vocab_size: int, train_docs: list[str], cache: Path) -> Tokenizer:
    """Train (or load from the cache) a byte-level BPE on ``train_docs``; written atomically."""
    key = content_key(FORMAT_VERSION, vocab_size, docs_hash(train_docs))[:16]
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
