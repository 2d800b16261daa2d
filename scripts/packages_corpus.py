#!/usr/bin/env python3
"""Build the packages corpus: plain-text documents from pinned Debian packages, deduplicated, split by document and
written as token shards (docs/packages-corpus.md; the recipe: data/packages-corpus.json).

    python scripts/packages_corpus.py --work DIR            # download, check, extract, dedup, shard into DIR
    python scripts/packages_corpus.py --work DIR --pin      # the same, then write every sha256 into the recipe

Every package is fetched by ``apt-get download NAME=VERSION`` (Debian's own client, the one index this machine
reaches that holds the text) and must match the recipe's sha256 before a byte of it is read; its files are read
straight out of ``dpkg-deb --fsys-tarfile`` (nothing is installed). A file becomes one document when its path
matches one of the package's ``include`` patterns and none of its ``exclude`` ones (fnmatch: ``*`` spans folders):
``.gz`` is decompressed, ``.html``/``.page``/``.xml`` lose their markup (script, style and navigation dropped), a
dictd ``.dz`` dictionary is cut into documents of about ``DICT_CHARS`` characters at entry boundaries, anything else
is read as UTF-8 text (a file that is not UTF-8 is skipped and counted). Documents shorter than ``MIN_CHARS`` are
dropped; exact duplicates (after collapsing whitespace) keep their first copy in recipe order. The documents go to
``DIR/corpus.jsonl`` (``{"text": ...}`` per line, in recipe order, then tar order), whose sha256 the recipe pins;
``scalevec prepare-data``'s ``prepare_shards`` then writes ``DIR/prepared/`` with the recipe's tokenizer and
validation split (``random``: documents held out one by one, so the validation set is spread over every package).
``DIR/build.json`` records the per-package counts, the sha256s and the seconds each stage took.
"""

from __future__ import annotations

import argparse
import fnmatch
import gzip
import hashlib
import json
import re
import subprocess
import sys
import tarfile
import time
from html.parser import HTMLParser
from pathlib import Path

RECIPE = Path(__file__).resolve().parents[1] / "data" / "packages-corpus.json"
MIN_CHARS = 200  # shorter documents are index stubs, redirects and empty pages, not text
DICT_CHARS = 65536  # a dictionary is cut into documents of about this many characters (at an entry boundary)
SKIP_TAGS = {"script", "style", "head", "nav", "noscript", "svg"}
BLOCK_TAGS = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "section", "dt", "dd", "title",
              "table", "blockquote", "page", "note", "item", "code"}


