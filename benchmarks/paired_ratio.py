"""Paired, round-by-round step-time ratio of two candidates of one ``scalevec bench --save`` JSON file.

    python benchmarks/paired_ratio.py RESULTS.json unified:fused/unified [baseline:fused/baseline ...]

Prints the median and interquartile range of ``time(A) / time(B)`` over the timed rounds (``times_s``: the
candidates of one round ran back to back, so the pair shares the machine's load) and in how many rounds A
was faster. Used for docs/performance.md's "fused ÷ exact" table (fused ÷ exact of the same strategy).
"""

from __future__ import annotations

import json
import statistics
import sys


def paired(path: str, pairs: list[str]) -> list[str]:
    """One line per ``A/B`` in ``pairs``; ``KeyError`` names a candidate the file does not hold."""
    with open(path) as f:
        rows = {c["name"]: c for c in json.load(f)["train"]}
    out = []
    for pair in pairs:
        a, b = pair.split("/")
        r = sorted(x / y for x, y in zip(rows[a]["times_s"], rows[b]["times_s"]))
        q = statistics.quantiles(r, n=4)
        out.append(f"{a} / {b}: {statistics.median(r):.3f} [{q[0]:.3f}, {q[2]:.3f}], "
                   f"faster in {sum(x < 1 for x in r)}/{len(r)} rounds")
    return out


if __name__ == "__main__":
    if len(sys.argv) < 3 or any("/" not in p for p in sys.argv[2:]):
        sys.exit("usage: paired_ratio.py RESULTS.json A/B [A/B ...]")
    print("\n".join(paired(sys.argv[1], sys.argv[2:])))
