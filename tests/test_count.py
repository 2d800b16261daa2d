"""``scalevec bench --count`` (bench/count.py): the kernels and bytes of a CUDA step, counted on meta tensors.

The count is checked by hand on modules small enough to derive (one RMSNorm and one linear map; a folded linear
map's fused ops), by its CUDA autocast rules, by a property of its per-block attribution (the same per block at any
depth), and through the CLI: its JSON, its one-line errors and its refusal to replace a file.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

from scalevec.bench.count import count, count_strategy, record_step
from scalevec.cli import main
from scalevec.config.presets import get_preset
from scalevec.model import kernels

N, D, M = 6, 8, 5  # tokens, d_in, d_out of the hand-checked module


def _meta(*shape, dtype=torch.float32, grad=True):
    return torch.empty(*shape, device="meta", dtype=dtype, requires_grad=grad)


def _norm_linear(x, w, W):
    return F.linear(F.rms_norm(x, (D,), w, 1e-6), W).sum()


def test_rms_norm_and_linear_counted_by_hand_in_float32():
    """RMSNorm + linear + sum, fp32: 5 memory-bound kernels and 3 matmuls with the bytes derived by hand."""
    x, w, W = _meta(N, D), _meta(D), _meta(M, D)
    ops = record_step(lambda: _norm_linear(x, w, W), None)
    names = [name for name, _ in ops]
    # forward: fused RMSNorm (one kernel on CUDA), mm, sum; backward: the seed of ones, mm ×2 (input, weight),
    # RMSNorm backward as CUDA runs it: one kernel for the input gradient, one for the weight gradient
    assert sorted(names) == sorted(["scalevec_count::rms_norm", "mm", "sum", "ones_like", "mm", "mm",
                                    "scalevec_count::rms_norm_backward_input",
                                    "scalevec_count::rms_norm_backward_weight"])
    by_name: dict[str, int] = {}
    for name, b in ops:
        by_name[name] = by_name.get(name, 0) + b
    f = 4  # bytes per fp32 element
    assert by_name["scalevec_count::rms_norm"] == f * (N * D + D) + f * (N * D + N)  # x, w -> y, rstd
    assert by_name["sum"] == f * N * M + f  # y -> loss
    assert by_name["ones_like"] == f  # writes the scalar seed, reads nothing
    # g (the gradient of x̂, from the mm), x, rstd, w -> grad x;  g, x, rstd -> grad w
    assert by_name["scalevec_count::rms_norm_backward_input"] == f * (N * D + N * D + N + D) + f * N * D
    assert by_name["scalevec_count::rms_norm_backward_weight"] == f * (N * D + N * D + N) + f * D
    # forward x̂ Wᵀ reads x̂ and W, writes y; backward: g W -> grad x̂ (g: the sum's gradient, one stored number
    # broadcast); gᵀ x̂ -> grad W
    assert by_name["mm"] == f * (N * D + M * D + N * M) + f * (1 + M * D + N * D) + f * (1 + N * D + M * D)


def test_fused_fold_is_one_kernel_each_way_counted_by_hand():
    """A folded linear map under bf16 autocast on the CUDA path (model/triton_fold.py) is counted through the fake
    implementations: one scalevec::fold_weight, one scalevec::fold_weight_backward and the one sum of the partials
    of ∂L/∂c, each with the bytes of its inputs and outputs derived from the shapes."""
    x, W, c, s = _meta(N, D), _meta(M, D), _meta(D), _meta(M)
    ops = record_step(lambda: kernels.folded_linear(x, W, c, s).sum(), torch.bfloat16)
    folds = [(name, b) for name, b in ops if name.startswith("scalevec::")]
    f, h = 4, 2  # bytes per fp32 / bf16 element
    # forward reads W, c, s and writes W' in bf16; backward reads ∂L/∂W' (bf16), W, c, s and writes ∂L/∂W, ∂L/∂s
    # and one program's row of ∂L/∂c partial sums (M = 5 rows: one program)
    assert folds == [("scalevec::fold_weight", f * (M * D + D + M) + h * M * D),
                     ("scalevec::fold_weight_backward", h * M * D + f * (M * D + D + M) + f * (M * D + M + D))]
    assert ops[-1] == ("sum", f * D + f * D)  # the partials (1, D) -> ∂L/∂c (D,), after the backward kernel


def test_autocast_casts_a_weight_once_and_an_activation_per_call():
    """Under CUDA's bf16 autocast, two linear maps of one weight cast the weight once (autocast's cache of leaf
    tensors) and the activation they read twice (no cache for non-leaves): 3 casts, as CUDA would launch."""
    x, W = _meta(N, D), _meta(M, D)

    def two_linears():
        u = x * 2  # a non-leaf activation, as a norm's output
        return (F.linear(u, W).float() + F.linear(u, W).float()).sum()

    casts = [b for name, b in record_step(two_linears, torch.bfloat16) if name == "_to_copy"]
    # each cast reads 4 or 2 bytes per element and writes the other: 6 per element. Forward: u twice and W once to
    # bf16, both y to fp32; backward: both y's gradients to bf16 (the sum's gradient: one stored number read),
    # u's two gradients and W's one (summed in bf16) to fp32. Without the cache W would be cast twice forward and
    # its gradient twice backward.
    u, w, y, gy = 6 * N * D, 6 * M * D, 6 * N * M, 4 + 2 * N * M
    assert sorted(casts) == sorted([u, u, w, y, y] + [gy, gy, u, u, w])


def test_autocast_reaches_inside_a_custom_autograd_function():
    """The model's own autograd Functions (kernels.folded_linear) see CUDA's autocast as on a GPU: their matmul runs
    in bf16 (it reads 2 bytes per element), though grad mode is off inside a Function's forward."""
    from scalevec.model.kernels import folded_linear

    x, W, c = _meta(N, D), _meta(M, D), _meta(D)
    ops = record_step(lambda: folded_linear(x * 2, W, c).float().sum(), torch.bfloat16)
    forward_mm = next(b for name, b in ops if name == "mm")
    assert forward_mm == 2 * (N * D + M * D + N * M)


