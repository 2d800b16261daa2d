"""Protocol v3: how a ladder cell is *read*, so that Δ carries no winner's curse and no CPU-kind mix.

A cell is a study folder (``results/ladder-RUNG-CORPUS[-tppD]``) with ``runs.csv`` and ``runs/RUN/meta.json``.
This module trains nothing; from those files it gives, per strategy:

- the lr pick as the study made it (the lowest mean final loss over the *tuning seeds*, the seeds every lr of the
  strategy was run on: seeds 0-1 on the ladder), its runner-up on the same curve, and the pick's margin over the
  runner-up with a standard error (``Pick``): the per-seed difference between two lrs of one strategy has a spread
  that two seeds cannot estimate, so it is pooled over every pair of neighbouring lrs of the cell
  (``neighbour_sd``); a pick whose margin is below 2 standard errors is *within noise* (our rule);
- Δ = strategy − baseline, each at its tuned lr, paired by seed, **on held-out seeds only** (seeds that are a
  tuning seed of neither arm), and separately on the tuning seeds (never pooled: ``StrategyV3``);
- only pairs whose two runs ran on the same CPU kind (``cpu`` + ``cpu_capability`` of ``meta.json``; runs on two
  kinds are not paired in the sense the t interval assumes, and kinds change between rungs); the pairs across kinds
  are listed (``cross_kind``), never pooled.

``delta_curve`` gives Δ at every evaluation of the runs (summary.json ``evals``), on the same held-out same-kind
pairs: Δ(t) of the WSD cell.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from scalevec.config.files import load_json
from scalevec.experiments.frames import read_runs_csv
from scalevec.experiments.stats import PairedDelta, paired_delta, pick_lr
from scalevec.training import rundir

STRATEGIES = ("baseline", "none", "unified")
NOISE_SE = 2.0  # a pick is within noise of its runner-up when its margin is below this many standard errors


@dataclass(frozen=True)
class Run:
    """One run of a cell: ``loss`` is the final validation loss (nats/token; ``inf`` when diverged or unfinished),
    ``kind`` the CPU kind it ran on (``"cpu / capability"``, a missing part named ``unknown CPU`` / ``unknown
    capability``, ``"unknown"`` when neither runs.csv nor meta.json says; a run of unknown kind pairs with none),
    ``n`` non-embedding and ``params`` total parameters, ``tokens`` training tokens (0 while unfinished),
    ``status`` done, diverged or unfinished (``records.RunRecord.status``)."""

    name: str
    strategy: str
    lr: float
    seed: int
    loss: float
    done: bool
    kind: str
    n: int
    params: int
    tokens: int
    wall_s: float
    status: str = "done"


UNKNOWN = "unknown"


# what a csv cell or a json value holds where no CPU was recorded; a machine type (``platform.machine()``, the
# fallback of a CPU name that could not be read) names a family of CPUs, not a kind that reproduces bits
MISSING = ("", "nan", "none", "null", "unknown", "n/a", "na", "?", "-",
           "x86_64", "amd64", "i386", "i686", "aarch64", "arm64", "armv7l", "ppc64le", "s390x")


def _known(value: object) -> str:
    """``value`` stripped, or "" where it records nothing (blank, NaN written by pandas, None, "unknown")."""
    text = str(value if value is not None else "").strip()
    return "" if text.lower() in MISSING else text


def read_json(path: Path):
    """A run's JSON file through scalevec's one reader (``load_json``: bounded, a key set twice refused, where
    ``json.loads`` would keep the last); ``ValueError`` naming the file otherwise."""
    return load_json(path, "run file", "restore it from git, or retrain the run")


def _kind(row: dict, meta: Path) -> str:
    cpu, cap = _known(row.get("cpu")), _known(row.get("cpu_capability"))
    if not (cpu and cap) and meta.is_file():
        try:
            m = read_json(meta)
            cpu, cap = cpu or _known(m.get("cpu")), cap or _known(m.get("cpu_capability"))
        except (OSError, ValueError, AttributeError):  # AttributeError: meta.json that is not an object
            pass
    if not (cpu or cap):
        return UNKNOWN
    return f"{cpu or 'unknown CPU'} / {cap or 'unknown capability'}"


def same_kind(a: str, b: str) -> bool:
    """Two runs share a CPU kind only when both kinds are known and equal: a run whose CPU or capability is not
    recorded cannot be shown to pair with anything (it is listed across kinds, never pooled)."""
    return a == b and "unknown" not in a


def read_runs(folder: Path) -> list[Run]:
    """The runs of a cell: the rows of its ``runs.csv`` (written when a study reports), then every finished run
    of ``runs/NAME/`` (``DONE`` or ``DIVERGED`` beside its ``summary.json``) that runs.csv does not list yet or
    lists as unfinished, so a cell still training shows what has finished, then every run still training there
    (a ``config.yaml`` alone: status unfinished, which holds back its strategy's pick when on a tuning seed).
    Each run's CPU kind: runs.csv's ``cpu`` and ``cpu_capability``
    columns where it has them, else the run's ``meta.json``. Empty when the cell has neither (or a header-only
    runs.csv and no finished run). ``ValueError`` (``frames.read_runs_csv``) when runs.csv is torn or lists a run
    twice or a finished row lacks its loss, parameter counts or tokens, when a finished run's ``summary.json``
    or a training run's ``config.yaml`` cannot be read, or when a finished run trained another token count than
    the cell's (``check_one_budget``)."""
    folder = Path(folder)
    out, seen = [], set()
    f = folder / "runs.csv"
    if f.is_file():
        for r in read_runs_csv(f):  # a torn or doubled runs.csv is a ValueError naming its line, not a wrong cell
            done = r["status"] == "done"
            if r["status"] == "unfinished" and (folder / "runs" / r["run"] / rundir.SUMMARY).is_file():
                continue  # it finished since runs.csv was written: its folder below says how
            loss = float(r["final_val_loss"]) if done else math.inf
            out.append(Run(r["run"], r["strategy"], float(r["lr"]), int(r["seed"]), loss, done,
                           _kind(r, folder / "runs" / r["run"] / rundir.META),
                           int(float(r["non_embedding_params"] or 0)), int(float(r["params"] or 0)),
                           int(float(r["tokens"] or 0)), float(r["wall_time_s"] or 0), r["status"]))
            seen.add(r["run"])
    listed = set(seen)  # the runs runs.csv names (check_one_budget says where a run came from)
    for d in sorted((folder / "runs").glob("*/summary.json")) if (folder / "runs").is_dir() else []:
        run = d.parent
        done, diverged = (run / rundir.DONE).is_file(), (run / rundir.DIVERGED).is_file()
        if run.name in seen or not (done or diverged):
            continue
        try:
            m = read_json(d)
            loss = float(m["final_val_loss"]) if done else math.inf
            out.append(Run(run.name, str(m["strategy"]), float(m["lr"]), int(m["seed"]), loss, done,
                           _kind({}, run / rundir.META), int(m.get("non_embedding_params") or 0),
                           int(m.get("params") or 0), int(m.get("tokens") or 0), float(m.get("wall_time_s") or 0),
                           "done" if done else "diverged"))
        except (OSError, ValueError, KeyError, TypeError) as e:  # a finished run left out would move the picks
            mark = rundir.DONE if done else rundir.DIVERGED
            raise ValueError(f"{d} cannot be read ({type(e).__name__}: {e}); retrain the run, or delete its {mark} "
                             f"to leave it unfinished") from None
        seen.add(run.name)
    # runs still training (a config, no DONE or DIVERGED): an lr pick must wait for a tuning seed among them
    for c in sorted((folder / "runs").glob(f"*/{rundir.CONFIG}")) if (folder / "runs").is_dir() else []:
        run = c.parent
        if run.name in seen or (run / rundir.DONE).is_file() or (run / rundir.DIVERGED).is_file():
            continue
        cfg = rundir.load_config(run)  # RunDirError (a ValueError) names a damaged config
        out.append(Run(run.name, cfg.strategy, float(cfg.optim.lr), int(cfg.train.seed), math.inf, False,
                       _kind({}, run / rundir.META), 0, 0, 0, 0.0, "unfinished"))
    check_one_budget(folder, out, listed)
    return out


