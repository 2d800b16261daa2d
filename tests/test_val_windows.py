"""The validation windows (DESIGN.md §8, data.val_windows): ``head`` as before, ``per_document`` spread over
documents."""

import json
import subprocess
import sys

import numpy as np
import pytest

from scalevec.config import DataConfig
from scalevec.data.corpus import prepare_data
from scalevec.data.documents import DOC_SEP
from scalevec.data.prepared import prepare_shards
from scalevec.data.sampler import val_batches, val_window_record, val_window_starts
from scalevec.resolve import resolve_config
from scalevec.training.trainer import train

# 30 documents of very different lengths (40 to ~3,000 characters), so the sharing-out rule has work to do
DOCS = [f"document {i}: " + "the quick brown fox jumps over the lazy dog. " * (1 + (i * 7) % 67) for i in range(30)]


def corpus(tmp_path, docs=DOCS):
    path = tmp_path / "c.txt"
    path.write_text(DOC_SEP.join(docs), encoding="utf-8")
    return path


def data_of(tmp_path, **over):
    cfg = DataConfig(source=str(corpus(tmp_path)), val_split="strided", val_frac=0.5, cache_dir=str(tmp_path / "cache"),
                     val_windows="per_document", **over)
    return prepare_data(cfg)


def test_every_validation_document_contributes_a_window(tmp_path):
    """per_document: each of the 15 validation documents has a window whose input starts in it or ends with it."""
    data = data_of(tmp_path)
    starts = val_window_starts(data, seq_len=32, n_tokens=4096, rule="per_document")
    doc_of_window = np.searchsorted(data.val_doc_starts, starts + 32 - 1, side="right") - 1
    assert len(data.val_doc_starts) == 15 and set(doc_of_window.tolist()) == set(range(15))
    assert len(starts) <= 4096 // 32 and np.all(starts + 33 <= len(data.val))
    rec = val_window_record(starts, "per_document", data, 32)
    assert (rec["val_docs"], rec["docs_scored"], rec["windows"]) == (15, 15, len(starts))


def test_document_starts_are_where_the_documents_are(tmp_path):
    """val_doc_starts points at each validation document's first byte (bytes: documents joined by DOC_SEP)."""
    data = data_of(tmp_path)
    val_docs = [d for i, d in enumerate(DOCS) if i % 2 == 1]  # strided at 0.5: documents 1, 3, 5, ...
    for s, d in zip(data.val_doc_starts.tolist(), val_docs):
        assert bytes(data.val[s:s + len(d)].tolist()).decode() == d


def test_windows_of_one_document_do_not_overlap_and_grow_with_its_length(tmp_path):
    """A document's windows are >= seq_len apart, and the longest document gets more windows than the shortest."""
    data = data_of(tmp_path)
    starts = val_window_starts(data, seq_len=32, n_tokens=4096, rule="per_document")
    doc = np.searchsorted(data.val_doc_starts, starts + 31, side="right") - 1
    for d in np.unique(doc):
        assert np.all(np.diff(starts[doc == d]) >= 32)
    lengths = np.diff(np.append(data.val_doc_starts, len(data.val)))
    counts = np.bincount(doc, minlength=len(lengths))
    assert counts[lengths.argmax()] > counts[lengths.argmin()] == 1


def test_per_document_sample_is_the_same_in_another_process(tmp_path):
    """The windows are a function of the data alone: a fresh interpreter computes the same starts (hash)."""
    data = data_of(tmp_path)
    here = val_window_record(val_window_starts(data, 32, 4096, "per_document"), "per_document", data, 32)
    code = (f"from scalevec.config import DataConfig; from scalevec.data.corpus import prepare_data; "
            f"from scalevec.data.sampler import val_window_starts as s, val_window_record as r; "
            f"d = prepare_data(DataConfig(source={str(corpus(tmp_path))!r}, val_split='strided', val_frac=0.5, "
            f"cache_dir={str(tmp_path / 'cache2')!r}, val_windows='per_document')); "
            f"print(r(s(d, 32, 4096, 'per_document'), 'per_document', d, 32)['starts_sha256'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == here["starts_sha256"]


def test_prepared_and_plain_paths_sample_the_same_windows(tmp_path):
    """A prepare-data folder's offsets files give the same document starts and windows as the plain path."""
    plain = data_of(tmp_path)
    prepare_shards(str(corpus(tmp_path)), "bytes", tmp_path / "prep", val_frac=0.5, val_split="strided",
                   shard_tokens=2000)  # several validation shards: the offsets are shifted per shard
    prepared = prepare_data(DataConfig(source=str(tmp_path / "prep"), val_windows="per_document"))
    assert prepared.val_doc_starts.tolist() == plain.val_doc_starts.tolist()
    ya, yb = (np.concatenate([y.numpy() for _, y in val_batches(d, 32, 4096, 8, "per_document")[0]])
              for d in (plain, prepared))
    assert np.array_equal(ya, yb)


def test_head_rule_is_the_first_windows(tmp_path):
    """head (the default, what every earlier run used): offsets 0, T, 2T, ... whatever the documents."""
    data = data_of(tmp_path)
    assert DataConfig().val_windows == "head"
    assert val_window_starts(data, 32, 200, "head").tolist() == [0, 32, 64, 96, 128, 160]


def test_too_few_windows_for_the_documents_is_an_error_naming_the_fix(tmp_path):
    """Fewer windows than validation documents: a ValueError naming the val_tokens that would do."""
    data = data_of(tmp_path)
    with pytest.raises(ValueError, match=r"raise data.val_tokens to at least 480"):
        val_window_starts(data, seq_len=32, n_tokens=14 * 32, rule="per_document")


def test_a_run_records_its_validation_windows(tmp_path):
    """meta.json's validation_windows names the rule, the windows and their hash; config.yaml the rule."""
    items = {"train.steps": 2, "train.batch_size": 4, "train.seq_len": 32, "train.eval_every": 2,
             "train.eval_batch_size": 8, "data.val_tokens": 2048, "schedule.warmup": 1,
             "data.cache_dir": str(tmp_path / "cache"), "data.source": str(corpus(tmp_path)),
             "data.val_split": "strided", "data.val_frac": 0.5, "data.val_windows": "per_document"}
    train(resolve_config("tiny", "baseline", [f"{k}={v}" for k, v in items.items()]), tmp_path / "run")
    rec = json.loads((tmp_path / "run" / "meta.json").read_text())["validation_windows"]
    data = data_of(tmp_path)
    expected = val_window_record(val_window_starts(data, 32, 2048, "per_document"), "per_document", data, 32)
    assert rec == expected and rec["docs_scored"] == 15
    assert "val_windows: per_document" in (tmp_path / "run" / "config.yaml").read_text()
