"""Sampling text from a run directory or an exported Hugging Face directory (DESIGN.md §10)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_model

from scalevec import RunConfig, ScaleConfig, build_model
from scalevec.cli import main
from scalevec.config.codec import save_yaml
from scalevec.data.tokenizer import load_tokenizer
from scalevec.hf.generate import generate_ids, generate_text, sample

V = 16


def _successor(tokens):
    """Fake logits (1, T, V): the last token's successor (t + 1) % V scores 5, its successor's successor 4."""
    last = tokens[0, -1]
    logits = torch.zeros(1, tokens.shape[1], V)
    logits[0, -1, (last + 1) % V] = 5.0
    logits[0, -1, (last + 2) % V] = 4.0
    return logits


@pytest.fixture
def model(make_cfg, perturb_scales):
    """A tiny dense model with a bytes vocabulary and non-trivial scales."""
    m = build_model(make_cfg(vocab_size=256), ScaleConfig.preset("unified_foldable"), seed=0)
    perturb_scales(m)
    return m


def _run_dir(path, model, strategy="unified_foldable"):
    """A run directory in the trainer's contract with a bytes tokenizer."""
    path.mkdir()
    save_yaml(RunConfig(strategy=strategy, model=model.cfg, scale=model.scfg), path / "config.yaml")
    ckpt = path / "checkpoints" / "step_0000005"
    ckpt.mkdir(parents=True)
    save_model(model, str(ckpt / "model.safetensors"))
    (path / "checkpoints" / "latest").write_text(ckpt.name)
    load_tokenizer("bytes").save(path / "tokenizer")
    (path / "DONE").write_text("")
    return path


def test_greedy_follows_the_argmax():
    """Temperature 0 picks the argmax every step: successor logits give prompt+1, +2, ... exactly."""
    assert sample(_successor, [3], max_new_tokens=5, temperature=0.0) == [4, 5, 6, 7, 8]


def test_greedy_tokens_are_the_models_argmax(model):
    """Greedy ids from our model equal the argmax of its teacher-forced logits at every generated position."""
    prompt = [83, 104, 97]
    new = sample(model, prompt, max_new_tokens=6, temperature=0.0, context=model.cfg.max_seq_len)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + new]))[0]
    assert new == logits[len(prompt) - 1:-1].argmax(-1).tolist()


def test_sampling_is_deterministic_for_a_seed(model):
    """The same seed gives the same ids; another seed gives other ids (near-uniform logits over 256 tokens)."""
    a = sample(model, [65], max_new_tokens=20, temperature=1.0, seed=7, context=16)
    b = sample(model, [65], max_new_tokens=20, temperature=1.0, seed=7, context=16)
    c = sample(model, [65], max_new_tokens=20, temperature=1.0, seed=8, context=16)
    assert a == b and a != c and len(a) == 20


def test_top_k_restricts_the_choices():
    """top_k=1 is greedy at any temperature; top_k=2 only ever picks the two best-scoring tokens."""
    assert sample(_successor, [0], 8, temperature=5.0, top_k=1, seed=1) == list(range(1, 9))
    ids = [0] + sample(_successor, [0], 40, temperature=5.0, top_k=2, seed=1)
    steps = {(b - a) % V for a, b in zip(ids, ids[1:])}
    assert steps == {1, 2}


def test_stops_at_eos():
    """Generation stops right after emitting the EOS id."""
    assert sample(_successor, [1], max_new_tokens=10, temperature=0.0, eos_id=4) == [2, 3, 4]


@pytest.mark.parametrize("kwargs", [dict(temperature=-1.0), dict(top_k=0), dict(max_new_tokens=-1)])
def test_bad_sampling_arguments_raise(kwargs):
    """Negative temperature or max_new_tokens, and top_k < 1, are ValueErrors."""
    args = dict(max_new_tokens=3, temperature=1.0) | kwargs
    with pytest.raises(ValueError):
        sample(_successor, [1], **args)


