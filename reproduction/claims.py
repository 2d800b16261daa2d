"""The reproduction study as one declaration: each study file, the results folder (cell) it fills, and the
claims of the paper those cells answer (docs/reproduction.md).

A *study* is ``sweeps/study-NAME.yaml`` run by ``scalevec study`` into ``results/CELL/``; several studies may
fill one cell (C5 reuses C6's baseline runs; the ``-seeds`` studies add seeds to a cell). A *claim* names the
cells it is read in, its control arm and its arms with the direction the paper states. ``scripts/study.sh``
runs the studies in the order declared here (``python -m reproduction.claims ladder|first``) and
``scripts/reproduction.py`` reads the claims from here; tests check that every committed study file is
declared once and that every claim's cells are filled by a declared study.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from reproduction import ladder


@dataclass(frozen=True)
class Study:
    """``sweeps/study-NAME.yaml`` run into ``results/CELL``. ``optional``: the file may not exist yet (a
    ladder rung's file is written by ``scripts/ladder_plan.py`` once the smaller rungs have reported)."""

    name: str
    cell: str
    optional: bool = False


@dataclass(frozen=True)
class Claim:
    """One claim of the paper as comparisons: in each of ``cells``, each ``(arm, direction)`` against the
    ``control`` arm; direction +1 = the paper says the arm is worse (higher loss), -1 = better, 0 = no claim
    (the difference is shown, no verdict). ``arms=()``: every arm of the cell but ``baseline`` and
    ``unified`` (the variants of the why-variants study), direction 0."""

    id: str
    statement: str
    cells: tuple[str, ...]
    control: str
    arms: tuple[tuple[str, int], ...]


def _ladder_studies() -> tuple[Study, ...]:
    """The model ladder (``reproduction.ladder``), smallest rung first, both corpora; the q/k and scale-lr
    suspects after cpu-25k."""
    out = []
    for rung in ladder.CPU_RUNGS:
        out += [Study(f"ladder-{rung}-{c}", f"ladder-{rung}-{c}", optional=True) for c in ladder.CORPORA]
        if rung == "cpu-25k":
            out += [Study(f"ladder-suspects-{r}-shakespeare", f"ladder-{r}-shakespeare")
                    for r in ("cpu-10k", "cpu-25k")]
    return tuple(out)


LADDER = _ladder_studies()


def _horizon_studies() -> tuple[Study, ...]:
    """The horizon axis (tokens per parameter ≠ 20), in the planned order (docs/reproduction.md, "The horizon
    axis: plan"): the cells that repeat no data first, cheapest first (cpu-10k, then cpu-25k, at 100 tokens per
    parameter, both corpora), the repetition test (cpu-10k Shakespeare at 100 on a quarter of the plays, at the
    same N and D; ``data/corpora/build_shakespeare_quarter.py``), the WSD cell (cpu-25k Shakespeare at 100; moved
    ahead of cpu-10k at 400 in the second session: its Δ(t) figure tests the paper's "the advantage grows through
    the stable phase", and it repeats no data), then cpu-10k Shakespeare at 400 (1.76 passes), cpu-80k at 100 on
    both corpora (the cells that repeat data 1.8-3.0 times). The repetition test moved Δ, so in the third session
    the third corpus, ``prose`` (``ladder.SOURCES``), under one pass in every cell: its 20-token cells (centred on
    Shakespeare's picks), then cpu-10k at 100, cpu-80k at 100 (the rung where `unified` came out ahead on
    repeated Shakespeare), cpu-25k at 100, and the cells at 400; cpu-25k Shakespeare at 400 (3.6 passes) last.
    Every file is written by ``scripts/ladder_plan.py RUNG CORPUS --tokens-per-param D`` (optional until then)."""
    cells = [("cpu-10k", "shakespeare", 100, ""), ("cpu-10k", "kjv", 100, ""), ("cpu-25k", "shakespeare", 100, ""),
             ("cpu-25k", "kjv", 100, ""), ("cpu-10k", "shakespeare", 100, "-quarter"),
             ("cpu-25k", "shakespeare", 100, "-wsd"), ("cpu-10k", "shakespeare", 400, ""),
             ("cpu-80k", "shakespeare", 100, ""), ("cpu-80k", "kjv", 100, ""),
             ("cpu-10k", "prose", 20, ""), ("cpu-25k", "prose", 20, ""), ("cpu-80k", "prose", 20, ""),
             ("cpu-10k", "prose", 100, ""), ("cpu-80k", "prose", 100, ""), ("cpu-25k", "prose", 100, ""),
             ("cpu-10k", "prose", 400, ""), ("cpu-25k", "prose", 400, ""),
             ("cpu-25k", "shakespeare", 400, "")]
    return tuple(Study(ladder.horizon_name(r, c, d) + w, ladder.horizon_name(r, c, d) + w, optional=True)
                 for r, c, d, w in cells)


HORIZON = _horizon_studies()

# The first protocol (init_std 0.02 at every width, warmup 50), in the order its claims are answered:
# C6 and C1 on the main cells first.
FIRST = (
    *(Study(f"c6-{size}-{corpus}", f"{size}-{corpus}") for size in ("cpu-25k", "cpu-80k")
      for corpus in ("shakespeare", "kjv")),
    Study("c6-cpu-10k-shakespeare", "cpu-10k-shakespeare"),  # the third size of C8 (with 25k, 80k)
    Study("c5-cpu-25k-shakespeare", "cpu-25k-shakespeare"),  # C5 shares C6's baseline runs
    Study("c4-cpu-25k-shakespeare", "c4-cpu-25k-shakespeare"),  # peri + QK-norm, wd on which scales
    *(Study(f"c7-cpu-25k-shakespeare-{c}", f"c7-cpu-25k-shakespeare-{c}") for c in ("adamw-wsd", "muon-cosine",
                                                                                     "muon-wsd")),
    *(Study(f"c6-{cell}-seeds", cell) for cell in ("cpu-10k-shakespeare", "cpu-25k-shakespeare", "cpu-25k-kjv")),
    Study("c6-moe-cpu-60k-shakespeare", "moe-cpu-60k-shakespeare"),
    Study("why-lrpick-cpu-25k-shakespeare", "why-lrpick-cpu-25k-shakespeare"),  # lr picked on 3 seeds
    Study("c6-cpu-10k-shakespeare-tpp100", "cpu-10k-shakespeare-tpp100"),
    Study("c6-cpu-25k-shakespeare-tpp100", "cpu-25k-shakespeare-tpp100"),
    Study("why-variants-cpu-25k-shakespeare", "why-variants-cpu-25k-shakespeare"),  # unified, one part changed
    Study("why-variants2-cpu-25k-shakespeare", "why-variants-cpu-25k-shakespeare"),  # decay on α instead of β
    Study("why-heldout-cpu-25k-kjv", "cpu-25k-kjv"),  # the two variants chosen above, on KJV
    Study("c6-cpu-25k-shakespeare-bpe4096", "cpu-25k-shakespeare-bpe4096"),  # the second tokenizer
    Study("c6-cpu-25k-shakespeare-bpe4096-seeds", "cpu-25k-shakespeare-bpe4096"),
    Study("c6-cpu-25k-kjv-bpe4096", "cpu-25k-kjv-bpe4096"),  # its held-out test
    Study("why-lrpick-cpu-25k-shakespeare-bpe4096", "why-lrpick-cpu-25k-shakespeare-bpe4096"),
    Study("c6-cpu-80k-shakespeare-seeds", "cpu-80k-shakespeare"),  # 10 seeds in the main job's cell
    Study("c6-moe-cpu-60k-shakespeare-seeds", "moe-cpu-60k-shakespeare"),  # 10 seeds for the MoE
    Study("c6-cpu-200k-shakespeare", "cpu-200k-shakespeare"),  # a fourth size (~10 min a run)
)
STUDIES = LADDER + HORIZON + FIRST

# The C6 cells: AdamW + cosine, 20 tokens per parameter, bytes; C8 fits the dense ones per corpus.
SCALING = {"shakespeare": ("cpu-10k-shakespeare", "cpu-25k-shakespeare", "cpu-80k-shakespeare",
                           "cpu-200k-shakespeare"),
           "kjv": ("cpu-25k-kjv", "cpu-80k-kjv")}
MAIN = (*SCALING["shakespeare"], *SCALING["kjv"], "moe-cpu-60k-shakespeare")
TPP100 = ("cpu-10k-shakespeare-tpp100", "cpu-25k-shakespeare-tpp100")
BPE = ("cpu-25k-shakespeare-bpe4096", "cpu-25k-kjv-bpe4096")
HELD_OUT_VARIANTS = (("unified-input-only", 0), ("unified-scale-wd0.01", 0))

CLAIMS = (
    Claim("C1", "removing the scale vectors hurts", MAIN, "baseline", (("none", +1),)),
    Claim("C4", "weight decay helps Input-Norm scales, hurts Output-Norm scales", ("c4-cpu-25k-shakespeare",),
          "none", (("input", -1), ("output", +1), ("all", 0))),
    Claim("C5", "each improvement helps on its own", ("cpu-25k-shakespeare",), "baseline",
          tuple((s, -1) for s in ("hg", "dp", "dnp", "or", "er", "iwd"))),
    Claim("C6", "the unified strategy beats the tuned baseline", MAIN, "baseline",
          (("unified", -1), ("unified_foldable", -1))),
    Claim("C7", "... for AdamW and Muon, cosine and WSD",
          tuple(f"c7-cpu-25k-shakespeare-{c}" for c in ("adamw-wsd", "muon-cosine", "muon-wsd")), "baseline",
          (("unified", -1),)),
    Claim("C6", "... with each lr picked on the mean of 3 seeds",
          ("why-lrpick-cpu-25k-shakespeare", "why-lrpick-cpu-25k-shakespeare-bpe4096"), "baseline",
          (("unified", -1),)),
    Claim("C1", "... at 100 tokens per parameter", TPP100, "baseline", (("none", +1),)),
    Claim("C6", "... at 100 tokens per parameter", TPP100, "baseline", (("unified", -1),)),
    Claim("C1", "... with the bpe:4096 tokenizer", BPE, "baseline", (("none", +1),)),
    Claim("C6", "... with the bpe:4096 tokenizer", BPE, "baseline", (("unified", -1),)),
    Claim("why", "unified with one part left out or one choice changed, vs the baseline",
          ("why-variants-cpu-25k-shakespeare",), "baseline", ()),
    Claim("why", "... and vs unified itself", ("why-variants-cpu-25k-shakespeare",), "unified", ()),
    Claim("why", "held out: the two variants chosen on Shakespeare, on KJV", ("cpu-25k-kjv",), "baseline",
          HELD_OUT_VARIANTS),
    Claim("why", "... and vs unified itself", ("cpu-25k-kjv",), "unified", HELD_OUT_VARIANTS),
)


def scaling_size(cell: str) -> tuple[str, int] | None:
    """``(corpus, size in thousands)`` of a C8 cell (``cpu-25k-kjv`` -> ``("kjv", 25)``); None for others."""
    for corpus, cells in SCALING.items():
        if cell in cells:
            return corpus, int(cell.split("-")[1].removesuffix("k"))
    return None


def main(argv: list[str] | None = None) -> int:
    """``python -m reproduction.claims ladder|horizon|first|all``: one ``NAME CELL OPTIONAL`` line per study,
    in run order (what scripts/study.sh reads). Exit 2 on another argument."""
    args = sys.argv[1:] if argv is None else argv
    part = {"ladder": LADDER, "horizon": HORIZON, "first": FIRST, "all": STUDIES}.get(args[0] if len(args) == 1 else "")
    if part is None:
        print("usage: python -m reproduction.claims ladder|horizon|first|all", file=sys.stderr)
        return 2
    for s in part:
        print(s.name, s.cell, int(s.optional))
    return 0


__all__ = ["CLAIMS", "FIRST", "HORIZON", "LADDER", "MAIN", "SCALING", "STUDIES", "Claim", "Study", "scaling_size"]

if __name__ == "__main__":
    sys.exit(main())
