"""Faults in prepared data: a manifest naming paths outside its folder, a dtype prepare-data never
writes, token ids outside the vocabulary, a malformed manifest. Each is a one-line error naming the file and
the field (exit 2 from the CLI, no traceback), raised before a shard is read, and nothing is changed."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from scalevec.cli import main
from scalevec.config import DataConfig
from scalevec.data import prepared as P
from scalevec.data.corpus import prepare_data
from test_cli_errors import fails  # the one "exit 2, one line, no traceback" check

DOCS = [f"Document {i}: the quick brown fox {'jumps ' * (i % 5)}over the lazy dog." for i in range(24)]


@pytest.fixture(scope="module")
def prepared_once(tmp_path_factory) -> Path:
    """A small prepared folder (bytes tokenizer: vocab 256, uint16), several shards per split; tests copy it."""
    base = tmp_path_factory.mktemp("prepared")
    src = base / "c.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS), encoding="utf-8")
    P.prepare_shards(str(src), "bytes", base / "p", val_frac=0.25, shard_tokens=300)
    return base / "p"


@pytest.fixture
def root(prepared_once, tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SCALEVEC_CACHE", str(tmp_path / "cache"))
    return Path(shutil.copytree(prepared_once, tmp_path / "p"))


def manifest(root: Path) -> dict:
    return json.loads((root / P.MANIFEST).read_text())


def write_manifest(root: Path, m: dict) -> None:
    (root / P.MANIFEST).write_text(json.dumps(m, indent=2))


def snapshot(*paths: Path) -> dict:
    """Every file and link under ``paths`` with its bytes (or link target): to show nothing changed."""
    out = {}
    for top in paths:
        for p in [top, *top.rglob("*")] if top.is_dir() and not top.is_symlink() else [top]:
            out[p] = ("link", os.readlink(p)) if p.is_symlink() else p.read_bytes() if p.is_file() else "dir"
    return out


def one_line_error(root: Path, *words: str) -> str:
    """``load_prepared`` and the trainer's ``prepare_data`` both raise one ValueError line holding ``words``."""
    for load in (lambda: P.load_prepared(root), lambda: prepare_data(DataConfig(source=str(root)))):
        with pytest.raises(ValueError) as e:
            load()
        msg = str(e.value)
        assert "\n" not in msg, msg
        for w in words:
            assert w in msg, msg
    return msg


def rewrite_shard(root: Path, split: str, k: int, values: dict[int, int]) -> None:
    """Set token ``i`` of shard ``k`` to ``v`` for each item, and update its SHA-256 so only the ids are wrong."""
    m = manifest(root)
    s = m[split]["shards"][k]
    arr = np.fromfile(root / s["file"], dtype=m["dtype"])
    for i, v in values.items():
        arr[i] = v
    arr.tofile(root / s["file"])
    s["sha256"] = hashlib.sha256((root / s["file"]).read_bytes()).hexdigest()
    write_manifest(root, m)


# --------------------------------------------------------------------------------------------- 1. paths


def _outside_shard(root: Path, outside: Path, m: dict, how: str) -> None:
    """Point train shard 0 at ``outside`` (a file of the right size beyond the folder) in the way ``how`` names."""
    shard = m["train"]["shards"][0]
    shutil.copyfile(root / shard["file"], outside)
    if how == "dotdot":
        shard["file"] = f"../{outside.name}"
    elif how == "absolute":
        shard["file"] = str(outside)
    elif how == "symlink":
        (root / shard["file"]).unlink()
        (root / shard["file"]).symlink_to(outside)
    elif how == "offsets":
        shutil.copyfile(root / shard["offsets"], outside)
        shard["offsets"] = f"sub/../../{outside.name}"
    elif how == "tokenizer_dir":
        shutil.copytree(root / "tokenizer", outside.with_suffix(""))
        m["tokenizer_dir"] = f"../{outside.stem}"
    elif how == "tokenizer_symlink":
        shutil.copytree(root / "tokenizer", outside.with_suffix(""))
        (root / "tokenizer" / "tokenizer.json").unlink()
        (root / "tokenizer" / "tokenizer.json").symlink_to(outside.with_suffix("") / "tokenizer.json")


