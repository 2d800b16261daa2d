"""``scalevec sweep``: a grid of runs from one YAML file, resumable, N at a time (DESIGN.md §9).

A sweep file has a ``base`` (config fields shared by every run) and a ``grid`` (axes whose values are
crossed); every combination becomes an ordinary run directory ``OUT/runs/NAME/`` trained by a
subprocess ``python -m scalevec train --config OUT/runs/NAME.yaml --out OUT/runs/NAME``::

    name: smoke
    base:                        # any RunConfig fields, nested or dotted
      train: {batch_size: 8, seq_len: 64, eval_every: 10}
    grid:                        # axes, crossed in this order; the run name follows the same order
      preset: [tiny]
      strategy: [baseline, none, unified]
      lr: [1.0e-3, 3.0e-3]       # aliases: lr optimizer schedule seed steps tokens tpp
      tokens_per_param: [20]     # token budget = 20 × the baseline's total parameters of the preset
      seed: [0, 1]
    tune: [optim.lr]             # axes picked per strategy by the report (default: lr if it varies, on
                                 # its axis or inside bundles; `tune: []` keeps a cell per lr)
    baseline: baseline           # the strategy others are compared with (default: baseline or the first)
    command: [torchrun, --nproc_per_node=8, -m, scalevec, train]   # optional (default: python -m scalevec train)

An axis value can also be a mapping of several fields (one "bundle", e.g. a size with its own batch
size), named by its ``name`` key. Choices made here (ours): names are built from the run's values on
the grid axes only, so they are stable across reruns and base edits are caught instead (a finished
run whose stored config differs from the sweep's is an error naming the fix); a run directory with
``DONE`` or ``DIVERGED`` is skipped, one with a checkpoint is resumed, one without is restarted, one
that another process holds (its lock, ``rundir.RunLock``) is skipped with a message (nanochat's sweeps
skip finished runs the same way); SIGINT or SIGTERM to the sweep sends SIGTERM to its trainers, which
checkpoint at their next step and exit, and the sweep then stops (exit 75 after SIGTERM, as ``train``:
stopped and resumable; 130 after Ctrl-C); on Linux a trainer also gets SIGTERM when its sweep dies any
other way, even by SIGKILL (``prctl(PR_SET_PDEATHSIG)``), so none is left training unwatched; the token
budget of ``tokens_per_param`` uses the ``baseline`` strategy's parameter count so that every strategy
of a cell trains on the same tokens. Every grid point resolves through ``resolve.resolve_config``, as ``scalevec
train`` does (so ``wsd`` decays to 0 unless ``schedule.min_lr_ratio`` is given).
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from scalevec.config import PRESET_NAMES, RunConfig, ScaleConfig
from scalevec.config_codec import apply_overrides, config_diff, format_diff, from_dict, load_yaml, short, to_dict
from scalevec.data.documents import BUNDLED
from scalevec.data.tokenizer import declared_vocab_size
from scalevec.experiments import sweepdir
from scalevec.resolve import default_warmup, fit_vocab, resolve_config, warmup_given
from scalevec.run_budget import budget_tokens, run_tokens, total_steps, usable_cpus
from scalevec.training import rundir
from scalevec.training.exits import DIVERGED_EXIT, PREEMPTED_EXIT, Preempted  # the trainer's codes: guard stop, SIGTERM
from scalevec.training.rundir import RunDirError

ALIASES = {"lr": "optim.lr", "optimizer": "optim.name", "schedule": "schedule.name", "seed": "train.seed",
           "steps": "train.steps", "tokens": "train.tokens", "tpp": "tokens_per_param"}
SECTIONS = ("model", "scale", "optim", "schedule", "data", "train")
NAME_PREFIX = {"optim.lr": "lr", "optim.muon_lr": "mlr", "train.seed": "s", "tokens_per_param": "tpp",
               "train.tokens": "tok", "train.steps": "steps", "optim.weight_decay": "wd"}
NAME_PLAIN = ("preset", "strategy", "optim.name", "schedule.name", "data.source", "model.layout")
SPEC_KEYS = ("name", "base", "grid", "tune", "baseline", "command")
DEFAULT_TRAIN_CMD = (sys.executable, "-m", "scalevec", "train")


@dataclass
class SweepSpec:
    """A parsed sweep file: flat ``base`` assignments, ordered ``axes``, tuned keys, baseline strategy."""

    name: str
    base: dict[str, Any]
    axes: list[tuple[str, list]]
    tune: list[str]
    baseline: str
    command: tuple[str, ...] | None = None  # the trainer command line (default: python -m scalevec train)
    notice: str = ""  # one line on a choice made for the user (an inferred ``tune``); printed by the CLI, not stored
    file: str | None = None  # the YAML file it was read from: relative data paths resolve beside it (spec_paths)

    def to_dict(self) -> dict:
        """The spec as a YAML-safe mapping (what ``OUT/sweep.yaml`` stores)."""
        out = {"name": self.name, "base": dict(self.base), "grid": {k: list(v) for k, v in self.axes},
               "tune": list(self.tune), "baseline": self.baseline}
        return {**out, "command": list(self.command)} if self.command else out


@dataclass
class Run:
    """One point of the grid: its stable ``name``, resolved config and the axis values that made it."""

    name: str
    cfg: RunConfig
    values: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------- parsing


def canonical_key(key: str) -> str:
    """``lr`` -> ``optim.lr`` etc.; ``moe.x`` -> ``model.moe.x``; other keys unchanged."""
    key = ALIASES.get(key, key)
    return "model." + key if key == "moe" or key.startswith("moe.") else key


def yaml_number(v: Any) -> Any:
    """YAML 1.1 reads ``1e-3`` as a string; turn numeric strings into numbers, leave the rest."""
    if isinstance(v, str):
        try:
            f = float(v)
        except ValueError:
            return v
        return int(f) if f.is_integer() and re.fullmatch(r"[-+]?\d+", v.strip()) else f
    return v


def flatten(data: dict, where: str, prefix: str = "") -> dict[str, Any]:
    """Nested sections and dotted keys -> ``{canonical dotted key: value}``. ``ValueError`` on a bad key.

    Aliases (``lr``, ``seed``, ...) apply to top-level keys only; ``{train: {steps: 10}}`` is ``train.steps``.
    """
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a mapping of config fields (e.g. train: {{steps: 100}})")
    out: dict[str, Any] = {}
    for key, value in data.items():
        full = prefix + str(key)
        if not prefix and not (full in SECTIONS and isinstance(value, dict)):  # `schedule: wsd` vs `schedule: {...}`
            full = canonical_key(full)
        if (full in SECTIONS or full == "model.moe") and isinstance(value, dict):
            out.update(flatten(value, f"{where}.{full}", full + "."))
        else:
            out[full] = yaml_number(value)
    return out


NAME_LIMIT = 100  # characters of a sweep, study or bundle name (a folder name under runs/)


def check_name(value: Any, where: str) -> str:
    """A sweep's (or study's, or a bundle's) ``name`` as text: it names a folder (``runs/<name>``,
    ``OUT/runs/<run name>``), so it must be one plain path component: text or a number, 1 to ``NAME_LIMIT``
    characters, no ``/`` or ``\\``, no control character, not ``.`` or ``..``. Raises ``ValueError`` quoting at
    most a short prefix of the value."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"{where} must be text (a folder name like my-sweep), not a {type(value).__name__} "
                         f"({short(value)})")
    text = str(value)
    if (not text.strip() or len(text) > NAME_LIMIT or text in (".", "..") or "/" in text or "\\" in text
            or any(ord(c) < 32 or ord(c) == 127 for c in text)):
        raise ValueError(f"{where}={short(text)} is not a usable name: it names a folder, so use 1-{NAME_LIMIT} "
                         f"characters without '/', '\\', control characters, and not '.' or '..' (like my-sweep)")
    return text


