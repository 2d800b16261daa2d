"""The trainer (DESIGN.md §8): loss normalization, exact resume, run directory, guards, CLI errors."""

import json
import math

import pytest
import torch

from scalevec import ScaleConfig, build_model
from scalevec.cli import main
from scalevec.model.params import count_params
from scalevec.resolve import resolve_config
from scalevec.training.checkpoint.run_model import load_model
from scalevec.training.step import accumulate_gradients
from scalevec.training.trainer import Trainer, TrainingDiverged, train


def tiny_run(tmp_path, strategy="baseline", steps=10, **over):
    """A seconds-long config: tiny preset, bundled Shakespeare as bytes, small validation set."""
    items = {"train.steps": steps, "train.batch_size": 4, "train.seq_len": 32, "train.eval_every": 5,
             "train.log_every": 1, "train.eval_batch_size": 8, "data.val_tokens": 2048, "schedule.warmup": 2,
             "data.cache_dir": str(tmp_path / "cache"), **over}
    return resolve_config("tiny", strategy, [f"{k}={v}" for k, v in items.items()])


def read_metrics(run, kind="train"):
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    return [r for r in rows if r["kind"] == kind]


def test_loss_normalized_over_global_batch(make_cfg):
    """Two micro-batches with 2 and 6 valid targets give the loss and gradients of one batch with all 8."""
    cfg = make_cfg()
    torch.manual_seed(0)
    x = torch.randint(0, cfg.vocab_size, (2, 8))
    y = torch.randint(0, cfg.vocab_size, (2, 8))
    y[0, 2:] = -100  # 2 valid targets in row 0
    y[1, :2] = -100  # 6 valid targets in row 1
    split = build_model(cfg, ScaleConfig.preset("unified"), seed=0)
    whole = build_model(cfg, ScaleConfig.preset("unified"), seed=0)
    loss_split, _ = accumulate_gradients(split, [(x[:1], y[:1]), (x[1:], y[1:])])
    loss_whole, _ = accumulate_gradients(whole, [(x, y)])
    ce, n, _ = build_model(cfg, ScaleConfig.preset("unified"), seed=0)(x, y)
    assert n == 8
    torch.testing.assert_close(loss_split, loss_whole, rtol=1e-6, atol=0)
    torch.testing.assert_close(loss_whole, ce / 8, rtol=1e-6, atol=0)
    # Same terms summed in another order: fp32 rounding only. Per-element tolerances fail on gradients that
    # are exactly zero in theory (unified's scale directions), so compare each tensor against the size of
    # the whole gradient; a wrong normalization would be off by 25-75 %.
    scale = torch.cat([p.grad.flatten() for p in whole.parameters()]).norm()
    for (name, a), (_, b) in zip(split.named_parameters(), whole.named_parameters()):
        assert (a.grad - b.grad).norm() <= 1e-5 * scale, name


@pytest.mark.slow  # four tiny trainings
def test_resume_is_bitwise_exact(tmp_path):
    """10 steps straight equal 5 steps + resume + 5 steps, bitwise, on CPU (AdamW and Muon)."""
    for opt in ("adamw", "muon"):
        cfg = tiny_run(tmp_path, "unified", **{"optim.name": opt})
        straight = tmp_path / f"straight-{opt}"
        train(cfg, straight, quiet=True)
        split = tmp_path / f"split-{opt}"
        assert train(cfg, split, stop_at=5, quiet=True) == {"stopped_at": 5}
        assert not (split / "DONE").exists()
        train(cfg, split, resume=True, quiet=True)
        a = [r["loss"] for r in read_metrics(straight)]
        b = [r["loss"] for r in read_metrics(split)]
        assert len(a) == len(b) == 10
        assert a == b
        assert ([r["val_loss"] for r in read_metrics(straight, "eval")]
                == [r["val_loss"] for r in read_metrics(split, "eval")])


def test_run_directory_contents(tmp_path):
    """A finished run holds config, meta, group table, metrics with scale stats, summary, tokenizer, DONE."""
    run = tmp_path / "run"
    summary = train(tiny_run(tmp_path, "hg", steps=6), run, quiet=True)
    for name in ("config.yaml", "meta.json", "optim_groups.txt", "metrics.jsonl", "summary.json", "DONE"):
        assert (run / name).is_file(), name
    assert (run / "tokenizer").is_dir()
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == list(range(6))
    assert {"lr", "loss", "grad_norm", "tok_per_s", "tokens"} <= set(rows[0])
    scales = rows[-1]["scales"]
    assert any("in_scale" in k for k in scales)
    fields = {"role", "mean", "std", "min", "max", "rms", "grad_norm", "update_norm"}
    assert all(set(v) == fields for v in scales.values())
    layers = set(rows[-1]["grad_norms"]) - {"embed", "head.branches.lm_head"}  # per-layer matrix grad norms
    assert layers == {f"layers.{i}" for i in range(len(layers))} and len(layers) >= 2
    on_disk = json.loads((run / "summary.json").read_text())
    assert on_disk["final_val_loss"] == summary["final_val_loss"] == read_metrics(run, "eval")[-1]["val_loss"]
    assert on_disk["tokens"] == 6 * 4 * 32
    # bytes tokenizer: bits-per-byte is nats/token divided by ln 2
    assert summary["final_val_bpb"] == pytest.approx(summary["final_val_loss"] / math.log(2), rel=1e-9)
    cfg, model, _ = load_model(run)
    assert cfg.strategy == "hg" and count_params(model)["params"] == summary["params"]


