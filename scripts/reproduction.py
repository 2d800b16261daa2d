"""Tables, figures and verdicts of docs/reproduction.md from the committed study results; the claims,
their cells and the studies that fill them are declared in ``reproduction.claims``.

    python scripts/reproduction.py                 # print the generated section
    python scripts/reproduction.py --write docs/reproduction.md   # replace it between the markers,
                                                   # and write its figures into docs/figures/

Reads only ``results/<cell>/runs.csv`` (one row per run, written by ``scalevec report``). A cell's
*arms* are its strategies, or, when a setting varies within a strategy (``scale.wd`` in the C4 study:
``report.setting_columns``), that setting's values. For each cell: the seed-0 lr curve of every arm
on its tuning seeds (the seeds every lr has), each arm at its tuned lr with its per-seed losses. For each claim: the
paired difference (arm − control, matched seeds) with a 95 % t interval, the verdict, and how many seeds a difference of
the observed size and spread would need (``stats.seeds_needed``). C8: a joint power-law fit over the
sizes of one corpus (``stats.fit_shared_power_law``) gives each strategy's compute multiplier over those measured
sizes only, when the baseline's E and α are identified (``identified``); no multiplier at another size.
Verdict rule: *reproduced* when the interval excludes 0 on the paper's side, *contradicted* when it
excludes 0 on the other side, *inconclusive* otherwise.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]  # scalevec from this checkout, and its reproduction package

from reproduction import controls, ladder  # noqa: E402
from reproduction.claims import CLAIMS, scaling_size  # noqa: E402

from scalevec.experiments.frames import MACHINE_COLUMNS, SUMMARY_COLUMNS, read_runs_csv  # noqa: E402
from scalevec.experiments.stats import (  # noqa: E402
    fit_power_law,
    fit_shared_power_law,
    paired_delta,
    pick_lr,
    seeds_for_halfwidth,
    seeds_needed,
)
from scalevec.training.rundir import write_atomic  # noqa: E402

BEGIN, END = "<!-- BEGIN GENERATED (scripts/reproduction.py) -->", "<!-- END GENERATED -->"
# columns every runs.csv has; any other non-metric column is a setting that names the arms
STANDARD = {"run", "status", "preset", "strategy", "optimizer", "schedule", "lr", "seed", *SUMMARY_COLUMNS,
            *MACHINE_COLUMNS}  # runs.csv's columns that are not a setting (frames.runs_frame)


def read_cell(folder: Path) -> list[dict]:
    """The rows of ``folder/runs.csv`` (``frames.read_runs_csv``: ``ValueError`` naming the line of a torn or
    doubled file; ``[]`` for a header-only one)."""
    return read_runs_csv(folder / "runs.csv")


def training_seconds(folders: list[Path]) -> float:
    """Training wall clock of the runs in ``folders`` (their ``runs.csv``), each run once: a run directory copied
    into a second cell's folder (as the bpe why-lrpick study reuses the C6 cell's) has the same name, final
    loss and wall time as the original, and that triple is a run's identity here."""
    trained = {}
    for folder in folders:
        for r in read_cell(folder):
            trained[r["run"], r["final_val_loss"], r["wall_time_s"]] = float(r["wall_time_s"] or 0)
    return sum(trained.values())


def _loss(row: dict) -> float:
    return float(row["final_val_loss"]) if row["status"] == "done" else math.inf


def arm_axis(rows: list[dict], where: str = "runs.csv") -> str:
    """The column that names a cell's arms: a setting column if the cell has one, else ``strategy``. ``ValueError``
    naming ``where`` (the cell's runs.csv) when it has two or more (``main``: one line, exit 2)."""
    extra = [k for k in (rows[0] if rows else {}) if k not in STANDARD and not k.startswith("eval.")]
    if len(extra) > 1:
        raise ValueError(f"{where} varies {extra} within a strategy; scripts/reproduction.py reads one setting "
                         f"axis: report the cell with one setting column")
    return extra[0] if extra else "strategy"


def analyse(rows: list[dict], where: str = "runs.csv") -> dict:
    """Per arm: the lr curve on the tuning seeds (the seeds every lr of the arm has: seed 0 in the C6
    protocol, seeds 0-2 in the why-lrpick study; their mean per lr), the tuned lr picked on it, the
    per-seed losses there and the non-embedding parameter count; the cell's arm axis, its number of runs
    (0 for a header-only runs.csv) and training time."""
    axis = arm_axis(rows, where)
    out: dict = {"axis": axis, "arms": {}, "runs": len(rows),
                 "wall_s": sum(float(r["wall_time_s"] or 0) for r in rows)}
    by_arm = defaultdict(list)
    for r in rows:
        by_arm[r[axis]].append(r)
    for arm, rs in by_arm.items():
        lrs = {float(r["lr"]) for r in rs}
        seeds_at = [{r["seed"] for r in rs if float(r["lr"]) == lr} for lr in lrs]
        tuning = set.intersection(*seeds_at) if seeds_at else set()
        # an unfinished tuning run leaves the pick open; an unfinished confirmation seed is just not counted yet
        unfinished = [r for r in rs if r["status"] not in ("done", "diverged") and r["seed"] in tuning]
        if not tuning or unfinished:
            continue
        curve = {lr: sum(_loss(r) for r in rs if float(r["lr"]) == lr and r["seed"] in tuning) / len(tuning)
                 for lr in lrs}
        try:
            pick = pick_lr({lr: [v] for lr, v in curve.items()})
        except ValueError:
            continue
        done = [r for r in rs if float(r["lr"]) == pick.lr and r["status"] == "done"]
        out["arms"][arm] = {"curve": curve, "lr": pick.lr, "edge": pick.at_edge,
                            "tuning_seeds": sorted(int(k) for k in tuning),
                            "seeds": {int(r["seed"]): float(r["final_val_loss"]) for r in done},
                            "n": float(done[0]["non_embedding_params"]) if done else math.nan}
    return out


def verdict(delta, direction: int) -> str:
    if direction == 0:
        return "no claim: " + (("higher" if delta.delta > 0 else "lower") if delta.significant else "within noise")
    if not delta.significant:
        return "inconclusive"
    return "reproduced" if (delta.delta > 0) == (direction > 0) else "contradicted"


def fmt_lr(lr: float) -> str:
    return f"{lr:g}"


def cell_section(name: str, a: dict) -> list[str]:
    lines = [f"#### {name}", ""]
    if not a["runs"]:  # a header-only runs.csv: say so rather than print empty tables
        return lines + [f"Its `runs.csv` lists no runs (`scalevec report results/{name}` once its runs finish).", ""]
    st = a["arms"]
    lrs = sorted({lr for s in st.values() for lr in s["curve"]})
    what = "strategy" if a["axis"] == "strategy" else f"`{a['axis']}`"
    tuning = sorted({tuple(s["tuning_seeds"]) for s in st.values()})
    on = " / ".join("seed " + ", ".join(map(str, t)) if len(t) == 1 else f"mean of seeds {', '.join(map(str, t))}"
                    for t in tuning)
    lines.append(f"Final validation loss (nats/token) on the tuning seeds ({on}) per lr and {what}; **bold** = "
                 f"the tuned lr, ∞ = diverged, blank = not run. Training time of the cell: {a['wall_s'] / 60:.1f} min.")
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
    lines.append(f"| {what} | tuned lr | per-seed final loss | mean ± std |")
    lines.append("|---|---:|---|---:|")
    for arm, s in st.items():
        vals = [s["seeds"][k] for k in sorted(s["seeds"])]
        if not vals:
            continue
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else math.nan
        edge = " (grid edge)" if s["edge"] else ""
        lines.append(f"| {arm} | {fmt_lr(s['lr'])}{edge} | {', '.join(f'{v:.4f}' for v in vals)} | "
                     f"{mean:.4f} ± {std:.4f} |")
    lines.append("")
    return lines


