"""The report's tables as text: per-cell comparison, scaling fits, overhead, and their legends (DESIGN.md §9).

Rows of strings from an ``Analysis``; ``text_table`` aligns them for a terminal (``compare``,
``report --print``), ``md_table`` writes them for ``report.md``.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from scalevec.experiments import stats
from scalevec.experiments.analysis import Analysis, Cell, ScalingResult, StrategyResult
from scalevec.experiments.labels import SHORT, si


def _num(v: float, fmt: str = ".4f") -> str:
    return "—" if v is None or not math.isfinite(v) else format(v, fmt)


def format_delta(d: stats.PairedDelta | None) -> str:
    """``+0.0123 [+0.0050, +0.0196] *`` (``*`` when the 95 % CI excludes 0); ``—`` for the baseline."""
    if d is None:
        return "—"
    if d.n < 2:
        return f"{d.delta:+.4f} (1 seed, no CI)"
    return f"{d.delta:+.4f} [{d.lo:+.4f}, {d.hi:+.4f}]{' *' if d.significant else ''}"


def cell_rows(cell: Cell) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-cell comparison table (terminal and markdown)."""
    header = ["strategy"]
    if cell.tune_key:
        header.append(f"best {SHORT.get(cell.tune_key, cell.tune_key)}")
    header += ["seeds", "val loss (mean ± std)", "Δ vs baseline [95 % CI]", "bits/byte", "token eff.", "params",
               "extra params", "step time"]
    rows = []
    for i, r in enumerate(cell.results):
        row = [r.strategy]
        if cell.tune_key:
            row.append(f"{r.pick.lr:g}{' †' if r.pick.at_edge else ''}" if r.pick else "—")
        row += [str(len(r.runs)), f"{r.loss_mean:.4f} ± {_num(r.loss_std)}", format_delta(r.delta),
                _num(r.bpb_mean), "—" if i == 0 else _token_eff(r),
                f"{r.params:,}", f"{r.extra_params:+,}", step_time_text(r, i == 0)]
        rows.append(row)
    return header, rows


STEP_NOISE = 0.05  # step-time ratios within 5 % of 1 are noise between runs of one machine (docs/performance.md)
LOAD_MARK = "‡"


def load_made_implausible(r: StrategyResult, is_baseline: bool = False) -> bool:
    """Whether ``r``'s step-time ratio contradicts the work its strategy does: more parameters than the baseline
    (scale vectors on the same matrices: never less work per step) and yet faster by more than ``STEP_NOISE``.
    Such a ratio measured the machine's load, which changed between the runs (the main job once printed
    ``unified 0.56×`` after its last runs ran alone), not the model."""
    return (not is_baseline and math.isfinite(r.step_time_ratio) and r.extra_params > 0
            and r.step_time_ratio < 1 - STEP_NOISE)


LOAD_SHARE_TOL = 0.2  # CPU shares (analysis.cpu_share) of one code on one machine differ by less when it is as free


def measured_under_other_load(r: StrategyResult, is_baseline: bool = False) -> bool:
    """Whether ``r``'s runs and the baseline's ran under different loads: their CPU seconds per wall second
    (``analysis.cpu_share``) differ by more than ``LOAD_SHARE_TOL`` (`none` once showed 1.51× the baseline
    from load alone, which ``load_made_implausible`` cannot see in a slower ratio)."""
    change = getattr(r, "cpu_share_change", math.nan)
    return not is_baseline and math.isfinite(change) and abs(change) > LOAD_SHARE_TOL


def step_time_text(r: StrategyResult, is_baseline: bool = False) -> str:
    """The step-time cell: ``1.03×``, ``0.92× ‡`` when the ratio measured the machine's load
    (``load_made_implausible``, ``measured_under_other_load``), ``—`` when not measured."""
    if not math.isfinite(r.step_time_ratio):
        return "—"
    loaded = load_made_implausible(r, is_baseline) or measured_under_other_load(r, is_baseline)
    return f"{r.step_time_ratio:.2f}×" + (f" {LOAD_MARK}" if loaded else "")


def _token_eff(r: StrategyResult) -> str:
    if not math.isfinite(r.token_efficiency):
        return "not reached"
    return f"{'≥ ' if r.token_efficiency_is_bound else ''}{r.token_efficiency:.2f}×"


def text_table(header: list[str], rows: list[list[str]]) -> str:
    """Aligned plain-text table (first column left, the rest right-aligned)."""
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]

    def line(cells):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """GitHub-flavoured markdown table."""
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])


