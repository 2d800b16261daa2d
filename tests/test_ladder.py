"""The model ladder's switches: its init regime (DESIGN.md §2), warmup as a share of the run, the scale-vector lr
multiplier, DP without q/k output scales, and the seeds a target interval needs."""

from __future__ import annotations

import math
import sys

import pytest
import torch

from scalevec.config import ModelConfig, OptimConfig, ScaleConfig, ScheduleConfig
from scalevec.config.presets import LADDER_INIT_WIDTH, PRESETS, get_preset
from scalevec.experiments import stats
from scalevec.model.params import SCALE_ROLES
from scalevec.model.transformer import build_model
from scalevec.resolve import resolve_config
from scalevec.training.optim import param_groups
from scalevec.training.schedule import lr_multiplier

LADDER = [name for name in PRESETS if name.startswith(("cpu-", "moe-cpu-"))]
REGIME = 0.02 * math.sqrt(LADDER_INIT_WIDTH)  # the 0.12B model's std·√d_model (0.506)


def test_every_ladder_rung_starts_in_the_012b_models_init_regime():
    """std·√d_model is the 0.12B model's on every CPU-ladder preset, and its own at llama-0.12b."""
    assert len(LADDER) >= 8
    for name in LADDER:
        m = get_preset(name)
        assert m.weight_std * math.sqrt(m.d_model) == pytest.approx(REGIME, rel=1e-12), name
    paper = get_preset("llama-0.12b")
    assert paper.init_width is None and paper.weight_std * math.sqrt(paper.d_model) == pytest.approx(REGIME)
    for name in ("tiny", "small", "medium", "llama-1b", "moe-tiny"):  # tests, golden losses and the paper keep 0.02
        assert get_preset(name).weight_std == 0.02, name


def test_built_weights_have_the_width_scaled_std():
    """The embedding and q weights are drawn at weight_std, W_o at weight_std/√(2·n_layers) (cpu-10k: 0.113)."""
    cfg = resolve_config("cpu-10k", "baseline")
    model = build_model(cfg.model, cfg.scale, seed=0)
    params = dict(model.named_parameters())
    expected = 0.02 * math.sqrt(640 / 20)
    emb = params["embed.weight"]
    # a sample std of n draws is within 4/√(2n) relative of the true std with overwhelming probability
    assert emb.std().item() == pytest.approx(expected, rel=4 / math.sqrt(2 * emb.numel()))
    o = next(p for n, p in params.items() if n.endswith("attn.o.weight"))
    assert o.std().item() == pytest.approx(expected / math.sqrt(2 * 2), rel=4 / math.sqrt(2 * o.numel()))


def test_init_width_null_restores_the_fixed_init_bitwise():
    """``model.init_width=null`` on a rung gives the same weights as init_std 0.02 at every width."""
    a = resolve_config("cpu-25k", "unified", {"model.init_width": None})
    b = ModelConfig(**{**{f: getattr(a.model, f) for f in ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff",
                                                            "vocab_size", "max_seq_len")}, "head_dim": 16})
    ma, mb = build_model(a.model, a.scale, seed=3), build_model(b, a.scale, seed=3)
    for (na, pa), (nb, pb) in zip(ma.named_parameters(), mb.named_parameters()):
        assert na == nb and torch.equal(pa, pb), na


@pytest.mark.parametrize("bad", [0, -640, 1.5, "wide", True])
def test_bad_init_width_is_a_one_line_error(bad):
    with pytest.raises(ValueError, match="model.init_width"):
        resolve_config("cpu-10k", "baseline", {"model.init_width": bad})


def test_warmup_frac_replaces_warmup_steps():
    """warmup_frac 0.05 of 1054 steps = 53: the peak is reached at step 52, and warmup (50) is ignored."""
    cfg = ScheduleConfig(warmup=50, warmup_frac=0.05)
    assert cfg.warmup_steps(1054) == 53 and cfg.warmup_steps(10) == 1 and ScheduleConfig().warmup_steps(10) == 50
    assert lr_multiplier(51, 1054, cfg) < 1.0 and lr_multiplier(52, 1054, cfg) == 1.0
    assert lr_multiplier(0, 1054, cfg) == pytest.approx(1 / 53)
    with pytest.raises(ValueError, match="warmup_frac"):
        ScheduleConfig(warmup_frac=1.0).validate()


