"""Generation speed with and without the KV cache (docs/performance.md, "Generation"): tokens per second, side by side.

    .venv/bin/python benchmarks/generate_speed.py [--preset small --strategies unified,baseline --new-tokens 200
                                                   --threads 1 --hf]

For each strategy a freshly built (random-init, seed 0) model of ``--preset`` samples ``--new-tokens``
greedy tokens after a 7-token prompt (``--prompt-len``), through ``scalevec.hf.generate.sample``: once rerunning the
whole context every step (no cache, what ``scalevec generate --no-cache`` does), once with
``Transformer.decode`` and its KV cache. Both must give the same ids (checked). With ``--hf`` the model
is also exported (plain Llama family or the custom architecture) and timed through transformers'
``generate()`` with ``use_cache`` True/False. Prints a markdown table. Tokens per second of this
process's CPU time (one thread by default: wall-clock on a shared CPU box measures its load), one run
each after a 10-token warm-up.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from scalevec import ScaleConfig, build_model
from scalevec.config.presets import get_preset
from scalevec.hf.generate import sample
from scalevec.model.transformer import KVCache


def _timed(fn) -> tuple[list[int], float]:
    """``(fn(), seconds)``: this process's CPU time (``time.process_time``), not wall-clock, so that other
    work on a shared machine does not count; with one thread it is the compute the generation costs."""
    t0 = time.process_time()
    out = fn()
    return out, time.process_time() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--strategies", default="unified")
    p.add_argument("--new-tokens", type=int, default=200)
    p.add_argument("--prompt-len", type=int, default=7,
                   help="prompt bytes: '\\nROMEO:' (7) or that many of Shakespeare")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--hf", action="store_true", help="also time the exported model in transformers")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    cfg = get_preset(a.preset)
    if a.prompt_len == 7:
        prompt = list(b"\nROMEO:")
    else:
        from scalevec.data.documents import load_documents

        prompt = list(load_documents("shakespeare")[-1].encode("utf-8"))[:a.prompt_len]
    print(f"preset {a.preset} (d_model {cfg.d_model}, {cfg.n_layers} layers, max_seq_len {cfg.max_seq_len}), "
          f"{a.new_tokens} new tokens after {len(prompt)}, greedy, {a.threads} thread(s), torch {torch.__version__}\n")
    print("| strategy | path | no cache (tok/CPU-s) | KV cache (tok/CPU-s) | speed-up | same ids |")
    print("|---|---|---:|---:|---:|---|")
    for strategy in a.strategies.split(","):
        model = build_model(cfg, ScaleConfig.preset(strategy), seed=0).eval()
        t_plain, t_fast, same = time_scalevec(model, prompt, a.new_tokens)
        n = a.new_tokens
        print(f"| {strategy} | scalevec | {n / t_plain:.1f} | {n / t_fast:.1f} | {t_plain / t_fast:.1f}x | "
              f"{'yes' if same else 'NO'} |", flush=True)
        if a.hf:
            t_plain, t_fast, same, arch = time_transformers(model, prompt, n)
            print(f"| {strategy} | transformers ({arch}) | {n / t_plain:.1f} | {n / t_fast:.1f} | "
                  f"{t_plain / t_fast:.1f}x | {'yes' if same else 'NO'} |", flush=True)


def time_scalevec(model, prompt: list[int], n: int) -> tuple[float, float, bool]:
    """Seconds for ``n`` greedy tokens without and with the KV cache, and whether the ids agree."""
    cfg = model.cfg

    def cached(x, cache):
        cache = cache if cache is not None else KVCache(cfg.n_layers)
        return model.decode(x, cache), cache

    def run(k, use_cache):
        return sample(model, prompt, k, temperature=0.0, context=cfg.max_seq_len, cached=cached if use_cache else None)

    run(10, False), run(10, True)  # warm-up
    plain, t_plain = _timed(lambda: run(n, False))
    fast, t_fast = _timed(lambda: run(n, True))
    return t_plain, t_fast, plain == fast


def time_transformers(model, prompt: list[int], n: int) -> tuple[float, float, bool, str]:
    """As ``time_scalevec`` for the export of ``model`` through transformers' ``generate(use_cache=...)``."""
    from transformers import AutoModelForCausalLM

    from scalevec.hf.export import export_model

    with tempfile.TemporaryDirectory() as d:
        out = export_model(model, Path(d) / "hf")
        hf = AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=True).eval()
    x = torch.tensor([prompt])

    def gen(k, use_cache):
        with torch.no_grad():
            ids = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=k, min_new_tokens=k,
                              do_sample=False, use_cache=use_cache, pad_token_id=0)
        return ids[0, len(prompt):].tolist()

    gen(10, False), gen(10, True)
    plain, t_plain = _timed(lambda: gen(n, False))
    fast, t_fast = _timed(lambda: gen(n, True))
    return t_plain, t_fast, plain == fast, type(hf).__name__


if __name__ == "__main__":
    main()
