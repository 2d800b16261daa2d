"""Tests for scalevec.data: corpora, tokenizers, token cache, validation set, sampler (DESIGN.md §8)."""

import json
import math
import sys
import types

import numpy as np
import pytest
import torch

from scalevec.config import DataConfig
from scalevec.data import corpus as corpus_mod
from scalevec.data import documents as documents_mod
from scalevec.data.cache import FORMAT_VERSION, cache_root, content_key, docs_hash
from scalevec.data.corpus import prepare_data
from scalevec.data.documents import DOC_SEP, load_documents, source_note
from scalevec.data.sampler import TrainSampler, bits_per_byte, val_batches
from scalevec.data.split import plan_split, split_documents, split_stream
from scalevec.data.tokenizer import BOS, EOS, ByteTokenizer, load_tokenizer, load_tokenizer_dir
from scalevec.data.tokens import token_dtype

DOCS = [
    "First document.\nIt has two lines about the quick brown fox.",
    "Second document: the lazy dog sleeps.\nAnd the fox jumps over the dog.",
    "Third document, all about tokenizers and bytes.\nÜnïcödé too: héllo wörld 🙂.",
    "Fourth and last document.\nValidation lives here, qqqq qqqq qqqq qqqq qqqq qqqq qqqq.",
]


def write_txt(tmp_path, docs=DOCS, name="corpus.txt"):
    path = tmp_path / name
    path.write_text(DOC_SEP.join(docs) + "\n", encoding="utf-8")
    return path


def cfg(tmp_path, source, tokenizer="bytes", val_frac=0.25, **over):
    return DataConfig(source=str(source), tokenizer=tokenizer, val_frac=val_frac, cache_dir=str(tmp_path / "cache"),
                      **over)


# --------------------------------------------------------------------------------------------- documents


def test_bundled_corpora_have_their_documents():
    """The bundled Shakespeare has 42 works and the KJV 66 books, none containing the separator."""
    shakespeare, kjv = load_documents("shakespeare"), load_documents("kjv")
    assert (len(shakespeare), len(kjv)) == (42, 66)
    assert shakespeare[0].startswith("ALL'S WELL THAT ENDS WELL") and kjv[0].startswith("Genesis")
    assert not any(DOC_SEP in d for d in shakespeare + kjv)


def test_txt_file_splits_on_blank_lines(tmp_path):
    """A .txt file with "\\n\\n\\n" separators gives one document per part, newlines trimmed."""
    assert load_documents(str(write_txt(tmp_path))) == DOCS


def test_txt_file_without_separator_is_one_document(tmp_path):
    """A .txt file without "\\n\\n\\n" is one document."""
    path = tmp_path / "one.txt"
    path.write_text("line one\n\nline three\n")
    assert load_documents(str(path)) == ["line one\n\nline three"]


def test_runs_of_three_or_more_newlines_end_a_document(tmp_path):
    """The .txt rule (docs/data.md): every run of 3+ newlines ends a document, whatever its length (3, 4, 7);
    two newlines do not; the load-time line says how many documents came out and by which rule."""
    path = tmp_path / "c.txt"
    path.write_text("one\n\nstill one\n\n\ntwo\n\n\n\nthree\n\n\n\n\n\n\nfour\n", encoding="utf-8")
    assert load_documents(str(path)) == ["one\n\nstill one", "two", "three", "four"]
    assert "3+ newlines" in source_note(str(path)) and "3+ newlines" in source_note("shakespeare")
    assert source_note(str(tmp_path)) == "one document per .txt file"
    data = prepare_data(cfg(tmp_path, path))
    assert data.meta["documents"] == 4
    line = data.describe()
    assert "4 documents (a .txt file: a new document after every run of 3+ newlines" in line and "\n" not in line


def test_txt_is_streamed_in_pieces_exactly_as_str_split(tmp_path, monkeypatch):
    """Read 7 bytes at a time (separators and multi-byte characters straddle the reads), a .txt file gives
    exactly the documents of splitting the whole text at DOC_SEP: nothing lost or merged at a piece boundary."""
    monkeypatch.setattr(documents_mod, "READ_BYTES", 7)
    text = "\ufeff\n\n" + DOC_SEP.join(DOCS) + "\n\n\n\n\nlast\r\nline 🙂\n\n\n\n\n\n\n\nend\n"
    path = tmp_path / "c.txt"
    path.write_text(text, encoding="utf-8")
    want = [p.strip("\n") for p in text.lstrip("\ufeff").split(DOC_SEP) if p.strip()]
    assert load_documents(str(path)) == want and len(want) == len(DOCS) + 2
    monkeypatch.setattr(documents_mod, "READ_BYTES", 1 << 20)
    assert load_documents(str(path)) == want