def test_run_and_export_generate_the_same_ids(tmp_path, model):
    """Greedy generation from the run directory and from its Hugging Face export gives the same ids."""
    import transformers  # noqa: F401  (a dev dependency: a missing one fails, never skips)
    run = _run_dir(tmp_path / "run", model)
    assert main(["export", str(run), "--out", str(tmp_path / "hf")]) == 0
    ours, _ = generate_ids(run, "Thou art", max_new_tokens=8, temperature=0.0)
    theirs, _ = generate_ids(tmp_path / "hf", "Thou art", max_new_tokens=8, temperature=0.0)
    assert ours == theirs and len(ours) == 8


def test_cli_generate_prints_prompt_and_continuation(tmp_path, model, capsys):
    """`scalevec generate RUN --prompt P` prints P followed by the sampled text; a bad path exits 2."""
    run = _run_dir(tmp_path / "run", model)
    args = ["generate", str(run), "--prompt", "Shall I", "--max-new-tokens", "5", "--seed", "3"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert first.startswith("Shall I") and len(first) > len("Shall I\n")
    assert main(args) == 0 and capsys.readouterr().out == first
    assert main(["generate", str(tmp_path / "nowhere"), "--prompt", "x"]) == 2
    assert "neither a scalevec run directory" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- KV cache

CACHE_CASES = [  # (strategy, model overrides): dense and MoE, pre and peri, QK-norm
    ("unified", {}),
    ("dnp", {"layout": "peri"}),
    ("unified", {"layout": "peri", "qk_norm": True}),
    ("baseline", {"qk_norm": True}),
    ("unified", {"moe": "moe"}),
]
# the fast loop runs the first (dense, pre) and the MoE case; the whole suite all of them
CACHE_PARAMS = [c if i in (0, len(CACHE_CASES) - 1) else pytest.param(*c, marks=pytest.mark.slow)
                for i, c in enumerate(CACHE_CASES)]


def _cache_model(make_cfg, perturb_scales, strategy, overrides):
    from scalevec import MoEConfig

    overrides = dict(overrides)
    if overrides.get("moe") == "moe":
        overrides["moe"] = MoEConfig(n_experts=4, top_k=2, d_expert=16)
    m = build_model(make_cfg(**overrides), ScaleConfig.preset(strategy), seed=0).eval()
    perturb_scales(m)
    return m


def test_causal_mask_lets_new_queries_see_every_cached_key():
    """2 new queries after 3 cached tokens: query 0 sees keys 0..3, query 1 keys 0..4 (not top-left 0..0, 0..1)."""
    from scalevec.model.transformer import causal_mask

    assert causal_mask(2, 5, torch.device("cpu")).tolist() == [[True, True, True, True, False], [True] * 5]
    assert torch.equal(causal_mask(4, 4, torch.device("cpu")), torch.ones(4, 4, dtype=torch.bool).tril())


@pytest.mark.parametrize("strategy, overrides", CACHE_PARAMS, ids=lambda c: str(c))
def test_decode_in_pieces_gives_the_forward_logits(make_cfg, perturb_scales, strategy, overrides):
    """Feeding a sequence as 5 + 1 + 1 + rest tokens through the KV cache gives forward()'s logits (fp32 rounding)."""
    from scalevec.model.transformer import KVCache

    m = _cache_model(make_cfg, perturb_scales, strategy, overrides)
    x = torch.randint(0, m.cfg.vocab_size, (2, m.cfg.max_seq_len), generator=torch.Generator().manual_seed(5))
    cache = KVCache(m.cfg.n_layers)
    with torch.no_grad():
        pieces = [m.decode(x[:, a:b], cache) for a, b in ((0, 5), (5, 6), (6, 7), (7, x.shape[1]))]
        full = m(x)
    assert len(cache) == x.shape[1]
    # same function, other matmul shapes: fp32 rounding only (~1e-7 observed), far below the logits' scale
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="max_seq_len"):
        m.decode(x[:, :1], cache)


@pytest.mark.parametrize("strategy, overrides", CACHE_PARAMS, ids=lambda c: str(c))
def test_cached_greedy_equals_uncached(make_cfg, perturb_scales, strategy, overrides):
    """Greedy ids with the KV cache equal the uncached path's, also past the context (16) where the cache is dropped."""
    from scalevec.model.transformer import KVCache

    m = _cache_model(make_cfg, perturb_scales, strategy, overrides)

    def cached(x, cache):
        cache = cache if cache is not None else KVCache(m.cfg.n_layers)
        return m.decode(x, cache), cache

    calls = []
    prompt, n = [3, 14, 15], 24  # 3 + 24 > 16: the last steps rerun the cropped window
    plain = sample(m, prompt, n, temperature=0.0, context=m.cfg.max_seq_len)
    with_cache = sample(lambda x: calls.append(x.shape[1]) or m(x), prompt, n, temperature=0.0,
                        context=m.cfg.max_seq_len, cached=cached)
    assert with_cache == plain and len(plain) == n
    assert calls and set(calls) == {m.cfg.max_seq_len}  # the uncached function only ran on full windows