def check_one_budget(folder: Path, runs: list[Run], listed: set[str]) -> None:
    """Raise ``ValueError`` naming the first finished run whose token count is not the one most of the cell's
    finished runs have (every strategy of a cell trains the tokens its baseline's size and tokens per parameter
    give): a runs.csv row or a run folder of another rung or budget, read in, would move the picks and Δ."""
    counts = Counter(r.tokens for r in runs if r.done and r.tokens > 0)
    if len(counts) < 2:
        return
    common = counts.most_common(1)[0][0]
    odd = next(r for r in runs if r.done and r.tokens > 0 and r.tokens != common)
    where = folder / "runs.csv" if odd.name in listed else folder / "runs" / odd.name / rundir.SUMMARY
    raise ValueError(f"{odd.name} in {where} trained {odd.tokens:,} tokens where the cell's other finished runs "
                     f"trained {common:,} (a run of another cell?); remove it there, or retrain it in this cell")


def tuning_seeds(runs: list[Run], strategy: str) -> set[int]:
    """The seeds ``strategy``'s lr was picked on: those run at two or more of its lrs (the ladder runs seeds 0-1 at
    every lr and the held-out seeds at the tuned lr alone; counting seeds at >= 2 lrs, rather than at every lr,
    keeps a seed whose run at a new edge lr is still training a tuning seed). Empty with a single lr."""
    lrs_of: dict[int, set[float]] = {}
    for r in runs:
        if r.strategy == strategy:
            lrs_of.setdefault(r.seed, set()).add(r.lr)
    return {k for k, v in lrs_of.items() if len(v) >= 2}