@pytest.mark.parametrize("how, field", [
    ("dotdot", "train.shards[0].file"), ("absolute", "train.shards[0].file"), ("symlink", "train.shards[0].file"),
    ("offsets", "train.shards[0].offsets"), ("tokenizer_dir", "tokenizer_dir"), ("tokenizer_symlink", "tokenizer_dir"),
])
def test_paths_outside_the_folder_are_refused(root, tmp_path, capsys, how, field):
    """A shard, offsets file or tokenizer named by ``..``, by an absolute path or reached through a symlink out of
    the folder: load, --verify and train refuse it before reading it; the folder and the outside file stay as
    they were."""
    m = manifest(root)
    _outside_shard(root, tmp_path / "outside.bin", m, how)
    write_manifest(root, m)
    before = snapshot(tmp_path)
    one_line_error(root, "manifest.json", field, "outside")
    fails(capsys, ["prepare-data", "--verify", str(root)], field, "outside")
    if how == "dotdot":  # the reported case: trained to DONE on a file outside the folder
        fails(capsys, ["train", "--preset", "tiny", "--steps", "1", "--batch-size", "2", "--seq-len", "8",
                       "--data", str(root), "--out", str(tmp_path / "run"), "--quiet"], field, "outside")
        assert not (tmp_path / "run").exists()
    assert snapshot(tmp_path) == before


def test_a_symlinked_folder_is_fine(prepared_once, tmp_path):
    """The folder itself may be reached through a symlink: its files are still inside it."""
    link = tmp_path / "link"
    link.symlink_to(prepared_once)
    assert P.verify(link) == [] and len(P.load_prepared(link).train) == manifest(prepared_once)["train"]["tokens"]


# --------------------------------------------------------------------------------------------- 2. dtype


@pytest.mark.parametrize("dtype", ["float16", "int16", "uint8", "uint32", "int64", "bogus", 16, None])
def test_only_the_dtype_prepare_data_writes_is_accepted(root, capsys, dtype):
    """vocab 256 is written as uint16: any other dtype (a float or signed reinterpretation of the same bytes,
    another width, not a dtype at all) is a one-line error naming the field."""
    m = manifest(root)
    m["dtype"] = dtype
    write_manifest(root, m)
    before = snapshot(root)
    one_line_error(root, "manifest.json", "dtype", "uint16")
    fails(capsys, ["prepare-data", "--verify", str(root)], "dtype", "uint16")
    assert snapshot(root) == before


# --------------------------------------------------------------------------------------------- 3. token ids


@pytest.mark.parametrize("split", ["train", "val"])
def test_token_ids_above_the_vocabulary_are_found(root, capsys, split):
    """A shard holding id 300 with a 256-id vocabulary (its SHA-256 updated, the manifest recording no max id):
    load, train start-up and --verify name the shard, the max id and the vocabulary size."""
    m = manifest(root)
    for s in m["train"]["shards"] + m["val"]["shards"]:
        s.pop("max_id", None)  # a manifest from before max_id was recorded: the ids are still checked
    write_manifest(root, m)
    rewrite_shard(root, split, 1, {5: 300, 9: 299})
    name = manifest(root)[split]["shards"][1]["file"]
    before = snapshot(root)
    one_line_error(root, name, "300", "256")
    problems = P.verify(root)
    assert len(problems) == 1 and all(w in problems[0] for w in (name, "300", "256")), problems
    assert main(["prepare-data", "--verify", str(root)]) == 1
    assert name in capsys.readouterr().out
    assert snapshot(root) == before


def test_recorded_max_id_is_checked(root, capsys):
    """prepare-data records each shard's max id; a shard whose ids changed (in the vocabulary, SHA-256 updated)
    no longer matches it: load and --verify say so."""
    m = manifest(root)
    for split in ("train", "val"):
        for s in m[split]["shards"]:
            assert s["max_id"] == int(np.fromfile(root / s["file"], dtype=np.uint16).max())
    assert P.verify(root) == []
    rewrite_shard(root, "train", 0, {3: 255})
    recorded = m["train"]["shards"][0]["max_id"]
    assert recorded < 255
    one_line_error(root, "train-00000.bin", "255", str(recorded))
    problems = P.verify(root)
    assert len(problems) == 1 and "train-00000.bin" in problems[0] and str(recorded) in problems[0], problems


def test_tokenizer_vocabulary_must_match_the_manifest(root):
    """vocab_size 300 in the manifest with the 256-id bytes tokenizer: the ids would be checked against the wrong
    vocabulary, so load and --verify report it."""
    m = manifest(root)
    m["vocab_size"] = 300
    write_manifest(root, m)
    one_line_error(root, "vocab_size", "300", "256")
    assert any("300" in p and "256" in p for p in P.verify(root))


# --------------------------------------------------------------------------------------------- 4. schema


def _set(path: str, value):
    """An edit of the manifest: set (or with ``value`` DELETE, remove) the field at the dotted ``path``."""
    def edit(m):
        *parents, last = path.split(".")
        obj = m
        for key in parents:
            obj = obj[int(key)] if key.isdigit() else obj[key]
        last = int(last) if last.isdigit() else last
        if value is DELETE:
            del obj[last]
        else:
            obj[last] = value(obj[last]) if callable(value) else value
    return edit