class _Text(HTMLParser):
    """The text of an HTML / XML page: tags dropped, a line break at each block tag, SKIP_TAGS' content dropped."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in SKIP_TAGS:
            self.skip += 1
        elif tag in BLOCK_TAGS:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in SKIP_TAGS:
            self.skip = max(self.skip - 1, 0)
        elif tag in BLOCK_TAGS:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)


def markup_text(text: str) -> str:
    """The readable text of an HTML / XML document (``_Text``), blank runs collapsed."""
    p = _Text()
    p.feed(text)
    p.close()
    return tidy("".join(p.parts))


def tidy(text: str) -> str:
    """Trailing spaces dropped, runs of blank lines cut to one, ends stripped."""
    text = re.sub(r"[ \t\r\f\v]+\n", "\n", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


_ENTRY = re.compile(r"\n+(?=\S)")  # a dictd entry starts with its headword at the start of a line


def dict_documents(text: str) -> list[str]:
    """A dictd dictionary's text in documents of about ``DICT_CHARS`` characters, each cut where the next entry
    starts (a line that does not start with white space)."""
    out, start = [], 0
    while start < len(text):
        m = _ENTRY.search(text, start + DICT_CHARS)
        cut, nxt = (len(text), len(text)) if m is None else (m.start(), m.end())
        out.append(tidy(text[start:cut]))
        start = nxt
    return out


def documents_of(name: str, raw: bytes, errors: str = "strict") -> tuple[list[str], bool]:
    """``(documents, ok)`` of one file of a package by its name (module docstring); ok False: not UTF-8 (skipped,
    unless ``errors="replace"``, the recipe's ``decode_errors`` for a package with a few stray bytes: those bytes
    become U+FFFD and the documents are kept)."""
    if name.endswith((".gz", ".dz")):
        raw = gzip.decompress(raw)  # a dictzip .dz is a gzip stream
    try:
        text, ok = raw.decode("utf-8-sig"), True
    except UnicodeDecodeError:
        if errors == "strict":
            return [], False
        text, ok = raw.decode("utf-8-sig", errors=errors), False
    base = name[:-3] if name.endswith((".gz", ".dz")) else name
    if name.endswith(".dz"):
        return dict_documents(text), ok
    if base.endswith((".html", ".htm", ".page", ".xml", ".xhtml")):
        return [markup_text(text)], ok
    return [tidy(text)], ok


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            h.update(block)
    return h.hexdigest()


def fetch(pkg: dict, debs: Path) -> Path:
    """``apt-get download NAME=VERSION`` into ``debs`` (kept, so a rebuild reads the same bytes)."""
    found = sorted(debs.glob(f"{pkg['name']}_*.deb"))
    if not found:
        subprocess.run(["apt-get", "download", f"{pkg['name']}={pkg['version']}"], cwd=debs, check=True,
                       stdout=subprocess.DEVNULL)
        found = sorted(debs.glob(f"{pkg['name']}_*.deb"))
    if len(found) != 1:
        raise SystemExit(f"packages_corpus: expected one {pkg['name']} .deb in {debs}, found {len(found)}")
    return found[0]


def package_documents(deb: Path, include: list[str], exclude: list[str], stats: dict, errors: str = "strict"):
    """The documents of the files of ``deb`` whose paths match ``include`` and not ``exclude``, in tar order."""
    proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
    with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
        for member in tar:
            path = member.name.lstrip("./")
            if (not member.isfile() or not any(fnmatch.fnmatch(path, p) for p in include)
                    or any(fnmatch.fnmatch(path, p) for p in exclude)):
                continue
            docs, ok = documents_of(path, tar.extractfile(member).read(), errors)
            stats["files"] += 1
            stats["not_utf8"] += not ok
            yield from docs
    if proc.wait():
        raise SystemExit(f"packages_corpus: dpkg-deb --fsys-tarfile {deb} failed")


def build(recipe: dict, work: Path, pin: bool) -> dict:
    debs = work / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    seen: set[bytes] = set()
    per_package = []
    corpus = work / "corpus.jsonl"
    with open(corpus, "w", encoding="utf-8") as out:
        for pkg in recipe["packages"]:
            deb = fetch(pkg, debs)
            sha = sha256_of(deb)
            if pkg.get("sha256") and pkg["sha256"] != sha:
                raise SystemExit(f"packages_corpus: {deb.name} has sha256 {sha}, the recipe pins {pkg['sha256']}; "
                                 f"the package changed: pin the new one with --pin after checking it")
            pkg["sha256"] = sha
            stats = {"name": pkg["name"], "version": pkg["version"], "files": 0, "not_utf8": 0, "documents": 0,
                     "short": 0, "duplicates": 0, "bytes": 0}
            for doc in package_documents(deb, pkg["include"], pkg.get("exclude", []), stats,
                                         pkg.get("decode_errors", "strict")):
                if len(doc) < MIN_CHARS:
                    stats["short"] += 1
                    continue
                key = hashlib.sha256(" ".join(doc.split()).encode()).digest()
                if key in seen:
                    stats["duplicates"] += 1
                    continue
                seen.add(key)
                out.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
                stats["documents"] += 1
                stats["bytes"] += len(doc.encode("utf-8"))
            per_package.append(stats)
            print(f"{pkg['name']:<24} {stats['documents']:>7,} docs {stats['bytes'] / 1e6:>8.1f} MB "
                  f"({stats['duplicates']:,} duplicates, {stats['short']:,} short, {stats['not_utf8']} not UTF-8)",
                  flush=True)
    t_extract = time.perf_counter() - t0
    corpus_sha = sha256_of(corpus)
    if recipe.get("corpus_sha256") and recipe["corpus_sha256"] != corpus_sha and not pin:
        raise SystemExit(f"packages_corpus: {corpus} has sha256 {corpus_sha}, the recipe pins "
                         f"{recipe['corpus_sha256']}: the extraction differs (another Python's HTML parser?)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from scalevec.data.prepared import prepare_shards

    t1 = time.perf_counter()
    split = recipe["split"]
    m = prepare_shards(str(corpus), recipe["tokenizer"], work / "prepared", workers=1, val_frac=split["val_frac"],
                       val_split=split["rule"], val_seed=split["seed"], overwrite=True)
    shards = {s["file"]: s["sha256"] for part in ("train", "val") for s in m[part]["shards"]}
    record = {"documents": sum(p["documents"] for p in per_package), "bytes": sum(p["bytes"] for p in per_package),
              "corpus_sha256": corpus_sha, "train_tokens": m["train"]["tokens"], "val_tokens": m["val"]["tokens"],
              "train_docs": m["train"]["docs"], "val_docs": m["val"]["docs"], "shards_sha256": shards,
              "seconds": {"extract": round(t_extract, 1), "prepare": round(time.perf_counter() - t1, 1)},
              "packages": per_package}
    (work / "build.json").write_text(json.dumps(record, indent=2) + "\n")
    if pin:
        recipe["corpus_sha256"] = corpus_sha
        recipe["result"] = {k: record[k] for k in ("documents", "bytes", "train_tokens", "val_tokens", "train_docs",
                                                   "val_docs", "shards_sha256")}
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", type=Path, default=RECIPE)
    p.add_argument("--work", type=Path, required=True, help="folder for the .debs, corpus.jsonl and prepared/")
    p.add_argument("--pin", action="store_true", help="write the packages' and the corpus's sha256 into the recipe")
    args = p.parse_args(argv)
    recipe = json.loads(args.recipe.read_text())
    record = build(recipe, args.work, args.pin)
    if args.pin:
        args.recipe.write_text(json.dumps(recipe, indent=2) + "\n")
    print(f"packages corpus: {record['documents']:,} documents, {record['bytes']:,} bytes, "
          f"{record['train_tokens']:,} train / {record['val_tokens']:,} val tokens ({recipe['tokenizer']}, "
          f"{record['val_docs']:,} validation documents); corpus sha256 {record['corpus_sha256']}; "
          f"{record['seconds']['extract']:.0f} s extract, {record['seconds']['prepare']:.0f} s prepare")
    return 0


if __name__ == "__main__":
    sys.exit(main())
