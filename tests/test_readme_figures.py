"""README and docs/reproduction.md quote no result by hand: every figure in README's main-job section's prose,
and in docs/reproduction.md's hand-written parts, is in docs/reproduction.md's generated section
(scripts/reproduction.py) or in a results file that prose cites, and README's links into docs/reproduction.md
land on generated headings.

A *figure* is a decimal number (at least one digit after the point) in prose: fenced code blocks are left out (the
main job's output is one, labelled as such, and commands are others), as are sizes written with a unit letter
(``0.12B``, ``2.16M``) and version numbers (``2.13.0``). The section checked runs from "### The main job" to the
next "## " heading: where the README reports what the code measured.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- BEGIN GENERATED (scripts/reproduction.py) -->", "<!-- END GENERATED -->"
# a decimal not inside a longer dotted number (a version: a dot and a digit after it; a full stop ends a sentence,
# not the figure), not followed by a unit letter (model sizes, token counts)
FIGURE = re.compile(r"(?<![\w.])([+\-−]?)(\d{1,3}\.\d+)(?!\d|\.\d|[KMB]\b)")
CITED = re.compile(r"`?(results/[\w.\-/]+\.csv)`?")


def prose(markdown: str) -> str:
    """``markdown`` without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)


def main_job_section(readme: str) -> str:
    """From "### The main job" to the next second-level heading."""
    start = readme.index("### The main job")
    end = readme.find("\n## ", start)
    return readme[start:end if end >= 0 else len(readme)]


def generated(doc: str) -> str:
    """The part of docs/reproduction.md that scripts/reproduction.py writes."""
    return doc[doc.index(BEGIN):doc.index(END)]


def _normal(text: str) -> str:
    return text.replace("−", "-")


def file_values(path: Path) -> list[float]:
    """Every number in a CSV file's cells."""
    out = []
    with path.open() as f:
        for row in csv.reader(f):
            for cell in row:
                try:
                    out.append(float(cell))
                except ValueError:
                    pass
    return out


def unbacked_figures(text: str, doc: str, root: Path) -> list[str]:
    """The figures of ``text``'s prose that neither ``doc`` (signed as written, when signed) nor a results file the
    prose cites (a value that rounds to the figure at its decimals) contains."""
    body = prose(text)
    files = [root / c for c in CITED.findall(body) if (root / c).is_file()]
    values = [v for f in files for v in file_values(f)]
    doc = _normal(doc)
    missing = []
    for sign, number in FIGURE.findall(_normal(body)):
        figure = sign.replace("−", "-") + number
        pattern = (re.escape(figure) if sign else r"[+\-]?" + re.escape(number)) + r"(?![\d])"
        if re.search(r"(?<![\d.])" + pattern, doc):
            continue
        decimals = len(number.split(".")[1])
        target = float(figure)
        if any(round(v, decimals) == target for v in values):
            continue
        missing.append(figure)
    return missing


def without_estimates(markdown: str) -> str:
    """``markdown`` with the cells of every table column whose header says "(est.)" emptied: a plan's estimates,
    written before its runs, are inputs to the plan, not results."""
    out, est = [], set()
    for line in markdown.splitlines():
        if not line.startswith("|"):
            est = set()
            out.append(line)
            continue
        cells = line.split("|")
        if not est and not out[-1].startswith("|"):  # a table's header row
            est = {i for i, c in enumerate(cells) if "(est.)" in c}
        out.append("|".join("" if i in est else c for i, c in enumerate(cells)))
    return "\n".join(out)


def hand_written(doc: str) -> str:
    """docs/reproduction.md outside its generated section, as prose: without inline code (settings and commands,
    ``model.init_std: 0.02``) and without estimate columns (``without_estimates``); fenced blocks go in
    ``unbacked_figures``."""
    text = doc[:doc.index(BEGIN)] + doc[doc.index(END):]
    return without_estimates(re.sub(r"`[^`\n]*`", "", text))


def github_slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_quotes_only_figures_the_generated_docs_or_cited_results_hold():
    """Every decimal in README's main-job prose is in docs/reproduction.md's generated section or a cited results
    file: a result typed by hand (or left behind when the study moved on) fails here."""
    readme = (ROOT / "README.md").read_text()
    doc = generated((ROOT / "docs" / "reproduction.md").read_text())
    missing = unbacked_figures(main_job_section(readme), doc, ROOT)
    assert not missing, (f"README quotes {missing}, which docs/reproduction.md's generated section and the results "
                         f"files README cites do not hold; link the generated section instead of quoting it")


def test_readme_main_job_prose_quotes_no_delta():
    """README's main-job prose holds no signed figure (a Δ, an interval's end): the generated section holds ~700
    signed 4-decimal values, so a hand-typed Δ would pass the look-up above by coincidence three times in four;
    README links the generated tables instead. The main job's output block (fenced) is not prose."""
    readme = (ROOT / "README.md").read_text()
    signed = [s + n for s, n in FIGURE.findall(_normal(prose(main_job_section(readme)))) if s]
    assert not signed, f"README's main-job prose quotes {signed}; link the generated section of docs/reproduction.md"
    assert FIGURE.findall("unified is +0.0061 [−0.0009, +0.0131]")[0][0] == "+"  # a signed figure is seen as one