LEGEND = ("Final validation loss in nats/token on the same validation tokens for every run, mean ± std over "
          "seeds. Δ = strategy − baseline, paired by seed (same seed ⇒ same data order and initial matrices), "
          "with a two-sided 95 % t interval; `*` marks an interval that excludes 0 (our significance rule). "
          "Token eff. = tokens the baseline needs to reach its final loss ÷ tokens the strategy needs "
          "(seed-averaged validation curves, interpolated; > 1 is better; ≥ when reached by the first evaluation, "
          "'not reached' when never). Step time is the process CPU time per optimizer step relative to the "
          "baseline, or the wall clock when a run of the cell did not log CPU time (results.csv: step_time_clock); "
          "a busy machine still inflates it through shared caches, so compare with care. ‡ marks a step time more "
          f"than {STEP_NOISE:.0%} below the baseline's for a strategy with more parameters (more work per step), "
          f"and a ratio from runs whose CPU seconds per wall second differ from the baseline's by more than "
          f"{LOAD_SHARE_TOL:.0%}: the machine's load changed between the runs, so that ratio measures the load, "
          "not the strategy (measure the overhead with `scalevec bench`). † marks a tuned value at the edge of its "
          "grid.")


SCALING_LEGEND = (
    "Fit of `L(N) = E + A·N^(-α)` to every run's final loss against non-embedding parameters N (scipy "
    "`curve_fit`, ± one sigma). Compute multiplier = (N the baseline needs for the same loss ÷ N)², i.e. the "
    "compute ratio at a fixed number of tokens per parameter (C ∝ N²); > 1 means the strategy is better. "
    "*Shared fit*: one curve for both with the strategy acting as m× the parameters (multiplier m², assumed "
    "constant over the measured sizes, which the column names; no statement beyond them); *at size*: the "
    "strategy's measured mean loss there against the baseline's fit, read only within the measured sizes: where "
    "the baseline would need a size beyond them, the bound the data support, `> (N_max/N)²` or `< (N_min/N)²`. "
    "No multiplier is given at a size that was not measured.")


def scaling_rows(s: ScalingResult, baseline: str) -> tuple[list[str], list[list[str]]]:
    """The fit table of one size group: per strategy E, A, α, the shared-fit multiplier over the measured range,
    and the multiplier at each measured size (a bound where the baseline's fit would be read beyond it)."""
    header = ["strategy", "E", "A", "α", "points", f"compute × (shared fit, {si(s.n_min)}–{si(s.n_max)})",
              *[f"compute × at {lbl}" for lbl, _ in s.sizes]]
    rows = []
    for strategy, fit in s.fits.items():
        sh = s.shared.get(strategy)
        shared = ("—" if strategy == baseline or sh is None
                  else f"{sh.multiplier:.3f} ± {_num(sh.multiplier_err, '.3f')}")
        rows.append([strategy, f"{fit.E:.3f} ± {_num(fit.E_err, '.3f')}", f"{fit.A:.3g} ± {_num(fit.A_err, '.2g')}",
                     f"{fit.alpha:.3f} ± {_num(fit.alpha_err, '.3f')}", str(fit.n_points), shared,
                     *(["—"] * len(s.sizes) if strategy == baseline else
                       [f"{side} {_num(m, '.3f')}".strip() if math.isfinite(m) else "—"
                        for m, side in zip(s.per_size.get(strategy, [math.nan] * len(s.sizes)),
                                           s.per_size_side.get(strategy, [""] * len(s.sizes)))])])
    return header, rows


def overhead_rows(a: Analysis) -> tuple[list[str], list[list[str]]]:
    """Per size and strategy: parameters, extra parameters, and the step-time ratio (geometric mean over cells)."""
    header = ["size", "strategy", "params", "scale params", "extra params", "extra share", "step time"]
    by_size: dict[str, list[Cell]] = defaultdict(list)
    for c in a.cells:  # cells are sorted by size
        by_size[c.size].append(c)
    rows = []
    for size, cells in by_size.items():
        ratios: dict[str, list[float]] = defaultdict(list)
        for c in cells:
            for r in c.results:
                ratios[r.strategy].append(r.step_time_ratio)
        for r in cells[0].results:
            measured = [x for x in ratios[r.strategy] if math.isfinite(x)]  # implausible ones are nan (analysis)
            geo = float(np.exp(np.mean(np.log(measured)))) if measured else math.nan
            rows.append([size, r.strategy, f"{r.params:,}", f"{r.scale_params:,}", f"{r.extra_params:+,}",
                         f"{r.extra_params / cells[0].results[0].params:+.3%}",
                         f"{geo:.3f}×" if math.isfinite(geo) else "—"])
    return header, rows


__all__ = ["LEGEND", "LOAD_MARK", "LOAD_SHARE_TOL", "SCALING_LEGEND", "STEP_NOISE", "cell_rows", "format_delta",
           "load_made_implausible", "md_table", "measured_under_other_load", "overhead_rows", "scaling_rows",
           "step_time_text", "text_table"]
