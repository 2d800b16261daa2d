"""Write the sweep files of the lr-matched controls (docs/reproduction.md, "lr-matched controls").

Per ladder cell: `none` and `unified` at the baseline's picked lr on the cell's held-out seeds (protocol v3's
seeds >= 2 that tuned no arm) and, in a `-wsd` cell, the baseline at the arms' lr with the arms there too. Every
run is the cell's own config except the lr: the sweep's ``base`` is the cell's study spec's ``base`` (preset, data,
validation, init regime, threads, schedule and token budget), and ``scalevec sweep`` refuses a run whose stored
config differs. Protocol v3 pairs runs on one CPU kind only (``protocol3.same_kind``), so where the cell's held-out
baseline ran on another kind than this machine's the baseline is rerun here at its pick; an arm whose pick is the
baseline's lr (within 0.1 %: the grid's 6-digit rounding) is left out, its tuned runs being the control. Seeds run
seed-major (one axis of (seed, strategy, lr) bundles), so a sweep cut short leaves complete pairs; ``--first K`` puts
the first K held-out seeds in ``sweeps/control-CELL.yaml`` and the rest in ``sweeps/control-CELL-more.yaml``.

Usage: python scripts/control_plan.py CELL [CELL ...] [--first K]   (CELL: ladder-cpu-25k-kjv-tpp100 ...)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]  # scalevec from this checkout, and its reproduction package

from reproduction import protocol3 as p3  # noqa: E402
from reproduction.controls import same_lr  # noqa: E402

from scalevec.config.files import load_yaml  # noqa: E402
from scalevec.experiments.sweep_grid import name_part  # noqa: E402
from scalevec.model.flops import cpu_name  # noqa: E402


def plan(cell: Path, kind: str, check: int) -> tuple[list[tuple[int, str, float]], list[int], str]:
    """``(runs, held-out seeds, note)`` of the controls of ``cell`` on CPU kind ``kind``: ``runs`` = ``(seed,
    strategy, lr)`` seed-major. Needed: the arms whose pick is not the baseline's lr at the baseline's lr and the
    baseline there (in a ``-wsd`` cell every strategy at every pick), on every held-out seed, less the runs that
    already finished on ``kind``; plus the baseline on ``check`` held-out seeds where it did (a bitwise check that
    the control's config is the cell's)."""
    runs = p3.read_runs(cell)
    c = p3.read_cell(cell)
    if c is None:
        raise SystemExit(f"{cell}: not a ladder cell with a baseline pick")
    base = c.picks["baseline"]
    tuning = set().union(*(set(p.seeds) for p in c.picks.values()))
    held = sorted({r.seed for r in runs if r.strategy == "baseline" and same_lr(r.lr, base.lr) and r.done}
                  - tuning)
    arms = [s for s in ("none", "unified") if s in c.picks and not same_lr(c.picks[s].lr, base.lr)]
    if not arms:
        return [], held, (f"every arm picked the baseline's lr {base.lr:g}: its tuned runs are the control")
    wanted = {(s, base.lr) for s in ["baseline", *arms]}
    if c.variant == "-wsd":  # equal lr both ways: every strategy at every pick
        wanted = {(s, p.lr) for s in ("baseline", *arms) for p in c.picks.values()}
        wanted = {(s, lr) for s, lr in wanted if not any(same_lr(lr, x) and lr > x for t, x in wanted if t == s)}

    def here(s: str, lr: float, k: int) -> bool:
        return any(r.strategy == s and r.seed == k and r.done and same_lr(r.lr, lr) and p3.same_kind(r.kind, kind)
                   for r in runs)

    order = {"baseline": 0, "none": 1, "unified": 2}
    checks = [k for k in held if here("baseline", base.lr, k)][:check]
    out = [(k, s, lr) for k in held for s, lr in sorted(wanted, key=lambda x: (order[x[0]], x[1]))
           if not here(s, lr, k) or (s == "baseline" and same_lr(lr, base.lr) and k in checks)]
    kinds = sorted({r.kind for r in runs if r.strategy == "baseline" and r.seed in held and same_lr(r.lr, base.lr)})
    note = (f"baseline pick {base.lr:g}; " + ", ".join(f"{s} pick {c.picks[s].lr:g}" for s in ("none", "unified"))
            + f"; held-out seeds {held[0]}-{held[-1]} ({len(held)}), their baselines on {', '.join(kinds)}; "
            + f"this machine: {kind}"
            + (f"; baseline rerun as a bitwise check on seeds {checks}" if checks else ""))
    return out, held, note


def sweep_file(cell: Path, name: str, runs: list[tuple[int, str, float]], note: str, est: str, folder: str) -> str:
    """The sweep file: the cell's study ``base``, one axis of bundles (seed, strategy, lr), named as a crossed
    grid would name them (``s2_baseline_lr0.0178179``)."""
    spec = load_yaml(cell / "sweep.yaml")
    bundles = [{"name": "_".join((name_part("train.seed", k), name_part("strategy", s), name_part("optim.lr", lr))),
                "train.seed": k, "strategy": s, "optim.lr": lr} for k, s, lr in runs]
    body = {"name": name, "base": spec["base"], "grid": {"run": bundles}, "tune": [], "baseline": "baseline"}
    head = (f"# lr-matched controls of {cell.name} (docs/reproduction.md, 'lr-matched controls'): {note}.\n"
            f"# base: the cell's study spec's base, unchanged; written by scripts/control_plan.py. {est}\n"
            f"# Regenerate (resumable): scalevec sweep sweeps/{name}.yaml --out results/{folder} --jobs 2\n")
    return head + yaml.safe_dump(body, sort_keys=False, default_flow_style=None, width=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cells", nargs="+")
    ap.add_argument("--first", type=int, default=0, help="held-out seeds in the first file (0: all)")
    ap.add_argument("--check-seeds", type=int, default=2,
                    help="held-out seeds whose baseline ran on this machine's kind and is rerun as a bitwise check")
    ap.add_argument("--results", default="results")
    ap.add_argument("--sweeps", default="sweeps")
    a = ap.parse_args(argv)
    kind = f"{cpu_name()} / {torch.backends.cpu.get_cpu_capability()}"
    for name in a.cells:
        cell = Path(a.results) / name
        runs, held, note = plan(cell, kind, a.check_seeds)
        if not runs:
            print(f"{name}: no control to run ({note})")
            continue
        per = sorted(r.wall_s for r in p3.read_runs(cell) if r.done and r.wall_s > 0)
        med = per[len(per) // 2]
        stem = f"control-{name.removeprefix('ladder-')}"
        first = set(held[:a.first]) if a.first else set(held)
        parts = [(stem, [r for r in runs if r[0] in first]), (stem + "-more", [r for r in runs if r[0] not in first])]
        for file_stem, part in parts:
            if not part:
                continue
            est = (f"Estimate: {len(part)} runs × {med:.0f} s (the cell's median run) ≈ {len(part) * med / 3600:.2f} "
                   f"single-thread hours.")
            Path(a.sweeps, file_stem + ".yaml").write_text(sweep_file(cell, file_stem, part, note, est, stem))
            print(f"{file_stem}: seeds {sorted({r[0] for r in part})}: {est}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
