"""The lr-matched controls of the ladder cells: is a cell's Δ the scale vectors, or the lr they were tuned to?

Protocol v3 (``protocol3``) reads Δ = strategy − baseline with each strategy at **its own** tuned lr. When the
picks differ, Δ mixes the strategy with the lr. A control folder ``results/control-CELL`` (``CELL`` the ladder
folder's name without ``ladder-``; written by ``scalevec sweep sweeps/control-CELL.yaml``, the cell's own config
except the lr) holds `none` and `unified` at the **baseline's** picked lr on the cell's held-out seeds, the baseline
rerun where the cell's held-out runs ran on another CPU kind, and in a ``-wsd`` cell every strategy at both picks.
This module trains nothing; from the cell's and the control's runs it gives, per arm:

- Δ at the tuned lrs (protocol v3's, unchanged) beside Δ at the baseline's lr, both on the cell's held-out seeds
  (seeds >= 2 that tuned neither arm), each pair's two runs on one CPU kind (``protocol3.same_kind``);
- a re-pick bootstrap (``repick_bootstrap``): tuning seeds resampled, each strategy's lr re-picked on them, and the
  held-out Δ at the re-picked lrs recomputed where held-out runs exist at both; the interval then carries the
  lr pick's uncertainty, and the share of draws whose re-picked lrs have no held-out runs is reported;
- in the WSD cell, Δ(t) of each arm against the baseline **at the same lr** (``equal_lr_curves``) and its mean over
  the evaluations of the stable phase (``stable_phase``: the lr at its peak, ``schedule.lr_multiplier``).

Our rules: a run in both folders on one kind (the 10K cells' baselines are rerun as a check that the control's
config is the cell's) counts once, the cell's; two lrs closer than 0.1 % are one grid value (the ladder writes lrs
to 6 digits, its grid steps ×√2).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path

from reproduction import protocol3
from reproduction.protocol3 import Run
from scalevec.experiments.stats import PairedDelta, paired_delta, pick_lr
from scalevec.training import rundir
from scalevec.training.schedule import lr_multiplier

ARMS = ("none", "unified")
SAME_LR = 1e-3  # relative: two lrs of a cell closer than this are one grid value written to 6 digits
DRAWS = 2000  # re-pick bootstrap draws: the 2.5/97.5 % quantiles move by < 0.001 nats between seeds of the rng
PREFIX = "control-"


def same_lr(a: float, b: float) -> bool:
    """Whether two lrs are one grid value (within ``SAME_LR``, relative)."""
    return abs(a - b) <= SAME_LR * max(abs(a), abs(b))


def control_folder(results: Path, cell: str) -> Path:
    """``results/control-CELL`` of the ladder folder ``cell`` (``ladder-cpu-25k-kjv`` -> ``control-cpu-25k-kjv``)."""
    return Path(results) / (PREFIX + cell.removeprefix("ladder-"))


def merged_runs(cell: Path, control: Path) -> tuple[list[Run], list[tuple[Run, Run]]]:
    """The cell's runs and the control's (``protocol3.read_runs`` of each), a control run that repeats a finished
    cell run (same strategy, lr, seed and CPU kind) left out; and those repeats as ``(cell run, control run)``:
    on one CPU kind a run is bitwise reproducible, so their losses must be equal (``reproduced``)."""
    runs = protocol3.read_runs(cell)
    extra = protocol3.read_runs(control) if Path(control).is_dir() else []
    repeats, out = [], list(runs)
    for r in extra:
        twin = next((c for c in runs if c.done and c.strategy == r.strategy and c.seed == r.seed
                     and same_lr(c.lr, r.lr) and protocol3.same_kind(c.kind, r.kind)), None)
        if twin is None:
            out.append(r)
        elif r.done:
            repeats.append((twin, r))
    return out, repeats


@dataclass(frozen=True)
class Pair:
    """One held-out seed's two runs on one CPU kind: ``delta`` = arm − baseline (nats/token)."""

    seed: int
    kind: str
    base: Run
    arm: Run

    @property
    def delta(self) -> float:
        return self.arm.loss - self.base.loss


