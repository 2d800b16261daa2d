"""The markdown tables ``scalevec bench`` prints: the training step, peak memory, inference, generation.

Formatting only: every figure comes from the result dicts of ``step.bench`` and ``generate.bench_generate``.
"""

from __future__ import annotations


def mib(n: int) -> str:
    """Bytes as MiB with two decimals."""
    return f"{n / 2**20:.2f}"


def mark(t: dict | None) -> str:
    """A target's verdict: ``ok (<= 1.02x)``, ``MISSED (<= 1.02x)``, or nothing when no target applies."""
    return "" if not t else ("ok" if t["met"] else "MISSED") + f" (<= {t['limit']:.2f}x)"


def format_report(r: dict) -> str:
    """The human-readable tables of a ``bench`` result (docs/performance.md's tables)."""
    ref = r["reference"]
    lines = [
        f"scalevec bench · preset {r['preset']} · batch {r['batch_size']} x seq {r['seq_len']} "
        f"({r['tokens_per_step']} tokens/step) · {r['device']} ({r['device_name']}, {r['threads']} threads) · "
        f"{r['dtype']}{' · compile' if r['compile'] else ''} · {r['steps']} interleaved rounds after "
        f"{r['warmup']} warm-up · torch {r['torch']}",
        f"load average (1/5/15 min) at start {'/'.join(f'{v:.2f}' for v in r['loadavg_start'])}, "
        f"at end {'/'.join(f'{v:.2f}' for v in r['loadavg_end'])}",
        f"FLOPs per token {r['flops_per_token']:,.0f} (scalevec.model.flops: 6 N_active + attention); "
        f"MFU against a matmul peak of {r['peak_tflops']:.3f} TFLOP/s ({r['peak_source']})"
        + (f", and against the GPU's dense bf16 spec {r['spec_peak_tflops']:.0f} TFLOP/s"
           if r.get("spec_peak_tflops") else ""),
        "",
        "Training step (forward + backward + clip + AdamW). Ratio: paired, round by round, vs the first candidate; "
        "median [IQR]. CPU time: the same ratio of process CPU seconds (time.process_time), which waiting for a "
        "core taken by another process does not inflate.",
        "",
        "| candidate | params | loss at init | step ms, median [IQR] | tokens/s | "
        + "TFLOP/s | MFU | " + f"step vs {ref} | CPU time vs {ref} | peak MiB | memory vs {ref} | target |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for t in r["train"]:
        flops = f"{t['tflops']:.3f} | {t['mfu']:.1%}" + (f" ({t['mfu_spec']:.1%} of spec)" if t.get("mfu_spec") else "")
        ts = t.get("targets", {})
        notes = "; ".join(f"{k} {mark(v)}" + (f" {v['ratio']:.3f}x" if k == "baseline_vs_hf" else "")
                          for k, v in ts.items() if "limit" in v)
        lines.append(
            f"| {t['name']} | {t['params']:,} | {t['loss_init']:.5f} | {1e3 * t['median_s']:.1f} "
            f"[{1e3 * t['q25_s']:.1f}, {1e3 * t['q75_s']:.1f}] | {t['tokens_per_s']:,.0f} | {flops} | "
            f"{t['ratio']:.3f} [{t['ratio_q25']:.3f}, {t['ratio_q75']:.3f}] | "
            f"{t['cpu_ratio']:.3f} [{t['cpu_ratio_q25']:.3f}, {t['cpu_ratio_q75']:.3f}] | "
            + (f"{mib(t['mem_peak_bytes'])} | {t['mem_ratio']:.4f} | " if "mem_peak_bytes" in t else "- | - | ")
            + f"{notes} |")
    if r["memory_method"]:
        lines += ["", f"Peak memory = parameters + buffers + optimizer state + the step's peak allocation "
                      f"({r['memory_method']})."]
    inf = r.get("inference")
    if inf:
        lines += ["", f"Inference (forward only, no grad). Ratio: paired vs {inf['reference']}; median [IQR]. "
                      f"A plain Llama (no scale vectors) has {inf['plain_llama_params']:,} parameters; "
                      f"transformers counts {inf['hf_llama_params']:,} with its RMSNorm weights "
                      "(exported as ones).", "",
                  f"| model | params | forward ms, median [IQR] | tokens/s | vs {inf['reference']} | target |",
                  "|---|---:|---:|---:|---:|---|"]
        for row in inf["rows"]:
            ts = row.get("targets", {})
            notes = ""
            if ts:
                notes = f"forward {mark(ts['forward'])}; params {'= plain model' if ts['params']['met'] else 'MISSED'}"
            lines.append(f"| {row['name']} | {row['params']:,} | {1e3 * row['median_s']:.1f} "
                         f"[{1e3 * row['q25_s']:.1f}, {1e3 * row['q75_s']:.1f}] | {row['tokens_per_s']:,.0f} | "
                         f"{row['ratio']:.3f} "
                         f"[{row['ratio_q25']:.3f}, {row['ratio_q75']:.3f}] | {notes} |")
    return "\n".join(lines)


def format_generate_report(r: dict) -> str:
    """The ``bench_generate`` results as a markdown table: tokens/s each way and scalevec's ratios."""
    lines = [f"greedy generation, preset {r['preset']}: {r['new_tokens']} new tokens after {r['prompt_len']}, "
             f"{r['threads']} thread(s), median of {r['rounds']} rounds of CPU time; {r['cpu']}, torch {r['torch']}, "
             f"transformers {r['transformers']}",
             "",
             "| strategy | export | scalevec generate tok/s | HF generate() tok/s | reference loop tok/s "
             "| scalevec / HF | scalevec / loop |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for name, row in r["strategies"].items():
        lines.append(f"| {name} | {row['format']} | {row['scalevec']['tokens_per_s']:.0f} | "
                     f"{row['hf']['tokens_per_s']:.0f} | {row['loop']['tokens_per_s']:.0f} | {row['vs_hf']:.2f}x | "
                     f"{row['vs_loop']:.2f}x |")
    return "\n".join(lines)