def spec_from_dict(data: dict, where: str = "sweep") -> SweepSpec:
    """Parse a sweep mapping (module docstring). Raises ``ValueError`` naming the bad key and the fix."""
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a mapping with keys {', '.join(SPEC_KEYS)}")
    unknown = set(data) - set(SPEC_KEYS)
    if unknown:
        raise ValueError(f"{where} has unknown key(s) {', '.join(sorted(short(k, 40) for k in unknown))}; allowed: "
                         f"{', '.join(SPEC_KEYS)}")
    name = check_name(data["name"], f"{where}.name") if data.get("name") not in (None, "") else "sweep"
    base = flatten(data.get("base") or {}, f"{where}.base")
    grid = data.get("grid")
    if not isinstance(grid, dict):
        raise ValueError(f"{where}.grid must map axis names to lists of values (e.g. strategy: [baseline, none])")
    if not grid:
        raise ValueError(f"{where}.grid is empty; give at least one axis (e.g. strategy: [baseline, none])")
    axes = []
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"{where}.grid.{key} must be a non-empty list (write [value] for one value)")
        if isinstance(values[0], dict):
            if not all(isinstance(v, dict) for v in values):
                raise ValueError(f"{where}.grid.{key} mixes mappings and plain values; use one kind")
            values = [{**({"name": check_name(v["name"], f"{where}.grid.{key} name")} if "name" in v else {}),
                       **flatten({k: x for k, x in v.items() if k != "name"}, f"{where}.grid.{key}")} for v in values]
            axes.append((str(key), values))
        else:
            bad = next((v for v in values if isinstance(v, (list, dict))), None)
            if bad is not None:
                raise ValueError(f"{where}.grid.{key} holds {short(bad)}, a {type(bad).__name__} among plain values; "
                                 f"an axis lists plain values (write [1, 2]) or mappings (bundles) only")
            values = [yaml_number(v) for v in values]
            dup = next((v for i, v in enumerate(values) if v in values[:i]), None)
            if dup is not None:
                raise ValueError(f"{where}.grid.{key} lists {short(dup)} twice; give each value once")
            axes.append((canonical_key(str(key)), values))
    keys = [k for k, _ in axes]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{where}.grid names an axis twice (after aliases: {keys}); merge them into one list")
    strategy_axis = dict(axes).get("strategy")
    strategies = [strategy_label(v) for v in (strategy_axis or _axis_values(axes, base, "strategy", "baseline"))]
    for v in dict(axes).get("strategy", []):
        if isinstance(v, dict):
            if "strategy" not in v:
                raise ValueError(f"{where}.grid.strategy bundle {short(v.get('name', v))} needs a 'strategy' key "
                                 "(the preset its scale vectors start from, e.g. strategy: unified)")
            if strategy_label(v) in PRESET_NAMES and strategy_label(v) != v["strategy"]:
                raise ValueError(f"{where}.grid.strategy bundle named {short(strategy_label(v))} sets strategy "
                                 f"{short(v['strategy'])}; a preset's name may only label that preset: rename the bundle")
    for k, values in axes:  # a field set by a bundle and by a plain axis: the later axis would silently win
        clash = sorted({f for v in values if isinstance(v, dict) for f in v} & (set(keys) - {k}))
        if clash:
            raise ValueError(f"{where}.grid.{k} bundles set {', '.join(clash)}, which is also a grid axis; set it in "
                             f"one place (per-strategy lrs of a study: study.lr_grids)")
    varying = {k for k, v in axes if len(v) > 1}
    # lrs set inside bundles (each strategy at its own lr, like compare) vary just as an lr axis does: without
    # `tune` the report would make a cell per lr and find no baseline in most of them (issue 26)
    lr_in_bundles = len({repr(v.get("optim.lr", base.get("optim.lr"))) for _, values in axes
                         if any(isinstance(v, dict) and "optim.lr" in v for v in values) for v in values}) > 1
    tune = data.get("tune")
    notice = ""
    if tune is None:
        tune = ["optim.lr"] if "optim.lr" in varying or lr_in_bundles else []
        if lr_in_bundles and "optim.lr" not in varying:
            notice = (f"{where}: optim.lr varies inside the grid's bundles and no `tune` is given: tuning it "
                      f"(tune: [optim.lr], each strategy at its best lr); write `tune: []` for a cell per lr")
    if isinstance(tune, str):
        tune = [tune]
    if not isinstance(tune, list) or not all(isinstance(t, str) for t in tune):
        raise ValueError(f"{where}.tune must be a grid axis's name or a list of one (like [optim.lr]); got {short(tune)}")
    tune = [canonical_key(t) for t in tune]
    if len(tune) > 1:
        raise ValueError(f"{where}.tune lists {tune}; tune one numeric axis at a time (usually optim.lr)")
    in_bundles = {k for _, values in axes for v in values if isinstance(v, dict) for k in v}
    for t in tune:  # a tuned field may vary inside bundles (compare: each strategy at its own tuned lr)
        if t not in keys and t not in in_bundles:
            raise ValueError(f"{where}.tune names {short(t)}, which is not a grid axis; add it to grid or drop it from tune")
    baseline = str(data.get("baseline") or ("baseline" if "baseline" in strategies else strategies[0]))
    if baseline not in strategies:
        raise ValueError(f"{where}.baseline={short(baseline)} is not among the strategies {short(strategies, 200)}; pick one of them")
    command = data.get("command")
    if command is not None and (not isinstance(command, list) or not all(isinstance(c, str) for c in command)):
        raise ValueError(f"{where}.command must be a list of strings, e.g. [torchrun, --nproc_per_node=8, -m, "
                         "scalevec, train]")
    return SweepSpec(name, base, axes, tune, baseline, tuple(command) if command else None,
                     notice)