def pairs_at(runs: list[Run], base_lr: float, arm: str, arm_lr: float, seeds) -> list[Pair]:
    """The pairs (baseline at ``base_lr``, ``arm`` at ``arm_lr``) over ``seeds``, each on one known CPU kind (the
    first kind in sorted order where a seed has both runs finished); a seed without such a pair is left out."""
    out = []
    for k in sorted(seeds):
        b = {r.kind: r for r in runs if r.strategy == "baseline" and r.seed == k and r.done and same_lr(r.lr, base_lr)}
        a = {r.kind: r for r in runs if r.strategy == arm and r.seed == k and r.done and same_lr(r.lr, arm_lr)}
        kinds = sorted(x for x in b.keys() & a.keys() if protocol3.same_kind(x, x))
        if kinds:
            out.append(Pair(k, kinds[0], b[kinds[0]], a[kinds[0]]))
    return out


def delta_of(pairs: list[Pair]) -> PairedDelta | None:
    """Δ over ``pairs`` with its 95 % t interval (``stats.paired_delta``); None without a pair."""
    if not pairs:
        return None
    return paired_delta([p.base.loss for p in pairs], [p.arm.loss for p in pairs])


def held_out_seeds(runs: list[Run], picks: dict[str, protocol3.Pick], arm: str) -> list[int]:
    """The seeds of ``runs`` that tuned neither the baseline nor ``arm`` (protocol v3's held-out seeds)."""
    tuning = set(picks["baseline"].seeds) | set(picks[arm].seeds)
    return sorted({r.seed for r in runs if r.strategy in ("baseline", arm)} - tuning)


def tuning_curve(runs: list[Run], strategy: str, seeds) -> dict[float, dict[int, float]]:
    """``{lr: {seed: final loss}}`` of ``strategy``'s finished or diverged runs on ``seeds`` (diverged: ``inf``)."""
    out: dict[float, dict[int, float]] = {}
    for r in runs:
        if r.strategy == strategy and r.seed in seeds and r.status != "unfinished":
            out.setdefault(r.lr, {})[r.seed] = r.loss
    return out


def repick(curve: dict[float, dict[int, float]], sample: list[int]) -> float | None:
    """The lr ``stats.pick_lr`` picks from ``curve`` on the resampled tuning seeds ``sample`` (a seed drawn twice
    counts twice), over the lrs that have every seed of it; None when none has, or every one diverged."""
    full = {lr: [v[k] for k in sample] for lr, v in curve.items() if set(sample) <= set(v)}
    if not full:
        return None
    try:
        return pick_lr(full).lr
    except ValueError:  # every lr diverged on this resample
        return None


@dataclass(frozen=True)
class Repick:
    """The re-pick bootstrap of one arm: ``lo``/``hi`` the 2.5/97.5 % quantiles of the held-out Δ over the draws
    whose re-picked lrs both have held-out runs (``covered`` of ``draws``; nan when none), ``moved`` the share of
    draws in which either pick moved, ``moved_covered`` the covered draws among those (0: the interval is a
    bootstrap of the held-out pairs at the picks alone, blind to how far a moved pick moves Δ), ``picks`` =
    ``{(baseline lr, arm lr): draws}``."""

    lo: float
    hi: float
    covered: int
    draws: int
    moved: float
    picks: dict
    moved_covered: int = 0


