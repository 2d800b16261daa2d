"""Expressivity, the fold check, on the real model (DESIGN.md §1, §4; the paper's Pre-Norm result).

For every strategy on a tiny ``pre`` model whose scale parameters are moved off their init (so that
they matter), ``scalevec.fold_scales`` builds the scale-free model ``W' = diag(s) W diag(γ)``; we report
the largest logit difference (fp32: rounding, ~1e-7) or the refusal (DNP's output normalization).
The reference logits come from the same model with ``apply='activation'`` (γ multiplies activations,
§3's reference form), since the default ``apply='weight'`` already computes ``W diag(γ)`` on the fly
and would match its fold bit for bit.
Then two rescalings that differ only in where the scale vector sits, with a compensating matrix
change: in ``pre``, ``γ_attn → c·γ_attn`` with ``W_q, W_k, W_v → W/c`` is the same function (the γ↔W
symmetry an Input-Norm scale lives on); in ``peri``, ``γ_attn_out → c·γ_attn_out`` with ``W_o → W_o/c``
changes the logits far above rounding, because the Output-Norm ``n`` removes any scale coming from
``W_o`` and nothing after it is linear: no fold can absorb γ_out, and ``fold_scales`` refuses.
"""

from __future__ import annotations

import dataclasses

import torch

from scalevec.config import PRESET_NAMES, ModelConfig, ScaleConfig
from scalevec.experiments.theory.toys import figure, generator
from scalevec.model.fold import fold_scales
from scalevec.model.params import SCALE_ROLES
from scalevec.model.transformer import Transformer, build_model
from scalevec.outpath import write_figure

CFG = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48, vocab_size=64, max_seq_len=16)
BATCH, SEQ, SPREAD, RESCALE = 2, 12, 0.5, 3.0


def perturb_scales(model: Transformer, gen: torch.Generator) -> None:
    """Move every scale parameter off its init: γ, s, β, α → 1 + SPREAD·N (clamped to ±1.5·SPREAD·... so
    no gain nears 0), ER's b → SPREAD·N. Matrices keep their seeded init."""
    roles = model.param_roles()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if roles[name] in SCALE_ROLES:
                noise = SPREAD * torch.randn(p.shape, generator=gen).clamp(-1.5, 1.5)
                p.copy_(noise if name.endswith("log_magnitude") else 1.0 + noise)


def _model(strategy: str, layout: str, seed: int, apply: str = "weight") -> Transformer:
    scfg = dataclasses.replace(ScaleConfig.preset(strategy), apply=apply)
    model = build_model(dataclasses.replace(CFG, layout=layout), scfg, seed=seed)
    perturb_scales(model, generator(seed + 1))
    return model.eval()


def fold_check(strategy: str, tokens: torch.Tensor, seed: int) -> dict:
    """Max |Δlogit| between a ``pre`` model (activation form) and ``fold_scales`` of it, or the refusal."""
    model = _model(strategy, "pre", seed, apply="activation")
    with torch.no_grad():
        logits = model(tokens)
        try:
            folded = fold_scales(model)
        except ValueError as e:
            return {"strategy": strategy, "foldable": False, "refusal": str(e),
                    "logit_scale": logits.abs().max().item()}
        diff = (folded(tokens) - logits).abs().max().item()
    return {"strategy": strategy, "foldable": True, "max_abs_diff": diff, "logit_scale": logits.abs().max().item(),
            "n_scale_params_after": sum(p.numel() for n, p in folded.named_parameters() if "scale" in n)}


