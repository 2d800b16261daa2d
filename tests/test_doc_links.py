"""Every relative link in README.md and docs/*.md lands: the file exists, and a ``#anchor`` into a markdown file
names one of its headings (GitHub's anchors). Links inside fenced code blocks are commands or output, not links."""

from __future__ import annotations

import re
from pathlib import Path

from test_readme_figures import github_slug, prose

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def heading_anchors(markdown: str) -> set[str]:
    """GitHub's anchors of ``markdown``'s headings, a repeated heading's later copies as ``slug-1``, ``slug-2``."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", prose(markdown), flags=re.M):
        slug = github_slug(re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading))  # a link in a heading: its text
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def broken_links(doc: Path, root: Path) -> list[str]:
    """``doc``'s relative links (outside fenced code) whose file does not exist under ``root`` or whose anchor names
    no heading of the markdown file it points to."""
    broken = []
    for link in LINK.findall(prose(doc.read_text()).replace("\n", " ")):
        if re.match(r"[a-z]+:", link):  # https:, mailto:
            continue
        path, _, anchor = link.partition("#")
        target = (doc.parent / path).resolve() if path else doc
        if not target.is_relative_to(root) or not target.exists():
            broken.append(f"{link} (no such file)")
        elif anchor and target.suffix == ".md" and anchor not in heading_anchors(target.read_text()):
            broken.append(f"{link} (no such heading)")
    return broken


def test_readme_and_docs_links_land_on_files_and_headings():
    """No relative link of README.md or docs/*.md points at a missing file or a missing heading."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = {str(d.relative_to(ROOT)): b for d in docs if (b := broken_links(d, ROOT))}
    assert not broken, f"links to nothing: {broken}; a doc's links are relative to its own folder"


def test_the_link_checker_catches_a_missing_file_and_heading(tmp_path):
    """A link to a missing file, a missing heading or a path relative to the wrong folder is reported; a link to
    an existing file, an existing (or repeated) heading, an in-page heading, a URL or one in a code block is not."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "data.md").write_text("# Data\n## Shards: `uint16`\n## Shards: `uint16`\n")
    doc = tmp_path / "docs" / "guide.md"
    doc.write_text("# Guide\n## Run directories\n[a](data.md) [b](data.md#shards-uint16) [c](data.md#shards-uint16-1) "
                   "[d](#run-directories) [e](https://x.org/y.md) [f](docs/data.md) [g](data.md#streaming) "
                   "[h](#runs) [i](../README.md)\n```\n[j](nowhere.md)\n```\n")
    assert broken_links(doc, tmp_path) == ["docs/data.md (no such file)", "data.md#streaming (no such heading)",
                                           "#runs (no such heading)", "../README.md (no such file)"]
