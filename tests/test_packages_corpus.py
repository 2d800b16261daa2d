"""scripts/packages_corpus.py: documents out of pinned .deb packages, checked, deduplicated, split and sharded."""

import gzip
import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("packages_corpus", ROOT / "scripts" / "packages_corpus.py")
pc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pc)

PROSE = "The quick brown fox jumps over the lazy dog, and then it rests in the shade of the old oak tree. "


def test_markup_loses_tags_scripts_and_navigation():
    """HTML becomes its readable text: tags, script, style and nav content dropped, entities decoded."""
    html = ("<html><head><title>T</title><style>p {}</style></head><body><nav>Home | Next</nav>"
            "<h1>Heading</h1><p>One &amp; two.</p><script>var x = 1;</script><p>Three.</p></body></html>")
    assert pc.markup_text(html) == "Heading\n\nOne & two.\n\nThree."


def test_dictionary_is_cut_at_entry_boundaries(monkeypatch):
    """A dictd text is cut into documents of about DICT_CHARS characters, each cut at a blank line."""
    monkeypatch.setattr(pc, "DICT_CHARS", 50)
    entries = [f"word{i}\n  a definition of word {i}, long enough." for i in range(10)]
    docs = pc.dict_documents("\n\n".join(entries))
    assert len(docs) > 1 and "\n\n".join(docs) == "\n\n".join(entries)
    assert all(d.startswith("word") for d in docs)


def _deb(tmp_path: Path, name: str, files: dict[str, bytes]) -> Path:
    root = tmp_path / f"{name}-root"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(f"Package: {name}\nVersion: 1.0\nArchitecture: all\n"
                                             f"Maintainer: t <t@t>\nDescription: test\n")
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    debs = tmp_path / "work" / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    deb = debs / f"{name}_1.0_all.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(root), str(deb)], check=True,
                   capture_output=True)
    return deb


def _recipe(sha: str = "") -> dict:
    return {"tokenizer": "bytes", "split": {"rule": "random", "val_frac": 0.3, "seed": 0}, "corpus_sha256": "",
            "packages": [{"name": "docs", "version": "1.0", "sha256": sha, "include": ["usr/share/doc/*"],
                          "exclude": ["*.js"]}]}


def _files() -> dict[str, bytes]:
    files = {f"usr/share/doc/a/page{i}.html": f"<p>Page {i}. {PROSE * 3}</p>".encode() for i in range(12)}
    files["usr/share/doc/a/copy.txt"] = f"Page 0. {PROSE * 3}".encode()  # the same text as page0.html
    files["usr/share/doc/a/notes.txt.gz"] = gzip.compress(f"Notes. {PROSE * 4}".encode())
    files["usr/share/doc/a/short.txt"] = b"too short"
    files["usr/share/doc/a/app.js"] = f"// {PROSE * 4}".encode()
    files["usr/share/doc/a/latin1.txt"] = ("caf\xe9 " + PROSE * 4).encode("latin-1")
    files["usr/bin/tool"] = PROSE.encode() * 4  # not under include
    return files


def test_build_extracts_dedups_splits_and_records(tmp_path):
    """The build keeps 13 documents (12 pages + notes; a duplicate, a short, a .js, a binary path and a non-UTF-8
    file out), holds out validation documents, pins the package and corpus sha256 and writes the shards."""
    deb = _deb(tmp_path, "docs", _files())
    recipe = _recipe()
    record = pc.build(recipe, tmp_path / "work", pin=True)
    stats = record["packages"][0]
    assert (stats["documents"], stats["duplicates"], stats["short"], stats["not_utf8"]) == (13, 1, 1, 1)
    assert recipe["packages"][0]["sha256"] == pc.sha256_of(deb) and recipe["corpus_sha256"] == record["corpus_sha256"]
    lines = (tmp_path / "work" / "corpus.jsonl").read_text().splitlines()
    assert len(lines) == 13 and not any("//" in json.loads(x)["text"] for x in lines)
    assert record["val_docs"] >= 1 and record["train_docs"] + record["val_docs"] == 13
    assert record["train_tokens"] + record["val_tokens"] == record["bytes"] + 3 * (13 - 2)  # bytes + separators
    assert (tmp_path / "work" / "prepared" / "manifest.json").is_file()


def test_build_refuses_a_package_whose_sha256_changed(tmp_path):
    """A .deb that is not the recipe's pinned bytes stops the build before a document is written."""
    _deb(tmp_path, "docs", _files())
    with pytest.raises(SystemExit, match="the recipe pins"):
        pc.build(_recipe(sha="0" * 64), tmp_path / "work", pin=False)


def test_recipe_pins_every_package_and_the_corpus():
    """data/packages-corpus.json names each package with a version and a sha256, and the corpus's sha256."""
    recipe = json.loads((ROOT / "data" / "packages-corpus.json").read_text())
    assert all(p["version"] and len(p["sha256"]) == 64 and p["include"] for p in recipe["packages"])
    assert len(recipe["corpus_sha256"]) == 64 and recipe["split"]["rule"] == "random"