def repick_bootstrap(runs: list[Run], picks: dict[str, protocol3.Pick], arm: str, draws: int = DRAWS,
                     seed: int = 0, at_base: bool = False) -> Repick:
    """Each draw resamples the tuning seeds (with replacement, one resample for both strategies: they share their
    tuning seeds), re-picks the baseline's and ``arm``'s lr on it (``at_base``: the arm at the baseline's re-picked
    lr, the control's comparison), and resamples the held-out pairs at the re-picked lrs (``pairs_at``); the Δ of a
    draw whose re-picked lrs have no held-out pair is not computable (the held-out seeds were run at the picked lrs
    and, in a control, the baseline's) and is counted out of ``covered``."""
    rng = random.Random(seed)
    tuning = sorted(set(picks["baseline"].seeds) | set(picks[arm].seeds))
    held = held_out_seeds(runs, picks, arm)
    curves = {s: tuning_curve(runs, s, set(tuning)) for s in ("baseline", arm)}
    cache: dict[tuple[float, float], list[float]] = {}
    values, tally, moved, moved_covered = [], {}, 0, 0
    for _ in range(draws):
        sample = [rng.choice(tuning) for _ in tuning]
        lb = repick(curves["baseline"], sample)
        la = lb if at_base else repick(curves[arm], sample)
        if lb is None or la is None:
            continue
        tally[(lb, la)] = tally.get((lb, la), 0) + 1
        moves = not (same_lr(lb, picks["baseline"].lr) and same_lr(la, picks["baseline" if at_base else arm].lr))
        moved += moves
        if (lb, la) not in cache:
            cache[(lb, la)] = [p.delta for p in pairs_at(runs, lb, arm, la, held)]
        d = cache[(lb, la)]
        if d:
            values.append(sum(rng.choice(d) for _ in d) / len(d))
            moved_covered += moves
    values.sort()
    if values:
        lo, hi = values[int(0.025 * (len(values) - 1))], values[int(math.ceil(0.975 * (len(values) - 1)))]
    else:
        lo = hi = math.nan
    return Repick(lo, hi, len(values), draws, moved / draws if draws else math.nan, tally, moved_covered)


@dataclass(frozen=True)
class ArmControl:
    """One arm of a cell: ``tuned`` = protocol v3's held-out Δ at the tuned lrs, ``at_base`` Δ with the arm at
    the baseline's lr over ``pairs`` (``same_pick``: the arm's own pick is the baseline's lr, so the two Δs are
    one), ``repick`` / ``repick_base`` the re-pick bootstrap of each (``repick_bootstrap``: ``repick`` on the cell's
    runs, the pairs ``tuned`` is read on; ``repick_base`` on the cell's and the control's, with the arm at the
    baseline's re-picked lr)."""

    strategy: str
    tuned_lr: float
    base_lr: float
    tuned: PairedDelta | None
    tuned_pairs: tuple[Pair, ...]
    at_base: PairedDelta | None
    pairs: tuple[Pair, ...]
    same_pick: bool
    repick: Repick | None
    repick_base: Repick | None


@dataclass
class CellControl:
    """A ladder cell with its control folder: ``cell`` (``protocol3.CellV3``), ``arms``, ``repeats`` (control runs
    that repeat a cell run on its kind: ``(cell run, control run)``), ``runs`` (the control folder's finished
    runs) and ``hours`` (their wall clock added up)."""

    name: str
    cell: protocol3.CellV3
    arms: dict[str, ArmControl] = field(default_factory=dict)
    repeats: list = field(default_factory=list)
    runs: int = 0
    hours: float = 0.0

    @property
    def reproduced(self) -> tuple[int, int]:
        """``(bitwise equal, compared)`` over ``repeats``."""
        return sum(a.loss == b.loss for a, b in self.repeats), len(self.repeats)


def read_control(results: Path, cell_name: str, draws: int = DRAWS) -> CellControl | None:
    """The controls of ladder cell ``results/cell_name`` (None when the cell has no baseline pick or no control
    folder). Picks are the cell's (``protocol3.read_cell``): the control's runs are never tuning runs."""
    folder = Path(results) / cell_name
    control = control_folder(results, cell_name)
    cell = protocol3.read_cell(folder)
    if cell is None or not control.is_dir():
        return None
    runs, repeats = merged_runs(folder, control)
    cell_runs = protocol3.read_runs(folder)  # Δ at the tuned lrs: the cell's own pairs, as protocol v3 reads it
    own = [r for r in protocol3.read_runs(control) if r.done]
    out = CellControl(cell_name, cell, repeats=repeats, runs=len(own), hours=sum(r.wall_s for r in own) / 3600)
    base = cell.picks["baseline"]
    for s in ARMS:
        if s not in cell.picks:
            continue
        seeds = held_out_seeds(runs, cell.picks, s)
        tuned = pairs_at(cell_runs, base.lr, s, cell.picks[s].lr, seeds)
        at_base = pairs_at(runs, base.lr, s, base.lr, seeds)
        out.arms[s] = ArmControl(s, cell.picks[s].lr, base.lr, delta_of(tuned), tuple(tuned), delta_of(at_base),
                                 tuple(at_base), same_lr(cell.picks[s].lr, base.lr),
                                 # the cell's runs, as ``tuned``: a control holding an arm at its own pick on
                                 # another kind (the WSD cell's) would otherwise swap in that kind's pairs
                                 repick_bootstrap(cell_runs, cell.picks, s, draws) if draws else None,
                                 repick_bootstrap(runs, cell.picks, s, draws, at_base=True) if draws else None)
    return out