def _curve(runs: list[Run], strategy: str, seeds: set[int]) -> dict[float, dict[int, float]] | None:
    """``{lr: {seed: loss}}`` over the lrs that have every tuning seed finished (an lr still training is left
    out until it has); None when no lr has."""
    out: dict[float, dict[int, float]] = {}
    for r in runs:
        if r.strategy == strategy and r.seed in seeds:
            out.setdefault(r.lr, {})[r.seed] = r.loss
    out = {lr: v for lr, v in out.items() if set(v) == seeds}
    return out or None


def neighbour_sd(runs: list[Run], strategies=STRATEGIES) -> tuple[float, int]:
    """The seed-to-seed standard deviation of the difference between the final losses of two neighbouring lrs of
    one strategy, pooled over every neighbouring pair of every strategy's tuning curve in the cell (each pair
    of k tuning seeds contributes k - 1 degrees of freedom), and those degrees of freedom. ``(nan, 0)`` when no
    pair has two finite seeds. The spread of a pick's margin over its runner-up (two seeds estimate one dof)."""
    ss, dof = 0.0, 0
    for s in strategies:
        seeds = tuning_seeds(runs, s)
        curve = _curve(runs, s, seeds) if len(seeds) >= 2 else None
        if not curve:
            continue
        lrs = sorted(curve)
        for a, b in zip(lrs, lrs[1:]):
            d = [curve[b][k] - curve[a][k] for k in sorted(seeds)]
            if all(math.isfinite(x) for x in d):
                m = sum(d) / len(d)
                ss += sum((x - m) ** 2 for x in d)
                dof += len(d) - 1
    return (math.sqrt(ss / dof), dof) if dof else (math.nan, 0)


@dataclass(frozen=True)
class Pick:
    """A strategy's lr pick on its tuning seeds: ``lr`` (``at_edge``: the smallest or largest lr tried), the
    ``runner_up`` lr (second-lowest mean; None with one lr), ``margin`` = runner-up mean − pick mean (nats) and
    its standard error ``margin_se`` = ``neighbour_sd`` / √(tuning seeds); ``within_noise`` when
    margin < ``NOISE_SE`` · margin_se."""

    strategy: str
    lr: float
    at_edge: bool
    seeds: tuple[int, ...]
    curve: dict[float, float]
    runner_up: float | None
    margin: float
    margin_se: float

    @property
    def within_noise(self) -> bool:
        return math.isfinite(self.margin_se) and self.margin < NOISE_SE * self.margin_se


def pick(runs: list[Run], strategy: str, sd: float) -> Pick | None:
    """The pick of ``strategy`` (``stats.pick_lr`` on the tuning seeds' mean, as ``scalevec study`` and its
    report pick), with its margin over the runner-up; ``sd`` is ``neighbour_sd``'s. None while the strategy has
    no tuning seed or an unfinished tuning run."""
    seeds = tuning_seeds(runs, strategy)
    if any(r.strategy == strategy and r.seed in seeds and r.status == "unfinished" for r in runs):
        return None  # the unfinished run's lr may still win: no pick past it (as ``scalevec study`` waits)
    curve = _curve(runs, strategy, seeds) if seeds else None
    if not curve:
        return None
    means = {lr: sum(v.values()) / len(v) for lr, v in curve.items()}
    best = pick_lr({lr: [m] for lr, m in means.items()})
    others = sorted((m, lr) for lr, m in means.items() if lr != best.lr)
    runner = others[0][1] if others else None
    margin = others[0][0] - means[best.lr] if others else math.inf
    se = sd / math.sqrt(len(seeds)) if math.isfinite(sd) else math.nan
    return Pick(strategy, best.lr, best.at_edge, tuple(sorted(seeds)), means, runner, margin, se)


