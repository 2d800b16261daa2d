"""reproduction.claims, the one declaration of the reproduction study: every committed study file is
declared once, every claim's cells are filled by declared studies, and scripts/study.sh reads that list."""

from __future__ import annotations

import re
from pathlib import Path

from reproduction import claims, ladder

ROOT = Path(__file__).resolve().parents[1]


def test_every_committed_study_file_is_declared_once_with_its_cell():
    names = [s.name for s in claims.STUDIES]
    assert len(names) == len(set(names))
    committed = {p.name.removeprefix("study-").removesuffix(".yaml") for p in (ROOT / "sweeps").glob("study-*.yaml")}
    assert committed - set(names) == set()
    for s in claims.STUDIES:
        path = ROOT / "sweeps" / f"study-{s.name}.yaml"
        if not path.is_file():
            assert s.optional, f"{s.name} is declared, not optional, and has no file"
            continue
        header = re.search(r"--out results/(\S+)", path.read_text())  # the file's "Regenerate:" line
        assert header is not None and header.group(1) == s.cell, s.name


def test_every_claim_reads_cells_that_a_declared_study_fills():
    filled = {s.cell for s in claims.STUDIES}
    for c in claims.CLAIMS:
        assert c.cells and set(c.cells) <= filled, (c.id, c.statement, set(c.cells) - filled)
        assert all(d in (-1, 0, 1) for _, d in c.arms)
    for corpus, cells in claims.SCALING.items():
        assert [claims.scaling_size(c) for c in cells] == [(corpus, int(c.split("-")[1][:-1])) for c in cells]
    assert claims.scaling_size("moe-cpu-60k-shakespeare") is None  # C8 fits dense cells only


def test_the_ladder_is_declared_rung_by_rung_smallest_first():
    rungs = [s.name for s in claims.LADDER if not s.name.startswith("ladder-suspects")]
    assert rungs == [f"ladder-{r}-{c}" for r in ladder.CPU_RUNGS for c in ladder.CORPORA]
    assert all(s.cell == ladder.folder(Path(), *s.name.removeprefix("ladder-").rsplit("-", 1)).name
               for s in claims.LADDER if not s.name.startswith("ladder-suspects"))


def test_listing_for_the_study_script(capsys):
    assert claims.main(["first"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"{s.name} {s.cell} 0" for s in claims.FIRST]
    assert claims.main(["everything"]) == 2