def test_non_utf8_bytes_are_named_by_their_offset(tmp_path, monkeypatch):
    """A bad byte is reported at its byte offset in the file, in a later read piece of a .txt file and on a
    later line of a .jsonl file alike (one error text for every reader)."""
    monkeypatch.setattr(documents_mod, "READ_BYTES", 16)
    txt = tmp_path / "c.txt"
    txt.write_bytes("héllo wörld, ".encode() * 5 + b"\xff tail")
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    for path, bad in ((txt, b"\xff"), (jsonl, b"\xe9")):
        offset = path.read_bytes().index(bad)  # 75: in the 5th piece of 16 bytes; 28: on line 2
        with pytest.raises(ValueError, match=f"not UTF-8 text \\(bad byte at offset {offset}\\)"):
            load_documents(str(path))


def test_folder_gives_one_document_per_txt_file_sorted(tmp_path):
    """A folder gives one document per .txt file (recursively, sorted by path), skipping other and empty files."""
    (tmp_path / "b.txt").write_text("bee")
    (tmp_path / "a.txt").write_text("ay")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.txt").write_text("sea\n\n\nstill one file")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "notes.md").write_text("ignored")
    assert load_documents(str(tmp_path)) == ["ay", "bee", "sea\n\n\nstill one file"]


def test_jsonl_reads_text_field(tmp_path):
    """A .jsonl file gives the "text" field of each line, skipping blank lines; U+2028 stays inside a document."""
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"text": "one", "id": 1}) + "\n\n"
                    + json.dumps({"text": "two\u2028lines"}, ensure_ascii=False) + "\n", encoding="utf-8")
    assert load_documents(str(path)) == ["one", "two\u2028lines"]


