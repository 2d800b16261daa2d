"""A sweep file (YAML) read into a validated ``SweepSpec``: keys, aliases, axes, bundles, ``tune``, ``baseline``.

A sweep file has a ``base`` (config fields shared by every run) and a ``grid`` (axes whose values are
crossed)::

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
size), named by its ``name`` key; a bundle of the ``strategy`` axis is a *variant* (``strategy_label``).
Relative data paths resolve beside the file (``spec_paths``). This module reads and checks the file's shape
only: whether each grid point is a valid config is ``sweep_grid``'s question (``expand``), and nothing here
touches a sweep folder or starts a run (``sweep``, ``sweep_launch``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from scalevec.config import PRESET_NAMES
from scalevec.config.files import load_yaml
from scalevec.config.typed import bad_input, is_number, short, yaml_number
from scalevec.data.documents import BUNDLED

ALIASES = {"lr": "optim.lr", "optimizer": "optim.name", "schedule": "schedule.name", "seed": "train.seed",
           "steps": "train.steps", "tokens": "train.tokens", "tpp": "tokens_per_param"}
SECTIONS = ("model", "scale", "optim", "schedule", "data", "train")
SPEC_KEYS = ("name", "base", "grid", "tune", "baseline", "command")


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


def canonical_key(key: str) -> str:
    """``lr`` -> ``optim.lr`` etc.; ``moe.x`` -> ``model.moe.x``; other keys unchanged."""
    key = ALIASES.get(key, key)
    return "model." + key if key == "moe" or key.startswith("moe.") else key


def flatten(data: dict, where: str, prefix: str = "") -> dict[str, Any]:
    """Nested sections and dotted keys -> ``{canonical dotted key: value}``. ``ValueError`` on a bad key.

    Aliases (``lr``, ``seed``, ...) apply to top-level keys only; ``{train: {steps: 10}}`` is ``train.steps``.
    A field set twice (``train.steps`` and ``train: {steps: ...}``, ``lr`` and ``optim: {lr: ...}``) is refused.
    """
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a mapping of config fields (e.g. train: {{steps: 100}})")
    out: dict[str, Any] = {}
    for key, value in data.items():
        full = prefix + str(key)
        if not prefix and not (full in SECTIONS and isinstance(value, dict)):  # `schedule: wsd` vs `schedule: {...}`
            full = canonical_key(full)
        if (full in SECTIONS or full == "model.moe") and isinstance(value, dict):
            items = flatten(value, f"{where}.{full}", full + ".")
        else:
            items = {full: yaml_number(value)}
        for k, v in items.items():  # `lr: 1e-3` beside `optim: {lr: 2e-3}`: one would win silently
            if k in out:
                raise ValueError(f"{where} sets {short(k, 80)[1:-1]} twice ({short(out[k])} and {short(v)}: as a "
                                 f"dotted key, an alias or in its section); set it once")
            out[k] = v
    return out


NAME_LIMIT = 100  # characters of a sweep, study or bundle name (a folder name under runs/)


def check_name(value: Any, where: str) -> str:
    """A sweep's (or study's, or a bundle's) ``name`` as text: it names a folder (``runs/<name>``,
    ``OUT/runs/<run name>``), so it must be one plain path component: text or a number, 1 to ``NAME_LIMIT``
    characters, no ``/`` or ``\\``, no control character, not ``.`` or ``..``, not starting with ``-`` (a shell
    command given the folder, ``rm -rf``, would read it as options). Raises ``ValueError`` quoting at
    most a short prefix of the value."""
    if not (isinstance(value, str) or is_number(value, finite=False)):
        raise ValueError(f"{where} must be text (a folder name like my-sweep), not a {type(value).__name__} "
                         f"({short(value)})")
    text = str(value)
    if (not text.strip() or len(text) > NAME_LIMIT or text in (".", "..") or "/" in text or "\\" in text
            or text.startswith("-") or any(ord(c) < 32 or ord(c) == 127 for c in text)):
        raise ValueError(f"{where}={short(text)} is not a usable name: it names a folder, so use 1-{NAME_LIMIT} "
                         f"characters without '/', '\\', control characters, not starting with '-', and not '.' "
                         f"or '..' (like my-sweep)")
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
            # the strategy axis may list variant bundles among plain strategy names (the ladder-suspects studies);
            # elsewhere a mapping among plain values, and a list anywhere, is a typo (nested lists as seeds)
            nested = (list,) if key == "strategy" else (list, dict)
            bad = next((v for v in values if isinstance(v, nested)), None)
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
                                 f"{short(v['strategy'])}; a preset's name may only label that preset: rename the "
                                 f"bundle")
    for k, values in axes:  # a field set by a bundle and by a plain axis: the later axis would silently win
        clash = sorted({f for v in values if isinstance(v, dict) for f in v} & (set(keys) - {k}))
        if clash:
            raise ValueError(f"{where}.grid.{k} bundles set {', '.join(clash)}, which is also a grid axis; set it in "
                             f"one place (per-strategy lrs of a study: study.lr_grids)")
    varying = {k for k, v in axes if len(v) > 1}
    # lrs set inside bundles (each strategy at its own lr, like compare) vary just as an lr axis does: without
    # `tune` the report would make a cell per lr and find no baseline in most of them
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
        raise ValueError(f"{where}.tune must be a grid axis's name or a list of one (like [optim.lr]); got "
                         f"{short(tune)}")
    tune = [canonical_key(t) for t in tune]
    if len(tune) > 1:
        raise ValueError(f"{where}.tune lists {tune}; tune one numeric axis at a time (usually optim.lr)")
    in_bundles = {k for _, values in axes for v in values if isinstance(v, dict) for k in v}
    for t in tune:  # a tuned field may vary inside bundles (compare: each strategy at its own tuned lr)
        if t not in keys and t not in in_bundles:
            raise ValueError(f"{where}.tune names {short(t)}, which is not a grid axis; add it to grid or drop it "
                             f"from tune")
    baseline = str(data.get("baseline") or ("baseline" if "baseline" in strategies else strategies[0]))
    if baseline not in strategies:
        raise ValueError(f"{where}.baseline={short(baseline)} is not among the strategies {short(strategies, 200)}; "
                         f"pick one of them")
    command = data.get("command")
    if command is not None and (not isinstance(command, list) or not all(isinstance(c, str) for c in command)):
        raise bad_input(f"{where}.command", "a list of strings", command,
                        like="[torchrun, --nproc_per_node=8, -m, scalevec, train]")
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



__all__ = [
    "ALIASES",
    "NAME_LIMIT",
    "PATH_FIELDS",
    "SweepSpec",
    "canonical_key",
    "check_name",
    "flatten",
    "load_spec",
    "spec_from_dict",
    "spec_paths",
    "strategy_label",
]
