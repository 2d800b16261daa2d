"""nanoGPT's and OLMo-core's token files, read as they are (``data/token_files.py``): ``train --data`` and
``prepare-data`` take them with the tokenizer that wrote them, nothing re-tokenized (DESIGN.md §8)."""

import json

import numpy as np
import pytest
from tokenizers import AddedToken

from scalevec.cli import main
from scalevec.config import DataConfig
from scalevec.data.corpus import prepare_data
from scalevec.data.prepared import load_prepared, prepare_shards
from scalevec.data.tokenizer import byte_level_hf_tokenizer, load_tokenizer, load_tokenizer_dir

EOT = "<|endoftext|>"


@pytest.fixture
def tokenizer_json(tmp_path):
    """A byte-level tokenizer.json with an end-of-text token (id 256, vocab 257), as a stand-in for GPT-2's."""
    hf = byte_level_hf_tokenizer()
    hf.add_special_tokens([AddedToken(EOT, special=True)])
    path = tmp_path / "tok" / "tokenizer.json"
    path.parent.mkdir()
    hf.save(str(path))
    return str(path)


def _docs(tok_path: str, texts: list[str]) -> list[list[int]]:
    tok = load_tokenizer(tok_path)
    return [tok.encode(t) + [tok.eos_id] for t in texts]


TEXTS = [f"document {i}: " + "the quick brown fox " * (3 + i % 5) for i in range(40)]


def write_nanogpt(folder, tok_path: str) -> tuple[np.ndarray, np.ndarray]:
    """nanoGPT's ``data/openwebtext/prepare.py``: ``ids + [eot]`` per document, ``np.memmap(uint16, 'w+')``."""
    folder.mkdir()
    docs = _docs(tok_path, TEXTS)
    out = {}
    for split, part in (("train", docs[:36]), ("val", docs[36:])):
        ids = np.concatenate([np.array(d) for d in part])
        arr = np.memmap(folder / f"{split}.bin", dtype=np.uint16, mode="w+", shape=(len(ids),))
        arr[:] = ids
        arr.flush()
        out[split] = ids
    return out["train"], out["val"]


def write_olmo_core(folder, tok_path: str, dtype=np.uint16) -> np.ndarray:
    """The Dolma toolkit's token files that OLMo-core reads: raw ids of ``get_dtype()`` (uint16 for a vocab of
    257 ≤ 65536), documents ending with EOS, two ``.npy`` files, no numpy header."""
    folder.mkdir()
    docs = _docs(tok_path, TEXTS)
    streams = [np.concatenate([np.array(d) for d in docs[:20]]), np.concatenate([np.array(d) for d in docs[20:]])]
    for k, ids in enumerate(streams):
        arr = np.memmap(folder / f"part-{k:02d}.npy", dtype=dtype, mode="w+", shape=(len(ids),))
        arr[:] = ids
        arr.flush()
    return np.concatenate(streams)


def test_nanogpt_bins_train_as_they_are(tmp_path, tokenizer_json):
    """``nanogpt:DIR`` reads train.bin / val.bin as uint16 memory maps: the same ids, nanoGPT's split, one document
    per end-of-text, the tokenizer recorded."""
    train, val = write_nanogpt(tmp_path / "owt", tokenizer_json)
    data = prepare_data(DataConfig(source=f"nanogpt:{tmp_path / 'owt'}", tokenizer=tokenizer_json))
    assert np.array_equal(np.asarray(data.train), train) and np.array_equal(np.asarray(data.val), val)
    assert isinstance(data.train, np.memmap) and data.train.dtype == np.uint16
    assert data.meta["train_docs"] == 36 and data.meta["val_docs"] == 4
    assert data.meta["tokenizer"] == tokenizer_json and data.vocab_size == 257


def test_olmo_core_npy_files_train_with_a_tail_split_at_a_document_boundary(tmp_path, tokenizer_json):
    """``olmo-core:DIR`` reads the raw ``.npy`` files in name order as one stream; validation is the tail, cut right
    after an EOS, about ``val_frac`` of the tokens; together they are the files' ids exactly."""
    ids = write_olmo_core(tmp_path / "dolma", tokenizer_json)
    data = prepare_data(DataConfig(source=f"olmo-core:{tmp_path / 'dolma'}", tokenizer=tokenizer_json, val_frac=0.1))
    train, val = np.asarray(data.train[:]), np.asarray(data.val)
    assert np.array_equal(np.concatenate([train, val]), ids)
    assert train[-1] == 256 and val[-1] == 256  # both splits end with a whole document
    assert abs(len(val) / len(ids) - 0.1) < 0.02  # one document is ~1% of the tokens here
    assert data.meta["train_docs"] + data.meta["val_docs"] == 40


