"""``scalevec bench --generate``: greedy generation speed, ``scalevec generate`` against transformers
(docs/performance.md).

Per strategy, a random-init model is exported as ``scalevec export`` writes it (custom code where it cannot
fold) and loaded as ``scalevec generate`` loads an export; then three ways generate the same greedy tokens:
``scalevec generate`` (``hf.generate.hf_sample`` on the loaded export), transformers' own ``generate()``
called directly on the same loaded export, and the reference loop over our ``Transformer`` with its KV cache
(``hf.sampling.sample``, what ``scalevec generate`` ran before it used transformers' ``generate()``). They
must agree on the ids.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from scalevec import __version__
from scalevec.bench.candidates import strategy_config
from scalevec.config.presets import get_preset
from scalevec.data.tokenizer import load_tokenizer
from scalevec.hf.export import export_model
from scalevec.hf.generate import hf_sample, load_generator
from scalevec.hf.sampling import sample
from scalevec.model.flops import cpu_name
from scalevec.model.transformer import KVCache, Transformer, build_model

GENERATE_STRATEGIES = "baseline,unified,dnp"  # a foldable export (plain Llama) and two custom-code ones
GENERATE_WAYS = ("scalevec", "hf", "loop")  # scalevec generate, transformers generate() directly, the reference loop


def bench_generate(preset: str = "small", strategies: str | None = None, new_tokens: int = 200, prompt_len: int = 7,
                   rounds: int = 3, threads: int | None = 1, seed: int = 0,
                   log: Callable[[str], None] | None = None) -> dict:
    """Greedy generation speed on CPU of each strategy's random-init model of ``preset``, exported and loaded
    as the module docstring says: ``new_tokens`` greedy tokens after a ``prompt_len``-token prompt, ``rounds``
    times each way (``GENERATE_WAYS``, the order rotated every round), after one untimed warm-up each. Times
    are this process's CPU seconds (``time.process_time``): with one thread the compute generation costs,
    whatever else runs on a shared machine. Returns ``{"strategies": {name: {way: {tokens_per_s, median_s,
    times_s}, "vs_hf": ratio, "vs_loop": ratio, "format": ...}}, ...}``, the ratios being scalevec's speed
    over the other's, the median of the rounds'. Raises ``ValueError`` for an unknown preset or strategy, a
    bad size or a context too short for the prompt and the new tokens, and ``RuntimeError`` when the ways
    disagree.
    """
    say = log or (lambda _msg: None)
    cfg = get_preset(preset)
    names = [n.strip() for n in (strategies or GENERATE_STRATEGIES).split(",") if n.strip()]
    if new_tokens < 1 or prompt_len < 1 or rounds < 1:
        raise ValueError(f"--new-tokens {new_tokens} / --prompt-len {prompt_len} / --steps {rounds}: use 1 or more")
    if prompt_len + new_tokens > cfg.max_seq_len:
        # past the context every way reruns a cropped window: a different workload, not what this measures
        raise ValueError(f"--prompt-len {prompt_len} + --new-tokens {new_tokens} exceed preset {preset}'s context of "
                         f"{cfg.max_seq_len}; ask for fewer tokens")
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads {threads}: use 1 or more CPU threads")
        torch.set_num_threads(threads)
    prompt = torch.randint(0, cfg.vocab_size, (prompt_len,), generator=torch.Generator().manual_seed(seed)).tolist()
    results = {}
    with tempfile.TemporaryDirectory(prefix="scalevec-bench-generate-") as tmp:
        tok_dir = Path(tmp) / "tokenizer"
        load_tokenizer("bytes").save(tok_dir)  # the presets' byte vocabulary: no EOS, so all 200 tokens come
        for name in names:
            model = build_model(cfg, strategy_config(name), seed=seed).eval()
            out = export_model(model, Path(tmp) / name, tok_dir)
            row = _generate_row(name, model, load_generator(out), prompt, new_tokens, rounds)
            results[name] = row
            say(f"{name} ({row['format']}): " + "  ".join(f"{w} {row[w]['tokens_per_s']:.0f}" for w in GENERATE_WAYS)
                + " tokens/s")
    return {"mode": "generate", "preset": preset, "new_tokens": new_tokens, "prompt_len": prompt_len,
            "rounds": rounds, "threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": _transformers_version(), "cpu": cpu_name(), "scalevec": __version__, "strategies": results}


def _generate_row(name: str, model: Transformer, g, prompt: list[int], new_tokens: int, rounds: int) -> dict:
    """One strategy's row of ``bench_generate``: ``model`` and ``g`` (its export, loaded as ``scalevec
    generate`` loads it) timed each way. Raises ``RuntimeError`` when their greedy ids differ."""

    def loop(n: int) -> list[int]:
        def cached(x, cache):
            cache = cache if cache is not None else KVCache(model.cfg.n_layers)
            return model.decode(x, cache), cache
        return sample(model, prompt, n, temperature=0.0, context=model.cfg.max_seq_len, cached=cached)

    def hf(n: int) -> list[int]:
        x = torch.tensor([prompt])
        with torch.no_grad():
            y = g.model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                                 pad_token_id=g.pad_id)
        return y[0, len(prompt):].tolist()

    ways = {"scalevec": lambda n: hf_sample(g, prompt, n, temperature=0.0), "hf": hf, "loop": loop}
    ids = {w: fn(new_tokens) for w, fn in ways.items()}  # the warm-up, and the equality check
    if len({tuple(v) for v in ids.values()}) != 1 or len(ids["hf"]) != new_tokens:
        raise RuntimeError(f"{name}: greedy ids differ between {', '.join(ways)}: "
                           f"{ {w: v[:8] for w, v in ids.items()} }")
    times: dict[str, list[float]] = {w: [] for w in ways}
    order = list(ways)
    for r in range(rounds):
        for w in order[r % len(order):] + order[:r % len(order)]:  # rotated: no way always runs first
            t0 = time.process_time()
            ways[w](new_tokens)
            times[w].append(time.process_time() - t0)
    row = {w: {"median_s": statistics.median(ts), "tokens_per_s": new_tokens / statistics.median(ts), "times_s": ts}
           for w, ts in times.items()}
    # speed ratios taken round by round, then the median: load from other processes falls on both alike
    for other in ("hf", "loop"):
        row[f"vs_{other}"] = statistics.median(t / ts for t, ts in zip(times[other], times["scalevec"]))
    row["format"] = type(g.model).__name__
    return row


def _transformers_version() -> str:
    import transformers  # only when a generate bench runs: the export it loads needs transformers anyway

    return transformers.__version__