def comparisons(cells: dict[str, dict]) -> list[dict]:
    """Every (claim, cell, arm) comparison that the results allow, and the ones still missing."""
    out = []
    for c in CLAIMS:
        for name in c.cells:
            if name not in cells:  # a declared cell whose study has not reported
                out.append({"claim": c.id, "cell": name, "arm": (c.arms or (("variants", 0),))[0][0],
                            "control": c.control, "direction": 0, "status": "not run yet"})
                continue
            if not cells[name]["runs"]:  # a header-only runs.csv: nothing was compared
                out.append({"claim": c.id, "cell": name, "arm": (c.arms or (("variants", 0),))[0][0],
                            "control": c.control, "direction": 0, "status": "runs.csv lists no runs"})
                continue
            st = cells[name]["arms"]
            arms = c.arms or tuple((arm, 0) for arm in st if arm not in ("baseline", "unified"))
            for i, (arm, direction) in enumerate(arms):
                row = {"claim": c.id, "cell": name, "arm": arm, "control": c.control, "direction": direction}
                if c.control not in st or arm not in st:
                    # a secondary arm that a cell's grid does not have (unified_foldable outside the C5 cell)
                    # is no missing result; the claim's first arm, or any arm of C4/C5, is
                    if i == 0 or len(arms) > 2 or arm in st:
                        out.append({**row, "status": "not run yet"})
                    continue
                common = sorted(set(st[c.control]["seeds"]) & set(st[arm]["seeds"]))
                base = [st[c.control]["seeds"][k] for k in common]
                mine = [st[arm]["seeds"][k] for k in common]
                if len(common) < 2:
                    out.append({**row, "status": f"{len(common)} seed(s) so far"})
                    continue
                d = paired_delta(base, mine)
                out.append({**row, "status": "ok", "delta": d, "verdict": verdict(d, direction),
                            "need": seeds_needed([m - b for m, b in zip(mine, base)])})
    return out


def claim_rows(rows: list[dict]) -> list[str]:
    lines = ["| claim | cell | arm vs control | Δ (mean) [95 % CI] | seeds | verdict | seeds needed at this effect |",
             "|---|---|---|---:|---:|---|---:|"]
    for r in rows:
        vs = f"{r['arm']} vs {r['control']}"
        if r["status"] != "ok":
            lines.append(f"| {r['claim']} | {r['cell']} | {vs} | {r['status']} | | | |")
            continue
        d = r["delta"]
        need = "—" if r["direction"] == 0 else (r["need"] if r["need"] else "> 1000")
        lines.append(f"| {r['claim']} | {r['cell']} | {vs} | {d.delta:+.4f} [{d.lo:+.4f}, {d.hi:+.4f}] | {d.n} | "
                     f"{r['verdict']} | {need} |")
    return lines


def scaling(cells: dict[str, dict]) -> list[dict]:
    """C8: per corpus with >= 3 sizes, the baseline's power law and each strategy's joint fit (shared E
    and α, the strategy acting like m× the parameters: compute multiplier m² ± one sigma). Every seed at
    the tuned lr is a point."""
    by_corpus: dict[str, dict[int, dict]] = defaultdict(dict)
    for name, a in cells.items():
        size = scaling_size(name)
        if size:
            by_corpus[size[0]][size[1]] = a
    fits = []
    for corpus, sizes in sorted(by_corpus.items()):
        def points(arm: str, sizes: dict = sizes) -> tuple[list[float], list[float]]:
            n, y = [], []
            for a in sizes.values():
                s = a["arms"].get(arm)
                if s:
                    n += [s["n"]] * len(s["seeds"])
                    y += list(s["seeds"].values())
            return n, y

        nb, yb = points("baseline")
        if len(set(nb)) < 3:
            fits.append({"corpus": corpus, "sizes": sorted(sizes), "status": f"{len(set(nb))} size(s) with results"})
            continue
        entry = {"corpus": corpus, "sizes": sorted(sizes), "status": "ok", "base": fit_power_law(nb, yb),
                 "points": {"baseline": (nb, yb)}, "shared": {}}
        for arm in ("none", "unified"):
            n, y = points(arm)
            if len(set(n)) >= 3:
                entry["shared"][arm] = fit_shared_power_law(nb, yb, n, y)
                entry["points"][arm] = (n, y)
        fits.append(entry)
    return fits


def scaling_lines(fits: list[dict]) -> list[str]:
    """C8's table: the baseline's fit per corpus and each strategy's joint-fit multiplier m², a constant assumed
    over the measured sizes the row names (never stated at another size), and withheld as *not identified* when
    the baseline's E or α is not (``identified``): the multiplier would then be an artefact of the fit."""
    lines = ["### C8: scaling", ""]
    if not fits:
        return lines + ["No dense 20 tokens/parameter cells yet.", ""]
    lines += ["| corpus | sizes (non-emb.) | baseline fit L(N) = E + A·N^-α | strategy | "
              "compute multiplier m² ± 1σ over these sizes |",
              "|---|---|---|---|---:|"]
    for f in fits:
        sizes = ", ".join(f"{s}k" for s in f["sizes"])
        if f["status"] != "ok":
            lines.append(f"| {f['corpus']} | {sizes} | {f['status']} | | |")
            continue
        b = f["base"]
        fit = (f"E {b.E:.3f} ± {b.E_err:.3f}, A {b.A:.3g}, α {b.alpha:.3f} ± {b.alpha_err:.3f} "
               f"(rmse {b.rmse:.4f}, {b.n_points} points)")
        if not f["shared"]:
            lines.append(f"| {f['corpus']} | {sizes} | {fit} | (no strategy at 3 sizes yet) | |")
        ok = identified(b.E, b.E_err) and identified(b.alpha, b.alpha_err)
        for arm, s in f["shared"].items():
            m = f"{s.multiplier:.3f} ± {s.multiplier_err:.3f}" if ok else "not identified (E or α at its bound)"
            lines.append(f"| {f['corpus']} | {sizes} | {fit} | {arm} | {m} |")
    lines += ["", "A multiplier above 1 means the strategy reaches the baseline's loss with less compute, as a "
              "constant factor over the sizes of its row (the fit assumes it; it says nothing at other sizes, "
              "the paper's 0.12B–2B included); 1 ± 2σ containing 1 is no evidence either way. E or α *not "
              "identified* (1σ reaching its bound 0): no multiplier, as in the ladder's C8.", ""]
    return lines