def test_prepare_data_copies_token_files_into_shards_without_retokenizing(tmp_path, tokenizer_json):
    """``prepare-data nanogpt:DIR`` writes a prepared folder whose shards hold the .bin ids unchanged, one document
    per end-of-text, the tokenizer saved beside them; ``train --data`` on it reads the same ids."""
    train, val = write_nanogpt(tmp_path / "owt", tokenizer_json)
    m = prepare_shards(f"nanogpt:{tmp_path / 'owt'}", tokenizer_json, tmp_path / "prep")
    assert m["train"]["docs"] == 36 and m["val"]["docs"] == 4 and m["tokenizer"] == tokenizer_json
    data = load_prepared(tmp_path / "prep")
    assert np.array_equal(np.asarray(data.train[:]), train) and np.array_equal(np.asarray(data.val[:]), val)
    assert data.vocab_size == 257


def test_bad_token_files_fail_in_one_line_with_exit_2(tmp_path, tokenizer_json, capsys):
    """Wrong dtype (OLMo-core uint32 files read as uint16), an id outside the vocabulary (the wrong tokenizer) and an
    odd byte length each stop ``prepare-data`` and ``train`` with exit 2 and one line naming the problem; nothing is
    written."""
    write_olmo_core(tmp_path / "u32", tokenizer_json, dtype=np.uint32)
    write_nanogpt(tmp_path / "owt", tokenizer_json)
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "train.bin").write_bytes(b"\x01\x00\x02")
    (odd / "val.bin").write_bytes(b"\x01\x00")
    cases = {f"olmo-core:{tmp_path / 'u32'}": ("every odd id is 0", tokenizer_json),
             f"nanogpt:{tmp_path / 'owt'}": ("token id 256 is not below the tokenizer's vocabulary (256", "bytes"),
             f"nanogpt:{odd}": ("3 bytes, not a whole number of uint16 ids", tokenizer_json)}
    for source, (problem, tok) in cases.items():
        for argv in (["prepare-data", source, "--tokenizer", tok, "--out", str(tmp_path / "never"), "--quiet"],
                     ["train", "--preset", "tiny", "--steps", "1", "--data", source, "--tokenizer", tok, "--out",
                      str(tmp_path / "never"), "--quiet"]):
            assert main(argv) == 2
            err = capsys.readouterr().err.strip()
            assert problem in err and len(err.splitlines()) == 1, err
            assert not (tmp_path / "never").exists()


@pytest.mark.slow  # a 3-step tiny training through the CLI (~3 s)
def test_train_cli_reads_nanogpt_bins(tmp_path, tokenizer_json):
    """``scalevec train --data nanogpt:DIR --tokenizer T`` trains on the .bin ids; the run records the tokenizer (its
    config and a copy) and nanoGPT's split."""
    write_nanogpt(tmp_path / "owt", tokenizer_json)
    assert main(["train", "--preset", "tiny", "--strategy", "baseline", "--steps", "3", "--data",
                 f"nanogpt:{tmp_path / 'owt'}", "--tokenizer", tokenizer_json, "--out", str(tmp_path / "run"),
                 "--quiet", "train.batch_size=2", "train.seq_len=32", "train.eval_every=3",
                 "data.val_tokens=64"]) == 0
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert "nanoGPT's own" in json.dumps(meta) and tokenizer_json in (tmp_path / "run" / "config.yaml").read_text()
    saved = load_tokenizer_dir(tmp_path / "run" / "tokenizer")
    assert saved.vocab_size == 257 and saved.eos_id == 256