@pytest.mark.slow  # 40 training steps
def test_training_lowers_the_loss(tmp_path):
    """40 steps on Shakespeare lower the validation loss well below the uniform ln(256) = 5.55 nats."""
    summary = train(tiny_run(tmp_path, "baseline", steps=40, **{"optim.lr": 1e-2}), tmp_path / "r", quiet=True)
    assert summary["final_val_loss"] < 3.5


@pytest.mark.slow  # trains and resumes
def test_existing_run_is_never_overwritten(tmp_path):
    """A second run into the same directory is refused unless --resume or --overwrite; the first is intact."""
    run = tmp_path / "run"
    cfg = tiny_run(tmp_path, steps=2)
    train(cfg, run, quiet=True)
    before = (run / "metrics.jsonl").read_text()
    with pytest.raises(FileExistsError, match="--resume.*--overwrite"):
        train(cfg, run, quiet=True)
    assert (run / "metrics.jsonl").read_text() == before
    train(cfg, run, overwrite=True, quiet=True)
    assert (run / "DONE").is_file()


def test_resume_with_different_config_is_refused(tmp_path):
    """Resuming with a changed config would silently mix two runs; it is an error."""
    run = tmp_path / "run"
    train(tiny_run(tmp_path, steps=4), run, stop_at=2, quiet=True)
    with pytest.raises(ValueError, match="differs"):
        train(tiny_run(tmp_path, steps=4, **{"optim.lr": 1e-2}), run, resume=True, quiet=True)


@pytest.mark.slow  # trains and resumes
def test_non_finite_loss_stops_and_keeps_last_checkpoint(tmp_path, monkeypatch):
    """A NaN loss stops the run with TrainingDiverged; the last good checkpoint stays loadable."""
    run = tmp_path / "run"
    trainer = Trainer(tiny_run(tmp_path, steps=6, **{"train.ckpt_every": 2}), run, quiet=True)
    real = trainer.model.forward
    calls = {"n": 0}

    def poisoned(tokens, targets=None):
        calls["n"] += 1
        out = real(tokens, targets)
        if targets is not None and calls["n"] > 3:
            return out[0] * float("nan"), out[1], out[2]
        return out

    monkeypatch.setattr(trainer.model, "forward", poisoned)
    with pytest.raises(TrainingDiverged, match="step 3"):
        trainer.fit()
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_0000002"
    assert not (run / "DONE").exists()
    load_model(run)


