"""A forward pass on fixed tokens before any output (model/forward_check.py): a model whose weights are all finite
but overflow float32 (one matrix set to 3e38) is refused by `generate`, `eval`, `convert` and `export` in one line
naming the first non-finite layer, exit 2, and nothing is printed or written; `eval` never prints a non-finite
perplexity.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from scalevec.cli import main
from scalevec.model.transformer import build_model
from test_faults_inputs import one_line_error
from test_rundir_faults import rewrite_manifest, tiny_setup  # the fault suite's tiny run and its manifest helper

HUGE = 3e38  # finite in float32 (max 3.4e38); any sum of two such products overflows
HF_LAYER = "model.layers.1.mlp.down_proj"  # the matrix set to HUGE in the export
RUN_LAYER = "layers.1.mlp.down"  # the same matrix in the run's checkpoint


def overflow(file: Path, name: str) -> None:
    """Set the tensor ``name`` of the safetensors ``file`` to HUGE everywhere (every value finite)."""
    sd = load_file(file)
    sd[name].fill_(HUGE)
    save_file(sd, file, metadata={"format": "pt"})


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A finished tiny run, its export, and copies of both with one matrix overflowing."""
    env = tiny_setup(tmp_path_factory.mktemp("faults-forward"), "run")
    root, run = env["root"], env["run"]
    assert main(["export", str(run), "--out", str(root / "exp")]) == 0
    shutil.copytree(root / "exp", root / "bad_exp")
    overflow(root / "bad_exp" / "model.safetensors", f"{HF_LAYER}.weight")
    shutil.copytree(run, root / "bad_run")
    newest = sorted((root / "bad_run" / "checkpoints").glob("step_*"))[-1]
    overflow(newest / "model.safetensors", f"{RUN_LAYER}.weight")
    rewrite_manifest(newest)  # the damage passes the manifest: only the forward can tell
    (root / "t.txt").write_text("ROMEO: what light through yonder window breaks? It is the east.\n")
    return {**env, "exp": root / "exp", "bad_exp": root / "bad_exp", "bad_run": root / "bad_run",
            "text": root / "t.txt"}


def test_nonfinite_layer_names_the_first_module_that_overflows():
    """The hooks name the first module, in the order the forward ran, whose output is not finite."""
    from scalevec.config import ModelConfig, ScaleConfig
    from scalevec.model.forward_check import nonfinite_layer, probe_tokens

    model = build_model(ModelConfig(d_model=32, n_layers=3, n_heads=2, n_kv_heads=2, d_ff=64, vocab_size=64,
                                    max_seq_len=32), ScaleConfig())
    x = probe_tokens(64, 32)
    assert nonfinite_layer(model, x) is None
    with torch.no_grad():
        model.layers[1].mlp.proj.branches.up.weight.fill_(HUGE)  # its input is normalized: each sum overflows
    assert nonfinite_layer(model, x) == "layers.1.mlp.proj"  # the fused gate/up projection holding the branch
    assert model.training  # the mode is restored


def test_generate_refuses_an_overflowing_export_in_one_line(models, capsys):
    """`generate` of an export with one matrix at 3e38 exits 2 naming the layer and prints no text (it printed
    8 NUL bytes, exit 0)."""
    rc = main(["generate", str(models["bad_exp"]), "--prompt", "ROMEO:", "--max-new-tokens", "8",
               "--temperature", "0"])
    out = capsys.readouterr()
    assert rc == 2 and out.out == ""
    last = out.err.strip().splitlines()[-1]
    assert HF_LAYER in last and "non-finite" in last and "Traceback" not in out.err


def test_eval_text_refuses_an_overflowing_export_and_prints_no_score(models, capsys):
    """`eval --text` of the same export exits 2 naming the layer; no perplexity line is printed."""
    rc = main(["eval", str(models["bad_exp"]), "--text", str(models["text"])])
    out = capsys.readouterr()
    assert rc == 2
    assert "perplexity" not in out.out
    assert HF_LAYER in out.err.strip().splitlines()[-1]


def test_eval_never_prints_a_nonfinite_perplexity(models, capsys, monkeypatch):
    """Whatever the probe missed, a perplexity that is not finite is an error (exit 2), never printed with exit 0."""
    import scalevec.training.perplexity as ppl

    real = ppl.perplexity

    def overflowing(*args, **kwargs):
        out = real(*args, **kwargs)
        return {**out, "nats_per_token": float("inf"), "perplexity": float("inf"), "bits_per_byte": float("nan")}

    monkeypatch.setattr(ppl, "perplexity", overflowing)
    rc = main(["eval", str(models["exp"]), "--text", str(models["text"])])
    out = capsys.readouterr()
    assert rc == 2 and "perplexity inf" not in out.out
    assert "non-finite" in out.err.strip().splitlines()[-1]


@pytest.mark.parametrize("fmt", ["run", "hf"])
def test_convert_refuses_an_overflowing_source_and_writes_nothing(models, tmp_path, capsys, fmt):
    """`convert` of the export with one matrix at 3e38 exits 2 naming the layer; --out is not created."""
    out = tmp_path / "conv"
    argv = ["convert", str(models["bad_exp"]), "--strategy", "unified", "--out", str(out)]
    assert main(argv + (["--format", "hf", "--verify"] if fmt == "hf" else [])) == 2
    one_line_error(capsys, "layers.1.mlp.down", "non-finite")
    assert not out.exists()


@pytest.mark.parametrize("command", ["export", "generate"])
def test_a_run_whose_checkpoint_overflows_is_refused_naming_the_layer(models, tmp_path, capsys, command):
    """A run's checkpoint with one matrix at 3e38 (its manifest rewritten to match) is refused by `export
    --verify` and `generate` in one line naming the layer; the export is not written."""
    out = tmp_path / "exp"
    argv = {"export": ["export", str(models["bad_run"]), "--out", str(out), "--verify"],
            "generate": ["generate", str(models["bad_run"]), "--prompt", "ROMEO:", "--max-new-tokens", "4"]}[command]
    assert main(argv) == 2
    one_line_error(capsys, RUN_LAYER, "non-finite")
    assert not out.exists()


def test_the_probe_passes_a_healthy_model(models, capsys):
    """The check refuses nothing healthy: the tiny run's export generates and scores a finite perplexity."""
    assert main(["generate", str(models["exp"]), "--prompt", "ROMEO:", "--max-new-tokens", "4",
                 "--temperature", "0"]) == 0
    assert main(["eval", str(models["exp"]), "--text", str(models["text"])]) == 0
    assert "perplexity" in capsys.readouterr().out