@dataclass(frozen=True)
class StrategyV3:
    """One strategy of a cell against the baseline under protocol v3: ``held_out`` Δ (None with < 1 pair) over
    ``held_seeds`` (same-kind pairs on seeds that tuned neither arm), ``tuning`` Δ over the same-kind pairs on the
    tuning seeds (reported beside it, never pooled), ``cross_kind`` = ``[(seed, kind of baseline, kind of arm)]``
    of the pairs left out because their runs ran on two CPU kinds."""

    strategy: str
    pick: Pick
    held_out: PairedDelta | None
    held_seeds: tuple[int, ...]
    tuning: PairedDelta | None
    tuning_seeds: tuple[int, ...]
    cross_kind: tuple[tuple[int, str, str], ...]


@dataclass
class CellV3:
    """A cell read under protocol v3: ``name`` (folder), ``rung``, ``corpus``, ``tpp`` (tokens per total
    parameter, from the name; 20 without ``-tppD``), ``variant`` (what follows, e.g. ``-wsd``), ``kinds`` (runs per
    CPU kind), ``n`` / ``params`` / ``tokens`` of the baseline, ``sd`` / ``sd_dof`` (``neighbour_sd``),
    ``hours`` (the runs' wall clock added up), ``picks`` and ``arms`` (each non-baseline strategy)."""

    name: str
    rung: str
    corpus: str
    tpp: float
    variant: str
    kinds: Counter
    n: int
    params: int
    tokens: int
    sd: float
    sd_dof: int
    hours: float
    picks: dict[str, Pick] = field(default_factory=dict)
    arms: dict[str, StrategyV3] = field(default_factory=dict)


NAME = re.compile(r"^ladder-(?P<rung>(?:cpu|gpu)-[0-9.]+[km])-(?P<corpus>[a-z0-9]+?)(?:-tpp(?P<tpp>[0-9.]+))?"
                  r"(?P<variant>-[a-z0-9-]+)?$")


def parse_name(name: str) -> tuple[str, str, float, str] | None:
    """``(rung, corpus, tokens per parameter, variant)`` of a ladder folder name (``ladder-cpu-25k-kjv-tpp100``
    -> ``("cpu-25k", "kjv", 100.0, "")``); None for another name."""
    m = NAME.match(name)
    if not m:
        return None
    return m["rung"], m["corpus"], float(m["tpp"] or 20), m["variant"] or ""


def _at(runs: list[Run], strategy: str, lr: float) -> dict[int, Run]:
    return {r.seed: r for r in runs if r.strategy == strategy and r.lr == lr and r.done}


def compare(runs: list[Run], base: Pick, arm: Pick) -> StrategyV3:
    """``arm`` against ``base`` (each at its pick) under protocol v3 (``StrategyV3``)."""
    a, b = _at(runs, base.strategy, base.lr), _at(runs, arm.strategy, arm.lr)
    tuning = set(base.seeds) | set(arm.seeds)
    common = sorted(a.keys() & b.keys())
    same = [k for k in common if same_kind(a[k].kind, b[k].kind)]
    cross = tuple((k, a[k].kind, b[k].kind) for k in common if not same_kind(a[k].kind, b[k].kind))

    def delta(seeds: list[int]) -> PairedDelta | None:
        return paired_delta([a[k].loss for k in seeds], [b[k].loss for k in seeds]) if seeds else None

    held = [k for k in same if k not in tuning]
    tun = [k for k in same if k in tuning]
    return StrategyV3(arm.strategy, arm, delta(held), tuple(held), delta(tun), tuple(tun), cross)


