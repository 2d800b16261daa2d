"""``scalevec info``: parameter counts of a preset and strategy, built on the meta device (instant at 2B).

Reports total, embedding and non-embedding parameters, scale-vector parameters by role, and the
overhead against ``baseline`` (DESIGN.md §3, §11). For MoE presets also the active (per-token) count.
``key=value`` overrides change the model or the strategy's switches, as ``scalevec train``'s do
(``scalevec info --strategy dp scale.dual_sites=q,k,v,gate,up,o,down``); the baseline keeps the model's.
The counting itself lives in ``params.py`` (also used by the trainer and the sweep); this is the CLI.
"""

from __future__ import annotations

import argparse
import json

from scalevec.config import PRESET_NAMES, RunConfig, ScaleConfig
from scalevec.config.codec import apply_overrides
from scalevec.config.presets import PRESETS, get_preset
from scalevec.model.params import count_params
from scalevec.model.transformer import build_model


def info(preset: str, strategy: str, overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """Figures for ``preset`` × ``strategy`` (with ``section.field=value`` ``overrides`` of the model and scale
    sections) plus the overhead against ``baseline`` on the same model. ``ValueError`` if unknown or invalid."""
    run = RunConfig(preset=preset, strategy=strategy, model=get_preset(preset), scale=ScaleConfig.preset(strategy))
    if overrides:
        run = apply_overrides(run, list(overrides))
    cfg, scfg = run.model, run.scale
    figures = count_params(build_model(cfg, scfg, device="meta"))
    base = count_params(build_model(cfg, ScaleConfig.preset("baseline"), device="meta"))
    extra = figures["params"] - base["params"]
    return {"preset": preset, "strategy": strategy, **figures, "overhead_params": extra,
            "overhead_share": extra / base["params"]}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="small", help=f"one of: {', '.join(PRESETS)}")
    p.add_argument("--strategy", default="baseline", help=f"one of: {', '.join(PRESET_NAMES)}")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="model or scale overrides, e.g. scale.dual_sites=q,k,v,gate,up,o,down or model.n_layers=4")


def run(args: argparse.Namespace) -> int:
    r = info(args.preset, args.strategy, args.overrides)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    rows = [
        ("total parameters", r["params"]),
        ("  embedding + LM head", r["embedding_params"]),
        ("  non-embedding", r["non_embedding_params"]),
    ]
    if r["active_params"] != r["params"]:
        rows.append(("active per token", r["active_params"]))
    rows.append(("scale-vector parameters", r["scale_params"]))
    rows += [(f"  {role}", n) for role, n in r["scale_params_by_role"].items() if n]
    rows.append(("overhead vs baseline", r["overhead_params"]))
    print(f"{args.preset} · {args.strategy}")
    for label, n in rows:
        print(f"  {label:<28}{n:>16,}")
    print(f"  {'overhead share':<28}{r['overhead_share']:>16.6%}")
    return 0