def test_parquet_reads_text_column(tmp_path):
    """A .parquet file gives its "text" column, nulls dropped."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3], "text": ["alpha", None, "gamma"]}), path)
    assert load_documents(str(path)) == ["alpha", "gamma"]


def test_hf_source_uses_datasets_train_split(monkeypatch):
    """hf:NAME:CONFIG calls datasets.load_dataset(NAME, CONFIG, split="train") and reads its "text" column."""
    calls = []

    class FakeDataset:
        column_names = ["text", "label"]

        def __getitem__(self, column):
            return ["doc one", "doc two"]

    def load_dataset(name, config, split):
        calls.append((name, config, split))
        return FakeDataset()

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    assert load_documents("hf:someone/corpus:small") == ["doc one", "doc two"]
    assert calls == [("someone/corpus", "small", "train")]


def test_hf_source_errors_are_clear(monkeypatch):
    """hf: without the datasets package, or offline, is a one-line ValueError naming the fix."""
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ValueError, match="pip install datasets"):
        load_documents("hf:someone/corpus")

    def offline(*args, **kwargs):
        raise ConnectionError("no network\nsecond line")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    with pytest.raises(ValueError, match="online") as e:
        load_documents("hf:someone/corpus")
    assert "\n" not in str(e.value)


def test_parquet_without_pyarrow_says_pip_install(tmp_path, monkeypatch):
    """Reading .parquet without pyarrow is a ValueError telling to pip install pyarrow."""
    path = tmp_path / "c.parquet"
    path.write_bytes(b"PAR1 not really")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ValueError, match="pip install pyarrow"):
        load_documents(str(path))


@pytest.mark.parametrize("value, words", [("[" * 100_000 + "]" * 100_000, "nests too deeply"),
                                          ("9" * 5000, "Exceeds the limit (4300 digits)")])
def test_a_jsonl_line_json_cannot_read_names_the_file_and_line(tmp_path, capsys, value, words):
    """A .jsonl line nested 100,000 deep (a RecursionError traceback before) or holding a 5,000-digit integer
    (Python's message alone before) is one line naming the file, the line and the fix, from the loader and
    prepare-data alike; nothing is written."""
    from scalevec.cli import main

    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "ok"}\n{"text": "a", "x": ' + value + "}\n")
    with pytest.raises(ValueError, match=rf"^data file {path} line 2 is not valid JSON \(.*\); fix or remove"):
        load_documents(str(path))
    assert main(["prepare-data", str(path), "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "line 2 is not valid JSON" in err and words in err, err
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("case, error, message", [
    ("missing", FileNotFoundError, "does not exist"),
    ("empty_file", ValueError, "is empty"),
    ("blank_file", ValueError, "contains no text"),
    ("empty_folder", ValueError, "has no .txt files"),
    ("blank_folder", ValueError, "contains no text"),
    ("latin1", ValueError, "not UTF-8"),
    ("bad_json", ValueError, "line 2 is not valid JSON"),
    ("no_field", ValueError, 'line 1 has no "text" field'),
    ("not_string", ValueError, "not a string"),
    ("no_column", ValueError, "no 'text' column"),
    ("corrupt_parquet", ValueError, "not a readable parquet"),
    ("suffix", ValueError, "unsupported type"),
])
def test_bad_sources_raise_one_line_errors(tmp_path, case, error, message):
    """Every bad data source raises FileNotFoundError/ValueError with a one-line message naming the problem."""
    path = {
        "missing": tmp_path / "nope.txt", "empty_file": tmp_path / "e.txt", "blank_file": tmp_path / "b.txt",
        "empty_folder": tmp_path / "d", "blank_folder": tmp_path / "d", "latin1": tmp_path / "l.txt",
        "bad_json": tmp_path / "j.jsonl", "no_field": tmp_path / "j.jsonl", "not_string": tmp_path / "j.jsonl",
        "no_column": tmp_path / "p.parquet", "corrupt_parquet": tmp_path / "p.parquet", "suffix": tmp_path / "x.csv",
    }[case]
    if case == "empty_file":
        path.write_bytes(b"")
    elif case == "blank_file":
        path.write_text(" \n\n\n\t\n")
    elif case in ("empty_folder", "blank_folder"):
        path.mkdir()
        if case == "blank_folder":
            (path / "a.txt").write_text("\n  \n")
    elif case == "latin1":
        path.write_bytes("café".encode("latin-1"))
    elif case == "bad_json":
        path.write_text('{"text": "ok"}\n{"text": oops}\n')
    elif case == "no_field":
        path.write_text('{"content": "x"}\n')
    elif case == "not_string":
        path.write_text('{"text": 42}\n')
    elif case == "no_column":
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.table({"body": ["x"]}), path)
    elif case == "corrupt_parquet":
        path.write_bytes(b"this is not parquet")
    elif case == "suffix":
        path.write_text("a,b\n")
    with pytest.raises(error, match=message) as e:
        load_documents(str(path))
    assert "\n" not in str(e.value) and ";" in str(e.value)  # one line: the problem; the fix


# --------------------------------------------------------------------------------------------- split


def test_split_holds_out_last_documents():
    """Validation is the last documents holding >= val_frac of the characters; train/val are disjoint, in order."""
    docs = ["a" * 50, "b" * 30, "c" * 12, "d" * 8]
    train, val, record = split_documents(docs, 0.15)
    assert (train, val) == (docs[:2], docs[2:])  # last 1 doc holds 8 % < 15 %, last 2 hold 20 %
    assert "last 2 of 4 documents" in record.note
    train, val, _ = split_documents(docs, 0.99)
    assert train == docs[:1] and val == docs[1:]  # at least one training document


def test_bundled_shakespeare_validation_is_last_four_plays():
    """On the bundled Shakespeare at val_frac 0.1 validation is the last 4 whole plays (Troilus ... Winter's Tale)."""
    docs = load_documents("shakespeare")
    train, val, _ = split_documents(docs, 0.1)
    assert len(val) == 4 and val[0].startswith("THE HISTORY OF TROILUS") and val[-1].startswith("THE WINTER'S TALE")
    assert train + val == docs


def test_single_document_splits_at_line_boundary():
    """One document is cut at the start of a line near 1 - val_frac, and the note says so."""
    text = "".join(f"line {i:02d}\n" for i in range(20))  # 8 chars per line
    train, val, record = split_documents([text], 0.25)
    assert train[0] + val[0] == text and train[0].endswith("\n") and val[0].startswith("line 15")
    assert "one document" in record.note and record.as_dict()["documents"] == 1
    with pytest.raises(ValueError, match="line break"):
        split_documents(["no line break here at all"], 0.1)


def test_strided_and_random_splits():
    """strided: documents 9, 19, 29 of 35 at 0.1. random: a seeded choice, the same on every call, another
    under another seed, a document's side independent of the corpus length, about val_frac of the documents."""
    docs = [f"document {i}" for i in range(35)]
    train, val, record = split_documents(docs, 0.1, "strided")
    assert val == [docs[9], docs[19], docs[29]] and train + val != docs and sorted(train + val) == sorted(docs)
    assert "every 10th document" in record.note
    sides = lambda n, seed: [plan_split("random", 0.1, seed).is_val(i) for i in range(n)]
    assert sides(2000, 7) == sides(2000, 7) and sides(2000, 7) != sides(2000, 8)
    assert sides(4000, 7)[:2000] == sides(2000, 7)
    # Binomial(2000, 0.1): mean 200, sd 13.4; the hash is fixed, so this is deterministic (bounds = ±3.7 sd)
    assert 150 < sum(sides(2000, 7)) < 250
    with pytest.raises(ValueError, match="unknown"):
        plan_split("every-other", 0.1)
    with pytest.raises(ValueError, match="validation split would be empty.*or the tail split"):
        split_documents(docs[:5], 0.1, "strided")


def test_split_record_names_the_validation_documents():
    """The record counts both sides and names the validation documents: first and last index, and the SHA-256
    of their indices as decimal lines (docs/data.md), so a split can be checked from outside."""
    import hashlib

    docs = [f"doc {i} " + "x" * i for i in range(30)]
    for rule in ("tail", "strided", "random"):
        split = plan_split(rule, 0.2, 5, [len(d) for d in docs])
        val_idx = [i for i, d in enumerate(docs) if split.is_val(i)]
        _, val, record = split_documents(docs, 0.2, rule, seed=5)
        r = record.as_dict(train_tokens=10, val_tokens=3)
        assert val == [docs[i] for i in val_idx] and r["rule"] == rule
        assert (r["documents"], r["val_docs"], r["train_docs"]) == (30, len(val_idx), 30 - len(val_idx))
        assert (r["val_first_doc"], r["val_last_doc"]) == (val_idx[0], val_idx[-1])
        assert r["val_index_sha256"] == hashlib.sha256("".join(f"{i}\n" for i in val_idx).encode()).hexdigest()
        assert r["val_chars"] == sum(map(len, val)) and (r["train_tokens"], r["val_tokens"]) == (10, 3)
    streamed = list(split_stream(iter(docs), plan_split("strided", 0.2)))
    assert [d for v, d in streamed if v] == [docs[i] for i in (4, 9, 14, 19, 24, 29)]


def test_val_split_option_of_the_plain_path(tmp_path):
    """data.val_split=strided holds out every 1/val_frac-th document and gets its own cache entry; the default
    tail keeps the cache key of earlier runs (so their entries and the golden losses stay as they were)."""
    docs = [f"Document {i}.\nSome text of document {i}." for i in range(10)]
    source = write_txt(tmp_path, docs)
    tail = prepare_data(cfg(tmp_path, source, val_frac=0.2))
    strided = prepare_data(cfg(tmp_path, source, val_frac=0.2, val_split="strided"))
    assert bytes(strided.val.astype(np.uint8)) == DOC_SEP.join([docs[4], docs[9]]).encode()
    assert bytes(tail.val.astype(np.uint8)) == DOC_SEP.join(docs[8:]).encode()
    assert strided.cache_path != tail.cache_path
    old_key = content_key(FORMAT_VERSION, docs_hash(docs), tail.tokenizer.identity(), repr(0.2))[:24]
    assert tail.cache_path.name == old_key
    v = strided.meta["validation"]
    assert (v["rule"], v["val_docs"], v["val_first_doc"], v["val_last_doc"]) == ("strided", 2, 4, 9)
    assert (v["train_tokens"], v["val_tokens"]) == (len(strided.train), len(strided.val))
    with pytest.raises(ValueError, match="data.val_split='blocks' is unknown; use tail, strided, random"):
        DataConfig(val_split="blocks").validate()


# --------------------------------------------------------------------------------------------- tokenizers


def test_bytes_tokenizer_ids_are_utf8_bytes():
    """bytes: vocab exactly 256, no BOS/EOS, ids are the UTF-8 bytes, decode inverts encode."""
    tok = load_tokenizer("bytes")
    text = "héllo wörld 🙂\n"
    assert tok.vocab_size == 256 and tok.bos_id is None and tok.eos_id is None
    assert tok.encode(text) == list(text.encode("utf-8"))
    assert tok.decode(tok.encode(text)) == text
    assert tok.hf.encode(text, add_special_tokens=False).ids == list(text.encode("utf-8"))  # the HF twin agrees


def test_saved_bytes_tokenizer_loads_in_transformers(tmp_path):
    """The saved bytes tokenizer loads in PreTrainedTokenizerFast and maps text to the same 256 byte ids."""
    import transformers
    ByteTokenizer().save(tmp_path)
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(tmp_path))
    text = "To be, or not to be: Ünïcödé 🙂\n\n"
    assert hf(text)["input_ids"] == list(text.encode("utf-8"))
    assert hf.decode(list(text.encode("utf-8"))) == text and len(hf) == 256
    assert isinstance(load_tokenizer_dir(tmp_path), ByteTokenizer)


def test_bpe_round_trips_through_transformers(tmp_path):
    """bpe:N has <|bos|>=0 and <|eos|>=1; saved, transformers gives [BOS] + our ids and decodes them back."""
    import transformers
    tok = load_tokenizer("bpe:300", DOCS, tmp_path / "cache")
    assert (tok.bos_id, tok.eos_id, tok.vocab_size) == (0, 1, 300)
    text = "the quick brown fox, héllo 🙂"
    ids = tok.encode(text)
    assert tok.decode(ids) == text and len(ids) < len(text.encode("utf-8"))  # merges were learned
    tok.save(tmp_path / "saved")
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(tmp_path / "saved"))
    assert hf(text)["input_ids"] == [tok.bos_id] + ids
    assert hf(text, add_special_tokens=False)["input_ids"] == ids
    assert hf.decode(ids) == text and hf.bos_token == BOS and hf.eos_token == EOS
    again = load_tokenizer_dir(tmp_path / "saved")
    assert again.spec == "bpe:300" and again.encode(text) == ids and again.eos_id == 1