def strategy_label(value: Any) -> str:
    """The strategy a run of the ``strategy`` axis is reported as: a plain value itself; a bundle its ``name``
    (a *variant*: the ``strategy`` key's preset with the bundle's overrides, e.g. ``{name: unified-no-or,
    strategy: unified, scale.param: direct}``), else its ``strategy`` key. Stored as the run's
    ``RunConfig.strategy``; the scale vectors are the run's ``scale`` section (``resolve.resolve_config``)."""
    if isinstance(value, dict):
        return str(value.get("name") or value.get("strategy", "baseline"))
    return str(value)


def _axis_values(axes: list[tuple[str, list]], base: dict, key: str, default: Any) -> list:
    """Every value ``key`` takes in the grid (plain axis or inside bundles), else its base/default value."""
    for k, values in axes:
        if k == key and not (values and isinstance(values[0], dict)):
            return list(values)
        if values and isinstance(values[0], dict) and any(key in v for v in values):
            return [v.get(key, base.get(key, default)) for v in values]
    return [base.get(key, default)]


def load_spec(path: str | Path) -> SweepSpec:
    """Read and parse a sweep YAML file (``ValueError`` if missing or malformed); its relative data paths
    resolve beside it (``spec_paths``)."""
    return replace(spec_from_dict(load_yaml(path), where=str(path)), file=str(path))


