"""The parity table of docs/integrations.md: every family record x every strategy at init (DESIGN.md §12).

For each family (the tiny models of tests/test_integrations.py, tests/test_families.py and
tests/test_families_frameworks.py: 2 layers, norm gains 1 + 0.3·N(0, 1); torchtitan's debugmodel) and each strategy:
the largest logit change |Δ| of ``apply_strategy`` against the unconverted model, and after ``fold``; DNP's change;
the strategies refused. fp32 on the CPU. Usage: ``python scripts/family_parity.py [--torchtitan]`` (torchtitan's
flex attention compiles on its first forward: ~15-110 s).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the tests' tiny-model builders

from scalevec.config import PRESET_NAMES, ScaleConfig  # noqa: E402
from scalevec.integrations import apply_strategy, fold  # noqa: E402
from scalevec.integrations.hf_model import _logits, model_family  # noqa: E402


def row(name: str, build, x: torch.Tensor) -> str:
    ref = None
    kept, folded, changed, refused = 0.0, 0.0, [], []
    for strategy in PRESET_NAMES:
        model = build()
        fam = model_family(model)
        with torch.no_grad():
            ref = _logits(model, fam, x)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                apply_strategy(model, strategy)
        except ValueError:
            refused.append(strategy)
            continue
        with torch.no_grad():
            gap = (_logits(model, fam, x) - ref).abs().max().item()
        if not model.scalevec_info.function_preserved:
            changed.append(f"{strategy} {gap:.2g}")
            continue
        kept = max(kept, gap)
        if ScaleConfig.preset(strategy).foldable:
            fold(model)
            with torch.no_grad():
                folded = max(folded, (_logits(model, fam, x) - ref).abs().max().item())
    scale = ref.abs().max().item()
    return (f"| {name} | {kept:.2g} | {folded:.2g} | {scale:.2g} | {', '.join(changed) or '-'} | "
            f"{', '.join(refused) or '-'} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--torchtitan", action="store_true", help="also torchtitan's Llama3 debugmodel (compiles)")
    args = p.parse_args()
    import test_families
    import test_families_frameworks as fw
    import test_integrations

    x = test_families.batch()
    print("| family | max |Δ logit| applied (kept) | after fold | max |logit| | function changed (|Δ|) | refused |")
    print("|---|---|---|---|---|---|")
    for fam in test_integrations.FAMILIES:
        print(row(fam, lambda f=fam: test_integrations.tiny_hf(f), x))
    for fam in test_families.FAMILIES:
        print(row(fam, lambda f=fam: test_families.tiny(f), x))
    print(row("olmo_core (llama_like)", fw.olmo_core, fw.tokens(256)))
    if args.torchtitan:
        from torchtitan.models.llama3 import llama3_configs

        def titan():
            torch.manual_seed(0)
            model = llama3_configs["debugmodel"](attn_backend="flex").build()
            model.init_states()
            return fw._gains_away_from_one(model)

        print(row("torchtitan_llama3 (debugmodel)", titan, fw.tokens(2048, b=1)))


if __name__ == "__main__":
    main()