def test_bpe_is_cached_and_keyed_by_data_and_size(tmp_path):
    """bpe:N is written once to the cache and reloaded; other data or another N gives another file."""
    cache = tmp_path / "cache"
    a = load_tokenizer("bpe:300", DOCS, cache)
    files = sorted((cache / "tokenizers").glob("*.json"))
    assert len(files) == 1
    assert load_tokenizer("bpe:300", DOCS, cache).identity() == a.identity()
    load_tokenizer("bpe:290", DOCS, cache)
    load_tokenizer("bpe:300", DOCS[:2], cache)
    assert len(list((cache / "tokenizers").glob("*.json"))) == 3
    assert not list((cache / "tokenizers").glob(".*tmp"))


def test_bpe_is_trained_on_training_split_only(tmp_path):
    """prepare_data trains BPE without the validation documents: a string only in val gets no merge."""
    data = prepare_data(cfg(tmp_path, write_txt(tmp_path), "bpe:300", val_frac=0.25))
    assert data.meta["val_docs"] == 1 and "qqqq" in DOCS[-1] and "qq" not in "".join(DOCS[:-1])
    vocab = data.tokenizer.hf.get_vocab()
    assert "qq" not in vocab and "Ġqq" not in vocab
    assert load_tokenizer("bpe:300", DOCS, tmp_path / "other").hf.get_vocab().keys() >= {"qq"}  # control