PATH_FIELDS = ("data.source", "data.tokenizer")  # the fields whose value may be a file or folder


def spec_paths(assign: dict[str, Any], spec_file: str | None) -> dict[str, Any]:
    """``assign`` (one run's flat assignments) with each relative path of ``PATH_FIELDS`` resolved for a spec read
    from ``spec_file`` (docs/data.md): the path beside that file when it exists there (made absolute, so the
    run's config.yaml names it from anywhere), else the path as written when it exists from the working
    directory (how files under sweeps/ were written before: a run made so keeps its config), else (in neither
    place) the path beside the file, so that a finished sweep still reports after its data moved and a run
    still to train is refused by ``check_sources``, naming that path; ``shakespeare``, ``kjv``, ``hf:NAME``,
    ``bytes`` and ``bpe:N`` are names, not paths, and absolute or ``~`` paths are kept. ``spec_file`` None (a
    spec built in code, e.g. by ``compare``): unchanged.
    """
    if spec_file is None:
        return assign
    out = dict(assign)
    for key in PATH_FIELDS:
        value = out.get(key)
        if (not isinstance(value, str) or Path(value).expanduser().is_absolute()
                or (key == "data.source" and (value in BUNDLED or value.startswith("hf:")))
                or (key == "data.tokenizer" and (value == "bytes" or value.startswith("bpe:")))):
            continue
        beside, here = Path(spec_file).parent / value, Path(value)
        if beside.exists():
            if not (here.exists() and os.path.samefile(beside, here)):  # the same file: keep the value as written
                out[key] = os.path.abspath(beside)
        elif not here.exists():
            out[key] = os.path.abspath(beside)
    return out


# ----------------------------------------------------------------------------------------- expansion


@cache
def _count_params(model_json: str, scale_json: str) -> int:
    """Total parameters of a model and scale config (given as JSON, for caching), built on the meta device."""
    from scalevec.config import ModelConfig
    from scalevec.model.params import count_params
    from scalevec.model.transformer import build_model

    model = from_dict(ModelConfig, json.loads(model_json))
    scale = from_dict(ScaleConfig, json.loads(scale_json))
    return count_params(build_model(model, scale, device="meta"))["params"]


def run_params(cfg: RunConfig, strategy: str | None = None) -> int:
    """Total parameters of ``cfg.model`` with ``cfg.scale`` (or the named ``strategy``), with the vocabulary the
    trainer will fit to the run's tokenizer (``resolve.fit_vocab``, ``tokenizer.declared_vocab_size``)."""
    scale = ScaleConfig.preset(strategy) if strategy else cfg.scale
    model = fit_vocab(cfg, declared_vocab_size(cfg.data.tokenizer)).model
    return _count_params(json.dumps(to_dict(model), sort_keys=True), json.dumps(to_dict(scale), sort_keys=True))


def baseline_params(cfg: RunConfig) -> int:
    """Total parameters of ``cfg.model`` with the baseline strategy (the token budget's reference)."""
    return run_params(cfg, "baseline")


def assigned_config(assign: dict[str, Any]) -> RunConfig:
    """The validated RunConfig of one grid point's flat assignments (``preset``, ``strategy``,
    ``tokens_per_param`` and dotted fields): ``resolve.resolve_config``, then the token budget
    (``run_budget.budget_tokens`` × the baseline strategy's parameters, ``baseline_params``).

    Raises ``ValueError`` for unknown presets, strategies or fields and invalid values.
    """
    a = dict(assign)
    preset, strategy = a.pop("preset", None), a.pop("strategy", None)
    tpp = a.pop("tokens_per_param", None)
    cfg = resolve_config(str(preset) if preset is not None else None, str(strategy) if strategy is not None else None,
                         overrides=a)
    if tpp is not None:  # a positive whole number of tokens: still valid (TrainConfig.validate), not checked again
        cfg = replace(cfg, train=replace(cfg.train, tokens=budget_tokens(tpp, baseline_params(cfg))))
        if not warmup_given(None, a):  # a default warmup is a share of the budget's steps (resolve.py)
            cfg = replace(cfg, schedule=replace(cfg.schedule, warmup=default_warmup(total_steps(cfg))))
    return cfg