@pytest.mark.parametrize("argv,needle", [
    (["--strategy", "bogus"], "unknown strategy"),
    (["--preset", "huge"], "unknown preset"),
    (["--lr", "0"], "optim.lr"),
    (["--lr=-1e-3"], "optim.lr"),
    (["--steps", "0"], "train.steps"),
    (["--seq-len", "100000"], "max_seq_len"),
    (["--tokenizer", "/nonexistent/tokenizer.json"], "tokenizer"),
    (["model.d_modle=3"], "unknown config key"),
])
def test_cli_bad_input_exit_2_writes_nothing(tmp_path, capsys, argv, needle):
    """Bad input: one-line error naming the problem, exit code 2, no run directory created."""
    out = tmp_path / "run"
    rc = main(["train", "--preset", "tiny", "--out", str(out), "--steps", "2", *argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert needle in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("content,needle", [(b"", "empty"), (b"\xff\xfe\xfa bad bytes", "UTF-8")])
def test_cli_bad_data_file_exit_2(tmp_path, capsys, content, needle, monkeypatch):
    """An empty or undecodable data file is refused with exit code 2 and nothing written."""
    monkeypatch.setenv("SCALEVEC_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "corpus.txt"
    data.write_bytes(content)
    out = tmp_path / "run"
    rc = main(["train", "--preset", "tiny", "--out", str(out), "--data", str(data), "--steps", "2"])
    assert rc == 2
    assert needle.lower() in capsys.readouterr().err.lower()
    assert not out.exists()


@pytest.mark.slow  # two trainings with Hessian probes: ~2 s
def test_probes_are_logged_when_asked_and_absent_by_default(tmp_path):
    """--probe-every / --sharpness-every add probe rows (γ² spectrum, column norms, sharpness); off: none."""
    run = tmp_path / "probed"
    train(tiny_run(tmp_path, "hg", steps=4, **{"train.probe_every": 2, "train.sharpness_every": 4}), run, quiet=True)
    probes = read_metrics(run, "probe")
    assert [r["step"] for r in probes] == [2, 4]
    attn = probes[0]["norms"]["layers.0.attn.proj"]["branches"]["q"]
    assert attn["gamma_sq"]["min"] <= attn["gamma_sq"]["median"] <= attn["gamma_sq"]["max"]
    assert attn["col_norm"]["min"] > 0
    assert "sharpness" not in probes[0] and probes[1]["sharpness"] > 0
    plain = tmp_path / "plain"
    train(tiny_run(tmp_path, "hg", steps=2), plain, quiet=True)
    assert read_metrics(plain, "probe") == []


def test_config_diff_ignores_execution_fields(tmp_path):
    """Resuming may change how a run executes (dist, device, compile) but not what it computes."""
    from scalevec.config.codec import apply_overrides, config_diff

    cfg = tiny_run(tmp_path)
    moved = apply_overrides(cfg, ["train.dist=ddp", "train.device=cpu", "train.compile=true", "train.threads=3"])
    assert config_diff(cfg, moved) == {}
    changed = apply_overrides(cfg, ["optim.lr=0.5", "model.d_model=32"])
    assert config_diff(cfg, changed) == {"model.d_model": (64, 32), "optim.lr": (cfg.optim.lr, 0.5)}


@pytest.mark.slow  # trains and resumes
def test_cli_resume_uses_stored_config(tmp_path, capsys, monkeypatch):
    """`scalevec train --resume --out RUN` continues with the stored config; changing a field is refused."""
    monkeypatch.setenv("SCALEVEC_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"
    common = ["--preset", "tiny", "--steps", "4", "--batch-size", "4", "--seq-len", "32", "--quiet",
              "data.val_tokens=1024", "train.eval_every=2"]
    assert main(["train", "--out", str(run), *common]) == 0
    (run / "DONE").unlink()  # pretend it stopped early: resume re-runs nothing but must accept the config
    assert main(["train", "--out", str(run), "--resume", "--device", "cpu", "--quiet"]) == 0
    for flags in (["--lr", "0.1"], ["--strategy", "dp"], ["--preset", "small"]):  # none of them silently ignored
        assert main(["train", "--out", str(run), "--resume", *flags]) == 2
        assert "--resume continues the stored config" in capsys.readouterr().err


def test_overrides_between_flags_are_applied(tmp_path, capsys):
    """`train a=1 --steps 3 b=2`: key=value items after a flag are overrides too, not an argparse error."""
    out = tmp_path / "run"
    rc = main(["train", "--preset", "tiny", "train.seq_len=32", "--steps", "2", "model.d_modle=64", "--out", str(out)])
    assert rc == 2 and "unknown config key 'model.d_modle'" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow  # trains and resumes
def test_tied_embeddings_checkpoint_and_resume_bitwise(tmp_path):
    """A tied-embedding run (Qwen3-0.6B style) checkpoints (the shared tensor is stored once) and resumes
    bitwise; the resumed model still has one tensor behind both names."""
    cfg = tiny_run(tmp_path, "unified", steps=6, **{"model.tie_embeddings": "true"})
    straight, split = tmp_path / "straight", tmp_path / "split"
    train(cfg, straight, quiet=True)
    assert train(cfg, split, stop_at=3, quiet=True) == {"stopped_at": 3}
    train(cfg, split, resume=True, quiet=True)
    assert [r["loss"] for r in read_metrics(straight)] == [r["loss"] for r in read_metrics(split)]
    _, model, _ = load_model(split)
    tied = [n for n, p in model.named_parameters(remove_duplicate=False) if p is model.embed.weight]
    assert len(tied) == 2


def test_meta_records_the_validation_split(tmp_path, capsys):
    """meta.json records the compile decision and names the validation split (rule, documents and tokens on each
    side, which documents), and the run's first lines say how many documents the corpus gave and how: a strided
    split of a 20-document .txt."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n\n".join(f"document {i}: " + "words of text " * 20 for i in range(20)))
    over = {"data.source": str(corpus), "data.val_split": "strided", "data.val_frac": 0.2, "train.eval_every": 2}
    train(tiny_run(tmp_path, steps=2, **over), tmp_path / "run", quiet=False)
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["compiled"] is False and meta["compile_why"].startswith("auto: eager on cpu")  # the compile decision
    split = meta["validation_split"]
    assert (split["rule"], split["documents"], split["val_docs"], split["train_docs"]) == ("strided", 20, 4, 16)
    assert (split["val_first_doc"], split["val_last_doc"]) == (4, 19)
    # bytes tokenizer, ASCII text: tokens = characters + the 3-newline separators between documents
    assert split["train_tokens"] == split["train_chars"] + 3 * 15 and split["val_tokens"] == split["val_chars"] + 3 * 3
    out = capsys.readouterr().out
    assert "20 documents (a .txt file: a new document after every run of 3+ newlines" in out
    assert "split strided (every 5th document): 4 of 20 documents" in out
