"""Presets and ``scalevec info``: parameter counts by role, overhead, the paper's Llama-1B (DESIGN.md §3, §5, §11)."""

from __future__ import annotations

import json

import pytest
import torch

from scalevec import ScaleConfig, build_model, get_preset
from scalevec.cli import main
from scalevec.config import PRESET_NAMES
from scalevec.config.presets import PRESETS
from scalevec.info import info
from scalevec.model.params import count_params

STRATEGIES = PRESET_NAMES  # every strategy of the table
DENSE = [name for name, cfg in PRESETS.items() if cfg.moe is None]


def expected_scale_params(cfg, strategy: str) -> dict[str, int]:
    """Scale parameters by role, counted by hand from DESIGN.md §2-§3 for a dense model."""
    s = ScaleConfig.preset(strategy)
    if s.scale == "none":
        return {"input_scale": 0, "output_scale": 0, "scale_direction": 0}
    d, ff, hd = cfg.d_model, cfg.d_ff, cfg.head_dim
    kv = cfg.n_kv_heads * hd
    per_layer = []  # (size, role) of every scale vector in one block
    n_attn, n_mlp = (3, 2) if s.scale == "branch" else (1, 1)
    per_layer += [(d, "input_scale")] * (n_attn + n_mlp)
    if s.placement != "input":  # output-side s on q, k, v, gate, up; DNP's gate s is an Output-Norm scale
        gate_role = "output_scale" if s.placement == "dual_norm" else "input_scale"
        per_layer += [(d, "input_scale"), (kv, "input_scale"), (kv, "input_scale"), (ff, gate_role),
                      (ff, "input_scale")]
    if cfg.qk_norm:
        per_layer += [(hd, "output_scale")] * 2
    if cfg.layout == "peri":
        per_layer += [(d, "output_scale")] * 2
    vectors = per_layer * cfg.n_layers + [(d, "input_scale")]  # + the final norm before the LM head
    counts = {"input_scale": 0, "output_scale": 0, "scale_direction": 0}
    for size, role in vectors:
        if s.param == "direct":
            counts[role] += size
        else:  # OR/ER: one magnitude (β or b) with the vector's role, the direction α of full size
            counts[role] += 1
            counts["scale_direction"] += size
    return counts


def expected_params(cfg, strategy: str) -> int:
    """Total parameters by hand: embedding, LM head (untied), 4 attention and 3 SwiGLU matrices per block."""
    d, ff, kv = cfg.d_model, cfg.d_ff, cfg.n_kv_heads * cfg.head_dim
    matrices = cfg.n_layers * (2 * d * d + 2 * d * kv + 3 * d * ff)
    embed = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2)
    return embed + matrices + sum(expected_scale_params(cfg, strategy).values())


# every strategy of a preset is built on meta: 0.5-8 s a preset, so the fast loop checks one dense and one MoE
# preset (the hand counts are the same formulas at every size) and the whole suite every preset
FAST_PRESETS = ("tiny", "moe-tiny")


@pytest.mark.parametrize("preset", [p if p in FAST_PRESETS else pytest.param(p, marks=pytest.mark.slow)
                                    for p in PRESETS])
def test_info_every_preset_and_strategy(preset):
    """info() for every preset x strategy: the JSON keys, totals that add up by role and vs baseline, and
    (dense presets) total and per-role scale counts equal to the hand count of DESIGN.md §2-§3."""
    results = {strategy: info(preset, strategy) for strategy in STRATEGIES}
    base = results["baseline"]
    for strategy, r in results.items():
        json.dumps(r)  # JSON-serializable, as `info --json` prints it
        assert {"params", "scale_params", "scale_params_by_role", "overhead_params"} <= set(r)
        assert r["params"] == sum(r["params_by_role"].values()) == r["embedding_params"] + r["non_embedding_params"]
        assert r["scale_params"] == sum(r["scale_params_by_role"].values())
        assert all(r["params_by_role"].get(k, 0) == v for k, v in r["scale_params_by_role"].items())
        assert r["overhead_params"] == r["params"] - base["params"]
        assert r["overhead_share"] == pytest.approx(r["overhead_params"] / base["params"])
        if preset in DENSE:
            cfg = get_preset(preset)
            assert r["scale_params_by_role"] == expected_scale_params(cfg, strategy), strategy
            assert r["params"] == expected_params(cfg, strategy), strategy
    assert base["overhead_params"] == 0
    assert results["none"]["scale_params"] == 0
    assert results["none"]["overhead_params"] == -base["scale_params"]