def test_readme_links_land_on_generated_headings():
    """Each README link into docs/reproduction.md#anchor names a heading of the generated section."""
    readme = (ROOT / "README.md").read_text()
    doc = generated((ROOT / "docs" / "reproduction.md").read_text())
    slugs = {github_slug(h) for h in re.findall(r"^#{2,6} (.+)$", doc, flags=re.M)}
    anchors = re.findall(r"\(docs/reproduction\.md#([^)\s]+)\)", readme.replace("\n", " "))
    assert len(anchors) >= 5  # README points into the generated sections instead of quoting them
    assert set(anchors) <= slugs, f"README links to {sorted(set(anchors) - slugs)}, no generated heading"


def test_reproduction_docs_hand_written_parts_quote_only_generated_figures():
    """Every decimal in docs/reproduction.md's hand-written prose (outside the generated section, inline code and
    estimate columns) is in its generated section or a results file the prose cites: a result typed by hand fails."""
    doc = (ROOT / "docs" / "reproduction.md").read_text()
    missing = unbacked_figures(hand_written(doc), generated(doc), ROOT)
    assert not missing, (f"docs/reproduction.md's hand-written parts quote {missing}, which its generated section and "
                         f"the results files they cite do not hold; move the number into scripts/reproduction.py "
                         f"or link the generated table instead")


def test_reproduction_docs_in_page_links_land_on_headings():
    """Each ``(#anchor)`` link of docs/reproduction.md (the hand-written parts point into the generated tables
    instead of quoting them) names one of its headings."""
    doc = (ROOT / "docs" / "reproduction.md").read_text()
    slugs = {github_slug(h) for h in re.findall(r"^#{1,6} (.+)$", doc, flags=re.M)}
    anchors = set(re.findall(r"\]\(#([^)\s]+)\)", doc.replace("\n", " ")))
    assert anchors and anchors <= slugs, f"docs/reproduction.md links to {sorted(anchors - slugs)}, no heading"


def test_hand_written_leaves_out_the_generated_section_code_and_estimates_only():
    """hand_written drops the generated block, inline code and "(est.)" columns, and keeps a figure in prose and in
    a table's other columns, so a hand-typed result there is still checked."""
    doc = (f"Δ was +0.0123 at `lr: 0.02`.\n\n| cell | passes | hours (est.) |\n|---|---:|---:|\n| a | 0.44 | 1.3 |\n\n"
           f"{BEGIN}\n| +0.0456 |\n{END}\nafter: 1.96618\n")
    text = hand_written(doc)
    assert [n for _, n in FIGURE.findall(text)] == ["0.0123", "0.44", "1.96618"]
    assert unbacked_figures(text, generated(doc), ROOT) == ["+0.0123", "0.44", "1.96618"]


def test_the_checker_catches_a_hand_quoted_figure(tmp_path):
    """The checker flags a prose figure missing from the docs, passes one the docs hold (either minus sign) or a
    cited results file rounds to, and ignores code blocks, sizes and versions."""
    (tmp_path / "results" / "c").mkdir(parents=True)
    (tmp_path / "results" / "c" / "results.csv").write_text("strategy,best_value\nbaseline,0.00861101\n")
    doc = "| unified | +0.0061 [-0.0009, +0.0131] |"
    text = ("### The main job\nΔ is +0.0061 [−0.0009, +0.0131] (was +0.0079), lr 0.00861 from "
            "`results/c/results.csv`, the 0.12B model, torch 2.13.0, 2.16M tokens.\n"
            "```\nunified +0.0056 [+0.0035, +0.0077] *\n```\n")
    assert unbacked_figures(text, doc, tmp_path) == ["+0.0079"]
    assert unbacked_figures(text.replace("+0.0061", "-0.0061"), doc, tmp_path) == ["-0.0061", "+0.0079"]


def test_a_figure_ending_a_sentence_is_checked():
    """A figure before a full stop is a figure (a dotted version such as 2.13.0 and a size such as 0.12B are not):
    a hand-typed result at the end of a sentence is flagged like any other."""
    found = FIGURE.findall("Δ was +0.0123. torch 2.13.0, the 0.12B model, lr 0.02.")
    assert [n for _, n in found] == ["0.0123", "0.02"]
    assert unbacked_figures("### The main job\nΔ was +0.0123.\n", "| +0.0456 |", ROOT) == ["+0.0123"]


def test_github_slug_matches_githubs_anchors():
    """Headings with Δ, parentheses, commas and dots give GitHub's anchors."""
    assert github_slug("Δ against N and D, every cell at once") == "δ-against-n-and-d-every-cell-at-once"
    assert github_slug("Verdicts of the first protocol (init_std 0.02 at every width, warmup 50)") == (
        "verdicts-of-the-first-protocol-init_std-002-at-every-width-warmup-50")