def test_olmo_core_files_of_a_large_vocabulary_are_uint32(tmp_path):
    """For a vocabulary above 65,536 ids (dolma2's 100,278) OLMo-core writes uint32 (``get_dtype``'s rule), and so
    ``olmo-core:`` reads them: ids above 65,535 come back whole."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import WordLevel

    vocab = {f"w{i}": i for i in range(70_000)} | {EOT: 70_000}
    hf = HFTokenizer(WordLevel(vocab, unk_token="w0"))
    hf.add_special_tokens([AddedToken(EOT, special=True)])
    tok_path = tmp_path / "tokenizer.json"
    hf.save(str(tok_path))
    ids = np.concatenate([[5, 69_999, 66_000, 70_000]] * 50 + [[7, 70_000]] * 10).astype(np.uint32)
    folder = tmp_path / "dolma"
    folder.mkdir()
    arr = np.memmap(folder / "part-00.npy", dtype=np.uint32, mode="w+", shape=(len(ids),))
    arr[:] = ids
    arr.flush()
    data = prepare_data(DataConfig(source=f"olmo-core:{folder}", tokenizer=str(tok_path), val_frac=0.1))
    assert data.train.dtype == np.uint32 and data.vocab_size == 70_001
    assert np.array_equal(np.concatenate([np.asarray(data.train), np.asarray(data.val)]), ids)


def test_a_fifo_or_folder_in_place_of_a_token_file_is_named_not_read(tmp_path, tokenizer_json, capsys):
    """A FIFO (whose open would block forever) or a folder where a token file belongs is refused in one line before
    anything opens it, in each layout; a FIFO in an OLMo-core folder is not skipped silently."""
    import os

    from scalevec.data.token_files import files, parse

    write_olmo_core(tmp_path / "dolma", tokenizer_json)
    os.mkfifo(tmp_path / "dolma" / "part-99.npy")
    os.mkfifo(tmp_path / "alone.npy")
    write_nanogpt(tmp_path / "owt", tokenizer_json)
    (tmp_path / "owt" / "val.bin").unlink()
    os.mkfifo(tmp_path / "owt" / "val.bin")
    (tmp_path / "dirbin").mkdir()
    (tmp_path / "dirbin" / "train.bin").mkdir()
    (tmp_path / "dirbin" / "val.bin").write_bytes(b"\x01\x00")
    for source, bad in ((f"olmo-core:{tmp_path / 'dolma'}", "part-99.npy"), (f"olmo-core:{tmp_path / 'alone.npy'}",
                        "alone.npy"), (f"nanogpt:{tmp_path / 'owt'}", "val.bin"),
                        (f"nanogpt:{tmp_path / 'dirbin'}", "train.bin")):
        with pytest.raises(ValueError, match=f"{bad} is not a regular file"):
            files(parse(source))
    argv = ["prepare-data", f"olmo-core:{tmp_path / 'dolma'}", "--tokenizer", tokenizer_json, "--out",
            str(tmp_path / "never"), "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "part-99.npy is not a regular file" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "never").exists()


def test_train_refuses_a_split_rule_token_files_would_ignore(tmp_path, tokenizer_json, capsys):
    """``train --data nanogpt:DIR data.val_split=random`` stops with exit 2 and one line, as ``prepare-data
    --val-split random`` does, instead of training on nanoGPT's own split while the config says random."""
    write_nanogpt(tmp_path / "owt", tokenizer_json)
    for split in ("random", "strided"):
        argv = ["train", "--preset", "tiny", "--steps", "1", "--data", f"nanogpt:{tmp_path / 'owt'}", "--tokenizer",
                tokenizer_json, "--out", str(tmp_path / "never"), "--quiet", f"data.val_split={split}"]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert f"data.val_split {split}: token files keep nanoGPT's own split" in err and err.count("\n") == 0, err
        assert not (tmp_path / "never").exists()


def test_documents_are_counted_in_chunks_of_flat_memory():
    """``documents`` counts EOS a chunk at a time (never a boolean array of the whole memory map) and gets the same
    count at any chunk size, a document split across chunks or an unterminated tail included."""
    from scalevec.data.token_files import documents

    ids = np.array([5, 1, 9, 9, 1, 7, 1, 3, 3], dtype=np.uint16)  # EOS 1: three documents and an open tail
    assert [documents(ids, 1, chunk=c) for c in (1, 2, 4, 100)] == [4, 4, 4, 4]
    assert documents(ids[:-2], 1, chunk=3) == 3 and documents(ids, None) == 0

    class Chunked(np.ndarray):
        """Records the largest slice read."""
        widest = 0

        def __getitem__(self, key):
            if isinstance(key, slice):
                Chunked.widest = max(Chunked.widest, len(range(*key.indices(len(self)))))
            return super().__getitem__(key)

    big = np.resize(ids, 1000).view(Chunked)
    documents(big, 1, chunk=64)
    assert Chunked.widest == 64
