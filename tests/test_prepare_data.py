"""Prepared data (docs/data.md): streamed sources, shards, manifest, workers, memory-mapped sampling, resume."""

import json
import os
import sys
import types

import numpy as np
import pytest

from scalevec.cli import main
from scalevec.config import DataConfig
from scalevec.data import documents as documents_mod
from scalevec.data import prepared as P
from scalevec.data.corpus import prepare_data
from scalevec.data.documents import DOC_SEP, iter_documents
from scalevec.data.sampler import TrainSampler, feistel_permutation, val_batches
from scalevec.data.tokens import TokenData
from scalevec.resolve import resolve_config
from scalevec.training.trainer import train

DOCS = [f"Document {i}: the quick brown fox {'jumps ' * (i % 5)}over the lazy dog.\nLine two of {i}, héllo 🙂."
        for i in range(23)]


def write_jsonl(path, docs=DOCS):
    path.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)), encoding="utf-8")
    return path


def split_docs(docs, val_frac):
    """The default (tail) split written out directly: the last documents holding >= val_frac of the characters."""
    total, n_val = sum(map(len, docs)), 1
    while sum(map(len, docs[-n_val:])) < val_frac * total:
        n_val += 1
    return docs[:-n_val], docs[-n_val:]


def concat(tokens: P.ShardedTokens) -> np.ndarray:
    return np.concatenate([np.asarray(s) for s in tokens.shards])


# --------------------------------------------------------------------------------------------- sources


@pytest.mark.parametrize("rule", ["tail", "strided", "random"])
def test_prepared_and_plain_paths_split_alike(tmp_path, rule):
    """One corpus, one rule: the shards hold exactly the train and val token streams of `train --data FILE`
    (data.prepare_data), and both record the same validation documents; over .txt, a folder, .jsonl and
    .parquet, all read by the one document reader."""
    txt = tmp_path / "c.txt"
    txt.write_text("\n\n" + DOC_SEP.join(DOCS) + "\n\n\n\n\nlast\r\nline\n", encoding="utf-8")
    folder = tmp_path / "folder"
    (folder / "sub").mkdir(parents=True)
    for i, d in enumerate(DOCS[:12]):
        (folder / ("sub" if i % 2 else "") / f"{i:02d}.txt").write_text(d, encoding="utf-8")
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"text": [*DOCS[:10], None, "  ", *DOCS[10:]]}), tmp_path / "c.parquet")
    for k, src in enumerate([txt, folder, write_jsonl(tmp_path / "c.jsonl"), tmp_path / "c.parquet"]):
        out = tmp_path / f"p{k}"
        P.prepare_shards(str(src), "bytes", out, val_frac=0.25, shard_tokens=400, val_split=rule, val_seed=3)
        prepared = P.load_prepared(out)
        plain = prepare_data(DataConfig(source=str(src), val_frac=0.25, val_split=rule, val_seed=3,
                                        cache_dir=str(tmp_path / "cache")))
        assert np.array_equal(concat(prepared.train), plain.train) and np.array_equal(concat(prepared.val), plain.val)
        a, b = prepared.meta["validation"], plain.meta["validation"]
        keys = ("rule", "documents", "train_docs", "val_docs", "val_first_doc", "val_last_doc", "val_index_sha256")
        assert [a[x] for x in keys] == [b[x] for x in keys] and a["val_docs"] > 0, src


