"""train --init-from: a Hugging Face model or a parent run as the start of a new run (init_from.py).

Small random HF Llama models are written with ``save_pretrained`` (no hub); runs use the ``tiny`` preset
on bundled Shakespeare bytes for a few steps.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from scalevec.cli import main
from scalevec.experiments.figures import parent_curves
from scalevec.resolve import resolve_config
from scalevec.training.checkpoint.run_model import load_model
from scalevec.training.init_from import resolve
from scalevec.training.trainer import Trainer, train

TOL = 1e-5  # fp32 logits, two orders of the same operations (tests/test_hf_import.py)


def tiny_items(tmp_path, steps=6, **over):
    items = {"train.steps": steps, "train.batch_size": 4, "train.seq_len": 32, "train.eval_every": 2,
             "train.log_every": 1, "train.eval_batch_size": 8, "data.val_tokens": 2048, "schedule.warmup": 2,
             "data.cache_dir": str(tmp_path / "cache"), "train.ckpt_every": 2, **over}
    return [f"{k}={v}" for k, v in items.items()]


def _hf_config(tmp_path, hf_dir, strategy):
    from scalevec.training.init_from import base_sections

    init = resolve(hf_dir)
    cfg = resolve_config("small", strategy, tiny_items(tmp_path), base_sections(init, None, strategy, None))
    return init, cfg


@pytest.mark.parametrize("strategy", ["baseline", "hg", "unified_foldable"])
def test_trainer_starts_from_the_hf_function(tmp_path, hf_llama, strategy):
    """The trainer's model at step 0 computes the HF model's logits (a foldable strategy), shape from config.json."""
    hf_dir, hf = hf_llama
    init, cfg = _hf_config(tmp_path, hf_dir, strategy)
    assert cfg.model.head_dim == 16 and cfg.model.d_model == 32
    trainer = Trainer(cfg, tmp_path / "run", quiet=True, init=init)
    x = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (trainer.model(x) - hf(input_ids=x).logits).abs().max().item() <= TOL
    assert init.info["function_preserved"] and init.info["optimizer"].startswith("fresh")


def test_dnp_init_reports_loss_before_and_after(tmp_path, hf_llama, capsys):
    """Into DNP the start-up says the function changes and meta.json holds the step-0 loss before and after."""
    hf_dir, _ = hf_llama
    init, cfg = _hf_config(tmp_path, hf_dir, "unified")
    train(cfg, tmp_path / "run", quiet=True, init=init)
    assert "THE FUNCTION CHANGES" in capsys.readouterr().err
    info = json.loads((tmp_path / "run" / "meta.json").read_text())["init_from"]
    assert not info["function_preserved"] and info["kind"] == "hf" and info["family"] == "llama"
    assert info["loss_before"] != info["loss_after"] and 3 < info["loss_before"] < 8


@pytest.mark.slow
def test_branch_continue_reproduces_the_parent(tmp_path):
    """Branching at step 4 with the same config, the optimizer carried and the schedule continued gives the
    parent's steps 4-6 bitwise (the same state, data and lr as the parent had)."""
    parent = tmp_path / "parent"
    main(["train", "--preset", "tiny", "--strategy", "hg", "--out", str(parent), "--quiet", *tiny_items(tmp_path)])
    branch = tmp_path / "branch"
    main(["train", "--init-from", str(parent / "checkpoints" / "step_0000004"), "--schedule-from", "continue",
          "--out", str(branch), "--quiet"])
    rows = lambda run: [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    ours = [(r["step"], r.get("loss"), r.get("val_loss")) for r in rows(branch)]
    theirs = [(r["step"], r.get("loss"), r.get("val_loss")) for r in rows(parent) if r["step"] >= 4
              and not (r["kind"] == "eval" and r["step"] == 4)]
    assert ours == theirs and ours[0][0] == 4
    info = json.loads((branch / "meta.json").read_text())["init_from"]
    assert (info["step"], info["strategy"], info["optimizer"], info["weights"]) == (4, "hg", "carried", "as saved")
    assert info["run_dir"] == str(parent.resolve())
    # report draws the parent up to the branch point, at its own tokens (continue)
    (name, tokens, loss), = parent_curves([SimpleNamespace(path=branch)])
    evals = [r for r in rows(parent) if r["kind"] == "eval" and r["step"] <= 4]
    assert list(tokens) == [r["tokens"] for r in evals] and list(loss) == [r["val_loss"] for r in evals]
    assert "parent parent (hg) to step 4" == name


@pytest.mark.slow
def test_branch_into_another_strategy_keeps_the_function(tmp_path):
    """A parent run's final model converted into OR computes the parent's logits; the optimizer starts fresh."""
    parent = tmp_path / "parent"
    main(["train", "--preset", "tiny", "--strategy", "dp", "--out", str(parent), "--quiet", *tiny_items(tmp_path)])
    init = resolve(parent)
    from scalevec.training.init_from import base_sections

    cfg = resolve_config("tiny", "or", [], base_sections(init, None, "or", None))
    trainer = Trainer(cfg, tmp_path / "branch", quiet=True, init=init)
    _, model, _ = load_model(parent)
    x = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (trainer.model(x) - model(x)).abs().max().item() <= TOL
    assert init.info["weights"] == "converted" and init.info["optimizer"].startswith("fresh")
    assert cfg.train.steps == 6 and cfg.scale.param == "magdir"  # the parent's config, the new strategy


@pytest.mark.slow  # trains a parent run
def test_reset_optimizer(tmp_path, small_parent):
    """--reset-optimizer starts the branch with a fresh optimizer even when the parameters match."""
    assert main(["train", "--init-from", str(small_parent), "--reset-optimizer", "--out", str(tmp_path / "b"),
                 "--quiet"]) == 0
    assert json.loads((tmp_path / "b" / "meta.json").read_text())["init_from"]["optimizer"] == "reset"
    (_, tokens, _), = parent_curves([SimpleNamespace(path=tmp_path / "b")])
    assert tokens[-1] == 0 and tokens[0] < 0  # restart: the parent ends where the branch starts


@pytest.fixture(scope="module")
def small_parent(tmp_path_factory):
    """A finished 2-step tiny run."""
    tmp_path = tmp_path_factory.mktemp("parent")
    main(["train", "--preset", "tiny", "--out", str(tmp_path / "run"), "--quiet",
          *tiny_items(tmp_path, steps=2, **{"train.eval_every": 1})])
    return tmp_path / "run"


@pytest.mark.parametrize("args, message", [
    (["--init-from", "nowhere"], "does not exist"),
    (["--init-from", "HF", "--schedule-from", "continue"], "continue needs a scalevec run"),
    pytest.param(["--init-from", "PARENT", "--schedule-from", "continue", "--steps", "2"], "beyond it",
                 marks=pytest.mark.slow),  # trains the parent run
    (["--init-from", "HF", "--strategy", "baseline", "--seq-len", "32", "model.d_model=64"], "shape"),
    (["--init-from", "nowhere", "--resume"], "drop --init-from"),  # refused before the source is read
])
def test_init_from_errors_exit_2(tmp_path, hf_llama, request, capsys, args, message):
    """A missing source, continue from an HF model, too few steps, a changed shape, --resume: one line, exit 2."""
    parent = request.getfixturevalue("small_parent") if "PARENT" in args else None
    args = [str(hf_llama[0]) if a == "HF" else str(parent) if a == "PARENT" else a for a in args]
    out = tmp_path / "new"
    assert main(["train", *args, "--out", str(out), "--quiet", f"data.cache_dir={tmp_path / 'cache'}"]) == 2
    assert message in capsys.readouterr().err
    assert not (out / "config.yaml").exists()