def _evals_of(results: Path, cell_name: str, run: Run) -> dict[int, float]:
    """``run``'s evaluations (``protocol3.run_evals``) from the cell's folder or its control's, whichever holds its
    own summary."""
    return protocol3.run_evals([Path(results) / cell_name, control_folder(results, cell_name)], run)


def curve(results: Path, cell_name: str, pairs: list[Pair]) -> list[tuple[int, PairedDelta]]:
    """Δ(t) over ``pairs`` at every evaluation (tokens) that all of their runs have."""
    if not pairs:
        return []
    ea = [_evals_of(results, cell_name, p.base) for p in pairs]
    eb = [_evals_of(results, cell_name, p.arm) for p in pairs]
    steps = sorted(set.intersection(*(set(a) & set(b) for a, b in zip(ea, eb))))
    return [(t, paired_delta([a[t] for a in ea], [b[t] for b in eb])) for t in steps]


def stable_steps(schedule, total: int, steps) -> set[int]:
    """The evaluation ``steps`` (optimizer steps done, 1-based) of a run of ``total`` steps under ``schedule``
    (``config.ScheduleConfig``) taken in its stable phase: after the warmup, with ``schedule.lr_multiplier`` = 1 at
    the step just before (the peak lr throughout the steps the evaluation follows, once past the warmup)."""
    warmup = schedule.warmup_steps(total)
    return {k for k in steps if warmup < k <= total and lr_multiplier(k - 1, total, schedule) == 1.0}


def stable_tokens(results: Path, cell_name: str, run: Run) -> set[int]:
    """The evaluations (tokens) of ``run`` taken in its schedule's stable phase (``stable_steps``), from its
    ``config.yaml`` and ``summary.json`` (in the cell's folder or its control's)."""
    found = protocol3.run_summary([Path(results) / cell_name, control_folder(results, cell_name)], run)
    if found is None:
        raise ValueError(f"run {run.name} has no summary.json in {results / cell_name} or its control folder; "
                         f"restore its run directory")
    d, s = found
    cfg = rundir.load_config(d)
    tokens = {int(e["step"]): int(e["tokens"]) for e in s.get("evals", [])}
    return {tokens[k] for k in stable_steps(cfg.schedule, int(s["steps"]), tokens)}


def stable_phase(results: Path, cell_name: str, pairs: list[Pair]) -> PairedDelta | None:
    """Δ averaged over the stable phase's evaluations (each seed's runs averaged over them first, then paired),
    over ``pairs``; None without pairs or stable evaluations."""
    if not pairs:
        return None
    tokens = stable_tokens(results, cell_name, pairs[0].base)
    ea = [_evals_of(results, cell_name, p.base) for p in pairs]
    eb = [_evals_of(results, cell_name, p.arm) for p in pairs]
    common = sorted(tokens.intersection(*(set(a) & set(b) for a, b in zip(ea, eb))))
    if not common:
        return None
    return paired_delta([sum(a[t] for t in common) / len(common) for a in ea],
                        [sum(b[t] for t in common) / len(common) for b in eb])


@dataclass(frozen=True)
class EqualLr:
    """One comparison of the WSD cell: ``arm`` at ``arm_lr`` against the baseline at ``base_lr`` (``label``; ``tuned``:
    each at its own pick, protocol v3's comparison), its pairs, Δ(t), the stable-phase mean and the final Δ."""

    label: str
    tuned: bool
    arm: str
    base_lr: float
    arm_lr: float
    pairs: tuple[Pair, ...]
    curve: list
    stable: PairedDelta | None
    final: PairedDelta | None


