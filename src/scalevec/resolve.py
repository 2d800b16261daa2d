"""Inputs -> one validated ``RunConfig``: the one config resolution (DESIGN.md §12).

``scalevec train`` (preset, ``--config`` file, flags, ``key=value``), ``sweep`` / ``compare`` / ``study``
(a grid point's flat assignments) and ``train --resume`` (the stored config plus execution flags) all
resolve their inputs here, and this is where a run's config is validated, once. The layers, lowest
first:

1. the defaults: ``base`` (a stored config) or the ``preset``'s model and the ``strategy``'s scales;
2. ``sections``: a nested mapping (a YAML file, a parent run's sections); its ``preset`` and
   ``strategy`` keys choose the defaults when the arguments do not;
3. ``overrides``: ``key=value`` strings or a ``{dotted key: value}`` mapping, applied in order.

One rule of its own (DESIGN.md §7): ``wsd`` decays to 0. A layer that sets ``schedule.name: wsd``
without ``schedule.min_lr_ratio``, where no layer above it sets the ratio, gets ``min_lr_ratio = 0``
(the config default 0.1 is the cosine floor). And one default that depends on the run: when
no layer sets ``schedule.warmup`` or ``schedule.warmup_frac`` (and no ``base`` holds the run's own), the
warmup is ``default_warmup(steps)``, 10 % of the run's steps, at most the field's default 50: every run of
500 steps or more keeps 50 as before (so does every committed study, each of which sets its warmup), and a
short run warms up over its first tenth instead of ramping for its whole length. Consumers (the
trainer, the model builder) take the result as given, but for one rule applied once the tokenizer is
known: ``fit_vocab`` (a preset's vocabulary is a default). The token budget per parameter needs a
model to count and lives with the sweep (``sweep_grid.assigned_config``, which resolves again with the
budget, so that a default warmup is a share of its steps); its arithmetic is ``run_budget.budget_tokens``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from scalevec.config import PRESET_NAMES, RunConfig, ScaleConfig, ScheduleConfig
from scalevec.config.codec import apply_overrides, from_dict, to_dict
from scalevec.config.presets import get_preset, model_base
from scalevec.config.run_budget import train_steps

WSD_FLOOR = "schedule.min_lr_ratio=0.0"  # DESIGN.md §7: WSD decays to 0


def resolve_config(preset: str | None = None, strategy: str | None = None,
                   overrides: list[str] | Mapping[str, Any] | None = None, sections: Mapping | None = None, *,
                   base: RunConfig | None = None) -> RunConfig:
    """The validated ``RunConfig`` of the layers in the module docstring.

    ``preset`` / ``strategy``: the defaults' names (else ``sections['preset']`` / ``['strategy']``, else
    ``small`` / ``baseline``); ``base``: a config to start from instead (``--resume``; then neither may be
    given). ``overrides``: ``["optim.lr=0.01", ...]`` (YAML values, as on the command line) or
    ``{"optim.lr": 0.01, ...}`` (typed values, as in a sweep file). Raises ``ValueError`` for an unknown
    preset, strategy, section or key, a malformed override and every invalid value.
    """
    data_in = dict(sections or {})
    items = _override_items(overrides)
    for item in items:
        key = item.split("=", 1)[0].strip()
        if key in ("preset", "strategy"):  # an override would relabel the run, not rebuild its model or scales
            raise ValueError(f"{item} is not an override; choose the {key} with --{key} NAME (or `{key}:` in a "
                             f"--config file)")
    if base is not None:
        if preset or strategy:
            raise ValueError("resolve_config: give preset/strategy or a base config, not both")
        data = to_dict(base)
    else:
        for key in ("preset", "strategy"):
            if key in data_in and not (isinstance(data_in[key], str) and data_in[key]):
                raise ValueError(f"{key}: {data_in[key]!r} is not a name; give a {key} name "
                                 f"(`scalevec info` lists them)")
        # a preset named in the sections may be a label (hf-llama) whose model section holds the shape
        shape = model_base(data_in["preset"], data_in.get("model")) if not preset and "preset" in data_in else None
        preset = preset or data_in.get("preset") or "small"
        strategy = strategy or data_in.get("strategy") or "baseline"
        data = to_dict(RunConfig(preset=str(preset), strategy=str(strategy), model=get_preset(shape or str(preset)),
                                 scale=_strategy_scales(str(strategy), data_in.get("scale"))))
    data_in.pop("preset", None)
    data_in.pop("strategy", None)
    for section, values in data_in.items():
        if section not in data or not isinstance(data[section], dict):
            known = ", ".join(k for k, v in data.items() if isinstance(v, dict))
            raise ValueError(f"unknown config section {section!r}; known: {known}")
        if not isinstance(values, Mapping):
            raise ValueError(f"config section {section!r} must be a mapping")
        if section == "model" and isinstance(values.get("moe"), Mapping) and data["model"]["moe"]:
            values = {**values, "moe": {**data["model"]["moe"], **values["moe"]}}  # a preset's experts, edited
        data[section] = {**data[section], **values}
    floor = _wsd_floor(data_in.get("schedule"), items)
    cfg = apply_overrides(from_dict(RunConfig, data), items + ([floor] if floor else []))
    cfg.validate()  # first: the step count below divides by the batch, and the default warmup is always valid
    if base is None and not warmup_given(data_in.get("schedule"), items):
        cfg.schedule.warmup = default_warmup(train_steps(cfg.train))
    return cfg


def default_warmup(steps: int) -> int:
    """The warmup of a run of ``steps`` steps that sets none (module docstring): ``min(50, steps // 10)``, the
    cap being ``ScheduleConfig``'s default; 0 (no warmup) below 10 steps (and for a bad step count, which
    ``validate`` then names itself, not as a negative warmup)."""
    return max(0, min(ScheduleConfig.warmup, steps // 10))


def warmup_given(schedule_section: Any, overrides: list[str] | Mapping[str, Any] | None) -> bool:
    """Whether a layer sets the warmup: ``warmup`` or ``warmup_frac`` in a ``schedule`` section, or an override
    of ``schedule.warmup``, ``schedule.warmup_frac`` or the whole ``schedule`` (``key=value`` strings or a
    mapping, as ``resolve_config`` takes them)."""
    if isinstance(schedule_section, Mapping) and ("warmup" in schedule_section or "warmup_frac" in schedule_section):
        return True
    keys = [i.split("=", 1)[0].strip() for i in _override_items(overrides)]
    return any(k in ("schedule", "schedule.warmup", "schedule.warmup_frac") for k in keys)


def _strategy_scales(strategy: str, scale_section: Any) -> ScaleConfig:
    """The defaults of the ``scale`` section: the named preset (DESIGN.md §3), or, for a variant's name (a
    sweep bundle's label, ``sweep_spec.strategy_label``: stored run configs carry it), the plain defaults that
    the run's own ``scale`` section then sets. ``ValueError`` for an unknown name without a ``scale`` section."""
    if strategy in PRESET_NAMES or not isinstance(scale_section, Mapping):
        return ScaleConfig.preset(strategy)
    return ScaleConfig()


