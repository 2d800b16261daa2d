"""The speed plumbing: FLOPs per token, the MFU peak, ``train.compile=auto``, the trainer's speed metrics,
and exact resume under compile (slow)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from scalevec import ScaleConfig, build_model, get_preset
from scalevec.config import MoEConfig, TrainConfig, normalize_compile
from scalevec.config.codec import from_dict
from scalevec.model.flops import flops_per_token, matmul_params_per_token, peak_flops
from scalevec.resolve import resolve_config
from scalevec.training.autocompile import CUDA_MIN_STEPS, resolve
from scalevec.training.trainer import train

MATMUL_ROLES = ("matrix", "lm_head", "router")


def counted_matmul_params(cfg) -> int:
    """Matmul parameters one token uses, counted from a built (meta) model: every matrix / LM head / router
    weight, less the routed experts a token is not sent to (the model's own ``inactive_params``)."""
    model = build_model(cfg, ScaleConfig.preset("baseline"), device="meta")
    roles = model.param_roles()
    total = sum(p.numel() for n, p in model.named_parameters() if roles[n] in MATMUL_ROLES)
    return total - sum(m.inactive_params() for m in model.modules() if hasattr(m, "inactive_params"))


@pytest.mark.parametrize("preset", ["tiny", "small", "medium"])
def test_matmul_params_match_the_model(preset):
    """The config formula counts exactly the matmul weights the model holds (dense presets)."""
    cfg = get_preset(preset)
    assert matmul_params_per_token(cfg) == counted_matmul_params(cfg)


def test_matmul_params_moe_counts_active_experts(make_cfg):
    """MoE: router + top_k routed + shared experts per token, first_dense blocks dense; equals the model's
    matmul weights less its inactive experts. A wrong expert count would be off by (E - k) · 3 d d_expert."""
    cfg = make_cfg(moe=MoEConfig(n_experts=4, top_k=2, d_expert=16, n_shared_experts=1, first_dense=1))
    assert matmul_params_per_token(cfg) == counted_matmul_params(cfg)


def test_flops_per_token_formula(make_cfg):
    """6 N + 12 · n_layers · seq_len · n_heads · head_dim (PaLM, appendix B), exactly."""
    cfg = make_cfg()
    n = matmul_params_per_token(cfg)
    assert flops_per_token(cfg, 16) == 6 * n + 12 * cfg.n_layers * 16 * cfg.n_heads * cfg.head_dim
    wide = dataclasses.replace(cfg, head_dim=16)  # explicit head_dim: attention width n_heads · 16, not d_model
    assert flops_per_token(wide, 16) - 6 * matmul_params_per_token(wide) == 12 * cfg.n_layers * 16 * cfg.n_heads * 16


def test_peak_flops_given_and_cached(tmp_path, monkeypatch):
    """train.peak_flops wins; otherwise the CPU matmul is measured once and then read from the cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert peak_flops(torch.device("cpu"), torch.float32, 1.5e12) == (1.5e12, "train.peak_flops")
    value, source = peak_flops(torch.device("cpu"), torch.float32)
    assert source == "measured" and 1e8 < value < 1e14  # any CPU core: 0.1 GFLOP/s .. 100 TFLOP/s
    cache = json.loads((tmp_path / "scalevec" / "matmul_peak.json").read_text())
    assert list(cache.values()) == [value]
    assert peak_flops(torch.device("cpu"), torch.float32) == (value, "measured (cached)")


def test_compile_values_and_auto_rule():
    """auto|true|false (YAML booleans of older runs too); auto: eager on CPU whatever the length, compiled
    on CUDA from CUDA_MIN_STEPS steps, eager under double backward."""
    assert normalize_compile(False) == "false" and normalize_compile(True) == "true"
    assert normalize_compile("On") == "true"
    with pytest.raises(ValueError, match="use auto, true or false"):
        normalize_compile("sometimes")
    assert resolve("auto", "cpu", 10 ** 9)[0] is False
    assert resolve("true", "cpu", 1)[0] is True and resolve("false", "cuda", 10 ** 9)[0] is False
    assert resolve("auto", "cuda", CUDA_MIN_STEPS)[0] is True
    assert resolve("auto", "cuda", CUDA_MIN_STEPS - 1)[0] is False
    assert resolve("auto", "cuda", 10 ** 9, double_backward=True)[0] is False
    old = from_dict(TrainConfig, {"compile": False})  # a config.yaml written before auto existed
    old.validate()
    assert old.compile == "false"


def tiny_run(tmp_path, steps=8, **over):
    items = {"train.steps": steps, "train.batch_size": 4, "train.seq_len": 32, "train.eval_every": steps,
             "train.log_every": 1, "train.eval_batch_size": 8, "data.val_tokens": 2048, "schedule.warmup": 2,
             "data.cache_dir": str(tmp_path / "cache"), **over}
    return resolve_config("tiny", "unified", [f"{k}={v}" for k, v in items.items()])


def rows(run, kind="train"):
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


@pytest.mark.slow  # trains
def test_train_rows_carry_speed_metrics(tmp_path):
    """Each train row: cpu_time (process seconds), flops_per_s = FLOPs/token · tokens / step_time, and
    mfu = flops_per_s / train.peak_flops; the summary has the median cpu_time and the compile decision."""
    cfg = tiny_run(tmp_path, steps=7, **{"train.peak_flops": 1e10})
    summary = train(cfg, tmp_path / "run", quiet=True)
    fpt = flops_per_token(cfg.model, cfg.train.seq_len)
    for r in rows(tmp_path / "run"):
        assert r["cpu_time"] > 0
        assert r["flops_per_s"] == pytest.approx(fpt * 4 * 32 / r["step_time"], rel=1e-12)
        assert r["mfu"] == pytest.approx(r["flops_per_s"] / 1e10, rel=1e-12)
    assert summary["compiled"] is False and summary["cpu_time_s"] > 0  # auto on CPU: eager


@pytest.mark.slow
def test_resume_is_exact_under_compile(tmp_path):
    """Compiled (train.compile=true): 8 steps straight equal 4 + resume + 4, bitwise (same compiled kernels)."""
    cfg = tiny_run(tmp_path, **{"train.compile": "true"})
    straight, split = tmp_path / "straight", tmp_path / "split"
    train(cfg, straight, quiet=True)
    train(cfg, split, stop_at=4, quiet=True)
    torch.compiler.reset()  # a fresh process would compile anew: do the same here
    train(cfg, split, resume=True, quiet=True)
    a, b = [r["loss"] for r in rows(straight)], [r["loss"] for r in rows(split)]
    assert len(a) == 8 and a == b
    assert [r["val_loss"] for r in rows(straight, "eval")] == [r["val_loss"] for r in rows(split, "eval")]


def test_bench_quiet_profiler_mfu_and_dense_twin(capfd):
    """``bench``: no ``USDT ... profiler_start`` lines from the memory pass (printed on fd 2 by kineto), an
    in-process matmul peak, MFU = achieved / peak per candidate, CPU-time ratios, and the ``dense-active``
    twin of an MoE preset doing the FLOPs of its active parameters (the router's aside)."""
    from scalevec.bench.candidates import dense_active
    from scalevec.bench.step import bench

    r = bench("moe-tiny", "baseline,dense-active", batch_size=2, seq_len=16, steps=1, warmup=1, inference=False,
              threads=1)
    err = capfd.readouterr().err
    assert "USDT" not in err and "profiler_start" not in err
    assert r["peak_tflops"] > 0 and r["peak_source"].startswith("measured")
    base, dense = r["train"]
    for row in r["train"]:
        assert row["mfu"] == pytest.approx(row["tflops"] / r["peak_tflops"])
        assert row["cpu_ratio"] > 0 and row["mem_peak_bytes"] > 0
    cfg = get_preset("moe-tiny")
    twin = dense_active(cfg)
    assert twin.moe is None and twin.d_ff == cfg.moe.d_expert * cfg.moe.top_k
    router = cfg.n_layers * cfg.d_model * cfg.moe.n_experts
    assert matmul_params_per_token(cfg) - matmul_params_per_token(twin) == router
    assert dense["flops_per_token"] == flops_per_token(twin, 16) and base["flops_per_token"] == flops_per_token(cfg, 16)