def _fmt(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def name_part(key: str, value: Any) -> str:
    """The piece of a run name for one axis value: ``lr0.003``, ``s1``, ``baseline``, ``d_model256``."""
    if isinstance(value, dict):
        part = value.get("name") or "-".join(name_part(k, v) for k, v in value.items())
    elif key in NAME_PLAIN:
        part = _fmt(value)
    else:
        part = NAME_PREFIX.get(key, key.split(".")[-1]) + _fmt(value)
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", part).strip("-")


def expand(spec: SweepSpec) -> list[Run]:
    """Every run of the grid, in axis order (the last axis varies fastest). Raises ``ValueError`` for an
    invalid config or two runs with the same name."""
    runs, seen = [], {}
    for combo in itertools.product(*[values for _, values in spec.axes]):
        assign, values = dict(spec.base), {}
        for (key, _), value in zip(spec.axes, combo):
            if isinstance(value, dict):
                assign.update({k: v for k, v in value.items() if k != "name"})
            else:
                assign[key] = value
            values[key] = value
        name = "_".join(name_part(k, v) for k, v in values.items()) or "run"
        if name in (".", "..") or len(name) > 200:
            raise ValueError(f"a run of the grid would be named {short(name)}, which cannot name its folder; give its "
                             f"bundle a short 'name' or use shorter axis values")
        if name in seen:
            raise ValueError(f"two runs of the grid are both named {short(name)}; give bundle values distinct 'name' keys")
        try:
            cfg = assigned_config(spec_paths(assign, spec.file))
        except ValueError as e:
            raise ValueError(f"run {name}: {e}") from None
        if isinstance(values.get("strategy"), dict):  # a variant is reported under its own name
            cfg = replace(cfg, strategy=strategy_label(values["strategy"]))
        seen[name] = True
        runs.append(Run(name, cfg, values))
    return runs


# ----------------------------------------------------------------------------------------- state on disk


def same_path(stored: Any, new: Any) -> bool:
    """Whether two values of a path field (``PATH_FIELDS``) name one file as far as a run can tell: one relative,
    the other absolute and ending in it (a sweep file's relative path resolved beside the file, ``spec_paths``,
    against the same path kept as written by a run started where it also resolved, or after the data moved)."""
    if not (isinstance(stored, str) and isinstance(new, str)):
        return False
    rel, full = (stored, new) if not os.path.isabs(stored) else (new, stored)
    if os.path.isabs(rel) or not os.path.isabs(full) or rel in BUNDLED or ":" in rel:
        return False
    return full.endswith(os.sep + os.path.normpath(rel))


def run_status(run: Run, runs_dir: Path) -> str:
    """``done`` (DONE present), ``diverged`` (DIVERGED present: a result, not retried; ``--overwrite`` the
    run or delete it to retry), ``locked`` (another process trains it now), ``resume`` (a checkpoint),
    ``restart`` (a partial run without one) or ``new`` (``rundir.state``).

    Raises ``ValueError`` when an existing run directory was made with a different config.
    """
    d = runs_dir / run.name
    status = rundir.state(d)
    if status == "new":
        return "new"
    if rundir.is_run(d):
        stored = rundir.load_config(d)
        # the trainer grew the vocabulary to fit a non-bytes tokenizer (resolve.fit_vocab): compare like with like
        expected = fit_vocab(run.cfg, stored.model.vocab_size) if run.cfg.data.tokenizer != "bytes" else run.cfg
        diff = {k: v for k, v in config_diff(stored, expected).items() if not (k in PATH_FIELDS and same_path(*v))}
        if diff:
            raise ValueError(f"{d} was trained with a different config ({format_diff(diff)}); use a new --out, "
                             f"or delete that run directory to retrain it")
    if status not in ("done", "diverged") and rundir.locked_by(d):
        return "locked"
    return status


write_atomic = rundir.write_atomic  # a per-process temporary file, then a rename

_children: set[subprocess.Popen] = set()  # trainers running now (stopped together with the sweep)
_children_lock = threading.Lock()
_stopping = threading.Event()


def stop_trainers(signum: int = signal.SIGTERM) -> None:
    """Send ``signum`` to every running trainer and start no new one (they checkpoint and exit)."""
    _stopping.set()
    with _children_lock:
        for proc in _children:
            try:
                proc.send_signal(signum)
            except OSError:
                pass


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@cache
def _prctl():
    """libc's ``prctl`` (Linux), or None where there is none; loaded once, in the sweep itself, so that a
    freshly forked child only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent():
    """A ``preexec_fn`` that has the kernel send SIGTERM to the child when the thread that started it
    dies, whatever kills it (SIGKILL, the OOM killer): the trainer then checkpoints at its next step and
    exits, as after a SIGTERM to the sweep, instead of training on unwatched. The sweep's worker thread
    waits on its trainer, so it lives as long as the trainer does. None off Linux."""
    prctl, parent = _prctl(), os.getpid()
    if prctl is None:
        return None

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGTERM))
        if os.getppid() != parent:  # the sweep died between the fork and prctl: the signal would never come
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def unwritable(out: Path, e: OSError) -> RunDirError:
    """The one-line error for a sweep folder that cannot be written (read-only, no permission, full)."""
    return RunDirError(f"cannot write the sweep folder {out} ({e.filename or out}: {e.strerror or e}); choose a "
                       f"writable --out with free space")


def train_one(run: Run, runs_dir: Path, status: str, train_cmd: tuple[str, ...], threads: int) -> int:
    """Train one run in a subprocess (log in ``runs_dir/NAME.log``); returns its exit code (75, "stopped",
    without starting it when the sweep is stopping). The trainer gets SIGTERM if the sweep dies
    (``die_with_parent``). Raises ``RunDirError`` when the run's config or log cannot be written."""
    if _stopping.is_set():
        return PREEMPTED_EXIT
    cfg_path = runs_dir / f"{run.name}.yaml"
    cfg = run.cfg if run.cfg.train.threads else apply_overrides(run.cfg, [f"train.threads={threads}"])
    # not --quiet: the log holds its output
    cmd = [*train_cmd, "--config", str(cfg_path), "--out", str(runs_dir / run.name)]
    cmd += {"resume": ["--resume"], "restart": ["--overwrite"]}.get(status, [])
    env = dict(os.environ)
    try:
        write_atomic(cfg_path, yaml.safe_dump(to_dict(cfg), sort_keys=False))
        log = open(runs_dir / f"{run.name}.log", "a")
    except OSError as e:
        raise unwritable(runs_dir.parent, e) from None
    with log:
        log.write(f"\n$ {' '.join(cmd)}\n")
        log.flush()
        with _children_lock:
            if _stopping.is_set():
                return PREEMPTED_EXIT
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=die_with_parent())
            _children.add(proc)
        try:
            rc = proc.wait()
        finally:
            with _children_lock:
                _children.discard(proc)
        log.write(f"[exit {rc}]\n")
        return rc