def test_cached_sampling_is_the_uncached_sampling(model):
    """With temperature and top-k the cache changes nothing: the same seed draws the same ids."""
    from scalevec.model.transformer import KVCache

    def cached(x, cache):
        cache = cache if cache is not None else KVCache(model.cfg.n_layers)
        return model.decode(x, cache), cache

    args = dict(max_new_tokens=10, temperature=0.9, top_k=20, seed=4, context=model.cfg.max_seq_len)
    assert sample(model, [83, 104], cached=cached, **args) == sample(model, [83, 104], **args)


def test_cli_generate_no_cache_prints_the_same_greedy_text(tmp_path, model, capsys):
    """`generate --temperature 0` prints the same text with and without --no-cache."""
    run = _run_dir(tmp_path / "run", model)
    args = ["generate", str(run), "--prompt", "Shall I", "--max-new-tokens", "12", "--temperature", "0"]
    assert main(args) == 0
    cached = capsys.readouterr().out
    assert main([*args, "--no-cache"]) == 0
    assert capsys.readouterr().out == cached


# ------------------------------------------------------------------------- through transformers' generate()

GREEDY_CASES = ["unified_foldable", "unified", "dnp"]  # a foldable export (llama) and two custom-code ones


def _reference_greedy(model, prompt: str, n: int) -> list[int]:
    """Greedy ids from the reference loop over our Transformer with its KV cache (``sample``): what
    ``scalevec generate`` printed before it went through transformers."""
    from scalevec.data.tokenizer import start_token
    from scalevec.model.transformer import KVCache

    tok = load_tokenizer("bytes")
    ids = ([start_token(tok)] if start_token(tok) is not None else []) + tok.encode(prompt)

    def cached(x, cache):
        cache = cache if cache is not None else KVCache(model.cfg.n_layers)
        return model.decode(x, cache), cache

    return sample(model, ids, n, temperature=0.0, context=model.cfg.max_seq_len, eos_id=tok.eos_id, cached=cached)


@pytest.mark.parametrize("strategy", GREEDY_CASES)
def test_greedy_equals_the_reference_loop_from_run_and_export(tmp_path, make_cfg, perturb_scales, strategy):
    """Greedy ids through generate() equal the reference loop's, from the run directory (converted in memory)
    and from its export, with and without the cache; 3 + 24 tokens also cross the context of 16."""
    m = build_model(make_cfg(vocab_size=256), ScaleConfig.preset(strategy), seed=0).eval()
    perturb_scales(m)
    run = _run_dir(tmp_path / "run", m, strategy)
    assert main(["export", str(run), "--out", str(tmp_path / "hf")]) == 0
    custom = "auto_map" in (tmp_path / "hf" / "config.json").read_text()
    assert custom == (strategy != "unified_foldable")  # both kinds of export are covered
    for n in (8, 24):
        ref = _reference_greedy(m, "Thou", n)
        assert len(ref) == n
        for path in (run, tmp_path / "hf"):
            for use_cache in (True, False):
                ids, _ = generate_ids(path, "Thou", max_new_tokens=n, temperature=0.0, use_cache=use_cache)
                assert ids == ref, (path.name, n, use_cache)


