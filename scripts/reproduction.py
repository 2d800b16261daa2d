"""Tables and verdicts of docs/reproduction.md from the committed study results (issue 12).

    python scripts/reproduction.py                 # print the generated section
    python scripts/reproduction.py --write docs/reproduction.md   # replace it between the markers

Reads only ``results/<size>-<corpus>/runs.csv`` (one row per run, written by ``scalevec report``). For
each cell: the seed-0 lr curve of every strategy (the tuning), each strategy at its tuned lr with its
per-seed losses, and each claim's paired difference with a 95 % t interval, the verdict, and how many
seeds a difference of the observed size and spread would need (``stats.seeds_needed``).
Verdict rule: *reproduced* when the interval excludes 0 on the paper's side, *contradicted* when it
excludes 0 on the other side, *inconclusive* otherwise.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from scalevec.experiments.stats import paired_delta, pick_lr, seeds_needed  # noqa: E402

BEGIN, END = "<!-- BEGIN GENERATED (scripts/reproduction.py) -->", "<!-- END GENERATED -->"
# claim -> (strategy, the paper's direction of strategy − baseline: +1 worse, -1 better, the statement)
CLAIMS = {
    "C1": ("none", +1, "removing the scale vectors hurts"),
    "C6": ("unified", -1, "the unified strategy beats the tuned baseline"),
}
CORPORA = ("shakespeare", "kjv")


def read_cell(folder: Path) -> list[dict]:
    with open(folder / "runs.csv") as f:
        return list(csv.DictReader(f))


def _loss(row: dict) -> float:
    return float(row["final_val_loss"]) if row["status"] == "done" else math.inf


def analyse(rows: list[dict]) -> dict:
    """Per strategy: seed-0 lr curve, tuned lr (on seed 0), per-seed losses there; wall time of the cell."""
    out: dict = {"strategies": {}, "wall_s": sum(float(r["wall_time_s"] or 0) for r in rows)}
    by_strategy = defaultdict(list)
    for r in rows:
        by_strategy[r["strategy"]].append(r)
    for strategy, rs in by_strategy.items():
        curve = {float(r["lr"]): _loss(r) for r in rs if r["seed"] == "0"}
        # an unfinished tuning run leaves the pick open; an unfinished confirmation seed is just not counted yet
        unfinished = [r for r in rs if r["status"] not in ("done", "diverged") and r["seed"] == "0"]
        if not curve or unfinished:
            continue
        try:
            pick = pick_lr({lr: [v] for lr, v in curve.items()})
        except ValueError:
            continue
        seeds = {int(r["seed"]): float(r["final_val_loss"]) for r in rs
                 if float(r["lr"]) == pick.lr and r["status"] == "done"}
        out["strategies"][strategy] = {"curve": curve, "lr": pick.lr, "edge": pick.at_edge, "seeds": seeds}
    return out


def verdict(delta, direction: int) -> str:
    if not delta.significant:
        return "inconclusive"
    return "reproduced" if (delta.delta > 0) == (direction > 0) else "contradicted"


def fmt_lr(lr: float) -> str:
    return f"{lr:g}"


def cell_section(name: str, a: dict) -> list[str]:
    lines = [f"#### {name}", ""]
    st = a["strategies"]
    lrs = sorted({lr for s in st.values() for lr in s["curve"]})
    lines.append("Seed-0 final validation loss (nats/token) per lr; **bold** = the strategy's tuned lr, "
                 "∞ = diverged, blank = not run:")
    lines.append("")
    lines.append("| lr | " + " | ".join(st) + " |")
    lines.append("|---:|" + "---:|" * len(st))
    for lr in lrs:
        cells = []
        for s in st.values():
            v = s["curve"].get(lr)
            text = "" if v is None else ("∞" if math.isinf(v) else f"{v:.4f}")
            cells.append(f"**{text}**" if lr == s["lr"] and text else text)
        lines.append(f"| {fmt_lr(lr)} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("| strategy | tuned lr | per-seed final loss | mean ± std |")
    lines.append("|---|---:|---|---:|")
    for strategy, s in st.items():
        vals = [s["seeds"][k] for k in sorted(s["seeds"])]
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else math.nan
        edge = " (grid edge)" if s["edge"] else ""
        lines.append(f"| {strategy} | {fmt_lr(s['lr'])}{edge} | {', '.join(f'{v:.4f}' for v in vals)} | "
                     f"{mean:.4f} ± {std:.4f} |")
    lines.append("")
    return lines


def claim_rows(cells: dict[str, dict]) -> list[str]:
    lines = ["| claim | cell | Δ vs baseline (mean) [95 % CI] | seeds | verdict | seeds needed at this effect |",
             "|---|---|---:|---:|---|---:|"]
    for claim, (strategy, direction, _) in CLAIMS.items():
        for name, a in cells.items():
            st = a["strategies"]
            if "baseline" not in st or strategy not in st:
                lines.append(f"| {claim} | {name} | not run yet | | | |")
                continue
            common = sorted(set(st["baseline"]["seeds"]) & set(st[strategy]["seeds"]))
            base = [st["baseline"]["seeds"][k] for k in common]
            mine = [st[strategy]["seeds"][k] for k in common]
            if len(common) < 2:
                lines.append(f"| {claim} | {name} | {len(common)} seed(s) so far | {len(common)} | | |")
                continue
            d = paired_delta(base, mine)
            need = seeds_needed([m - b for m, b in zip(mine, base)])
            lines.append(f"| {claim} | {name} | {d.delta:+.4f} [{d.lo:+.4f}, {d.hi:+.4f}] | {d.n} | "
                         f"{verdict(d, direction)} | {need if need else '> 1000'} |")
    return lines


def generate(results: Path) -> str:
    cells = {}
    for folder in sorted(results.iterdir()):
        if (folder / "runs.csv").is_file():
            cells[folder.name] = analyse(read_cell(folder))
    lines = ["### Verdicts", ""] + claim_rows(cells) + [""]
    hours = sum(a["wall_s"] for a in cells.values()) / 3600
    lines.append(f"Machine time of these cells: {hours:.2f} h of training wall clock (one run at a time, one "
                 f"thread each; the rest of the machine was shared with other work).")
    lines.append("")
    lines.append("### Cells")
    lines.append("")
    for name, a in cells.items():
        lines += cell_section(name, a)
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=str(ROOT / "results"))
    p.add_argument("--write", help="a markdown file whose text between the markers is replaced")
    args = p.parse_args()
    text = generate(Path(args.results))
    if not args.write:
        print(text)
        return 0
    doc = Path(args.write).read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{args.write} has no {BEGIN} ... {END} markers")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    Path(args.write).write_text(f"{head}{BEGIN}\n{text}{END}{tail}")
    print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