DELETE = object()
MALFORMED = [  # (edit, the field the error names)
    (_set("dtype", DELETE), "dtype"),
    (_set("train", DELETE), "train"),
    (_set("train.shards", "x"), "train.shards"),
    (_set("val.shards", {"file": "val-00000.bin"}), "val.shards"),
    (_set("train.shards", []), "train.shards"),
    (_set("train.shards.0", "train-00000.bin"), "train.shards[0]"),
    (_set("train.tokens", "many"), "train.tokens"),
    (_set("train.shards.0.tokens", "many"), "train.shards[0].tokens"),
    (_set("train.shards.0.tokens", -1), "train.shards[0].tokens"),
    (_set("train.shards.0.tokens", True), "train.shards[0].tokens"),
    (_set("train.shards.0.tokens", 1.5), "train.shards[0].tokens"),
    (_set("train.shards.0.docs", None), "train.shards[0].docs"),
    (_set("train.tokens", lambda n: n + 1), "train.tokens"),
    (_set("val.docs", lambda n: n + 1), "val.docs"),
    (lambda m: [_set(f, lambda n: n + 1)(m) for f in ("train.tokens", "train.shards.0.tokens")],
     "train.shards[0]"),  # adds up, but disagrees with the file's size
    (_set("train.shards.0.file", 7), "train.shards[0].file"),
    (_set("train.shards.0.file", "nowhere.bin"), "train.shards[0]"),
    (_set("train.shards.0.sha256", DELETE), "train.shards[0].sha256"),
    (_set("train.shards.0.max_id", "high"), "train.shards[0].max_id"),
    (_set("vocab_size", "256"), "vocab_size"),
    (_set("vocab_size", 0), "vocab_size"),
    (_set("tokenizer", 5), "tokenizer"),
    (_set("tokenizer_dir", DELETE), "tokenizer_dir"),
    (_set("val_frac", "a tenth"), "val_frac"),
    (_set("val_frac", float("nan")), "val_frac"),
    (_set("val_frac", 2.5), "val_frac"),
]


@pytest.mark.parametrize("edit, field", MALFORMED, ids=[f"{f}-{i}" for i, (_, f) in enumerate(MALFORMED)])
def test_malformed_manifest_is_one_line_error(root, capsys, edit, field):
    """Missing fields, wrong types, negative or non-integer counts, counts that do not add up or disagree with
    the file sizes: load, train start-up and --verify give one line naming manifest.json and the field, and
    change nothing."""
    m = manifest(root)
    edit(m)
    write_manifest(root, m)
    before = snapshot(root)
    msg = one_line_error(root, "manifest.json", field)
    assert "prepare" in msg and "manymany" not in msg
    fails(capsys, ["prepare-data", "--verify", str(root)], "manifest.json", field)
    assert snapshot(root) == before


@pytest.mark.parametrize("raw, words", [(b"[" * 100_000 + b"]" * 100_000, "nests too deeply"),
                                        (b'{"vocab_size": ' + b"9" * 5000 + b"}", "is not valid JSON"),
                                        (b"\xff\xfe{}", "is not valid JSON")])
def test_a_manifest_that_json_cannot_read_is_one_line(root, capsys, raw, words):
    """A manifest nested 100,000 deep (a RecursionError before), with an integer of 5,000 digits (Python's
    message without the file before) or not UTF-8 is one line naming manifest.json and the fix."""
    (root / P.MANIFEST).write_bytes(raw)
    one_line_error(root, "manifest.json", words, "prepare the data again")
    fails(capsys, ["prepare-data", "--verify", str(root)], "manifest.json", words)


def test_a_fifo_manifest_is_named_as_such_without_hanging(root):
    """A FIFO where manifest.json should be is refused as not a regular file, never read (it would block)."""
    (root / P.MANIFEST).unlink()
    os.mkfifo(root / P.MANIFEST)
    with pytest.raises(ValueError, match=r"manifest .*manifest\.json is not a regular file \(a FIFO"):
        P.load_prepared(root)


def test_manifest_is_checked_before_any_shard_is_read(root, monkeypatch):
    """A manifest whose last shard is malformed fails before the first shard is opened or hashed."""
    m = manifest(root)
    m["val"]["shards"][-1]["tokens"] = "many"
    write_manifest(root, m)
    monkeypatch.setattr(np, "memmap", lambda *a, **k: pytest.fail("a shard was opened"))
    monkeypatch.setattr(P, "_file_sha256", lambda *a: pytest.fail("a shard was hashed"))
    for check in (P.load_prepared, P.verify):
        with pytest.raises(ValueError, match=r"val\.shards\[\d+\]\.tokens"):
            check(root)