def test_stop_string_truncates_the_output(tmp_path, model, capsys):
    """`--stop S` prints the greedy text up to and including the first S, and generates no further;
    a second --stop that comes earlier wins."""
    run = _run_dir(tmp_path / "run", model)
    args = ["generate", str(run), "--prompt", "Shall I", "--max-new-tokens", "30", "--temperature", "0"]
    assert main(args) == 0
    full = capsys.readouterr().out[len("Shall I"):-1]
    # the random model emits many invalid UTF-8 bytes (printed as U+FFFD): stop at printable ASCII ones
    ascii_at = [i for i, c in enumerate(full) if c.isascii() and c.isprintable() and full.index(c) == i]
    assert len(ascii_at) >= 2 and ascii_at[-1] > 0
    earlier, later = full[ascii_at[0]], full[ascii_at[-1]]
    assert main([*args, "--stop", later]) == 0
    assert capsys.readouterr().out == "Shall I" + full[:ascii_at[-1] + 1] + "\n"
    assert main([*args, "--stop", later, "--stop", earlier]) == 0
    assert capsys.readouterr().out == "Shall I" + full[:ascii_at[0] + 1] + "\n"
    new, _ = generate_ids(run, "Shall I", max_new_tokens=30, temperature=0.0, stop=[earlier])
    assert len(new) < 30  # generation ended there, not only the printed text


def test_repetition_penalty_changes_greedy_output_on_a_repeating_model(tmp_path, model, capsys):
    """The random model's greedy text repeats its tokens; --repetition-penalty 5 gives other, less repetitive
    ids, still greedy (the same on every call); 1 changes nothing."""
    run = _run_dir(tmp_path / "run", model)
    plain, _ = generate_ids(run, "Shall I", max_new_tokens=40, temperature=0.0)
    assert len(set(plain)) < len(plain)  # it repeats
    penalized, _ = generate_ids(run, "Shall I", max_new_tokens=40, temperature=0.0, repetition_penalty=5.0)
    assert penalized != plain and len(set(penalized)) > len(set(plain))
    assert generate_ids(run, "Shall I", max_new_tokens=40, temperature=0.0, repetition_penalty=1.0)[0] == plain
    args = ["generate", str(run), "--prompt", "Shall I", "--max-new-tokens", "40", "--temperature", "0"]
    assert main(args) == 0
    greedy_text = capsys.readouterr().out
    assert main([*args, "--repetition-penalty", "5"]) == 0
    assert capsys.readouterr().out != greedy_text


def test_top_p_restricts_the_choices(tmp_path, model, capsys):
    """A tiny --top-p keeps only the most likely token: hot sampling becomes greedy; --top-p 1 samples the
    full distribution (other text than greedy at temperature 5, and the same text for the same seed)."""
    run = _run_dir(tmp_path / "run", model)
    greedy = generate_text(run, "Shall I", max_new_tokens=20, temperature=0.0)
    assert generate_text(run, "Shall I", max_new_tokens=20, temperature=5.0, top_p=1e-6, seed=3) == greedy
    hot = generate_text(run, "Shall I", max_new_tokens=20, temperature=5.0, top_p=1.0, seed=3)
    assert hot != greedy and hot == generate_text(run, "Shall I", max_new_tokens=20, temperature=5.0, seed=3)
    args = ["generate", str(run), "--prompt", "Shall I", "--max-new-tokens", "20", "--temperature", "5"]
    assert main([*args, "--top-p", "1e-6"]) == 0
    assert capsys.readouterr().out == "Shall I" + greedy + "\n"


@pytest.mark.parametrize("flag, value, needle", [
    ("--top-p", "0", "--top-p=0.0 must be in (0, 1]"), ("--top-p", "1.5", "--top-p=1.5 must be in (0, 1]"),
    ("--top-p", "-0.1", "must be in (0, 1]"), ("--top-p", "nan", "must be in (0, 1]"),
    ("--repetition-penalty", "0", "--repetition-penalty=0.0 must be > 0"),
    ("--repetition-penalty", "-1", "must be > 0"), ("--stop", "", "--stop '' is empty"),
    ("--repetition-penalty", "inf", "must be > 0 and finite"), ("--temperature", "inf", "must be >= 0 and finite"),
])
def test_bad_generation_flags_are_one_line_errors(tmp_path, model, capsys, flag, value, needle):
    """top-p outside (0, 1], a penalty <= 0 or infinite, an infinite temperature and an empty stop string exit 2
    with one line on stderr."""
    run = _run_dir(tmp_path / "run", model)
    assert main(["generate", str(run), "--prompt", "x", "--temperature", "0", flag, value]) == 2
    captured = capsys.readouterr()
    assert needle in captured.err and len(captured.err.strip().splitlines()) == 1 and captured.out == ""