def test_one_document_is_cut_at_a_line_on_both_paths(tmp_path):
    """A .txt file of one document (no run of 3 newlines): prepare-data cuts it at the line before the
    1 - val_frac point, as the plain path does (it used to refuse: the validation split was empty)."""
    text = "".join(f"line {i:02d} of the only document\n" for i in range(40))
    (tmp_path / "one.txt").write_text(text, encoding="utf-8")
    m = P.prepare_shards(str(tmp_path / "one.txt"), "bytes", tmp_path / "p", val_frac=0.25)
    prepared = P.load_prepared(tmp_path / "p")
    plain = prepare_data(DataConfig(source=str(tmp_path / "one.txt"), val_frac=0.25, cache_dir=str(tmp_path / "c")))
    assert bytes(concat(prepared.val).astype(np.uint8)).decode().startswith("line 29")  # 0.75 × 1,159 chars: in it
    assert np.array_equal(concat(prepared.train), plain.train) and np.array_equal(concat(prepared.val), plain.val)
    assert m["documents"] == 1 and "one document only: split at line 30 of 40" in m["split"]["note"]


def test_bad_bytes_and_empty_files_read_alike_on_both_paths(tmp_path, monkeypatch):
    """The one reader gives prepare-data and the plain path the same one-line errors: a bad byte past the first
    read piece named by its offset, an empty .jsonl refused as empty (it used to give an empty split)."""
    monkeypatch.setattr(documents_mod, "READ_BYTES", 16)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine text\n\n\nmore fine text here" + b"\xe9t\xe9")
    (tmp_path / "empty.jsonl").write_bytes(b"")
    offset = bad.read_bytes().index(b"\xe9")  # 31: in the second piece of 16 bytes
    for src, want in ((bad, f"bad byte at offset {offset}"), (tmp_path / "empty.jsonl", "is empty (0 bytes)")):
        with pytest.raises(ValueError) as plain:
            prepare_data(DataConfig(source=str(src), cache_dir=str(tmp_path / "cache")))
        with pytest.raises(ValueError) as prepared:
            P.prepare_shards(str(src), "bytes", tmp_path / "p")
        assert str(plain.value) == str(prepared.value) and want in str(plain.value)
    assert not (tmp_path / "p").exists()


def test_hf_source_streams(monkeypatch):
    """hf:NAME:CONFIG calls datasets.load_dataset(NAME, CONFIG, split="train", streaming=True) and reads rows
    lazily: the first document comes out before the stream is exhausted."""
    calls, pulled = [], []

    def rows():
        for i in range(1000):
            pulled.append(i)
            yield {"text": f"doc {i}", "label": 0}

    def load_dataset(name, config, split, streaming):
        calls.append((name, config, split, streaming))
        return rows()

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    docs = iter_documents("hf:someone/corpus:small")
    assert next(docs) == "doc 0" and len(pulled) <= 2
    assert calls == [("someone/corpus", "small", "train", True)]
    no_text = types.SimpleNamespace(load_dataset=lambda *a, **k: iter([{"body": "x"}]))
    monkeypatch.setitem(sys.modules, "datasets", no_text)
    with pytest.raises(ValueError, match="no 'text' column"):
        next(iter_documents("hf:someone/corpus"))


# --------------------------------------------------------------------------------------------- shards and manifest


def test_shards_hold_the_stream_of_data_prepare_data(tmp_path):
    """Train/val shards, concatenated, are byte for byte what data/corpus.py writes for the same documents (bytes
    tokenizer: documents joined by DOC_SEP), split by the default rule (the last 25 % of the characters)."""
    src = str(write_jsonl(tmp_path / "c.jsonl"))
    m = P.prepare_shards(src, "bytes", tmp_path / "p", val_frac=0.25, shard_tokens=500)
    train_docs, val_docs = split_docs(DOCS, 0.25)
    assert (m["train"]["docs"], m["val"]["docs"], m["documents"]) == (len(train_docs), len(val_docs), len(DOCS))
    data = P.load_prepared(tmp_path / "p")
    assert len(data.train.shards) > 2  # several shards: the test covers the cut between them
    assert bytes(concat(data.train).astype(np.uint8)) == DOC_SEP.join(train_docs).encode()
    assert bytes(concat(data.val).astype(np.uint8)) == DOC_SEP.join(val_docs).encode()
    assert data.train.dtype == np.uint16 and all(isinstance(s, np.memmap) for s in data.train.shards)
    assert m["tokenizer"] == "bytes" and m["dtype"] == "uint16" and m["vocab_size"] == 256
    assert (tmp_path / "p" / "tokenizer" / "tokenizer.json").is_file()
    assert sum(s["tokens"] for s in m["train"]["shards"]) == m["train"]["tokens"] == len(data.train)