def test_per_block_count_does_not_depend_on_depth():
    """A baseline block's kernels and bytes per token are the same in a 2-block and a 4-block model: the per-block
    figure is the block's own work, not a share of the embedding, head or loss. (``unified`` computes the whole
    model's γ once per step: that work is shared out among the blocks, so its per-block figure falls with depth.)"""
    cfg = get_preset("tiny")
    counts = [count_strategy("baseline", dataclasses.replace(cfg, n_layers=n), 2, 16, "bfloat16") for n in (2, 4)]
    assert counts[0]["kernels_per_block"] == counts[1]["kernels_per_block"]
    assert counts[0]["bytes_per_token"] == pytest.approx(counts[1]["bytes_per_token"], rel=1e-12)  # float division
    shared = [count_strategy("unified", dataclasses.replace(cfg, n_layers=n), 2, 16, "bfloat16") for n in (2, 4)]
    assert shared[1]["kernels_per_block"] < shared[0]["kernels_per_block"]


def test_the_part_outside_the_blocks_is_counted_on_a_fresh_model():
    """Kernels per step = n_layers × kernels per block + the kernels of the model built without blocks (embedding,
    head, loss), built afresh: a model that ran with its blocks keeps their groups of scale vectors and would
    count their γ as outside the blocks."""
    from torch import nn

    from scalevec import ScaleConfig, build_model
    from scalevec.bench.count import step_ops

    cfg = dataclasses.replace(get_preset("tiny"), n_layers=2)
    r = count_strategy("unified", cfg, 2, 16, "bfloat16")
    bare = build_model(cfg, ScaleConfig.preset("unified"), device="meta")
    bare.layers = nn.ModuleList()
    rest = len(step_ops(bare, torch.zeros(2, 17, dtype=torch.long, device="meta"), torch.bfloat16))
    assert r["kernels_per_step"] == pytest.approx(2 * r["kernels_per_block"] + rest, abs=1e-9)