def test_tokenizer_json_path_and_errors(tmp_path):
    """A tokenizer.json path loads (BOS/EOS from its config); missing, invalid and bad specs raise clearly."""
    tok = load_tokenizer("bpe:300", DOCS, tmp_path / "cache")
    tok.save(tmp_path / "t")
    loaded = load_tokenizer(str(tmp_path / "t" / "tokenizer.json"))
    assert loaded.encode(DOCS[0]) == tok.encode(DOCS[0]) and (loaded.bos_id, loaded.eos_id) == (0, 1)
    with pytest.raises(FileNotFoundError, match="bpe:N"):
        load_tokenizer(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a valid tokenizer.json"):
        load_tokenizer(str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match=">= 258"):
        load_tokenizer("bpe:100", DOCS)
    with pytest.raises(ValueError, match="integer"):
        load_tokenizer("bpe:lots", DOCS)
    with pytest.raises(FileNotFoundError):
        load_tokenizer_dir(tmp_path / "nothing")


@pytest.mark.parametrize("file, raw, words", [
    ("tokenizer.json", b"\xff\xfe{}", "is not UTF-8 text, so no tokenizer.json"),  # Python's words alone before
    ("tokenizer_config.json", b"[" * 100_000 + b"]" * 100_000, "nests too deeply"),  # a RecursionError before
    ("tokenizer_config.json", b'{"x": ' + b"9" * 5000 + b"}", "is not valid JSON"),  # no file named before
])
def test_an_unreadable_tokenizer_file_is_named(tmp_path, file, raw, words):
    """A tokenizer.json that is not UTF-8, or a tokenizer_config.json beside it nested 100,000 deep or holding a
    5,000-digit integer, is one ValueError naming the file."""
    tok = load_tokenizer("bpe:300", DOCS, tmp_path / "cache")
    tok.save(tmp_path / "t")
    (tmp_path / "t" / file).write_bytes(raw)
    with pytest.raises(ValueError, match=words) as e:
        load_tokenizer(str(tmp_path / "t" / "tokenizer.json"))
    assert str(tmp_path / "t" / file) in str(e.value) and "\n" not in str(e.value)


# --------------------------------------------------------------------------------------------- token cache


def test_bytes_streams_are_the_documents_joined(tmp_path):
    """bytes (no BOS/EOS): each split's stream is its documents joined by "\\n\\n\\n", as UTF-8 bytes, in uint16."""
    data = prepare_data(cfg(tmp_path, write_txt(tmp_path)))
    assert data.train.dtype == np.uint16 and isinstance(data.train, np.memmap)
    assert bytes(data.train.astype(np.uint8)) == DOC_SEP.join(DOCS[:3]).encode("utf-8")
    assert bytes(data.val.astype(np.uint8)) == DOCS[3].encode("utf-8")


@pytest.mark.parametrize("damage", ["", "[" * 100_000 + "]" * 100_000, '{"dtype": "no such dtype"}'])
def test_a_damaged_token_cache_is_named_with_the_fix(tmp_path, damage):
    """A token cache whose meta.json is empty, nested 100,000 deep or names no dtype raised json's, a
    RecursionError's or numpy's words (no file, no fix): one ValueError naming the cache and "delete that folder"."""
    data = prepare_data(cfg(tmp_path, write_txt(tmp_path)))
    (data.cache_path / "meta.json").write_text(damage)
    with pytest.raises(ValueError, match=rf"^the token cache {data.cache_path} is damaged .*delete that folder"):
        prepare_data(cfg(tmp_path, write_txt(tmp_path)))


def test_bpe_streams_wrap_every_document_in_bos_eos(tmp_path):
    """With BOS/EOS every document is [BOS] + ids + [EOS], documents back to back, train/val disjoint by document."""
    data = prepare_data(cfg(tmp_path, write_txt(tmp_path), "bpe:300"))
    tok = data.tokenizer
    expected = lambda docs: [i for d in docs for i in [tok.bos_id, *tok.encode(d), tok.eos_id]]
    assert data.train.tolist() == expected(DOCS[:3])
    assert data.val.tolist() == expected(DOCS[3:])


def test_cache_hit_and_key_changes(tmp_path):
    """A second prepare_data reads the cache; val_frac, tokenizer or file content changes give a new entry."""
    source = write_txt(tmp_path)
    first = prepare_data(cfg(tmp_path, source))
    again = prepare_data(cfg(tmp_path, source))
    assert not first.from_cache and again.from_cache and again.cache_path == first.cache_path
    assert np.array_equal(again.train, first.train)
    paths = {first.cache_path,
             prepare_data(cfg(tmp_path, source, val_frac=0.5)).cache_path,
             prepare_data(cfg(tmp_path, source, "bpe:300")).cache_path}
    write_txt(tmp_path, DOCS[:3] + [DOCS[3] + " changed"])
    changed = prepare_data(cfg(tmp_path, source))
    assert not changed.from_cache
    assert len(paths | {changed.cache_path}) == 4
    assert not [p for p in (tmp_path / "cache" / "tokens").iterdir() if p.name.startswith(".")]


def test_cache_dir_falls_back_to_env(tmp_path, monkeypatch):
    """cache_dir "" uses $SCALEVEC_CACHE; an explicit cache_dir wins."""
    monkeypatch.setenv("SCALEVEC_CACHE", str(tmp_path / "env"))
    assert cache_root("") == tmp_path / "env" and cache_root(tmp_path / "x") == tmp_path / "x"


def test_interrupted_cache_write_leaves_nothing(tmp_path, monkeypatch):
    """If tokenizing dies midway, no cache entry and no temporary folder remain; the next call rebuilds."""
    source = write_txt(tmp_path)
    real = corpus_mod._write_stream

    def dies_on_val(path, *args, **kwargs):
        if path.name == "val.bin":
            raise KeyboardInterrupt
        return real(path, *args, **kwargs)

    monkeypatch.setattr(corpus_mod, "_write_stream", dies_on_val)
    with pytest.raises(KeyboardInterrupt):
        prepare_data(cfg(tmp_path, source))
    assert list((tmp_path / "cache" / "tokens").iterdir()) == []
    monkeypatch.setattr(corpus_mod, "_write_stream", real)
    assert not prepare_data(cfg(tmp_path, source)).from_cache


def test_failed_prepare_writes_nothing(tmp_path):
    """A bad source fails before anything is written to the cache."""
    with pytest.raises(FileNotFoundError):
        prepare_data(cfg(tmp_path, tmp_path / "missing.txt", "bpe:300"))
    assert not (tmp_path / "cache").exists()


def test_token_dtype_switches_to_uint32_above_65536(tmp_path):
    """Ids are stored as uint16 up to vocab 65536 and as uint32 above (end to end with a 70k-word tokenizer)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32
    vocab = {f"w{i}": i for i in range(70000)}
    vocab["[UNK]"] = 70000
    hf = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf.save(str(tmp_path / "big.json"))
    write_txt(tmp_path, ["w1 w69999\nw2", "w3 w4\nw5"])
    data = prepare_data(cfg(tmp_path, tmp_path / "corpus.txt", str(tmp_path / "big.json"), val_frac=0.4))
    assert data.train.dtype == np.uint32 and data.train.tolist()[:2] == [1, 69999]


# --------------------------------------------------------------------------------------------- evaluation


def test_val_batches_cover_the_first_targets_exactly(tmp_path):
    """val_batches: windows of T+1 at offsets 0, T, 2T; targets are val[1 : n*T + 1], each once; deterministic."""
    data = prepare_data(cfg(tmp_path, "shakespeare"))
    batches, n_bytes = val_batches(data, seq_len=64, n_tokens=1000, batch_size=4)
    assert [x.shape[0] for x, _ in batches] == [4, 4, 4, 3]  # 1000 // 64 = 15 windows
    x = torch.cat([b[0] for b in batches]).flatten()
    y = torch.cat([b[1] for b in batches]).flatten()
    assert x.dtype == torch.int64 and x.tolist() == data.val[:960].tolist() and y.tolist() == data.val[1:961].tolist()
    assert n_bytes == 960  # bytes: one byte per target
    again, _ = val_batches(data, seq_len=64, n_tokens=1000, batch_size=4)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(batches, again))


def test_val_batches_errors_when_too_short(tmp_path):
    """A val stream shorter than one window, or n_tokens below seq_len, is a ValueError."""
    data = prepare_data(cfg(tmp_path, write_txt(tmp_path)))
    with pytest.raises(ValueError, match="fewer than one window"):
        val_batches(data, seq_len=len(data.val), n_tokens=10**6, batch_size=2)
    with pytest.raises(ValueError, match="val_tokens"):
        val_batches(data, seq_len=16, n_tokens=8, batch_size=2)


def test_bits_per_byte_equals_nats_over_ln2_for_bytes(tmp_path):
    """For the bytes tokenizer bpb = mean nats per target / ln 2, from the returned byte count."""
    data = prepare_data(cfg(tmp_path, write_txt(tmp_path)))
    batches, n_bytes = val_batches(data, seq_len=8, n_tokens=40, batch_size=2)
    logits = torch.randn(5, 8, 256, generator=torch.Generator().manual_seed(0))
    y = torch.cat([b[1] for b in batches])
    nats = torch.nn.functional.cross_entropy(logits.view(-1, 256), y.view(-1), reduction="sum").item()
    assert n_bytes == y.numel() == 40
    assert bits_per_byte(nats, n_bytes) == pytest.approx(nats / y.numel() / math.log(2), rel=1e-12)
    with pytest.raises(ValueError):
        bits_per_byte(1.0, 0)


def test_bpe_target_bytes_equal_the_decoded_text(tmp_path):
    """For BPE the byte count of the val targets equals the UTF-8 length of their text, specials counting 0."""
    data = prepare_data(cfg(tmp_path, write_txt(tmp_path), "bpe:300", val_frac=0.5))
    batches, n_bytes = val_batches(data, seq_len=5, n_tokens=10**6, batch_size=3)
    targets = torch.cat([b[1] for b in batches]).flatten().tolist()
    specials = {data.tokenizer.bos_id, data.tokenizer.eos_id}
    assert data.meta["val_docs"] == 2 and specials <= set(targets)  # EOS and BOS between the two val documents
    text = data.tokenizer.decode([t for t in targets if t not in specials])
    assert n_bytes == len(text.encode("utf-8")) > 0
    assert data.token_bytes[list(specials)].tolist() == [0, 0]


# --------------------------------------------------------------------------------------------- sampler


def test_sampler_is_a_function_of_seed_and_step():
    """Same (seed, step) gives the same batch in any call order; another seed gives another batch; y = x shifted."""
    tokens = np.arange(1000, dtype=np.uint16)
    a, b = TrainSampler(tokens, 8, 4, seed=1), TrainSampler(tokens, 8, 4, seed=1)
    xa = [a.batch(s)[0] for s in (0, 1, 2, 50)]
    xb = [b.batch(s)[0] for s in (50, 2, 1, 0)][::-1]
    assert all(torch.equal(p, q) for p, q in zip(xa, xb))
    assert not torch.equal(TrainSampler(tokens, 8, 4, seed=2).batch(0)[0], xa[0])
    x, y = a.batch(3)
    assert x.shape == (4, 8) and x.dtype == torch.int64 and torch.equal(y, x + 1)  # consecutive tokens
    assert (x[:, 0] % 8 == 0).all()  # windows start at multiples of seq_len (non-overlapping)


def test_sampler_epoch_is_a_permutation_of_windows():
    """Within an epoch every window is drawn exactly once (batches may straddle epochs)."""
    tokens = np.arange(10 * 5 + 3, dtype=np.uint32)  # 10 windows of 5 (+1)
    s = TrainSampler(tokens, 5, 4, seed=0)
    drawn = np.concatenate([s.windows(step) for step in range(5)])  # 20 samples = 2 epochs
    assert sorted(drawn[:10]) == list(range(10)) and sorted(drawn[10:]) == list(range(10))
    assert not np.array_equal(drawn[:10], drawn[10:])  # a fresh permutation per epoch


def test_sampler_rank_slices_partition_the_global_batch():
    """Rank r takes rows [r*B/W, (r+1)*B/W) of the global batch: disjoint, and their union is the batch."""
    tokens = np.arange(5000, dtype=np.uint16)
    s = TrainSampler(tokens, 16, 8, seed=3)
    x, y = s.batch(7)
    parts = [s.batch(7, rank=r, world_size=4) for r in range(4)]
    assert all(p[0].shape == (2, 16) for p in parts)
    assert torch.equal(torch.cat([p[0] for p in parts]), x) and torch.equal(torch.cat([p[1] for p in parts]), y)
    starts = [int(p[0][i, 0]) for p in parts for i in range(2)]
    assert len(set(starts)) == 8  # no window twice in a step


def test_sampler_errors():
    """Indivisible batch, bad rank and a corpus shorter than one window raise ValueError."""
    s = TrainSampler(np.arange(100), 8, 6, seed=0)
    with pytest.raises(ValueError, match="divisible"):
        s.batch(0, rank=0, world_size=4)
    with pytest.raises(ValueError, match="rank"):
        s.batch(0, rank=3, world_size=3)
    with pytest.raises(ValueError, match="fewer than one window"):
        TrainSampler(np.arange(8), 8, 2, seed=0)