def plot(rows: list[dict], fits: list[dict], figures: Path) -> list[str]:
    """The forest plot of every finished comparison and the C8 scaling plot; returns the file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures.mkdir(parents=True, exist_ok=True)
    written = []
    done = [r for r in rows if r["status"] == "ok"]
    if done:
        fig, ax = plt.subplots(figsize=(7.5, 0.32 * len(done) + 1.2))
        for i, r in enumerate(reversed(done)):
            d = r["delta"]
            colour = {"reproduced": "tab:green", "contradicted": "tab:red"}.get(r["verdict"], "tab:gray")
            ax.errorbar(d.delta, i, xerr=[[d.delta - d.lo], [d.hi - d.delta]], fmt="o", color=colour, capsize=3)
        ax.set_yticks(range(len(done)))
        ax.set_yticklabels([f"{r['claim']} {r['cell']}: {r['arm']} vs {r['control']}" for r in reversed(done)],
                           fontsize=7)
        ax.axvline(0, color="k", lw=0.8)
        ax.set_xlabel("Δ final validation loss, arm − control (nats/token), 95 % paired t interval")
        ax.set_title("Every comparison of the study\n(green: reproduced, red: contradicted, grey: inconclusive "
                     "or no claim)", fontsize=8)
        fig.tight_layout()
        fig.savefig(figures / "reproduction_deltas.png", dpi=130)
        plt.close(fig)
        written.append("reproduction_deltas.png")
    ok = [f for f in fits if f["status"] == "ok"]
    if ok:
        import numpy as np

        fig, axes = plt.subplots(1, len(ok), figsize=(5 * len(ok), 3.8), squeeze=False)
        for ax, f in zip(axes[0], ok):
            # the fits drawn over the measured sizes only: they say nothing beyond them
            grid = np.geomspace(min(f["points"]["baseline"][0]), max(f["points"]["baseline"][0]), 100)
            for arm, (n, y) in f["points"].items():
                line = ax.scatter(n, y, s=12, label=arm)
                if arm == "baseline":
                    ax.plot(grid, f["base"].predict(grid), color=line.get_facecolor()[0])
                else:
                    s = f["shared"][arm]
                    ax.plot(grid, f["base"].E + (f["base"].predict(grid * s.m) - f["base"].E),
                            color=line.get_facecolor()[0], ls="--")
            ax.set_xscale("log")
            ax.set_xlabel("non-embedding parameters")
            ax.set_ylabel("final validation loss (nats/token)")
            ax.set_title(f"C8, {f['corpus']}: per-seed points, fits (dashed: joint)", fontsize=8)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(figures / "reproduction_scaling.png", dpi=130)
        plt.close(fig)
        written.append("reproduction_scaling.png")
    return written


# The paper's figures (DESIGN.md §11, a third-party reading of the paper, medium confidence): none +0.015 at
# 0.12B after retuning lr; unified -0.016 to -0.019 at 0.5B (Muon + WSD).
PAPER_POINTS = (("none", "llama-0.12b", 0.015), ("unified", "llama-0.5b", -0.0175))
TARGET_HALFWIDTH = 0.015  # each rung's Δ resolved to ±0.015 nats (95 %): the size of the paper's effects above


def identified(value: float, err: float) -> bool:
    """A fitted parameter is identified when it is finite, off its bound 0 and more than 2σ from it."""
    return math.isfinite(err) and value > 0 and value > 2 * err


def tuned_differences(runs: list[dict], got: dict, strategy: str) -> list[float]:
    """Per-seed ``strategy − baseline`` final losses of one rung's ``runs.csv``, each at its tuned lr."""
    def at_tuned(s: str) -> dict[int, float]:
        return {int(r["seed"]): float(r["final_val_loss"]) for r in runs
                if r["strategy"] == s and r["status"] == "done" and s in got and float(r["lr"]) == got[s].lr}

    a, b = at_tuned("baseline"), at_tuned(strategy)
    return [b[k] - a[k] for k in sorted(a.keys() & b.keys())]


