"""Forward-only speed before and after ``fold_scales`` (DESIGN.md §4, §10).

Every candidate's forward under ``inference_mode``, and the model ``fold_scales`` makes from each foldable
strategy, timed interleaved (``harness``) against the first candidate's unfolded forward; the folded
parameter count is checked against a plain Llama's.
"""

from __future__ import annotations

import torch
from torch import Tensor

from scalevec.bench.candidates import HF, Candidate
from scalevec.bench.harness import interleave, summarize
from scalevec.config import ModelConfig, ScaleConfig
from scalevec.model.fold import fold_scales
from scalevec.model.params import count_params
from scalevec.model.transformer import build_model

FOLDED_FORWARD_TARGET = 1.01  # the goal: a folded model's forward ≤ 1.01× the reference's


def bench_inference(cands: list[Candidate], cfg: ModelConfig, x: Tensor, dev: torch.device, autocast, compile: bool,
                    steps: int, warmup: int, tokens: int) -> dict:
    """Forward-only timing of every candidate, and of the folded model of every foldable strategy, interleaved.

    ``x``: the (batch, seq) input ids; ``tokens``: tokens per forward. Returns ``{"reference", "plain_llama_params",
    "hf_llama_params", "rows": [{name, params, median_s, q25_s, q75_s, tokens_per_s, ratio, ..., targets}]}``;
    a folded row's targets hold its forward ratio against ``FOLDED_FORWARD_TARGET`` and whether its parameter
    count is a plain Llama's."""
    runs: list[Candidate] = list(cands)
    for c in cands:
        if c.name == HF or not c.model.scfg.foldable or c.model.cfg.layout != "pre":
            continue
        folded = fold_scales(c.model).eval()
        if compile:
            for layer in folded.layers:
                layer.compile()

        def fwd(m=folded) -> Tensor:
            with torch.inference_mode(), autocast:
                return m(x)

        runs.append(Candidate(f"{c.name}+folded", folded, [], fwd, fwd, count_params(folded)["params"]))
    for r in runs:
        r.model.eval()
        for _ in range(max(warmup, 1)):
            r.forward()
    summary = summarize(interleave(runs, lambda r: r.forward, steps, dev), runs[0].name, tokens)
    for c in cands:
        c.model.train()
    plain = count_params(build_model(cfg, ScaleConfig.preset("none"), device="meta"))["params"]
    norm_slots = (2 * cfg.n_layers + 1) * cfg.d_model  # HF Llama's RMSNorm weights (exported as ones, §10)
    rows = []
    for r in runs:
        s = summary[r.name]
        row = {"name": r.name, "params": r.params, "median_s": s["median_s"], "q25_s": s["q25_s"], "q75_s": s["q75_s"],
               "tokens_per_s": s["tokens_per_s"], "ratio": s["ratio"], "ratio_q25": s["ratio_q25"],
               "ratio_q75": s["ratio_q75"], "times_s": s["times_s"]}
        if r.name.endswith("+folded"):
            row["targets"] = {
                "forward": {"limit": FOLDED_FORWARD_TARGET, "ratio": s["ratio"],
                            "met": s["ratio"] <= FOLDED_FORWARD_TARGET},
                "params": {"plain_llama": plain, "hf_llama": plain + norm_slots, "met": r.params == plain},
            }
        rows.append(row)
    return {"reference": runs[0].name, "plain_llama_params": plain, "hf_llama_params": plain + norm_slots,
            "rows": rows}