def test_count_json_schema(tmp_path, capsys):
    """--json FILE holds kernels_per_block and bytes_per_token per strategy, the per-operator breakdown adding up to
    them, and the tables are printed; the reference's ratios are 1."""
    out = tmp_path / "count.json"
    assert main(["bench", "--count", "--preset", "tiny", "--strategies", "baseline,unified", "--seq-len", "16",
                 "--json", str(out)]) == 0
    assert "bench --count: tiny, bfloat16" in capsys.readouterr().out
    r = json.loads(out.read_text())
    assert set(r["kernels_per_block"]) == set(r["bytes_per_token"]) == {"baseline", "unified"}
    assert (r["dtype"], r["batch_size"], r["seq_len"], r["path"]) == ("bfloat16", 16, 16, "cuda")
    for row in r["strategies"]:
        assert row["kernels_per_block"] == sum(v["kernels"] for v in row["per_op"].values())
        assert row["bytes_per_token"] == pytest.approx(
            sum(v["bytes_per_token"] for v in row["per_op"].values() if not v["matmul"]), rel=1e-12)
        assert row["kernels_per_block"] > row["matmul_kernels_per_block"] >= 7  # at least the 7 forward matmuls
    assert r["strategies"][0]["kernels_ratio"] == r["strategies"][0]["bytes_ratio"] == 1.0


@pytest.mark.parametrize("argv, words", [
    (["--strategies", "baseline,nope"], "unknown candidate 'nope' in --strategies"),
    (["--strategies", "baseline,hf-llama"], "--count counts scalevec strategies"),
    (["--dtype", "float16"], "argument --dtype: invalid choice: 'float16'"),
    (["--generate"], "--count and --generate are two different benchmarks"),
    (["--batch-size", "0"], "--batch-size 0 / --seq-len 256: use a batch >= 1"),
    (["--seq-len", "0"], "--batch-size 16 / --seq-len 0: use a batch >= 1"),
    (["--compile"], "does not use --compile; drop it"),
    (["--device", "cuda", "--steps", "3"], "does not use --steps, --device; drop them"),
])
def test_count_bad_input_is_one_line_exit_2(argv, words, capsys):
    """An unknown strategy, a candidate that is not a strategy, a bad dtype, --generate too, a batch or sequence
    length of 0 (never read as the default), or a flag --count does not read (--compile: never ignored silently):
    one line, exit 2."""
    try:
        code = main(["bench", "--count", "--preset", "tiny", *argv])
    except SystemExit as e:  # argparse's own refusals (a --dtype outside its choices) exit from the parser
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and words in err and err.count("\n") == 1


@pytest.mark.parametrize("flag", ["--json", "--save"])
def test_count_refuses_to_replace_a_file_unless_told(flag, tmp_path, capsys):
    """--json FILE / --save FILE on an existing file: exit 2 before any work, the file untouched; --overwrite
    replaces it with the count."""
    out = tmp_path / "count.json"
    out.write_text("precious")
    argv = ["bench", "--count", "--preset", "tiny", "--strategies", "baseline", "--seq-len", "8", flag, str(out)]
    assert main(argv) == 2
    assert capsys.readouterr().err == (f"scalevec bench: error: {flag} {out} already exists; pass --overwrite to "
                                       f"replace it, or choose another file\n")
    assert out.read_text() == "precious"
    assert main([*argv, "--overwrite"]) == 0
    assert json.loads(out.read_text())["kernels_per_block"].keys() == {"baseline"}


def test_count_of_the_papers_smallest_shape_runs_and_meets_the_targets():
    """At llama-0.12b bf16 (the paper's smallest shape) the count runs on meta tensors, and the CUDA path (DNP's SwiGLU
    and the fold fused, model/triton_dnp.py and model/triton_fold.py, counted through their fake implementations) is
    within its targets: unified <= 1.30x the baseline's kernels per block and <= 1.10x its bytes per token,
    unified_foldable <= 1.25x and <= 1.05x (figures: docs/performance.md)."""
    r = count("llama-0.12b", "baseline,unified,unified_foldable", dtype="bfloat16")
    k, b = r["kernels_per_block"], r["bytes_per_token"]
    assert k["unified"] <= 1.30 * k["baseline"] and b["unified"] <= 1.10 * b["baseline"]
    assert k["unified_foldable"] <= 1.25 * k["baseline"] and b["unified_foldable"] <= 1.05 * b["baseline"]