def live_progress(todo: list[tuple[Run, str]], runs_dir: Path, scope=None):
    """A started ``progress.GridProgress`` over the runs to train: each run's step and loss from its
    metrics.jsonl, an ETA for the grid weighted by 6·N·D (one refreshing line on a TTY, else a plain
    line every minute), and with ``scope`` (a ``progress.StudyScope``) the whole study's bound."""
    from scalevec.experiments.progress import GridProgress

    items = []
    for run, _ in todo:
        items.append((run.name, runs_dir / run.name, total_steps(run.cfg),
                      6.0 * run_params(run.cfg) * run_tokens(run.cfg)))
    return GridProgress(items, scope=scope).start()


def _final_loss(run_dir: Path) -> str:
    try:
        s = rundir.read_summary(run_dir)
        return f"val_loss {s['final_val_loss']:.4f}"
    except (ValueError, KeyError, TypeError):
        return "no summary"


# ----------------------------------------------------------------------------------------- the sweep


def check_sources(runs: list[Run]) -> None:
    """Check each distinct data source of ``runs`` as its trainer would before reading it
    (``corpus.check_source``), so that a missing or unreadable ``--data`` stops the sweep (and its dry run)
    with one line instead of failing every run. Raises ``FileNotFoundError`` / ``ValueError`` naming the
    first run with that source."""
    from scalevec.data.corpus import check_source

    first: dict[str, Run] = {}
    for r in runs:
        first.setdefault(r.cfg.data.source, r)
    for r in first.values():
        try:
            check_source(r.cfg.data)
        except (OSError, ValueError) as e:
            raise type(e)(f"run {r.name}: {e}") from None