def test_scale_lr_mult_multiplies_only_the_scale_groups():
    cfg = resolve_config("cpu-10k", "unified", {"scale.lr_mult": 0.25, "optim.lr": 0.04})
    model = build_model(cfg.model, cfg.scale, seed=0)
    groups = param_groups(model, cfg.optim, cfg.scale)
    assert {g.role for g in groups} & set(SCALE_ROLES)
    for g in groups:
        assert g.lr == (0.04 * 0.25 if g.role in SCALE_ROLES else 0.04), g.role
    plain = param_groups(model, OptimConfig(lr=0.04), ScaleConfig.preset("unified"))
    assert all(g.lr == 0.04 for g in plain)
    with pytest.raises(ValueError, match="scale.lr_mult"):
        resolve_config("cpu-10k", "unified", {"scale.lr_mult": 0})


def test_dp_without_qk_output_scales_builds_none_on_q_and_k():
    """``scale.dual_sites=[v, gate, up]`` (a suspect inside unified as a switch): no output scale on q or k, v's
    kept."""
    cfg = resolve_config("cpu-10k", "unified", {"scale.dual_sites": ["v", "gate", "up"]})
    names = [n for n, _ in build_model(cfg.model, cfg.scale, seed=0).named_parameters()]
    assert not [n for n in names if ".q.out_scale" in n or ".k.out_scale" in n]
    assert [n for n in names if ".v.out_scale" in n] and [n for n in names if ".gate.out_scale" in n]
    full = [n for n, _ in build_model(*(lambda c: (c.model, c.scale))(resolve_config("cpu-10k", "unified")),
                                      seed=0).named_parameters()]
    assert [n for n in full if ".q.out_scale" in n]  # the default unified has them


def test_seeds_for_halfwidth_matches_the_t_interval():
    """The returned n is the first whose planned half-width t·sd/√n is at most the target."""
    from scipy import stats as st

    diffs = [0.01, -0.03, 0.02, 0.04, -0.01]
    sd = torch.tensor(diffs, dtype=torch.float64).std().item()
    n = stats.seeds_for_halfwidth(diffs, 0.015)
    half = lambda k: st.t.ppf(0.975, k - 1) * sd / math.sqrt(k)
    assert half(n) <= 0.015 < half(n - 1)
    assert stats.seeds_for_halfwidth(diffs, 1e-6, max_seeds=50) is None
    with pytest.raises(ValueError):
        stats.seeds_for_halfwidth([0.1], 0.015)


def test_fit_line_recovers_a_line_and_covers_it():
    """Exact points give the line; noisy points with their true se give an interval around the true slope."""
    from scalevec.experiments.stats import fit_line

    x = [4.0, 4.4, 4.9, 5.3, 5.7]
    exact = fit_line(x, [0.1 - 0.04 * v for v in x], [0.01] * 5)
    assert exact.slope == pytest.approx(-0.04, abs=1e-12) and exact.intercept == pytest.approx(0.1, abs=1e-12)
    y, lo, hi = exact.predict(7.77)
    assert y == pytest.approx(0.1 - 0.04 * 7.77) and lo < y < hi  # the se still give a band (chi2 < 1 not shrunk)
    rng = torch.Generator().manual_seed(0)
    covered = 0
    for _ in range(200):
        noisy = [0.1 - 0.04 * v + 0.01 * torch.randn(1, generator=rng).item() for v in x]
        lo, hi = fit_line(x, noisy, [0.01] * 5).slope_interval
        covered += lo < -0.04 < hi
    assert covered >= 180  # a 95 % interval (no less, being conservative): 190 expected, 180 is 2.9 sd below
    with pytest.raises(ValueError):
        fit_line([1.0, 1.0], [0.0, 1.0])