def test_document_offsets_mark_every_document(tmp_path):
    """With bpe (BOS/EOS) each document k of a shard is offsets[k]:offsets[k+1] = [BOS] + encode(doc) + [EOS]."""
    P.prepare_shards(str(write_jsonl(tmp_path / "c.jsonl")), "bpe:300", tmp_path / "p", val_frac=0.25, shard_tokens=300)
    data = P.load_prepared(tmp_path / "p", "bpe:300")
    tok = data.tokenizer
    m = P.read_manifest(tmp_path / "p")
    for split, docs in zip(("train", "val"), split_docs(DOCS, 0.25)):
        got = []
        for k, shard in enumerate(m[split]["shards"]):
            off = P.document_offsets(tmp_path / "p", split, k)
            assert off[-1] == shard["tokens"] and len(off) == shard["docs"] + 1
            arr = np.asarray((data.train if split == "train" else data.val).shards[k])
            got += [arr[a:b].tolist() for a, b in zip(off[:-1], off[1:])]
        assert got == [[tok.bos_id, *tok.encode(d), tok.eos_id] for d in docs]


def test_uint32_shards_above_65536_tokens(tmp_path):
    """A 70k-word tokenizer gives uint32 shards holding ids above 65535."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(70000)}
    vocab["[UNK]"] = 70000
    hf = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf.save(str(tmp_path / "big.json"))
    write_jsonl(tmp_path / "c.jsonl", ["w1 w69999", "w3 w4", "w5"])
    m = P.prepare_shards(str(tmp_path / "c.jsonl"), str(tmp_path / "big.json"), tmp_path / "p", val_frac=0.4)
    data = P.load_prepared(tmp_path / "p", str(tmp_path / "big.json"))
    assert m["dtype"] == "uint32" and data.train.dtype == np.uint32 and data.train[:2].tolist() == [1, 69999]


def test_workers_write_the_same_bytes_as_one_process(tmp_path, monkeypatch):
    """2 worker processes (many small chunks) give identical shards, offsets and manifest to 1 process."""
    monkeypatch.setattr(P, "CHUNK_DOCS", 3)
    src = str(write_jsonl(tmp_path / "c.jsonl"))
    one = P.prepare_shards(src, "bpe:300", tmp_path / "one", workers=1, val_frac=0.2, shard_tokens=400)
    two = P.prepare_shards(src, "bpe:300", tmp_path / "two", workers=2, val_frac=0.2, shard_tokens=400)
    drop = lambda m: {k: v for k, v in m.items() if k not in ("created", "seconds")}
    assert drop(one) == drop(two)
    files = sorted(p.name for p in (tmp_path / "one").iterdir() if p.is_file())
    assert len(files) > 5
    for name in files:
        if name != "manifest.json":
            assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name


def test_documents_stream_with_bounded_read_ahead(tmp_path, monkeypatch):
    """Memory does not grow with the corpus: at most 2 × workers chunks are read ahead of the writer."""
    monkeypatch.setattr(P, "CHUNK_DOCS", 5)
    read = []

    def endless(source):
        read.clear()  # one count per pass: the tail split's size pass reads everything first, by design
        for i in range(400):
            read.append(i)
            yield f"document number {i}"

    written, ahead = [], []
    real_add = P._ShardWriter.add

    def add(self, ids):
        written.append(1)
        ahead.append(len(read) - len(written))
        return real_add(self, ids)

    monkeypatch.setattr(P, "iter_documents", endless)
    monkeypatch.setattr(P._ShardWriter, "add", add)
    P.prepare_shards("anything", "bytes", tmp_path / "p", workers=2)
    assert len(written) == 400 and max(ahead) <= 2 * 2 * 5 + 5  # in-flight chunks + the one being filled


def test_manifest_records_the_split_and_older_manifests_still_load(tmp_path):
    """The manifest holds the split's record (rule, counts, which documents); a manifest written before it
    (only the rule's text) still loads, its split described by that text."""
    m = P.prepare_shards(str(write_jsonl(tmp_path / "c.jsonl")), "bytes", tmp_path / "p", val_frac=0.25)
    train_docs, val_docs = split_docs(DOCS, 0.25)
    assert (m["split"]["rule"], m["split"]["val_docs"], m["split"]["val_last_doc"]) == ("tail", len(val_docs), 22)
    assert m["split"]["val_first_doc"] == len(train_docs) and m["split"]["val_tokens"] == m["val"]["tokens"]
    old = {k: v for k, v in m.items() if k not in ("split", "seconds")}
    old["split_rule"] = "document i is validation when floor((i+1)*val_frac) > floor(i*val_frac)"
    (tmp_path / "p" / P.MANIFEST).write_text(json.dumps(old))
    data = P.load_prepared(tmp_path / "p")
    assert data.meta["split"] == f"prepared: {old['split_rule']} (val_frac 0.25)"
    assert data.meta["validation"]["val_docs"] == len(val_docs) and "val_index_sha256" not in data.meta["validation"]


def test_verify_and_lazy_load(tmp_path, monkeypatch):
    """Loading hashes nothing (only sizes are checked); --verify finds a flipped byte; a truncated shard
    fails to load."""
    P.prepare_shards("shakespeare", "bytes", tmp_path / "p")
    assert P.verify(tmp_path / "p") == []
    monkeypatch.setattr(P, "_file_sha256", lambda *a: pytest.fail("load_prepared must not hash the shards"))
    data = prepare_data(DataConfig(source=str(tmp_path / "p")))  # the trainer's entry point
    assert data.from_cache and data.meta["train_docs"] == 38 and data.meta["val_docs"] == 4
    monkeypatch.undo()
    shard = tmp_path / "p" / "train-00000.bin"
    raw = bytearray(shard.read_bytes())
    raw[1000] ^= 1
    shard.write_bytes(bytes(raw))
    assert P.verify(tmp_path / "p") == ["train-00000.bin: SHA-256 differs from the manifest"]
    assert main(["prepare-data", "--verify", str(tmp_path / "p")]) == 1
    shard.write_bytes(bytes(raw[:-2]))
    with pytest.raises(ValueError, match="manifest says"):
        P.load_prepared(tmp_path / "p")


def test_errors_write_nothing(tmp_path, capsys):
    """A bad source, an empty split, an existing --out or a conflicting tokenizer: one-line errors, exit 2,
    nothing left."""
    assert main(["prepare-data", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "p")]) == 2
    write_jsonl(tmp_path / "two.jsonl", DOCS[:2])
    assert main(["prepare-data", str(tmp_path / "two.jsonl"), "--out", str(tmp_path / "p"), "--val-frac", "0.1",
                 "--val-split", "strided"]) == 2
    assert "validation split would be empty" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["two.jsonl"]  # no output, no temporary folder
    assert main(["prepare-data", "shakespeare", "--out", str(tmp_path / "p"), "--quiet"]) == 0
    assert main(["prepare-data", "shakespeare", "--out", str(tmp_path / "p")]) == 2
    assert "--overwrite" in capsys.readouterr().err
    with pytest.raises(ValueError, match="tokenized with 'bytes'"):
        P.load_prepared(tmp_path / "p", "bpe:300")
    with pytest.raises(ValueError, match="already prepared"):
        P.prepare_shards(str(tmp_path / "p"), "bytes", tmp_path / "q")