def equal_lr_curves(results: Path, cell_name: str) -> list[EqualLr]:
    """The WSD cell's comparisons: each arm at the tuned lrs (the cell's own pairs, as protocol v3 reads it), then
    each arm against the baseline at the **same** lr, at the baseline's pick and at the arms' pick(s), on the cell's
    held-out seeds."""
    c = read_control(results, cell_name, draws=0)
    if c is None:
        return []
    runs, _ = merged_runs(Path(results) / cell_name, control_folder(results, cell_name))
    cell_runs = protocol3.read_runs(Path(results) / cell_name)
    picks = c.cell.picks
    lrs = sorted({p.lr for p in picks.values()})
    lrs = [lr for i, lr in enumerate(lrs) if not any(same_lr(lr, x) for x in lrs[:i])]
    out = []
    for s in ARMS:
        if s not in picks:
            continue
        seeds = held_out_seeds(runs, picks, s)
        comps = [(f"{s} at its lr {picks[s].lr:.3g}, baseline at its lr {picks['baseline'].lr:.3g} (tuned)", True,
                  picks["baseline"].lr, picks[s].lr, cell_runs)]
        comps += [(f"{s} and baseline both at {lr:.3g}", False, lr, lr, runs) for lr in lrs]
        for label, tuned, lb, la, pool in comps:
            pairs = pairs_at(pool, lb, s, la, seeds)
            out.append(EqualLr(label, tuned, s, lb, la, tuple(pairs), curve(results, cell_name, pairs),
                               stable_phase(results, cell_name, pairs), delta_of(pairs)))
    return out


__all__ = ["ARMS", "ArmControl", "CellControl", "EqualLr", "Pair", "Repick", "control_folder", "curve", "delta_of",
           "equal_lr_curves", "held_out_seeds", "merged_runs", "pairs_at", "read_control", "repick",
           "repick_bootstrap", "same_lr", "section", "stable_phase", "stable_steps", "stable_tokens", "tuning_curve"]


# ---- the generated section of docs/reproduction.md -------------------------------------------------------------

RUNGS = ("cpu-10k", "cpu-25k")  # the plan's scope: these rungs at 20 and 100 tokens per parameter, and the WSD cell
BUDGETS = (20.0, 100.0)
SHORT_KIND = {"AMD EPYC": "AMD", "Intel(R) Xeon(R) Processor": "Intel"}


def in_scope(cell: protocol3.CellV3) -> bool:
    """Whether the controls' plan covers ``cell``: cpu-10k / cpu-25k at 20 or 100 tokens per parameter, no variant
    but ``-wsd``."""
    return cell.rung in RUNGS and cell.tpp in BUDGETS and cell.variant in ("", "-wsd")


def _kind(kind: str) -> str:
    cpu, _, cap = kind.partition(" / ")
    return f"{SHORT_KIND.get(cpu, cpu)} {cap}".strip()


def _ci(d: PairedDelta | None) -> str:
    if d is None:
        return "—"
    if math.isnan(d.lo):
        return f"{d.delta:+.4f} (1 pair)"
    return f"{d.delta:+.4f} [{d.lo:+.4f}, {d.hi:+.4f}]"


def _kinds(pairs) -> str:
    counts: dict[str, int] = {}
    for p in pairs:
        counts[_kind(p.kind)] = counts.get(_kind(p.kind), 0) + 1
    return ", ".join(f"{k} ×{n}" for k, n in sorted(counts.items())) or "—"


def _boot(r: Repick | None) -> str:
    if r is None or not r.draws:
        return "—"
    if not r.covered:
        return f"— (0 of {r.draws} draws covered)"
    return f"[{r.lo:+.4f}, {r.hi:+.4f}] ({100 * r.covered / r.draws:.0f} %; moved {100 * r.moved:.0f} %)"