def test_predict_lr_follows_the_smaller_rungs_power_law():
    """Tuned lrs on a power law lr = c·N^-0.8 over 3 rungs predict the next rung's exactly; with fewer rungs the
    prior slope -1/2 runs through their geometric mean."""
    from reproduction.ladder import lr_grid, predict_lr

    pts = [(n, 3.0 * n ** -0.8) for n in (9660, 24672, 83280)]
    assert predict_lr(pts, 196672) == pytest.approx(3.0 * 196672 ** -0.8, rel=1e-9)
    assert predict_lr(pts[:1], 4 * 9660) == pytest.approx(pts[0][1] / 2)
    two = [(10_000, 0.04), (40_000, 0.01)]  # slope -1 between them; the prior gives 0.02 at their mean N 20,000
    assert predict_lr(two, 80_000) == pytest.approx(0.02 / 2)
    assert lr_grid(0.01) == [0.00707107, 0.01, 0.0141421] and len(lr_grid(0.02, steps=2)) == 5


def test_trend_reads_committed_rungs(tmp_path):
    """Δ rows in the ladder's results.csv -> a falling trend through exactly those rungs, with its interval."""
    from reproduction import ladder

    head = ("cell,strategy,tuned,best_value,at_grid_edge,seeds,val_loss_mean,val_loss_std,delta,ci_lo,ci_hi,"
            "non_embedding_params\n")
    for rung, d in (("cpu-10k", 0.03), ("cpu-25k", 0.02), ("cpu-80k", 0.0)):
        f = ladder.folder(tmp_path, rung, "kjv")
        f.mkdir(parents=True)
        n = ladder.non_embedding_params(rung)
        f.joinpath("results.csv").write_text(
            head + f"c,baseline,optim.lr,0.01,False,10,2.0,0.01,,,,{n}\n"
            f"c,unified,optim.lr,0.02,True,10,2.0,0.01,{d},{d - 0.01},{d + 0.01},{n}\n")
    rows = ladder.read_ladder(tmp_path)
    assert [r.rung for r in rows if r.strategy == "unified"] == ["cpu-10k", "cpu-25k", "cpu-80k"]
    assert rows[1].at_edge and rows[1].se == pytest.approx(0.01 / 2.2621571627, rel=1e-6)  # t(0.975, 9)
    t = ladder.trend(rows, "unified", "kjv")
    lo, hi = t.slope_interval
    assert lo < t.fit.slope < 0 < hi and [p[0] for p in t.points] == [r.n for r in rows if r.strategy == "unified"]
    assert ladder.trend(rows, "unified", "shakespeare") is None


def fake_rungs(results, corpus: str, k: dict[str, float], exponent: float, seeds: int) -> None:
    """cpu-10k and cpu-25k results.csv files whose tuned lr is ``k[strategy] · N^exponent`` (no Δ columns)."""
    from reproduction import ladder

    head = ("cell,strategy,tuned,best_value,at_grid_edge,seeds,val_loss_mean,val_loss_std,delta,ci_lo,ci_hi,"
            "non_embedding_params\n")
    for rung in ("cpu-10k", "cpu-25k"):
        f = ladder.folder(results, rung, corpus)
        f.mkdir(parents=True)
        n = ladder.non_embedding_params(rung)
        f.joinpath("results.csv").write_text(head + "".join(
            f"c,{s},optim.lr,{c * n ** exponent:.9g},False,{seeds},2.0,0.01,,,,{n}\n" for s, c in k.items()))