def failure_cause(log: Path, since: int = 0, tail_bytes: int = 16384) -> str:
    """The last line that names an error (the CLI's ``scalevec …: error: …`` line or a traceback's last line)
    among what this attempt appended to a failed run's log (from byte ``since``: an earlier attempt's error is
    not this one's), shortened to 200 characters; ``""`` when there is none or the log cannot be read."""
    try:
        with open(log, "rb") as f:
            f.seek(max(since, f.seek(0, os.SEEK_END) - tail_bytes))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        line = line.strip()
        if ": error: " in line or re.match(r"^[A-Za-z_.]*(Error|Exception)\b", line):
            return line.split(": error: ", 1)[-1][:200]
    return ""


def dry_run_text(runs: list[Run], statuses: list[str]) -> str:
    """The run list with status, lr, steps, tokens and parameters, and the total token budget."""
    lines = [f"{'run':<48} {'status':<8} {'lr':>9} {'steps':>7} {'tokens':>12} {'params':>12}"]
    total = todo = flops = 0
    for run, status in zip(runs, statuses):
        tokens, params, steps = run_tokens(run.cfg), run_params(run.cfg), total_steps(run.cfg)
        total += tokens
        if status != "done":
            todo += tokens
            flops += 6 * params * tokens
        lines.append(f"{run.name:<48} {status:<8} {run.cfg.optim.lr:>9g} {steps:>7,} {tokens:>12,} {params:>12,}")
    n_todo = sum(s != "done" for s in statuses)
    lines.append(f"{len(runs)} runs ({n_todo} to train); total token budget {total:,} tokens "
                 f"({todo:,} still to train, about {flops:.2e} FLOP at 6·N·D)")
    return "\n".join(lines)