def rescale_check(layout: str, tokens: torch.Tensor, seed: int) -> dict:
    """γ → c·γ on layer 0's attention scale with the compensating matrix change W → W/c (module docstring).

    ``pre``: the Input-Norm γ of ``layers.0.attn.proj`` and W_q, W_k, W_v. ``peri``: the Output-Norm γ of
    ``layers.0.attn_out`` and W_o. Returns the max |Δlogit| and, for ``peri``, ``fold_scales``'s refusal."""
    model = _model("baseline", layout, seed)
    with torch.no_grad():
        before = model(tokens)
        attn = model.layers[0].attn
        if layout == "pre":
            attn.proj.scale.weight.mul_(RESCALE)
            for branch in attn.proj.branches.values():
                branch.weight.div_(RESCALE)
        else:
            model.layers[0].attn_out.scale.weight.mul_(RESCALE)
            attn.o.weight.div_(RESCALE)
        change = (model(tokens) - before).abs().max().item()
    out = {"layout": layout, "rescale": RESCALE, "max_abs_change": change, "logit_scale": before.abs().max().item()}
    if layout == "peri":
        try:
            fold_scales(model)
            out["fold"] = "folded (unexpected)"
        except ValueError as e:
            out["fold"] = f"refused: {e}"
    return out


def compute(seed: int = 0) -> dict:
    """Fold every strategy and run both rescalings (a second or two). JSON-ready."""
    tokens = torch.randint(0, CFG.vocab_size, (BATCH, SEQ), generator=generator(seed))
    folds = [fold_check(s, tokens, seed) for s in PRESET_NAMES]
    pre, peri = rescale_check("pre", tokens, seed), rescale_check("peri", tokens, seed)
    rounding = max([f["max_abs_diff"] for f in folds if f["foldable"]] + [pre["max_abs_change"]])
    return {"setup": {"model": {k: v for k, v in dataclasses.asdict(CFG).items() if k != "moe"}, "batch": BATCH,
                      "seq": SEQ, "spread": SPREAD, "dtype": "float32", "seed": seed},
            "folds": folds, "rescale_pre": pre, "rescale_peri": peri, "max_fold_diff": rounding,
            "peri_over_rounding": peri["max_abs_change"] / rounding if rounding > 0 else None}


def summarize(r: dict) -> list[str]:
    done = [f"{f['strategy']} {f['max_abs_diff']:.1e}" for f in r["folds"] if f["foldable"]]
    refused = [f["strategy"] for f in r["folds"] if not f["foldable"]]
    pre, peri = r["rescale_pre"], r["rescale_peri"]
    return [
        f"pre, fold_scales max |Δlogit| (fp32, logits up to ~{r['folds'][0]['logit_scale']:.2f}): " + ", ".join(done),
        f"refused (DNP output normalization cannot fold): {', '.join(refused)}",
        (f"γ×{pre['rescale']:g} with W/{pre['rescale']:g}: pre Input-Norm |Δlogit| {pre['max_abs_change']:.1e} "
         f"(same function); peri Output-Norm {peri['max_abs_change']:.3f} ({_ratio(r['peri_over_rounding'])} the "
         f"largest fold difference); fold_scales on peri: {peri['fold'].split(':')[0]}"),
    ]


def _ratio(x: float | None) -> str:
    return "∞×" if x is None else f"{x:.0e}×"


def plot(r: dict, path: str) -> None:
    """One panel: max |Δlogit| per strategy after folding (log scale), refusals marked, and the rescalings."""
    fig, (ax,) = figure(1, width=8)
    names, values, colors = [], [], []
    for f in r["folds"]:
        names.append(f["strategy"])
        values.append(f["max_abs_diff"] if f["foldable"] else float("nan"))  # refused: no bar
        colors.append("C0")
    names += [f"pre: γ×{RESCALE:g}, W/{RESCALE:g}", f"peri: γ_out×{RESCALE:g}, W_o/{RESCALE:g}"]
    values += [r["rescale_pre"]["max_abs_change"], r["rescale_peri"]["max_abs_change"]]
    colors += ["C2", "C3"]
    floor = 1e-10  # a bitwise-equal fold (0) still shows as a sliver on the log axis
    ax.bar(names, [max(v, floor) for v in values], color=colors)
    for k, f in enumerate(r["folds"]):
        if not f["foldable"]:
            ax.text(k, floor * 10, "refused", rotation=90, ha="center", va="bottom", fontsize=8)
    ax.set_yscale("log")
    ax.set(title="max |Δlogit|: fold_scales per strategy (pre) and γ rescaling", ylabel="max |Δlogit| (fp32)")
    ax.tick_params(axis="x", rotation=45)
    write_figure(fig, path, dpi=110)