def cpu_hours(folder: Path) -> float:
    """Training CPU time of the finished runs of ``folder`` in hours: each ``summary.json``'s CPU seconds per step
    (``cpu_time_s``, the median over its logged steps) times its steps (evaluation and start-up not counted; a
    machine shared with other work inflates the wall clock, not this). Raises ``ValueError`` naming a finished
    run's summary that cannot be read or holds no such numbers: skipping it would print fewer hours than were spent."""
    total = 0.0
    for f in sorted((Path(folder) / "runs").glob("*/summary.json")) if (Path(folder) / "runs").is_dir() else []:
        if (f.parent / rundir.DONE).is_file():
            s = protocol3.read_json(f)
            try:
                total += float(s.get("cpu_time_s") or 0) * int(s.get("steps") or 0)
            except (AttributeError, TypeError, ValueError):  # not an object, or a count that is text
                raise ValueError(f"{f} holds no CPU seconds per step and step count; restore it from git, or "
                                 f"retrain the run") from None
    return total / 3600


def section(results: Path, draws: int = DRAWS) -> list[str]:
    """The "lr-matched controls" section of docs/reproduction.md (markdown lines)."""
    results = Path(results)
    cells = [c for c in protocol3.read_ladder_cells(results) if in_scope(c)]
    lines = ["### lr-matched controls: Δ at the tuned lrs beside Δ at the baseline's lr", "",
             "Protocol v3's Δ puts each strategy at **its own** tuned lr; where the picks differ, Δ mixes the scale "
             "vectors with the lr. The controls run `none` and `unified` at the **baseline's** picked lr on the cell's "
             "held-out seeds (seeds ≥ 2, which tuned no arm), each run the cell's own config except the lr "
             "(`sweeps/control-CELL.yaml`, written by `scripts/control_plan.py` from the cell's study spec; queue: "
             "`scripts/controls.sh`, resumable; runs in `results/control-CELL/`). Pairs only within one CPU kind "
             "(protocol v3): where the cell's held-out baselines ran on another kind than the controls' machine, the "
             "baseline is rerun there at its pick. An arm whose pick *is* the baseline's lr needs no control (its "
             "tuned runs are one). 95 % t intervals over the held-out pairs; **re-pick interval**: a bootstrap "
             f"({draws} draws) that resamples the tuning seeds 0-1, re-picks each strategy's lr on them (the arm at "
             "the baseline's re-picked lr in the control's column) and resamples the held-out pairs at the re-picked "
             "lrs; a draw whose re-picked lrs have no held-out runs (they exist at the picks and, with a control, at "
             "the baseline's lr) cannot be computed: the share of draws covered and the share whose pick moved are "
             "given, and the interval is over the covered draws only. With two tuning seeds a resample is one of "
             "three ({0, 0}, {1, 1}, {0, 1}); a draw whose pick moved shows how far that moves Δ only where it is "
             "covered (the line below the table counts those), and the interval is never a full account of the "
             "pick's noise.", ""]
    lines += ["| cell | arm | lr: arm's pick / baseline's | Δ at tuned lrs [95 % CI] (pairs: kinds) | re-pick "
              "interval | Δ at the baseline's lr [95 % CI] (pairs: kinds) | re-pick interval | control runs "
              "(CPU h) |", "|---|---|---|---:|---:|---:|---:|---:|"]
    controls, missing = [], []
    for cell in sorted(cells, key=lambda c: (RUNGS.index(c.rung), c.tpp, c.variant, c.corpus)):
        c = read_control(results, cell.name, draws)
        folder = control_folder(results, cell.name)
        if c is None:
            arms_differ = any(not same_lr(cell.picks[s].lr, cell.picks["baseline"].lr)
                              for s in ARMS if s in cell.picks)
            missing.append((cell.name, arms_differ))
            continue
        controls.append(c)
        for s, a in c.arms.items():
            base = ("= tuned (the arm picked the baseline's lr)" if a.same_pick else
                    f"{_ci(a.at_base)} ({len(a.pairs)}: {_kinds(a.pairs)})")
            lines.append(f"| `{cell.name}` | {s} | {a.tuned_lr:.3g} / {a.base_lr:.3g} | {_ci(a.tuned)} "
                         f"({len(a.tuned_pairs)}: {_kinds(a.tuned_pairs)}) | {_boot(a.repick)} | {base} | "
                         f"{'—' if a.same_pick else _boot(a.repick_base)} | {c.runs} ({cpu_hours(folder):.2f}) |")
    lines.append("")
    lines += [repick_note([r for c in controls for a in c.arms.values()
                           for r in (a.repick, None if a.same_pick else a.repick_base)]), ""]
    for name, differ in missing:
        lines.append(f"- `{name}`: " + ("no control run yet" + (f" (`scalevec sweep sweeps/control-"
                     f"{name.removeprefix('ladder-')}.yaml --out results/control-{name.removeprefix('ladder-')} "
                     "--jobs 2`)" if differ else "") if differ else
                     "every arm picked the baseline's lr: Δ at tuned lrs is Δ at the baseline's lr, no control "
                     "needed."))
    if missing:
        lines.append("")
    same, compared = (sum(c.reproduced[0] for c in controls), sum(c.reproduced[1] for c in controls))
    if compared:
        lines += [f"**Config check**: {same} of {compared} control runs that repeat a cell's run on the cell's own CPU "
                  "kind (a held-out baseline rerun on purpose) reproduce its final loss bitwise.", ""]
    hours = sum(cpu_hours(control_folder(results, c.name)) for c in controls)
    wall = sum(c.hours for c in controls)
    lines += [f"Spent: {sum(c.runs for c in controls)} control runs, {hours:.2f} CPU hours of training "
              f"(single-thread; their wall clock added up, {wall:.2f} h, is inflated by the other work on the "
              "machine).", ""]
    lines += ["**Per-seed Δ at the baseline's lr** (arm − baseline, nats/token; seed: Δ):", "",
              "| cell | arm | kind | per seed |", "|---|---|---|---|"]
    for c in controls:
        for s, a in c.arms.items():
            if a.pairs and not a.same_pick:
                lines.append(f"| `{c.name}` | {s} | {_kinds(a.pairs)} | "
                             + ", ".join(f"{p.seed}: {p.delta:+.4f}" for p in a.pairs) + " |")
    lines.append("")
    wsd = next((c for c in cells if c.variant == "-wsd"), None)
    if wsd is not None:
        lines += wsd_lines(results, wsd.name)
    return lines


