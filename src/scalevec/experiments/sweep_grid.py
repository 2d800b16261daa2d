"""A sweep's grid: its points (``expand``), their stable names (``name_part``), each point's validated config
(``assigned_config``: the resolution and the token budget of ``tokens_per_param``) and its state in a sweep
folder (``run_status``).

Choices made here (ours): names are built from the run's values on the grid axes only, so they are stable
across reruns and base edits are caught instead (a finished run whose stored config differs from the sweep's is
an error naming the fix); the token budget of ``tokens_per_param`` uses the ``baseline`` strategy's parameter
count so that every strategy of a cell trains on the same tokens. Every grid point resolves through
``resolve.resolve_config``, as ``scalevec train`` does (so ``wsd`` decays to 0 unless ``schedule.min_lr_ratio``
is given). Reading the sweep file is ``sweep_spec``'s job; this module writes nothing and starts no run.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from scalevec.config import RunConfig, ScaleConfig
from scalevec.config.codec import config_diff, format_diff, from_dict, to_dict
from scalevec.config.run_budget import budget_tokens, total_steps
from scalevec.config.typed import bad_input, short
from scalevec.data.documents import BUNDLED
from scalevec.data.tokenizer import declared_vocab_size
from scalevec.experiments.sweep_spec import PATH_FIELDS, SweepSpec, spec_paths, strategy_label
from scalevec.resolve import default_warmup, fit_vocab, resolve_config, warmup_given
from scalevec.training import rundir

NAME_PREFIX = {"optim.lr": "lr", "optim.muon_lr": "mlr", "train.seed": "s", "tokens_per_param": "tpp",
               "train.tokens": "tok", "train.steps": "steps", "optim.weight_decay": "wd"}
NAME_PLAIN = ("preset", "strategy", "optim.name", "schedule.name", "data.source", "model.layout")


@dataclass
class Run:
    """One point of the grid: its stable ``name``, resolved config and the axis values that made it."""

    name: str
    cfg: RunConfig
    values: dict[str, Any] = field(default_factory=dict)


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
    for key in ("preset", "strategy"):  # a null would fall back to the default (small, baseline) under its label
        if key in a and not (isinstance(a[key], str) and a[key].strip()):
            raise bad_input(key, "a name", a[key], like="tiny" if key == "preset" else "baseline",
                            fix="`scalevec info` lists them")
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
            raise ValueError(f"two runs of the grid are both named {short(name)}; give bundle values distinct "
                             f"'name' keys")
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
    against the same path kept as written by a run started where it also resolved, or after the data moved).
    A relative path's leading ``..`` parts are dropped first: a study file's ``../data/x.txt``, written beside
    sweeps/ and copied verbatim into OUT/sweep.yaml, names the ``data/x.txt`` its runs stored as absolute."""
    if not (isinstance(stored, str) and isinstance(new, str)):
        return False
    rel, full = (stored, new) if not os.path.isabs(stored) else (new, stored)
    if os.path.isabs(rel) or not os.path.isabs(full) or rel in BUNDLED or ":" in rel:
        return False
    parts = Path(os.path.normpath(rel)).parts
    while parts and parts[0] == os.pardir:
        parts = parts[1:]
    return bool(parts) and full.endswith(os.sep + os.path.join(*parts))


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



__all__ = [
    "NAME_PLAIN",
    "NAME_PREFIX",
    "Run",
    "assigned_config",
    "baseline_params",
    "expand",
    "name_part",
    "run_params",
    "run_status",
    "same_path",
]