def test_a_dangling_link_above_out_is_one_line_naming_it(tmp_path, capsys):
    """--out below a symbolic link that leads nowhere was mkdir's bare '[Errno 17] File exists': one line (exit 2)
    naming the link, where it leads and the fix, before the source is read; nothing is created, the link is kept."""
    src = write_jsonl(tmp_path / "docs.jsonl")
    link = tmp_path / "dang"
    os.symlink(tmp_path / "nowhere", link)
    out = link / "sub"
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    assert main(["prepare-data", str(src), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"scalevec prepare-data: error: --out {out}: {link} is a symbolic link that leads nowhere (to "
                   f"{os.path.realpath(tmp_path / 'nowhere')}); remove it or choose another --out")
    assert "Errno" not in err and sorted(str(p) for p in tmp_path.rglob("*")) == before and link.is_symlink()


# --------------------------------------------------------------------------------------------- reading


def test_sharded_tokens_index_like_one_array(tmp_path):
    """Integers, slices (across shard cuts) and (B, T+1) index arrays equal indexing the concatenation."""
    rng = np.random.default_rng(0)
    parts = [rng.integers(0, 256, n).astype(np.uint16) for n in (5, 1, 17, 9)]
    st, whole = P.ShardedTokens(parts), np.concatenate(parts)
    assert len(st) == 32 and st[-1] == whole[-1] and st[5] == whole[5]
    for a, b in ((0, 32), (3, 7), (5, 6), (4, 30), (10, 10), (-5, None)):
        assert np.array_equal(st[a:b], whole[a:b])
    idx = rng.integers(0, 32, (4, 9))
    assert np.array_equal(st[idx], whole[idx])
    with pytest.raises(IndexError):
        st[np.array([32])]


def test_memmap_sampler_equals_in_memory_sampler(tmp_path):
    """TrainSampler over the memmapped shards gives the batches of TrainSampler over the same tokens in RAM,
    across epochs and ranks, with windows that cross shard boundaries; val_batches too."""
    P.prepare_shards("shakespeare", "bytes", tmp_path / "p", shard_tokens=100_003)
    data = P.load_prepared(tmp_path / "p")
    assert len(data.train.shards) > 20  # documents stay whole, so a shard holds at least one play
    mem = TokenData(train=concat(data.train), val=concat(data.val), tokenizer=data.tokenizer,
                      token_bytes=data.token_bytes, meta=data.meta)
    assert TrainSampler(data.train, 256, 64, seed=3).order == "feistel"  # the shards' default
    for order in ("feistel", "permutation"):
        a = TrainSampler(data.train, 256, 64, seed=3, order=order)
        b = TrainSampler(mem.train, 256, 64, seed=3, order=order)
        for step in (0, 1, 7, a.n_windows // 64 + 2):  # the last one is in the second epoch
            for rank in (0, 1):
                for x, y in zip(a.batch(step, rank, 2), b.batch(step, rank, 2)):
                    assert x.equal(y)
    (va, na), (vb, nb) = val_batches(data, 64, 4096, 8), val_batches(mem, 64, 4096, 8)
    assert na == nb and all(x.equal(y) for p, q in zip(va, vb) for x, y in zip(p, q))


@pytest.mark.slow  # trains and resumes
def test_train_on_prepared_dir_resumes_exactly(tmp_path):
    """`train --data DIR`: 6 steps straight equal 3 steps + resume + 3 steps, bitwise, on memmapped shards."""
    P.prepare_shards("shakespeare", "bytes", tmp_path / "p", shard_tokens=1_000_000)
    items = {"train.steps": 6, "train.batch_size": 4, "train.seq_len": 32, "train.eval_every": 3, "train.log_every": 1,
             "train.eval_batch_size": 8, "data.val_tokens": 2048, "data.source": str(tmp_path / "p")}
    cfg = resolve_config("tiny", "unified", [f"{k}={v}" for k, v in items.items()])
    train(cfg, tmp_path / "straight", quiet=True)
    assert train(cfg, tmp_path / "split", stop_at=3, quiet=True) == {"stopped_at": 3}
    train(cfg, tmp_path / "split", resume=True, quiet=True)

    def losses(run):
        rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
        return [(r["kind"], r["step"], r.get("loss", r.get("val_loss"))) for r in rows]

    assert losses(tmp_path / "straight") == losses(tmp_path / "split") and len(losses(tmp_path / "split")) == 8


def test_feistel_order_is_a_fresh_permutation_per_epoch():
    """feistel_permutation is a bijection of [0, n) for awkward n; the sampler's feistel order visits every
    window once per epoch, in another order each epoch and seed, and does not keep neighbours together."""
    keys = np.arange(1, 7, dtype=np.uint64)
    for n in (1, 2, 3, 5, 64, 1000, 4097):
        assert sorted(feistel_permutation(np.arange(n), n, keys).tolist()) == list(range(n))
    tokens = np.arange(1000 * 8 + 1) % 256
    s = TrainSampler(tokens, 8, 100, seed=0, order="feistel")
    epoch0 = np.concatenate([s.windows(k) for k in range(10)])
    epoch1 = np.concatenate([s.windows(k) for k in range(10, 20)])
    assert sorted(epoch0.tolist()) == sorted(epoch1.tolist()) == list(range(1000))
    assert not np.array_equal(epoch0, epoch1)
    assert not np.array_equal(epoch0, np.concatenate([TrainSampler(tokens, 8, 100, seed=1, order="feistel").windows(k)
                                                      for k in range(10)]))
    assert np.mean(np.abs(np.diff(epoch0)) == 1) < 0.01  # a shuffle, not a shifted range


# ----------------------------------------------------------------------------------------------------- BPE progress


def test_bpe_training_reports_progress_lines_in_a_log():
    """Outside a terminal train_bpe prints one-line reports while it trains (a thread: tokenizers releases the GIL)
    and a last line counting what it read; the tokenizer is the one trained without them."""
    import io

    from scalevec.data.documents import load_documents
    from scalevec.data.tokenizer import train_bpe

    docs = load_documents("shakespeare")[:400]
    log = io.StringIO()  # not a TTY: no bars
    with_lines = train_bpe(2000, iter(docs), length=len(docs), progress=True, every=0.01, stream=log)
    lines = log.getvalue().splitlines()
    assert lines[0] == "bpe: training 2,000 tokens" and all(ln.startswith("bpe: ") for ln in lines)
    assert any("counting words" in ln or "computing merges" in ln for ln in lines[1:-1])  # the periodic reports
    chars = sum(map(len, docs)) / 1e6
    assert lines[-1].startswith(f"bpe: trained 2,000 tokens on {len(docs):,} documents ({chars:.1f}M characters)")
    assert with_lines.to_str() == train_bpe(2000, iter(docs), length=len(docs)).to_str()


def test_prepare_data_bpe_progress_reaches_the_log(tmp_path, capsys):
    """`scalevec prepare-data --tokenizer bpe:N` into a log (pytest's stderr is no TTY) says what BPE trained;
    --quiet says nothing."""
    src = str(write_jsonl(tmp_path / "c.jsonl"))
    assert main(["prepare-data", src, "--tokenizer", "bpe:300", "--out", str(tmp_path / "p")]) == 0
    err = capsys.readouterr().err
    n_train = len(split_docs(DOCS, 0.1)[0])  # BPE trains on the training split only (--val-frac 0.1)
    assert "bpe: training 300 tokens" in err and f"bpe: trained 300 tokens on {n_train} documents" in err
    assert main(["prepare-data", src, "--tokenizer", "bpe:300", "--out", str(tmp_path / "q"), "--quiet"]) == 0
    assert "bpe:" not in capsys.readouterr().err