def run_sweep(spec: SweepSpec, out: str | Path, jobs: int = 1, dry_run: bool = False,
              train_cmd: tuple[str, ...] | None = None, report: bool = True, quiet: bool = False,
              record_spec: bool = True, scope=None) -> int:
    """Expand ``spec``, skip finished runs, train the rest ``jobs`` at a time, then write the report.

    ``record_spec=False`` trains into ``out`` without storing ``spec`` there (``study``: its narrowed
    follow-up grids belong to the study's own spec, which is stored; ``sweepdir``); ``scope`` (a
    ``progress.StudyScope``) puts the whole study's time bound on the progress line.

    Everything is validated before anything is written. Returns 0 when every run finished, 1 when a run
    failed (the others still run; rerun the same command to retry) or was skipped because another process (a
    dying sweep's trainer, another sweep) held it. Raises ``ValueError`` for an invalid
    spec, a config mismatch with an existing run, or ``jobs < 1``. ``train_cmd`` (default: the spec's
    ``command``, else ``python -m scalevec train``) gets ``--config FILE --out DIR`` appended; its output
    goes to ``OUT/runs/NAME.log``, and unless ``quiet`` a live status (``live_progress``) shows on stdout.
    """
    train_cmd = tuple(train_cmd or spec.command or DEFAULT_TRAIN_CMD)
    if jobs < 1:
        raise ValueError(f"--jobs {jobs} must be >= 1")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out} exists and is not a directory; choose another --out")
    if rundir.has_config(out):
        raise FileExistsError(f"{out} is a single training run (config.yaml), not a sweep folder; choose another --out")
    sweepdir.check_folder(out, spec.file)
    runs = expand(spec)
    runs_dir = out / "runs"
    statuses = [run_status(r, runs_dir) for r in runs]
    check_sources([r for r, s in zip(runs, statuses) if s not in ("done", "diverged")])
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    if dry_run:
        print(dry_run_text(runs, statuses))
        return 0
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
        if record_spec:
            sweepdir.write_spec(out, spec.to_dict())
    except OSError as e:
        raise unwritable(out, e) from None
    todo = [(r, s) for r, s in zip(runs, statuses) if s not in ("done", "diverged", "locked")]
    n_div, n_resume = statuses.count("diverged"), statuses.count("resume")
    say(f"sweep {spec.name}: {len(runs)} runs, {statuses.count('done')} already done, "
        f"{f'{n_div} diverged before (not retried; --overwrite or delete the run to retry), ' if n_div else ''}"
        f"{len(todo)} to train{f' ({n_resume} resume from a checkpoint)' if n_resume else ''} ({jobs} at a time) "
        f"in {runs_dir}")
    skipped: list[str] = []  # runs another process held: not done, so the sweep does not exit 0
    for r, s in zip(runs, statuses):
        if s == "locked":
            skipped.append(r.name)
            say(f"skipped {r.name}: in use by process {rundir.locked_by(runs_dir / r.name)} (another sweep or train); "
                f"rerun this sweep when it is done")
    threads = max(1, usable_cpus() // jobs)  # each run gets an explicit share (train.threads), never torch's guess
    failed: list[str] = []
    progress = None if quiet else live_progress(todo, runs_dir, scope)
    say = progress.say if progress else say

    def one(item: tuple[int, tuple[Run, str]]) -> None:
        i, (run, status) = item
        t0 = time.perf_counter()
        if progress:
            progress.started(run.name, resumed=status == "resume")
        log = runs_dir / (run.name + ".log")
        log_start = log.stat().st_size if log.is_file() else 0  # the log is appended to, attempt after attempt
        rc = train_one(run, runs_dir, status, tuple(train_cmd), threads)
        if progress:
            progress.finished(run.name)
        head = f"[{i + 1}/{len(todo)}] {run.name}:"
        if rc == 0 and rundir.is_done(runs_dir / run.name):
            took = f"{time.perf_counter() - t0:.0f} s" + (" since its resume" if status == "resume" else "")
            say(f"{head} {_final_loss(runs_dir / run.name)} ({took})")
        elif rc == DIVERGED_EXIT and rundir.is_diverged(runs_dir / run.name):
            # a result (this lr is too high), not a failure
            div = rundir.read_diverged(runs_dir / run.name) or {}
            say(f"{head} diverged ({div.get('reason', 'health guard')}); the report counts it as a failed lr")
        elif _stopping.is_set():
            say(f"{head} stopped with the sweep (exit {rc}); rerun the same command to resume it")
        elif rundir.locked_by(runs_dir / run.name):
            skipped.append(run.name)
            say(f"{head} skipped: in use by process {rundir.locked_by(runs_dir / run.name)}; rerun this sweep later")
        else:
            failed.append(run.name)
            cause = failure_cause(log, log_start)
            say(f"{head} FAILED (exit {rc}){f': {cause}' if cause else ''}; see {log}")

    stopped_by: list[int] = []  # the first signal decides the exit code: 75 for SIGTERM, 130 for Ctrl-C

    def on_signal(signum, frame):  # SIGINT / SIGTERM: the trainers checkpoint and stop, then the sweep stops
        stop_trainers(signal.SIGTERM)
        if not stopped_by or signum == signal.SIGINT:  # a second Ctrl-C stops waiting; another SIGTERM does not
            stopped_by.append(signum)
            raise KeyboardInterrupt

    main = threading.current_thread() is threading.main_thread()
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    for s in old:
        signal.signal(s, on_signal)
    _stopping.clear()
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        for future in [pool.submit(one, item) for item in enumerate(todo)]:
            future.result()
    except KeyboardInterrupt:  # start no new run; wait for the running trainers to checkpoint and exit
        stop_trainers(signal.SIGTERM)
        pool.shutdown(wait=True, cancel_futures=True)
        if progress:
            progress.stop()
        if stopped_by == [signal.SIGTERM]:  # preempted like a trainer: exit 75 (cli.py), resumable
            raise Preempted(f"SIGTERM: stopped the sweep; its running trainers checkpointed; rerun the same command "
                            f"to resume ({runs_dir})") from None
        raise
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    pool.shutdown()
    if progress:
        progress.stop()
    if report:
        from scalevec.experiments.report import write_report

        try:
            write_report(out, quiet=quiet)
        except (ValueError, FileNotFoundError) as e:
            say(f"no report: {e}")
    if skipped:  # said on stderr too, so that `sweep && report` in a script shows why it stopped
        print(f"scalevec sweep: {len(skipped)} run(s) skipped, in use by another process: {', '.join(skipped)}; "
              f"rerun the same command when it is done", file=sys.stderr, flush=True)
    if failed:
        say(f"{len(failed)} run(s) failed: {', '.join(failed)}; rerun the same command to retry them")
    return 1 if failed or skipped else 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="sweep YAML file (see sweeps/smoke.yaml)")
    p.add_argument("--out", help="output folder (default runs/<sweep name>); rerun the command to resume")
    p.add_argument("--dry-run", action="store_true", help="print the runs and the total token budget, train nothing")
    p.add_argument("--jobs", type=int, default=1, help="runs trained at the same time (threads split between them)")
    p.add_argument("--no-report", action="store_true", help="skip `scalevec report` at the end")


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    if spec.notice:
        print(f"note: {spec.notice}", flush=True)
    out = args.out or f"runs/{spec.name}"
    return run_sweep(spec, out, jobs=args.jobs, dry_run=args.dry_run, report=not args.no_report)


__all__ = [
    "Run",
    "SweepSpec",
    "assigned_config",
    "baseline_params",
    "canonical_key",
    "dry_run_text",
    "expand",
    "load_spec",
    "name_part",
    "run_status",
    "run_sweep",
    "spec_from_dict",
    "spec_paths",
    "yaml_number",
]