def repick_note(boots: list[Repick | None]) -> str:
    """One line on what the table's re-pick intervals (``boots``; None: not computed) can show: how many have a
    covered draw whose pick moved; where none has, every interval is a bootstrap of the held-out pairs at the picks."""
    shown = [r for r in boots if r is not None and r.covered]
    moving = [r for r in shown if r.moved_covered]
    if not shown:
        return "**Re-pick intervals**: none computed."
    if not moving:
        return (f"**Re-pick intervals**: in none of the {len(shown)} intervals did a covered draw move a pick, so each "
                "is a bootstrap of the held-out pairs at the picked lrs: the share moved says how often a pick made on "
                "one tuning seed differs, not how far that would move Δ.")
    return (f"**Re-pick intervals**: in {len(moving)} of the {len(shown)} intervals some covered draws moved a pick "
            f"({sum(r.moved_covered for r in moving)} draws in all); in the other {len(shown) - len(moving)} the "
            "interval is a bootstrap of the held-out pairs at the picked lrs alone.")


def _named(group: list[EqualLr], tuned: EqualLr) -> str:
    """The equal-lr lrs of ``group``, each with whose pick it is in the ``tuned`` comparison (``0.0178 (the
    baseline's pick)``)."""
    out = []
    for e in group:
        b, a = same_lr(e.base_lr, tuned.base_lr), same_lr(e.base_lr, tuned.arm_lr)
        whose = " (both picks)" if a and b else " (the baseline's pick)" if b else " (the arm's pick)" if a else ""
        out.append(f"{e.base_lr:.3g}{whose}")
    return ", ".join(out)