def ladder_section(results: Path, figures: Path | None) -> list[str]:
    """The model ladder read as published (protocol v2): the per-rung table, the trend of Δ with N between its
    rungs, the C8 re-fit on the ladder, hours per rung, and the figure."""
    rows = ladder.read_ladder(results)
    lines = ["### The ladder in the 0.12B model's init regime, as published: protocol v2", "",
             "Protocol v2 as it was published, kept for comparison: Δ over **every** seed, the tuning "
             "seeds 0-1 included (they carry the winner's curse of the pick), CPU kinds pooled. Protocol v3 above "
             "is the reading to quote.", ""]
    if not rows:
        return lines + ["No ladder rung has reported yet (`scripts/study.sh ladder`).", ""]
    from scalevec.config.presets import get_preset

    lines += ["Each rung: `results/ladder-RUNG-CORPUS/`, made by `sweeps/study-ladder-RUNG-CORPUS.yaml`. lr: each "
              "strategy's, picked on the mean of seeds 0-1 (* = at the edge of the grid tried); Δ: strategy − "
              "baseline at each one's tuned lr, paired by seed, 95 % t interval; spread: the baseline's seed std; "
              "seeds to ±0.015: what `stats.seeds_for_halfwidth` plans from the per-seed differences so far, for the "
              "wider of the two Δ (1001: more than 1000); tok/s: the median run's training tokens per second of "
              "wall clock (two runs at once on the two cores, one thread each, as the runs met the machine: a cell "
              "that shared it with other work, such as the test suite, reads slower; `compiled`: blocks under "
              "`torch.compile`); hours: the runs' wall clock added up (single-thread hours).", "",
              "| rung | corpus | N (non-emb.) | d_model | tokens | seeds | lr baseline / none / unified | "
              "Δ none | Δ unified | spread | seeds to ±0.015 | tok/s | hours |",
              "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for rung in ladder.RUNGS:
        for corpus in ladder.CORPORA:
            got = {r.strategy: r for r in rows if r.rung == rung and r.corpus == corpus}
            if "baseline" not in got:
                continue
            folder = ladder.folder(results, rung, corpus)
            runs = read_cell(folder) if (folder / "runs.csv").is_file() else []
            hours = sum(float(r["wall_time_s"] or 0) for r in runs) / 3600
            rates = [float(r["tokens"]) / float(r["wall_time_s"]) for r in runs if r["wall_time_s"] and r["tokens"]]
            compiled = " compiled" if any(r.get("compiled") == "True" for r in runs) else ""
            tok_s = f"{statistics.median(rates):,.0f}{compiled}" if rates else "—"
            tokens = f"{int(float(runs[0]['tokens'])):,}" if runs else "—"  # no runs.csv rows: nothing to say
            lrs = " / ".join(f"{got[s].lr:.3g}{'*' if got[s].at_edge else ''}" if s in got else "—"
                             for s in ("baseline", "none", "unified"))
            seeds = "/".join(str(got[s].seeds) for s in ("baseline", "none", "unified") if s in got)

            def delta(s: str, got: dict = got) -> str:
                r = got.get(s)
                if r is None or r.delta is None or r.lo is None:
                    return "—"
                return f"{r.delta:+.4f} [{r.lo:+.4f}, {r.hi:+.4f}]"

            need = []
            for s in ("none", "unified"):
                diffs = tuned_differences(runs, got, s)
                if len(diffs) >= 2:
                    need.append(seeds_for_halfwidth(diffs, TARGET_HALFWIDTH) or 1001)
            lines.append(f"| {rung} | {corpus} | {got['baseline'].n:,} | {get_preset(rung).d_model} | {tokens} | "
                         f"{seeds} | {lrs} | {delta('none')} | {delta('unified')} | {got['baseline'].loss_std:.4f} | "
                         f"{max(need) if need else '—'} | {tok_s} | {f'{hours:.2f}' if runs else '—'} |")
    variants = [r for r in rows if r.strategy not in ("baseline", "none", "unified") and r.delta is not None]
    if variants:
        lines += ["", "**The suspects** (`sweeps/study-ladder-suspects-*.yaml`, in the rung's folder: its baseline "
                  "runs are the rung's): `unified-no-qk-out` is `unified` without DP's output scales on q and k "
                  "(`scale.dual_sites: [v, gate, up]`), `unified-scale-lr0.25` `unified` with the scale vectors' lr "
                  "at 1/4 (`scale.lr_mult: 0.25`); each against the baseline at its own tuned lr. Several variants "
                  "are tried here, so one interval that barely excludes 0 is a lead for the next rung and the "
                  "held-out corpus, not a finding.", "",
                  "| rung | corpus | variant | lr | seeds | Δ vs baseline [95 % CI] | Δ unified (same rung) |",
                  "|---|---|---|---:|---:|---:|---:|"]
        for v in variants:
            u = next((r for r in rows if r.rung == v.rung and r.corpus == v.corpus and r.strategy == "unified"), None)
            ud = f"{u.delta:+.4f}" if u is not None and u.delta is not None else "—"
            lines.append(f"| {v.rung} | {v.corpus} | {v.strategy} | {v.lr:.3g}{'*' if v.at_edge else ''} | "
                         f"{v.seeds} | {v.delta:+.4f} [{v.lo:+.4f}, {v.hi:+.4f}] | {ud} |")
    trends = [t for s in ("none", "unified") for c in ladder.CORPORA if (t := ladder.trend(rows, s, c)) is not None]
    lines += ["", "**Trend of Δ with N** (a weighted line in log10 N, the rungs' standard errors as weights, scaled "
              "by the reduced χ² when the rungs scatter more; 95 % t intervals, or normal ones through exactly two "
              "rungs, which the line passes through), between the rungs measured.", ""]
    if not trends:
        lines += ["Fewer than two rungs with an interval on every corpus: no trend yet.", ""]
    else:
        lines += ["| strategy | corpus | rungs | slope (nats per decade of N) |", "|---|---|---:|---:|"]
        for t in trends:
            lo, hi = t.slope_interval
            slope = f"{t.fit.slope:+.4f}" + ("" if math.isnan(lo) else f" [{lo:+.4f}, {hi:+.4f}]")
            lines.append(f"| {t.strategy} | {t.corpus} | {len(t.points)} | {slope} |")
        lines.append("")
    lines += c8_ladder_lines(results, rows)
    if figures is not None and trends:
        name = ladder_figure(rows, trends, figures)
        lines += [f"![{name}](figures/{name})", ""]
    return lines


def c8_ladder_lines(results: Path, rows: list) -> list[str]:
    """C8 re-fitted on the ladder: every seed at each tuned lr is a point of ``L(N) = E + A·N^-α``; the
    strategy's compute multiplier is given only when the baseline's E and α are both identified."""
    lines = ["**C8 on the ladder** (every seed at the tuned lr is a point; E or α *not identified* when its 1σ "
             "reaches its bound 0, and then no multiplier is reported: it would be an artefact of the fit).", "",
             "| corpus | rungs | baseline E ± 1σ | α ± 1σ | none: multiplier m² | unified: multiplier m² |",
             "|---|---:|---:|---:|---:|---:|"]
    any_row = False
    for corpus in ladder.CORPORA:
        pts: dict[str, tuple[list, list]] = {s: ([], []) for s in ("baseline", "none", "unified")}
        rungs = 0
        for rung in ladder.RUNGS:
            folder = ladder.folder(results, rung, corpus)
            got = {r.strategy: r for r in rows if r.rung == rung and r.corpus == corpus}
            if "baseline" not in got or not (folder / "runs.csv").is_file():
                continue
            before = len(pts["baseline"][0])
            for r in read_cell(folder):
                s = r["strategy"]
                if s in pts and s in got and r["status"] == "done" and float(r["lr"]) == got[s].lr:
                    pts[s][0].append(got["baseline"].n)
                    pts[s][1].append(float(r["final_val_loss"]))
            rungs += len(pts["baseline"][0]) > before  # a rung whose runs.csv gave no baseline point is no rung
        if rungs < 3:
            continue
        any_row = True
        base = fit_power_law(*pts["baseline"])
        ok = identified(base.E, base.E_err) and identified(base.alpha, base.alpha_err)
        cells = []
        for s in ("none", "unified"):
            if len(set(pts[s][0])) < 3:
                cells.append("fewer than 3 rungs")
            elif not ok:
                cells.append("not identified")
            else:
                f = fit_shared_power_law(*pts["baseline"], *pts[s])
                cells.append(f"{f.multiplier:.3f} ± {f.multiplier_err:.3f}")
        e = f"{base.E:.3f} ± {base.E_err:.3f}" + ("" if identified(base.E, base.E_err) else " (not identified)")
        a = f"{base.alpha:.3f} ± {base.alpha_err:.3f}" + ("" if identified(base.alpha, base.alpha_err)
                                                           else " (not identified)")
        lines.append(f"| {corpus} | {rungs} | {e} | {a} | {cells[0]} | {cells[1]} |")
    if not any_row:
        lines.append("| — | fewer than 3 rungs on each corpus | | | | |")
    return lines + [""]


def ladder_figure(rows: list, trends: list, figures: Path) -> str:
    """Δ per rung with its interval against N, both corpora, each trend's band between its rungs, and the paper's
    reported points (the paper's models, far to the right: its numbers, not a prediction of ours)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    figures.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    colours = {"shakespeare": "tab:blue", "kjv": "tab:orange"}
    for ax, strategy in zip(axes, ("none", "unified")):
        for corpus, colour in colours.items():
            pts = [r for r in rows if r.strategy == strategy and r.corpus == corpus and r.delta is not None
                   and r.lo is not None]
            if pts:
                shift = 1.04 if corpus == "kjv" else 1 / 1.04
                ax.errorbar([r.n * shift for r in pts], [r.delta for r in pts],
                            yerr=[[r.delta - r.lo for r in pts], [r.hi - r.delta for r in pts]], fmt="o",
                            color=colour, capsize=3, label=f"{corpus} (95 % CI)")
            t = next((t for t in trends if t.strategy == strategy and t.corpus == corpus), None)
            if t is not None:
                grid = np.geomspace(min(p[0] for p in t.points), max(p[0] for p in t.points), 60)
                band = [t.fit.predict(math.log10(n)) for n in grid]
                ax.plot(grid, [b[0] for b in band], color=colour, lw=1)
                if not math.isnan(band[0][1]):
                    ax.fill_between(grid, [b[1] for b in band], [b[2] for b in band], color=colour, alpha=0.15)
        for s, preset, value in PAPER_POINTS:
            if s == strategy:
                ax.scatter([ladder.non_embedding_params(preset)], [value], marker="*", s=120, color="k",
                           label=f"paper ({preset}, DESIGN §11)", zorder=5)
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("non-embedding parameters N")
        ax.set_title(f"Δ {strategy} − baseline, each at its tuned lr; trend band (95 %)", fontsize=8)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("Δ final validation loss (nats/token)")
    fig.tight_layout()
    fig.savefig(figures / "ladder_deltas.png", dpi=130)
    plt.close(fig)
    return "ladder_deltas.png"


# ---- protocol v3 and the horizon axis (tokens per parameter ≠ 20) ----------------------------------------------

V3_STRATEGIES = ("none", "unified")


def _ci(d) -> str:
    if d is None:
        return "—"
    if math.isnan(d.lo):
        return f"{d.delta:+.4f} (1 seed)"
    return f"{d.delta:+.4f} [{d.lo:+.4f}, {d.hi:+.4f}]"


def _kinds(cell) -> str:
    short = {"AMD EPYC": "AMD", "Intel(R) Xeon(R) Processor": "Intel"}
    parts = []
    for k, v in sorted(cell.kinds.items()):
        cpu, _, cap = k.partition(" / ")
        parts.append(f"{' '.join(filter(None, (short.get(cpu, cpu), cap)))} ×{v}")  # "unknown" has no " / CAP"
    return ", ".join(parts)


def _order(cell) -> tuple:
    corpus = ladder.HORIZON_CORPORA.index(cell.corpus) if cell.corpus in ladder.HORIZON_CORPORA else 99
    return ladder.RUNGS.index(cell.rung) if cell.rung in ladder.RUNGS else 99, corpus, cell.tpp, cell.variant


QUARTER_TRAIN_TOKENS = 1_073_110  # data/corpora/shakespeare-quarter.txt's training tokens (its README)


def _passes(cell) -> float | None:
    """Passes over the cell's training tokens (> 1: data repeat); None for a corpus the ladder does not know."""
    if cell.variant == "-quarter":
        return cell.tokens / QUARTER_TRAIN_TOKENS
    return ladder.passes(cell.tokens, cell.corpus) if cell.corpus in ladder.TRAIN_TOKENS else None


def v3_table(cells: list) -> list[str]:
    """Protocol v3's table: one row per ladder cell (both budgets)."""
    lines = ["| cell | tokens / param (total; non-emb.) | passes | CPU kinds (runs) | held-out seeds none / unified "
             "| Δ none, held-out [95 % CI] | Δ unified, held-out [95 % CI] | Δ on tuning seeds 0-1: none / unified "
             "| pairs across kinds (left out) | hours |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for c in sorted(cells, key=_order):
        arms = [c.arms.get(s) for s in V3_STRATEGIES]
        held = " / ".join(str(len(a.held_seeds)) if a else "—" for a in arms)
        tun = " / ".join(f"{a.tuning.delta:+.4f}" if a and a.tuning else "—" for a in arms)
        cross = "; ".join(f"{a.strategy}: seed{'s' if len(a.cross_kind) > 1 else ''} "
                          + ", ".join(str(k) for k, _, _ in a.cross_kind) for a in arms if a and a.cross_kind) or "0"
        passes = _passes(c)
        p = "—" if passes is None else f"{passes:.2f}"
        lines.append(f"| `{c.name}` | {c.tpp:g}; {c.tokens / c.n:.0f} | {p} | {_kinds(c)} | {held} | "
                     f"{_ci(arms[0].held_out if arms[0] else None)} | {_ci(arms[1].held_out if arms[1] else None)} | "
                     f"{tun} | {cross} | {c.hours:.2f} |")
    return lines


def picks_table(cells: list) -> list[str]:
    """Every pick with its margin over the runner-up and that margin's standard error."""
    lines = ["| cell | sd of a neighbouring-lr difference (dof) | baseline | none | unified |",
             "|---|---:|---|---|---|"]
    for c in sorted(cells, key=_order):
        row = []
        for s in ("baseline", *V3_STRATEGIES):
            p = c.picks.get(s)
            if p is None:
                row.append("—")
                continue
            flag = " **within noise**" if p.within_noise else ""
            edge = " (grid edge)" if p.at_edge else ""
            runner = f"{p.runner_up:.3g}" if p.runner_up is not None else "—"
            row.append(f"{p.lr:.3g}{edge} over {runner} by {p.margin:.4f} ± {p.margin_se:.4f}{flag}")
        lines.append(f"| `{c.name}` | {c.sd:.4f} ({c.sd_dof}) | " + " | ".join(row) + " |")
    return lines


def v3_trend(cells: list) -> list[str]:
    """The held-out Δ's weighted line in log10 N over the rungs of each corpus and budget, each rung with its
    passes; the rungs' N range is the line's, no value beyond it is computed."""
    from scipy import stats as scipy_stats

    from scalevec.experiments.stats import fit_line

    lines = ["| strategy | corpus | tokens / param | rungs (N) | per-rung held-out Δ (passes) | slope per decade of N "
             "[95 % CI] |", "|---|---|---:|---|---|---:|"]
    for s in V3_STRATEGIES:
        for corpus in ladder.HORIZON_CORPORA:
            for tpp in sorted({c.tpp for c in cells}):
                pts = []
                for c in sorted(cells, key=_order):
                    a = c.arms.get(s)
                    if c.corpus != corpus or c.tpp != tpp or c.variant or a is None or a.held_out is None:
                        continue
                    d = a.held_out
                    if d.n >= 2 and d.hi > d.lo:
                        pts.append((c, d.delta, (d.hi - d.lo) / 2 / float(scipy_stats.t.ppf(0.975, d.n - 1))))
                if len({p[0].n for p in pts}) < 2:
                    continue
                f = fit_line([math.log10(p[0].n) for p in pts], [p[1] for p in pts], [p[2] for p in pts])
                lo, hi = f.slope_interval
                interval = " (2 rungs: no interval)" if math.isnan(lo) else f" [{lo:+.4f}, {hi:+.4f}]"
                slope = f"{f.slope:+.4f}" + interval
                per = ", ".join(f"{p[1]:+.4f} ({_passes(p[0]):.2f})" for p in pts)
                rungs = f"{len(pts)} ({si(pts[0][0].n)}–{si(pts[-1][0].n)})"
                lines.append(f"| {s} | {corpus} | {tpp:g} | {rungs} | {per} | {slope} |")
    return lines


def _change(a, b) -> tuple[float, float, float]:
    """Δ ``b`` minus Δ ``a`` (two ``Delta``s from different runs) with a 95 % normal interval: their standard
    errors, each from its t interval, add in quadrature (our approximation)."""
    from scipy import stats as scipy_stats

    def se(d):
        return (d.hi - d.lo) / 2 / float(scipy_stats.t.ppf(0.975, d.n - 1))

    diff = b.delta - a.delta
    half = 1.959963984540054 * math.hypot(se(a), se(b))
    return diff, diff - half, diff + half


def horizon_changes(cells: list) -> list[str]:
    """Δ at a longer horizon minus Δ at 20 on the same rung and corpus (held-out seeds of each; the two cells'
    runs are different runs, so the standard errors add: a normal interval, our approximation)."""
    by = {(c.rung, c.corpus, c.tpp, c.variant): c for c in cells}
    lines = ["| rung | corpus | tokens / param | passes | strategy | Δ held-out at 20 | Δ held-out here "
             "| change [95 % CI] |", "|---|---|---:|---:|---|---:|---:|---:|"]
    n = 0
    for c in sorted(cells, key=_order):
        short = by.get((c.rung, c.corpus, 20.0, ""))
        if c.tpp == 20 or c.variant or short is None:
            continue
        for s in V3_STRATEGIES:
            a, b = short.arms.get(s), c.arms.get(s)
            if not (a and b and a.held_out and b.held_out and a.held_out.n >= 2 and b.held_out.n >= 2):
                continue
            diff, lo, hi = _change(a.held_out, b.held_out)
            lines.append(f"| {c.rung} | {c.corpus} | {c.tpp:g} | {_passes(c):.2f} | {s} | {_ci(a.held_out)} | "
                         f"{_ci(b.held_out)} | {diff:+.4f} [{lo:+.4f}, {hi:+.4f}] |")
            n += 1
    return lines if n else ["No horizon cell has held-out seeds for both strategies yet."]


ONE_PASS = 1.0  # passes over a corpus's training tokens up to which no token is seen twice


def delta_cells(cells: list, strategy: str) -> list:
    """The regression's points for ``strategy``: every cell without a variant whose held-out Δ has an interval
    (≥ 2 held-out pairs on one CPU kind), its standard error from that t interval, with the cell's passes."""
    from reproduction import ndfit
    from scipy import stats as scipy_stats

    out = []
    for c in sorted(cells, key=_order):
        a = c.arms.get(strategy)
        d = a.held_out if a else None
        if c.variant or d is None or d.n < 2 or not d.hi > d.lo or _passes(c) is None:
            continue
        se = (d.hi - d.lo) / 2 / float(scipy_stats.t.ppf(0.975, d.n - 1))
        out.append(ndfit.CellDelta(c.name, c.corpus, c.n, c.tokens, _passes(c), d.delta, se))
    return out


def _slope(sl) -> str:
    return (f"{sl.value:+.4f} [{sl.lo:+.4f}, {sl.hi:+.4f}]{' *' if sl.excludes_zero else ''} "
            f"(leave one out: {sl.loo_lo:+.4f} to {sl.loo_hi:+.4f})")


def nd_section(cells: list) -> list[str]:
    """The (N, D) regression of held-out Δ (``ndfit.fit``) per strategy, over every cell and over the cells under
    one pass, each labelled; N and D ranges of the cells it holds between."""
    from reproduction import ndfit

    lines = ["| strategy | cells | corpora | N (non-emb.) | D (tokens) | Δ per decade of D [95 % CI] "
             "(leave-one-cell-out range) | Δ per decade of N [95 % CI] (leave-one-cell-out range) | "
             "reduced χ² (dof) |", "|---|---|---|---|---|---:|---:|---:|"]
    for s in V3_STRATEGIES:
        pts = delta_cells(cells, s)
        for label, sub in ((f"all ({len(pts)}; passes up to {max((p.passes for p in pts), default=0):.2f})", pts),
                           ("under one pass ({})", [p for p in pts if p.passes <= ONE_PASS])):
            label = label.format(len(sub))
            try:
                f = ndfit.fit(sub)
            except ValueError as e:
                lines.append(f"| {s} | {label} | | | | {e} | | |")
                continue
            n_lo, n_hi = f.n_range
            d_lo, d_hi = f.d_range
            lines.append(f"| {s} | {label} | {', '.join(sorted(f.intercepts))} | {si(n_lo)}–{si(n_hi)} | "
                         f"{si(d_lo)}–{si(d_hi)} | {_slope(f.d_slope)} | {_slope(f.n_slope)} | "
                         f"{f.reduced_chi2:.1f} ({f.dof}) |")
    return lines


def si(n: float) -> str:
    """``9.7K``, ``12M``: a count to two or three significant digits."""
    for unit, div in (("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:g}"


def horizon_figure(cells: list, figures: Path) -> str:
    """Δ (held-out) against D/N at each N, and against N at each D/N, both strategies, with the paper's points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    figures.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharey="row")
    paper = {s: (ladder.non_embedding_params(p), 100 * ladder.total_params(p) / ladder.non_embedding_params(p), v)
             for s, p, v in PAPER_POINTS}
    markers = {"shakespeare": "o-", "kjv": "s--", "prose": "^:"}  # KJV: squares, dashed; prose: triangles, dotted
    for row, s in enumerate(V3_STRATEGIES):
        pts = [(c, c.arms[s].held_out) for c in cells if s in c.arms and c.arms[s].held_out is not None
               and c.arms[s].held_out.n >= 2 and not c.variant]
        rungs = sorted({c.rung for c, _ in pts}, key=ladder.RUNGS.index)
        tpps = sorted({c.tpp for c, _ in pts})
        cmap = plt.get_cmap("viridis")
        for corpus in ladder.HORIZON_CORPORA:
            for i, rung in enumerate(rungs):  # left: against D/N, one line per N
                sel = sorted([(c.tokens / c.n, d) for c, d in pts if c.rung == rung and c.corpus == corpus])
                if sel:
                    colour = cmap(i / max(1, len(rungs) - 1))
                    axes[row, 0].errorbar([x for x, _ in sel], [d.delta for _, d in sel],
                                          yerr=[[d.delta - d.lo for _, d in sel], [d.hi - d.delta for _, d in sel]],
                                          fmt=markers[corpus], color=colour, capsize=3, ms=4,
                                          label=f"{rung} {corpus}")
            for j, tpp in enumerate(tpps):  # right: against N, one line per budget
                sel = sorted([(c.n, d) for c, d in pts if c.tpp == tpp and c.corpus == corpus])
                if sel:
                    colour = plt.get_cmap("tab10")(j)
                    axes[row, 1].errorbar([x for x, _ in sel], [d.delta for _, d in sel],
                                          yerr=[[d.delta - d.lo for _, d in sel], [d.hi - d.delta for _, d in sel]],
                                          fmt=markers[corpus], color=colour, capsize=3, ms=4,
                                          label=f"{tpp:g} tok/param, {corpus}")
        if s in paper:
            n, ratio, v = paper[s]
            axes[row, 0].scatter([ratio], [v], marker="*", s=140, color="k", zorder=5, label="paper (DESIGN §11)")
            axes[row, 1].scatter([n], [v], marker="*", s=140, color="k", zorder=5, label="paper (DESIGN §11)")
        for col in (0, 1):
            ax = axes[row, col]
            ax.axhline(0, color="k", lw=0.8)
            ax.set_xscale("log")
            ax.legend(fontsize=5, ncol=2, framealpha=0.6)
            ax.set_title(f"Δ {s} − baseline, held-out seeds, same CPU kind (95 % CI)", fontsize=8)
        axes[row, 0].set_ylabel("Δ final validation loss (nats/token)")
        axes[row, 0].set_xlabel("tokens per non-embedding parameter D/N")
        # D/N spans under two decades: label round values, not matplotlib's crowded minor ticks (2×10¹, 3×10¹, ...)
        axes[row, 0].set_xticks([20, 50, 100, 200, 500, 1000], ["20", "50", "100", "200", "500", "1000"])
        axes[row, 0].xaxis.set_minor_formatter(NullFormatter())
        axes[row, 1].set_xlabel("non-embedding parameters N")
    fig.tight_layout()
    fig.savefig(figures / "horizon_deltas.png", dpi=130)
    plt.close(fig)
    return "horizon_deltas.png"


def delta_t_lines(cells: list, results: Path, figures: Path | None) -> list[str]:
    """Δ(t) at every evaluation of each horizon cell (held-out same-kind pairs), the WSD cell's with a figure."""
    from reproduction import protocol3

    lines = ["**Δ during training** (Δ(t): each evaluation of the horizon cells, on the same held-out same-kind "
             "pairs as their final Δ; tokens seen so far; the paper says `unified`'s advantage grows through WSD's "
             "stable phase).", ""]
    wsd = next((c for c in cells if c.variant == "-wsd"), None)
    if wsd is None:
        lines += ["The WSD cell (`results/ladder-cpu-25k-shakespeare-tpp100-wsd`) has not been reached yet (its "
                  "study file is queued in `scripts/study.sh horizon`).", ""]
    shown = 0
    for cell in sorted((c for c in cells if c.tpp != 20), key=_order):
        curves = {s: dict(protocol3.delta_curve(results / cell.name, cell, s)) for s in V3_STRATEGIES}
        steps = sorted(set().union(*curves.values()))
        if not steps:
            continue
        shown += 1
        lines += [f"`{cell.name}`:", "", "| tokens | " + " | ".join(f"Δ {s} [95 % CI] (pairs)" for s in V3_STRATEGIES)
                  + " |", "|---:|" + "---:|" * len(V3_STRATEGIES)]
        for t in steps:
            lines.append(f"| {t:,} | " + " | ".join(
                (f"{_ci(curves[s][t])} ({curves[s][t].n})" if t in curves[s] else "—") for s in V3_STRATEGIES) + " |")
        lines.append("")
        if cell is wsd and figures is not None:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            fig, ax = plt.subplots(figsize=(6, 3.6))
            for s in V3_STRATEGIES:
                ts = sorted(curves[s])
                ds = [curves[s][t] for t in ts]
                ax.plot(ts, [d.delta for d in ds], marker="o", ms=3, label=s)
                ax.fill_between(ts, [d.lo for d in ds], [d.hi for d in ds], alpha=0.2)
            ax.axhline(0, color="k", lw=0.8)
            ax.set_xlabel("training tokens")
            ax.set_ylabel("Δ validation loss vs baseline (nats/token)")
            ax.set_title("WSD, cpu-25k Shakespeare, 100 tokens/param: Δ(t), held-out seeds (95 %)", fontsize=8)
            ax.legend(fontsize=7)
            fig.tight_layout()
            figures.mkdir(parents=True, exist_ok=True)
            fig.savefig(figures / "horizon_wsd_delta_t.png", dpi=130)
            plt.close(fig)
            lines += ["![horizon_wsd_delta_t.png](figures/horizon_wsd_delta_t.png)", ""]
    if not shown:
        lines += ["No horizon cell has held-out pairs yet.", ""]
    return lines


def _validation_setting(folder: Path) -> tuple | None:
    """``(corpus file name, rule, val_frac, val_tokens, recorded note)`` of a cell's first run: its config.yaml's
    data section and, where the run recorded it, meta.json's ``validation_split`` note (None without a run)."""
    import yaml

    from scalevec.training import rundir

    run = next((d for d in sorted((folder / "runs").glob("*")) if rundir.is_run(d)), None)
    if run is None:
        return None
    data = yaml.safe_load((run / rundir.CONFIG).read_text())["data"]
    note = (rundir.read_meta(run).get("validation_split") or {}).get("note", "")
    return (Path(str(data["source"])).name, data.get("val_split", "tail"), float(data["val_frac"]),
            int(data["val_tokens"]), note)


def _scored_documents(name: str, rule: str, val_frac: float, val_tokens: int) -> tuple[int, int, int] | None:
    """``(documents the scored tokens reach, validation documents, bytes of the first)`` for a corpus this checkout
    holds (bundled, or committed in data/corpora/), bytes tokenizer: the scored tokens are the first ``val_tokens``
    of the validation documents in order (``sampler``: windows from offset 0); None for a corpus not here."""
    from scalevec.data.documents import BUNDLED, load_documents
    from scalevec.data.split import split_documents

    source = name if name in BUNDLED else ROOT / "data" / "corpora" / name
    if name not in BUNDLED and not Path(source).is_file():
        return None
    _, val, _ = split_documents(load_documents(str(source)), val_frac, rule)
    sizes = [len(d.encode()) for d in val]
    reached, total = 0, 0
    while reached < len(sizes) and total < val_tokens + 1:  # +1: the last target token
        total += sizes[reached] + 1  # one separator between documents
        reached += 1
    return reached, len(sizes), sizes[0]


def validation_lines(cells: list, results: Path) -> list[str]:
    """What each cell's validation loss is measured on: per corpus setting, the cells, the held-out documents
    (meta.json's record where the runs kept one) and how many of them the scored tokens reach."""
    groups: dict[tuple, list[str]] = defaultdict(list)
    for c in sorted(cells, key=_order):
        setting = _validation_setting(results / c.name)
        if setting is not None:
            groups[setting].append(c.name.removeprefix("ladder-"))
    lines = ["#### What the validation loss is measured on", "",
             "Every run scores the first `data.val_tokens` tokens of its corpus's validation documents, in their "
             "order (windows from offset 0), not a sample spread over them; the cells below were all run that way. "
             "Where the first validation document is longer than that, the loss is one document's.", "",
             "| corpus file | split | scored tokens | held-out documents | documents the scored tokens reach | cells |",
             "|---|---|---:|---|---|---|"]
    for (name, rule, frac, tokens, note), names in groups.items():
        reach = _scored_documents(name, rule, frac, tokens)
        held = note.removeprefix("by document: ") if note else "not recorded by these runs (older than the record)"
        if reach is None:
            got = "not computed: the corpus is built, not committed (data/corpora/README.md)"
        else:
            got = f"{reach[0]} of {reach[1]} (the first holds {reach[2]:,} bytes)"
        lines.append(f"| `{name}` | {rule}, val_frac {frac:g} | {tokens:,} | {held} | {got} | {', '.join(names)} |")
    return lines + [""]


def held_out_mean(results: Path, cell, strategy: str) -> tuple[float, int] | None:
    """Mean final validation loss of ``strategy`` at its tuned lr over its held-out seeds in ``cell`` (finished
    runs), with their number; None without a pick or a finished held-out run."""
    from reproduction import protocol3

    p = cell.picks.get(strategy)
    if p is None:
        return None
    losses = [r.loss for r in protocol3.read_runs(results / cell.name)
              if r.strategy == strategy and r.lr == p.lr and r.done and r.seed not in p.seeds]
    return (statistics.fmean(losses), len(losses)) if losses else None


def _span(values: list[float]) -> str:
    lo, hi = f"{min(values):.1f}", f"{max(values):.1f}"
    return lo if lo == hi else f"{lo}–{hi}"


def repetition_lines(quarter, full, results: Path) -> list[str]:
    """The repetition test: what the two cells are, each strategy's held-out Δ in both, their difference with its
    interval (``_change``), and where the difference comes from: each strategy's own loss change (quarter − whole,
    held-out means at its tuned lr) beside the lr each cell picked. The two cells differ in the text (the quarter
    corpus is fewer and other plays, not the same plays repeated) and in their lr picks, so a moved Δ is read as
    the difference of those strategies' changes, not as an effect of repetition alone."""
    parts, moved = [], []
    for s in V3_STRATEGIES:
        a, b = (full.arms[s].held_out if s in full.arms else None), (quarter.arms[s].held_out
                                                                    if s in quarter.arms else None)
        if not (a and b and a.n >= 2 and b.n >= 2):
            parts.append(f"{s}: not both measured yet")
            continue
        diff, lo, hi = _change(a, b)
        parts.append(f"{s} {_ci(b)} ({_passes(quarter):.2f} passes) vs {_ci(a)} ({_passes(full):.2f}), "
                     f"difference {diff:+.4f} [{lo:+.4f}, {hi:+.4f}]")
        if lo > 0 or hi < 0:
            moved.append(s)
    changes, lrs = {}, []
    for s in ("baseline", *V3_STRATEGIES):
        q, f = held_out_mean(results, quarter, s), held_out_mean(results, full, s)
        if q and f:
            changes[s] = q[0] - f[0]
        if s in quarter.picks and s in full.picks:
            lrs.append(f"{s} {quarter.picks[s].lr:.3g} / {full.picks[s].lr:.3g}")
    ratio = ladder.TRAIN_TOKENS["shakespeare"] / QUARTER_TRAIN_TOKENS
    what = (f"cpu-10k Shakespeare at 100 tokens per parameter on `shakespeare-quarter.txt` "
            f"(the bundled Shakespeare's first 8 plays, {QUARTER_TRAIN_TOKENS:,} training tokens, 1/{ratio:.1f} of "
            "the whole corpus's: fewer and less varied plays, not the same text repeated; the same 4 validation "
            "plays) against the whole corpus at the same N and D, each cell with its own lr picks (quarter / "
            f"whole: {'; '.join(lrs)}); held-out Δ: " + "; ".join(parts) + ".")
    if "baseline" in changes and len(changes) > 1:
        arms = [s for s in V3_STRATEGIES if s in changes]
        change_text = ", ".join(f"{s} {changes[s]:+.4f}" for s in ("baseline", *arms))
        worse = [s for s in arms if changes["baseline"] > changes[s]]
        lr_ratio = [quarter.picks["baseline"].lr / quarter.picks[s].lr for s in worse if s in quarter.picks]
        why = (f" Each strategy's own held-out loss, quarter − whole: {change_text} (nats/token): every strategy "
               "is worse on the smaller corpus, and Δ moves because the baseline"
               + (f", at {_span(lr_ratio)}× the lr of {' and '.join(worse)} in the quarter cell," if lr_ratio else "")
               + f" degrades more than {' and '.join(worse)}." if worse else
               f" Each strategy's own held-out loss, quarter − whole: {change_text} (nats/token).")
    else:
        why = ""
    verdict = (f" The difference excludes 0 for {' and '.join(moved)}: a cell with more than one pass is shown with "
               "its passes and not read as an effect of the budget alone; what moves is the baseline at its own "
               "lr on another text as much as repetition." if moved else
               " Within noise for every strategy at this cell.")
    return ["#### The repetition test", "", what + why + verdict, ""]


def v3_section(results: Path, figures: Path | None) -> list[str]:
    """Protocol v3 (``reproduction.protocol3``) on every ladder cell, the horizon axis, the (N, D) fit and the
    figure."""
    from reproduction import protocol3

    cells = protocol3.read_ladder_cells(results)
    lines = ["### Protocol v3: every ladder cell, both budgets", ""]
    shown, hidden = {c.name for c in cells}, []
    for f in sorted(results.glob("ladder-*")):  # a cell that read_ladder_cells drops is named, not silently absent
        if f.is_dir() and f.name not in shown and protocol3.parse_name(f.name) is not None:
            why = "no runs yet" if not protocol3.read_runs(f) else "no baseline lr pick yet"
            hidden.append(f"`{f.name}` ({why})")
    hidden = ["Not in the table: " + ", ".join(hidden) + ".", ""] if hidden else []
    if not cells:
        return lines + ["No ladder cell has reported yet.", ""] + hidden
    lines += ["Δ = strategy − baseline, each at its own tuned lr, paired by seed, 95 % t interval, **on held-out "
              "seeds only** (seeds on which neither arm's lr was picked: seeds ≥ 2), and only over pairs whose two "
              "runs ran on the same CPU kind (`meta.json`'s `cpu` + `cpu_capability`); Δ on the tuning seeds 0-1 "
              "is shown beside it (a point: 2 seeds), never pooled with it. tokens / param: the budget per total "
              "parameter (as the ladder's 20) and what it is per non-embedding parameter; passes: over the corpus's "
              "training tokens (> 1: data repeat); hours: the runs' wall clock added up (single-thread hours). "
              "`-tppD`: the horizon cells (`sweeps/study-ladder-RUNG-CORPUS-tppD.yaml`); `-quarter`: the "
              "repetition test (a quarter of the training plays, the same validation tokens); `-wsd`: the WSD cell; "
              "corpus `prose`: `data/corpora/gutenberg-sotu.txt` (public-domain books and the State of the Union "
              "addresses, 16.9M training tokens: under one pass in every cell; `data/corpora/README.md`). "
              "A cell still training shows what has finished.", ""]
    lines += v3_table(cells) + [""] + hidden
    lines += validation_lines(cells, results)
    lines += ["**The picks.** Each strategy's lr is the lowest mean over its tuning seeds; shown with the runner-up "
              "on the same curve and the margin between them. The margin's standard error is the seed-to-seed sd of "
              "the difference between two neighbouring lrs of one strategy, pooled over every neighbouring pair of "
              "the cell (two seeds estimate one degree of freedom each), over √(tuning seeds); *within noise*: a "
              "margin below 2 standard errors (our rule): the pick could as well have been the runner-up.", ""]
    lines += picks_table(cells) + [""]
    noisy = sum(p.within_noise for c in cells for p in c.picks.values())
    total = sum(len(c.picks) for c in cells)
    lines += [f"{noisy} of {total} picks are within noise of their runner-up by this rule.", ""]
    lines += ["#### Trend of the held-out Δ with N", "",
              "At each budget and corpus (the weighted line of `stats.fit_line` on the held-out Δs, inside the "
              "rungs measured: no value beyond them is computed). Each rung's Δ is given with its passes over the "
              "corpus's training tokens in parentheses: a rung past 1 pass trains on repeated data, so a line "
              "through it mixes repetition into N.", ""]
    lines += v3_trend(cells) + [""]
    lines += ["**What the budget changes**: Δ at the longer horizon minus Δ at 20 tokens per parameter on the same "
              "rung and corpus (held-out seeds of each; different runs, so the two standard errors add in "
              "quadrature: a normal interval, our approximation; the two cells may have run on different CPU kinds, "
              "see the table above).", ""]
    lines += horizon_changes(cells) + [""]
    quarter = next((c for c in cells if c.variant == "-quarter"), None)
    full = next((c for c in cells if c.rung == "cpu-10k" and c.corpus == "shakespeare" and c.tpp == 100
                 and not c.variant), None)
    if quarter is None:
        lines += ["#### The repetition test", "", "(`-quarter`): not reached yet.", ""]
    elif full is not None:
        lines += repetition_lines(quarter, full, results)
    lines += delta_t_lines(cells, results, figures)
    lines += ["#### Δ against N and D, every cell at once", "", "A weighted regression of each cell's held-out Δ on "
              "log10 N and log10 D with one intercept per corpus (`ndfit.fit`; weights 1/se², se from each cell's "
              "t interval), over the cells without a variant that have an interval; its covariance is scaled by the "
              "reduced χ² (the lack of fit: the cells scatter about the plane by that many times their seed noise), "
              "95 % t intervals, `*` where one excludes 0, and the range of each slope over the fits that leave one "
              "cell out. Negative: the strategy's Δ falls (its deficit shrinks) per decade. Once over every cell "
              "(labelled with the most passes among them: repeated data included), once over the cells under one "
              "pass only. The slopes hold inside the N and D listed; no value outside them is computed. It replaces "
              "the fit L = E + A·N^(−α) + B·D^(−β) and its compute multipliers at 0.12B, whose E sat at its bound "
              "in every fit and whose multipliers moved by factors of 10 or more when one cell was left out.", ""]
    lines += nd_section(cells) + [""]
    lines += ["**Per-seed values of the horizon cells** (final validation loss at each strategy's tuned lr; "
              "tuning seeds in parentheses):", "", "| cell | strategy | tuned lr | per-seed loss (seed: loss) |",
              "|---|---|---:|---|"]
    for c in sorted((c for c in cells if c.tpp != 20 or c.variant), key=_order):
        runs = protocol3.read_runs(results / c.name)
        for s, p in c.picks.items():
            vals = sorted((r.seed, r.loss) for r in runs if r.strategy == s and r.lr == p.lr and r.done)
            text = ", ".join((f"({k}: {v:.4f})" if k in p.seeds else f"{k}: {v:.4f}") for k, v in vals)
            lines.append(f"| `{c.name}` | {s} | {p.lr:.3g}{' (grid edge)' if p.at_edge else ''} | {text} |")
    lines.append("")
    if figures is not None:
        name = horizon_figure(cells, figures)
        lines += [f"![{name}](figures/{name})", ""]
    return lines


def generate(results: Path, figures: Path | None = None) -> str:
    """The generated section; ``ValueError`` (``frames.read_runs_csv``) for a torn or doubled runs.csv, raised
    before any figure is written."""
    folders = [f for f in sorted(results.iterdir()) if (f / "runs.csv").is_file()]
    for f in folders:  # every runs.csv checked first: a torn one found midway would leave half the figures new
        read_cell(f)
    ladder_lines = v3_section(results, figures) + controls.section(results) + ladder_section(results, figures)
    # the first protocol's cells below: not the ladder's, nor the ladder's lr-matched controls
    folders = [f for f in folders if not f.name.startswith(("ladder-", controls.PREFIX))]
    cells = {folder.name: analyse(read_cell(folder), str(folder / "runs.csv")) for folder in folders}
    rows = comparisons(cells)
    fits = scaling(cells)
    lines = ladder_lines + ["### Verdicts of the first protocol (init_std 0.02 at every width, warmup 50)", ""]
    lines += claim_rows(rows) + [""]
    hours = training_seconds(folders) / 3600
    lines.append(f"Machine time of these cells: {hours:.2f} h of training wall clock (one run at a time, one "
                 f"thread each; the rest of the machine was shared with other work).")
    lines.append("")
    lines += scaling_lines(fits)
    if figures is not None:
        for name in plot(rows, fits, figures):
            lines += [f"![{name}](figures/{name})", ""]
    lines.append("### Cells")
    lines.append("")
    for name, a in cells.items():
        lines += cell_section(name, a)
    return "\n".join(lines).rstrip() + "\n"


def _refusal(results: Path, write: str | None) -> str | None:
    """Why the command cannot run, as one line (None when it can): checked before anything is generated, so that a
    mistyped path never replaces the doc's section (or its figures) with an empty one."""
    if not results.is_dir():
        return f"--results {results} is not a folder; pass the repository's results/"
    if not any((f / "runs.csv").is_file() or f.name.startswith("ladder-") for f in results.iterdir() if f.is_dir()):
        return (f"--results {results} holds no study cell (no */runs.csv, no ladder-* folder); pass the "
                f"repository's results/")
    if write is None:
        return None
    try:
        doc = Path(write).read_text()
    except (OSError, UnicodeDecodeError) as e:
        return f"--write {write} cannot be read ({getattr(e, 'strerror', None) or e}); name the existing markdown file"
    if doc.count(BEGIN) != 1 or doc.count(END) != 1 or doc.index(BEGIN) > doc.index(END):
        return f"--write {write} needs one {BEGIN} line followed by one {END} line"
    return None


def main() -> int:
    """Print or write the generated section; 0 on success, 2 (one line on stderr, nothing written) on a refusal."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=str(ROOT / "results"))
    p.add_argument("--write", help="a markdown file whose text between the markers is replaced; its figures "
                                   "go into figures/ next to it")
    args = p.parse_args()
    results = Path(args.results)
    bad = _refusal(results, args.write)
    if bad:
        print(f"reproduction.py: error: {bad}", file=sys.stderr)
        return 2
    try:
        if not args.write:
            print(generate(results))
            return 0
        doc = Path(args.write).read_text()
        text = generate(results, figures=Path(args.write).parent / "figures")
    except ValueError as e:  # a torn or doubled runs.csv, an unreadable finished run: one line, nothing written
        print(f"reproduction.py: error: {e}", file=sys.stderr)
        return 2
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    write_atomic(args.write, f"{head}{BEGIN}\n{text}{END}{tail}")  # whole or not at all
    print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