def fit_vocab(cfg: RunConfig, vocab_size: int) -> RunConfig:
    """``cfg`` with ``model.vocab_size`` grown to ``vocab_size`` when it is smaller: a preset's vocabulary
    (256, the bytes) is a default, not a constraint, so a ``bpe:N`` or tokenizer.json run gets an embedding
    that fits its tokenizer (the trainer, with the tokenizer's size; a sweep, with a stored run's size, so
    that a rerun sees the config the trainer resolved). Never shrinks."""
    if vocab_size <= cfg.model.vocab_size:
        return cfg
    return replace(cfg, model=replace(cfg.model, vocab_size=vocab_size))


def _override_items(overrides: list[str] | Mapping[str, Any] | None) -> list[str]:
    """``key=value`` strings; a mapping's values are written as JSON (a YAML subset) so that types survive."""
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        return [f"{k}={json.dumps(v)}" for k, v in overrides.items()]
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"unexpected argument {item!r}; overrides are key=value (e.g. model.d_model=256)")
    return list(overrides)


def _wsd_floor(schedule_section: Any, items: list[str]) -> str | None:
    """``WSD_FLOOR`` when the layer that chose ``wsd`` (overrides, else sections) leaves the floor unset."""
    def key_of(item: str) -> str:
        return item.split("=", 1)[0].strip()

    def value_of(item: str) -> str:
        return item.split("=", 1)[1].strip().strip("'\"")

    names = [value_of(i) for i in items if key_of(i) == "schedule.name"]
    ratio_in_items = any(key_of(i) == "schedule.min_lr_ratio" for i in items)
    if names:  # the last override of schedule.name decides
        return WSD_FLOOR if names[-1] == "wsd" and not ratio_in_items else None
    if isinstance(schedule_section, Mapping) and schedule_section.get("name") == "wsd":
        return WSD_FLOOR if "min_lr_ratio" not in schedule_section and not ratio_in_items else None
    return None


__all__ = ["WSD_FLOOR", "resolve_config", "fit_vocab", "default_warmup", "warmup_given"]