def read_cell(folder: Path, strategies=STRATEGIES) -> CellV3 | None:
    """A ladder cell under protocol v3 (None when its name is not a ladder cell's or it has no baseline pick)."""
    folder = Path(folder)
    parsed = parse_name(folder.name)
    runs = read_runs(folder)
    if parsed is None or not runs:
        return None
    sd, dof = neighbour_sd(runs, strategies)
    picks = {s: p for s in strategies if (p := pick(runs, s, sd)) is not None}
    if "baseline" not in picks:
        return None
    base_runs = [r for r in runs if r.strategy == "baseline" and r.done]
    b0 = base_runs[0] if base_runs else runs[0]
    kinds = Counter(r.kind for r in runs if r.status != "unfinished")  # finished runs: one in flight may still move
    cell = CellV3(folder.name, *parsed, kinds, b0.n, b0.params, b0.tokens, sd, dof, sum(r.wall_s for r in runs) / 3600,
                  picks)
    for s, p in picks.items():
        if s != "baseline":
            cell.arms[s] = compare(runs, picks["baseline"], p)
    return cell


def read_ladder_cells(results: Path) -> list[CellV3]:
    """Every ladder cell under ``results`` (``ladder-*`` folders with a runs.csv or finished runs), read under
    protocol v3."""
    out = []
    for f in sorted(Path(results).glob("ladder-*")):
        if f.is_dir() and (c := read_cell(f)) is not None:
            out.append(c)
    return out


def run_summary(folders: list[Path], run: Run) -> tuple[Path, dict] | None:
    """The directory of ``run`` and its parsed ``summary.json`` among ``folders`` (a cell's and its control's): the
    first ``FOLDER/runs/NAME`` whose ``summary.json`` is the run's (strategy, lr, seed and, finished, final loss
    equal to ``run``'s: runs.csv copies them from it), so that a control's rerun named as a cell run on another CPU
    kind reads its own evaluations; None when none of them has a summary of that name. ``ValueError`` naming the
    files when one cannot be read or none is the run's (a summary of another run or cell copied in)."""
    found = []
    for folder in folders:
        f = Path(folder) / "runs" / run.name / rundir.SUMMARY
        if not f.is_file():
            continue
        try:
            s = read_json(f)
            own = (s["strategy"] == run.strategy and float(s["lr"]) == run.lr and int(s["seed"]) == run.seed
                   and (not run.done or float(s["final_val_loss"]) == run.loss))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{f} cannot be read ({type(e).__name__}: {e}); retrain the run, or restore the "
                             f"file from git") from None
        if own:
            return f.parent, s
        found.append(str(f))
    if found:
        raise ValueError(f"{' and '.join(found)} is not the summary of run {run.name} ({run.strategy}, lr {run.lr:g}, "
                         f"seed {run.seed}, final loss {run.loss:.6g}); restore the run's own summary.json")
    return None


def run_evals(folders: list[Path], run: Run) -> dict[int, float]:
    """``{tokens: validation loss}`` at each evaluation of ``run`` (its ``summary.json`` ``evals``, found by
    ``run_summary``); {} when it has no summary there."""
    found = run_summary(folders, run)
    evals = found[1].get("evals", []) if found else []
    return {int(e["tokens"]): float(e["val_loss"]) for e in evals if "val_loss" in e}


def delta_curve(folder: Path, cell: CellV3, strategy: str) -> list[tuple[int, PairedDelta]]:
    """Δ(t) of ``strategy`` against the baseline at every evaluation both runs of a pair have (``summary.json``
    ``evals``: ``(tokens, Δ)``), on the held-out same-kind pairs of ``cell``; [] without them."""
    arm = cell.arms.get(strategy)
    if arm is None or not arm.held_seeds:
        return []
    runs = read_runs(folder)
    a, b = _at(runs, "baseline", cell.picks["baseline"].lr), _at(runs, strategy, arm.pick.lr)

    ea = {k: run_evals([folder], a[k]) for k in arm.held_seeds}
    eb = {k: run_evals([folder], b[k]) for k in arm.held_seeds}
    steps = sorted(set.intersection(*(set(ea[k]) & set(eb[k]) for k in arm.held_seeds)))
    return [(t, paired_delta([ea[k][t] for k in arm.held_seeds], [eb[k][t] for k in arm.held_seeds]))
            for t in steps]


__all__ = ["CellV3", "NOISE_SE", "Pick", "Run", "StrategyV3", "compare", "delta_curve", "neighbour_sd",
           "parse_name", "pick", "read_cell", "read_ladder_cells", "read_json", "read_runs", "run_evals", "run_summary",
           "same_kind", "tuning_seeds"]