def test_ladder_plan_writes_a_study_around_the_predicted_lrs(tmp_path):
    """scripts/ladder_plan.py: per strategy, 3 lrs ×√2 around the smaller rungs' power law, a valid study file;
    --predicted-only gives one lr each and no tuning (seeds still grow unless --no-confirm); a rung with no smaller
    results is refused (exit 2)."""
    import subprocess
    import sys
    from pathlib import Path

    from reproduction import ladder

    from scalevec.config.files import load_yaml
    from scalevec.experiments.study import parse

    fake_rungs(tmp_path, "kjv", {"baseline": 3.0, "none": 2.0, "unified": 6.0}, -0.5, seeds=10)
    script = Path(__file__).resolve().parents[1] / "scripts" / "ladder_plan.py"
    out = tmp_path / "study.yaml"
    def run(*a):  # ladder_plan never overwrites its --out: each call writes a new file
        out.unlink(missing_ok=True)
        return subprocess.run([sys.executable, str(script), *a, "--results", str(tmp_path), "--out", str(out)],
                              capture_output=True, text=True)
    assert run("cpu-80k", "kjv").returncode == 0
    spec, plan, _ = parse(load_yaml(out))
    n = ladder.non_embedding_params("cpu-80k")
    assert plan.lr_grids["unified"][1] == pytest.approx(ladder.predict_lr(
        [(m, 6.0 * m ** -0.5) for m in map(ladder.non_embedding_params, ("cpu-10k", "cpu-25k"))], n), rel=1e-5)
    g = plan.lr_grids["baseline"]
    assert len(g) == 3 and g[1] / g[0] == pytest.approx(math.sqrt(2), rel=1e-5) == g[2] / g[1]
    assert plan.target_halfwidth == 0.015 and spec.base["preset"] == "cpu-80k"
    assert run("cpu-550k", "kjv", "--predicted-only").returncode == 0
    spec, plan, _ = parse(load_yaml(out))
    assert all(len(g) == 1 for g in plan.lr_grids.values()) and plan.max_extensions == 0
    assert plan.confirm_seeds == [2, 3, 4, 5] and plan.target_halfwidth == 0.015  # untuned, still seeded
    assert run("cpu-550k", "kjv", "--predicted-only", "--no-confirm").returncode == 0
    assert parse(load_yaml(out))[1].confirm_seeds == []
    bad = run("cpu-80k", "shakespeare")
    assert bad.returncode == 2 and "no smaller rung" in bad.stderr


@pytest.mark.slow  # 3 short real trainings
def test_gpu_ladder_smallest_rung_runs_on_cpu(tmp_path):
    """scripts/gpu_ladder.sh with DEVICE=cpu and a tiny budget trains the smallest GPU rung (cpu-1m) from the
    committed-style smaller rungs' lrs and reports it where reproduction.py's ladder reads it."""
    import subprocess
    from pathlib import Path

    from reproduction import ladder

    root = Path(__file__).resolve().parents[1]
    fake_rungs(tmp_path, "shakespeare", {"baseline": 0.6, "none": 0.5, "unified": 1.2}, -0.3, seeds=2)
    env = {**__import__("os").environ, "DEVICE": "cpu", "TPP": "0.02", "SEEDS": "1", "JOBS": "2", "PREDICTED_ONLY": "1",
           "VAL_TOKENS": "4096",
           "RESULTS": str(tmp_path), "PYTHON": sys.executable}
    r = subprocess.run(["bash", str(root / "scripts" / "gpu_ladder.sh"), "cpu-1m"], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    got = ladder.read_rung(ladder.folder(tmp_path, "cpu-1m", "shakespeare"), "cpu-1m", "shakespeare")
    assert set(got) == {"baseline", "none", "unified"} and got["baseline"].n == ladder.non_embedding_params("cpu-1m")
    spec = (ladder.folder(tmp_path, "cpu-1m", "shakespeare") / "study-ladder-cpu-1m-shakespeare.yaml").read_text()
    assert "batch_size: 64" in spec and "× 2.828" in spec  # the GPU batch and its √8 lr scaling
    assert all(r.seeds == 1 for r in got.values())


@pytest.mark.parametrize("bad", [{"min_lr_ratio": 1.5}, {"decay_frac": 0.0}])
def test_schedule_ratios_are_still_validated(bad):
    """Adding warmup_frac kept min_lr_ratio and decay_frac validated."""
    with pytest.raises(ValueError, match="min_lr_ratio"):
        ScheduleConfig(**bad).validate()