@pytest.mark.parametrize("variant", [dict(), dict(qk_norm=True, tie_embeddings=True), dict(layout="peri")])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_tiny_gqa_counts_match_hand_formula(make_cfg, variant, strategy):
    """The hand count also holds with GQA, QK-norm, tied embeddings and peri, on a real (CPU) model."""
    cfg = make_cfg(**variant)
    model = build_model(cfg, ScaleConfig.preset(strategy))
    figures = count_params(model)
    assert figures["params"] == sum(p.numel() for p in model.parameters()) == expected_params(cfg, strategy)
    assert figures["scale_params_by_role"] == expected_scale_params(cfg, strategy)


@pytest.mark.parametrize("preset", ["tiny", "small", "medium"])
def test_cpu_preset_count_equals_sum_of_numel(preset):
    """A CPU preset built for real has info()'s parameter count, the sum of numel over its parameters."""
    model = build_model(get_preset(preset), ScaleConfig.preset("unified"), seed=0)
    assert info(preset, "unified")["params"] == sum(p.numel() for p in model.parameters())


@pytest.mark.slow  # a 1B model on meta: ~1 s
def test_llama_1b_is_the_papers_model():
    """llama-1b (DESIGN.md §11): d 1792, 22 layers, 28 heads, d_ff 4778, vocab 50304 untied;
    1,028,065,024 parameters with baseline, 80,640 of them scale vectors."""
    cfg = get_preset("llama-1b")
    shape = (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff, cfg.vocab_size, cfg.tie_embeddings)
    assert shape == (1792, 22, 28, 28, 4778, 50304, False)
    r = info("llama-1b", "baseline")
    assert r["params"] == 1_028_065_024
    assert r["scale_params"] == 80_640
    assert r["scale_params_by_role"] == {"input_scale": 80_640, "output_scale": 0, "scale_direction": 0}
    assert r["embedding_params"] == 2 * 50304 * 1792


@pytest.mark.slow  # builds every paper preset: ~4 s
def test_preset_sizes_match_their_names():
    """Paper presets total their documented size (presets.py table); CPU presets their ~non-embedding size."""
    documented = {"llama-0.12b": 0.123, "llama-0.25b": 0.244, "llama-0.5b": 0.483, "llama-1b": 1.028, "llama-2b": 2.015}
    for name, billions in documented.items():
        assert abs(info(name, "baseline")["params"] / 1e9 - billions) < 1e-3, name
    cpu = {"tiny": (0.15e6, 0.3e6), "small": (0.7e6, 1.3e6), "medium": (4e6, 6e6)}
    for name, (lo, hi) in cpu.items():
        assert lo <= info(name, "baseline")["non_embedding_params"] <= hi, name


def test_get_preset_returns_a_copy_and_names_unknown():
    """get_preset gives a fresh copy (editing it leaves PRESETS alone); an unknown name lists the presets."""
    cfg = get_preset("tiny")
    cfg.d_model = 999
    assert PRESETS["tiny"].d_model == 64
    with pytest.raises(ValueError, match=r"'llama-7b'.*llama-1b"):
        get_preset("llama-7b")


def test_info_builds_on_meta(monkeypatch):
    """info() allocates no parameter memory: every model it builds lives on the meta device."""
    devices = []
    real = build_model

    def spy(*args, **kwargs):
        model = real(*args, **kwargs)
        devices.append({p.device for p in model.parameters()})
        return model

    monkeypatch.setattr("scalevec.info.build_model", spy)
    info("llama-2b", "unified")
    assert devices and all(d == {torch.device("meta")} for d in devices)


def test_cli_info_json(capsys):
    """`scalevec info --json` exits 0 and prints the info() dict as JSON."""
    assert main(["info", "--preset", "tiny", "--strategy", "unified", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(json.dumps(info("tiny", "unified")))
    assert printed["scale_params_by_role"]["scale_direction"] > 0


def test_cli_info_table(capsys):
    """`scalevec info` (table) exits 0 and shows the total with thousands separators and the overhead."""
    assert main(["info", "--preset", "llama-1b", "--strategy", "baseline"]) == 0
    out = capsys.readouterr().out
    assert "1,028,065,024" in out and "80,640" in out and "overhead vs baseline" in out


@pytest.mark.parametrize("argv, named", [
    (["info", "--preset", "llama-7b"], "llama-7b"),
    (["info", "--preset", "tiny", "--strategy", "bogus"], "bogus"),
])
def test_cli_info_unknown_name_exits_2(capsys, argv, named):
    """An unknown preset or strategy exits with code 2 and a one-line error naming it and the choices."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err and "choose one of" in err