def test_bench_generate_reports_every_way_side_by_side(capsys):
    """`scalevec bench --generate` times scalevec generate, HF generate() and the reference loop on the same export
    for a foldable and a custom-code strategy (structure only: speed is measured, never asserted); too many
    tokens for the context is a one-line error."""
    import json

    from scalevec.bench.generate import GENERATE_WAYS

    args = ["bench", "--generate", "--preset", "tiny", "--strategies", "baseline,dnp", "--new-tokens", "4",
            "--steps", "1", "--json"]
    assert main(args) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["mode"] == "generate" and r["threads"] == 1 and list(r["strategies"]) == ["baseline", "dnp"]
    assert r["strategies"]["baseline"]["format"] == "LlamaForCausalLM"
    assert r["strategies"]["dnp"]["format"] == "ScalevecForCausalLM"
    for row in r["strategies"].values():
        assert all(row[w]["tokens_per_s"] > 0 and len(row[w]["times_s"]) == 1 for w in GENERATE_WAYS)
        assert row["vs_hf"] == pytest.approx(row["hf"]["times_s"][0] / row["scalevec"]["times_s"][0])
    assert main(["bench", "--generate", "--preset", "tiny", "--new-tokens", "500"]) == 2
    assert "exceed preset tiny's context of 256" in capsys.readouterr().err


def test_model_dir_kind_is_the_one_run_or_export_dispatch(tmp_path):
    """``rundir.model_dir_kind``: a run directory (config.yaml) is a run even beside a config.json, a config.json
    alone an export, anything else refused by one line naming both; generate's and eval's loaders ask it."""
    from scalevec.hf.evaluation import evaluate
    from scalevec.hf.generate import load_generator, load_text_model
    from scalevec.training import rundir

    run, hf, both, empty = (tmp_path / n for n in ("run", "hf", "both", "empty"))
    for d in (run, hf, both, empty):
        d.mkdir()
    (run / rundir.CONFIG).write_text("{}\n")
    (hf / "config.json").write_text("{}\n")
    (both / rundir.CONFIG).write_text("{}\n")
    (both / "config.json").write_text("{}\n")
    assert [rundir.model_dir_kind(d) for d in (run, hf, both)] == ["run", "hf", "run"]
    for missing in (empty, tmp_path / "nowhere"):
        with pytest.raises(FileNotFoundError, match=r"neither a scalevec run directory \(config.yaml\) nor an "
                                                    r"exported Hugging Face directory \(config.json\)"):
            rundir.model_dir_kind(missing)
    for load in (load_text_model, load_generator, lambda p: evaluate(p, ["x"], write=False)):
        with pytest.raises(FileNotFoundError, match="neither a scalevec run directory"):
            load(empty)


def guide_snippet(name: str) -> str:
    """The Python block of docs/guide.md that follows the line starting with ``name``."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "guide.md").read_text()
    after = text[text.index(name):]
    return after[after.index("```python\n") + len("```python\n"):after.index("\n```", after.index("```python"))]


def test_the_guides_loading_snippet_prints_what_generate_prints(tmp_path, make_cfg, perturb_scales, capsys,
                                                                 monkeypatch):
    """The guide's code for loading a plain export with transformers alone prints the text `scalevec generate`
    prints on the same export (it encoded the prompt without BOS and so continued another text)."""
    import transformers  # noqa: F401  (a dev dependency: a missing one fails, never skips)

    # a context that holds the prompt and the 40 new tokens: past it generate slides its window, the snippet not
    model = build_model(make_cfg(vocab_size=256, max_seq_len=64), ScaleConfig.preset("unified_foldable"), seed=0)
    perturb_scales(model)
    run = _run_dir(tmp_path / "run", model)
    assert main(["export", str(run), "--out", str(tmp_path / "hf" / "uf")]) == 0
    capsys.readouterr()
    assert main(["generate", str(tmp_path / "hf" / "uf"), "--prompt", "ROMEO:", "--max-new-tokens", "40",
                 "--temperature", "0"]) == 0
    ours = capsys.readouterr().out
    monkeypatch.chdir(tmp_path)  # the snippet loads "hf/uf"
    exec(guide_snippet("Loading it needs nothing from scalevec"), {})
    assert capsys.readouterr().out == ours