def wsd_verdict(comps: list[EqualLr]) -> str:
    """One sentence per arm on the stable-phase claim at equal lr (our rule): a gain *remains* at an lr where the
    stable-phase mean's 95 % interval lies below 0, a *deficit* where it lies above, *not distinguishable from 0*
    where it spans 0 (every equal-lr lr is named with its class and whose pick it is, so a gain at the arm's pick
    never hides a null at the baseline's); *not measured* below 2 pairs."""
    parts = []
    for arm in ARMS:
        rows = [e for e in comps if e.arm == arm]
        tuned = next((e for e in rows if e.tuned), None)
        equal = [e for e in rows if not e.tuned]
        measured = [e for e in equal if e.stable is not None and e.stable.n >= 2]
        if tuned is None or not equal:
            continue
        head = f"`{arm}`: stable-phase mean Δ {_ci(tuned.stable)} at the tuned lrs"
        if not measured:
            parts.append(head + "; at equal lr not measured yet (fewer than 2 pairs).")
            continue
        at = "; ".join(f"{_ci(e.stable)} with both at {e.base_lr:.3g} ({e.stable.n} pairs)" for e in measured)
        below = [e for e in measured if e.stable.hi < 0]
        above = [e for e in measured if e.stable.lo > 0]
        spans = [e for e in measured if e not in below and e not in above]
        if not below and not above:
            verdict = "at equal lr the stable-phase gain is not distinguishable from 0"
        else:
            verdict = "; ".join(([f"a gain remains at equal lr {_named(below, tuned)}"] if below else [])
                                + ([f"a deficit at equal lr {_named(above, tuned)}"] if above else [])
                                + ([f"not distinguishable from 0 at {_named(spans, tuned)}"] if spans else []))
        missing = [e for e in equal if e not in measured]
        more = (" (not measured yet at " + ", ".join(f"{e.base_lr:.3g}" for e in missing) + ")") if missing else ""
        parts.append(f"{head}, {at}: {verdict}{more}.")
    rule = "**Verdict** (rule: a gain remains where the equal-lr stable-phase interval lies below 0): "
    return rule + " ".join(parts)


def wsd_lines(results: Path, cell_name: str) -> list[str]:
    """The WSD cell's stable-phase claim judged at equal lr: a summary table and Δ(t) of every comparison."""
    comps = equal_lr_curves(results, cell_name)
    lines = [f"**The WSD cell at equal lr** (`{cell_name}`; Δ(t) at every evaluation on the held-out pairs, one CPU "
             "kind per pair; *stable phase*: the evaluations after the warmup with the lr at its peak for every "
             "step before them; *stable-phase mean*: each seed's Δ averaged over those evaluations, then paired; "
             "*lowest*: the most negative Δ(t) there). The tuned rows are protocol v3's Δ(t) (each strategy at its "
             "own lr); the equal-lr rows put the baseline and the arm at one lr.", "",
             "| comparison | pairs (kinds) | stable-phase mean Δ [95 % CI] | lowest Δ(t) in the stable phase "
             "(tokens) | Δ at the end [95 % CI] |", "|---|---:|---:|---:|---:|"]
    if not comps:
        return lines + ["| — | 0 | — | — | — |", ""]
    for e in comps:
        low = "—"
        if e.curve and e.pairs:
            stable = stable_tokens(results, cell_name, e.pairs[0].base)
            inside = [(d.delta, t, d) for t, d in e.curve if t in stable]
            if inside:
                v, t, d = min(inside)
                low = f"{_ci(d)} ({t:,})"
        lines.append(f"| {e.label} | {len(e.pairs)} ({_kinds(e.pairs)}) | {_ci(e.stable)} | {low} | {_ci(e.final)} |")
    lines += ["", wsd_verdict(comps), ""]
    shown = [e for e in comps if e.curve]
    if shown:
        steps = sorted(set().union(*({t for t, _ in e.curve} for e in shown)))
        lines += ["Δ(t) of each comparison (columns as the rows above):", "",
                  "| tokens | " + " | ".join(e.label for e in shown) + " |", "|---:|" + "---:|" * len(shown)]
        for t in steps:
            row = []
            for e in shown:
                d = dict(e.curve).get(t)
                row.append(_ci(d) if d else "—")
            lines.append(f"| {t:,} | " + " | ".join(row) + " |")
        lines.append("")
    return lines
