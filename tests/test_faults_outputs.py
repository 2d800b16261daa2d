"""No output is silently wrong, and a run resumes from any working directory.

- ``generate``, ``eval`` and ``convert --format hf`` refuse non-finite weights with one line (exit 2);
- an export's custom code is checked file by file (two shipped files swapped are refused, not imported);
- ``export --verify``'s logit tolerance scales with the logits (a trained ``unified`` run passes);
- ``eval --text`` windows default to the run's ``train.seq_len``, its input is a regular file (or a bounded
  device read), and a bad ``eval.json`` is refused before the evaluation, by name;
- ``convert`` onto a file, a model that cannot fit in memory (``model.d_model: 10^9`` on resume);
- ``train --data``, ``--init-from`` and ``convert`` store absolute paths: ``--resume`` works from anywhere.

Models are tiny, trained for a few steps on the bundled corpus; nothing downloads.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
import transformers  # noqa: F401  (a dev dependency: a missing one fails, never skips)
import yaml
from safetensors.torch import load_file, save_file

from scalevec.cli import main
from scalevec.hf import evaluation
from scalevec.hf.export import REMOTE_FILES, export_run
from scalevec.training import rundir

GENERATE = ["--prompt", "Thou", "--max-new-tokens", "3", "--temperature", "0"]
ITEMS = ["train.batch_size=2", "train.seq_len=16", "train.eval_every=4", "data.val_tokens=512", "schedule.warmup=2"]


def one_line_error(capsys, command: str, *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    lines = [ln for ln in err.splitlines() if not ln.startswith(("note: ", "init-from: "))]
    assert len(lines) == 1 and lines[0].startswith(f"scalevec {command}: error: "), err
    for needle in needles:
        assert needle in lines[0], err
    return lines[0]


def _train(out: Path, strategy: str, steps: int = 8, lr: float = 1e-2, *extra: str) -> Path:
    items = [*ITEMS, f"train.eval_every={steps}"]  # one evaluation, at the end
    assert main(["train", "--preset", "tiny", "--strategy", strategy, "--steps", str(steps), "--lr", str(lr),
                 "--out", str(out), "--quiet", *items, *extra]) == 0
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A tiny baseline run and a tiny unified run (custom code on export), trained for a few steps."""
    root = tmp_path_factory.mktemp("faults-outputs")
    return {"root": root, "baseline": _train(root / "baseline", "baseline"),
            "unified": _train(root / "unified", "unified", 20, 3e-2)}


def _poison(hf_dir: Path) -> None:
    """Put a NaN into the first matrix of an export's weights (as a damaged copy would hold)."""
    f = hf_dir / "model.safetensors"
    state = load_file(f)
    name = next(k for k, t in state.items() if t.ndim == 2)
    state[name][0, 0] = float("nan")
    save_file(state, f, metadata={"format": "pt"})


# ------------------------------------------------------------------------------------------ non-finite weights


def test_generate_and_eval_refuse_an_export_with_nonfinite_weights(runs, tmp_path, capsys):
    hf = export_run(runs["baseline"], tmp_path / "hf")
    _poison(hf)
    text = tmp_path / "t.txt"
    text.write_text("Thou art a villain, and thou knowest it well enough.\n")
    assert main(["generate", str(hf), *GENERATE]) == 2
    one_line_error(capsys, "generate", "non-finite")
    assert main(["eval", str(hf), "--text", str(text)]) == 2
    one_line_error(capsys, "eval", "non-finite")


def test_convert_to_hf_refuses_a_nonfinite_source(runs, tmp_path, capsys):
    src = export_run(runs["baseline"], tmp_path / "src")
    _poison(src)
    out = tmp_path / "out"
    assert main(["convert", str(src), "--strategy", "baseline", "--out", str(out), "--format", "hf"]) == 2
    one_line_error(capsys, "convert", "non-finite")
    assert not out.exists()


# ------------------------------------------------------------------------------------------------- custom code


def test_swapped_shipped_files_are_refused_by_name(runs, tmp_path, capsys):
    hf = export_run(runs["unified"], tmp_path / "hf")
    a, b = (hf / n for n in REMOTE_FILES)
    ta, tb = a.read_bytes(), b.read_bytes()
    a.write_bytes(tb)
    b.write_bytes(ta)
    assert main(["generate", str(hf), *GENERATE]) == 2
    one_line_error(capsys, "generate", REMOTE_FILES[0], "--trust-remote-code")


# ------------------------------------------------------------------------------------------------------ verify


@pytest.mark.slow
def test_verify_passes_on_a_trained_unified_run_and_states_what_it_compares(runs, tmp_path, capsys):
    assert main(["export", str(runs["unified"]), "--out", str(tmp_path / "hf"), "--verify"]) == 0
    out = capsys.readouterr().out
    assert "verify: OK" in out and "x max(1, largest |logit|" in out and "logits" in out


def test_verify_tolerance_scales_with_the_logits(runs, tmp_path):
    """Logits of hundreds (a sharpened LM head) round in float32 far above the absolute 1e-5: the scaled
    tolerance passes them, and still fails a real difference."""
    from scalevec.hf.export import plan_export, write_export
    from scalevec.hf.verify import VERIFY_ATOL_REMOTE, VerifyError, verify
    from scalevec.training.checkpoint.run_model import load_model

    _, model, _ = load_model(runs["unified"])
    with torch.no_grad():
        model.head.branches.lm_head.weight.mul_(200.0)
    model.eval()
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    out = tmp_path / "hf"
    write_export(plan_export(model, out, rundir.tokenizer_dir(runs["unified"])), model=model)
    r = verify(out, model, tokens)
    assert r["max_abs_logit_diff"] > VERIFY_ATOL_REMOTE and r["greedy_equal"]  # the old fixed tolerance failed it
    with torch.no_grad():
        model.head.branches.lm_head.weight[0].add_(1.0)  # a real mismatch (one vocabulary row) is still caught
    with pytest.raises(VerifyError, match="logits differ"):
        verify(out, model, tokens)


# ------------------------------------------------------------------------------------------------- eval --text


def test_eval_text_defaults_to_the_runs_seq_len(runs, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("Thou art a villain, and thou knowest it well enough.\n" * 4)
    assert rundir.load_config(runs["baseline"]).model.max_seq_len > 16
    assert main(["eval", str(runs["baseline"]), "--text", str(text)]) == 0
    assert "windows of 16 (the run's train.seq_len)" in capsys.readouterr().out
    r = evaluation.text_perplexity(runs["baseline"], text)
    assert r["seq_len"] == 16


def test_eval_text_says_how_far_it_is(runs, tmp_path, capsys, monkeypatch):
    text = tmp_path / "t.txt"
    text.write_text("Thou art a villain, and thou knowest it well enough.\n" * 20)
    monkeypatch.setattr(evaluation, "PROGRESS_EVERY", 0.0)
    assert main(["eval", str(runs["baseline"]), "--text", str(text), "--batch-size", "2"]) == 0
    err = capsys.readouterr().err
    assert "tokens scored" in err and "%" in err, err


def test_eval_text_inputs_are_bounded(runs, tmp_path, capsys):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert main(["eval", str(runs["baseline"]), "--text", str(fifo)]) == 2
    one_line_error(capsys, "eval", "not a regular file")
    assert main(["eval", str(runs["baseline"]), "--text", "/dev/zero"]) == 2
    one_line_error(capsys, "eval", "more than")


@pytest.mark.parametrize("content", ["[]", "{\"tasks\": [1]}", "not json"])
def test_bad_eval_json_is_refused_before_the_evaluation(runs, tmp_path, capsys, monkeypatch, content):
    run = tmp_path / "run"
    shutil.copytree(runs["baseline"], run)
    (run / rundir.EVAL).write_text(content)

    def never(*a, **k):
        raise AssertionError("the evaluation ran")

    monkeypatch.setattr(evaluation, "evaluate_hf_dir", never)
    monkeypatch.setattr(evaluation, "text_perplexity", never)
    assert main(["eval", str(run), "--tasks", evaluation.SHAKESPEARE_TASK, "--text", "/dev/null"]) == 2
    one_line_error(capsys, "eval", str(run / rundir.EVAL), "--no-write")
    assert (run / rundir.EVAL).read_text() == content


# ---------------------------------------------------------------------------------------------- convert, memory


def test_convert_onto_a_file_or_from_a_file_says_so(runs, tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    for fmt in ("run", "hf"):
        assert main(["convert", str(runs["baseline"]), "--strategy", "unified", "--out", str(f), "--format", fmt]) == 2
        one_line_error(capsys, "convert", "is an existing file")
        assert main(["convert", str(runs["baseline"]), "--strategy", "unified", "--out", str(f / "x"),
                     "--format", fmt]) == 2
        one_line_error(capsys, "convert", "is a file")
    assert main(["convert", str(f), "--strategy", "unified", "--out", str(tmp_path / "o")]) == 2
    one_line_error(capsys, "convert", "is a file, not a directory")
    assert f.read_text() == "x"


def test_a_model_too_large_for_memory_is_one_line_also_on_resume(runs, tmp_path, capsys):
    assert main(["train", "--preset", "tiny", "--steps", "2", "--out", str(tmp_path / "new"), "--quiet",
                 "model.d_model=1000000000"]) == 2
    one_line_error(capsys, "train", "memory", "model")
    assert not (tmp_path / "new").exists()
    run = tmp_path / "run"
    shutil.copytree(runs["baseline"], run)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["model"]["d_model"] = 10**9
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    assert main(["train", "--resume", "--out", str(run), "--quiet"]) == 2
    one_line_error(capsys, "train", "memory", "config.yaml")


# ------------------------------------------------------------------------------------------- absolute paths


def test_data_and_init_from_paths_are_stored_absolute(runs, tmp_path, monkeypatch, capsys):
    """train --data, train --init-from (its tokenizer.json) and convert store absolute paths; --resume then works
    from another working directory."""
    work = tmp_path / "work"
    work.mkdir()
    corpus = work / "corpus.txt"
    corpus.write_text("".join(f"line {i}: thou art more lovely and more temperate.\n\n\n" for i in range(200)))
    hf = export_run(runs["baseline"], work / "hf")
    monkeypatch.chdir(work)
    _train(Path("r-data"), "baseline", 4, 1e-2, "--data", "corpus.txt")
    assert main(["train", "--init-from", "hf", "--steps", "4", "--out", "r-init", "--quiet", *ITEMS]) == 0
    assert main(["convert", "hf", "--strategy", "unified", "--out", "r-conv", "train.steps=2", *ITEMS]) == 0
    stored = {n: rundir.load_config(work / n).data for n in ("r-data", "r-init", "r-conv")}
    assert stored["r-data"].source == str(corpus)
    assert stored["r-init"].tokenizer == str(hf / "tokenizer.json")
    assert stored["r-conv"].tokenizer == str(hf / "tokenizer.json")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    (work / "r-data" / rundir.DONE).unlink()  # as if it stopped early
    for n in ("r-data", "r-init", "r-conv"):
        capsys.readouterr()
        assert main(["train", "--resume", "--out", str(work / n), "--quiet"]) == 0, capsys.readouterr().err


# ------------------------------------------------------------------------------ the guide's transformers snippet


def test_guide_transformers_snippet_generates_what_scalevec_generates(runs, tmp_path, capsys):
    """docs/guide.md's snippet (README links it) for a custom-code export (tokenizer with trust_remote_code, the
    attention mask passed) prints the text `scalevec generate` prints, also for a prompt with newlines (a bytes
    export's pad token is the newline byte: a mask inferred from it would hide them)."""
    import contextlib
    import io
    import re

    readme = (Path(__file__).resolve().parents[1] / "docs" / "guide.md").read_text(encoding="utf-8")
    snippet = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S)
                   if "AutoTokenizer" in b and '"hf/unified"' in b)  # the custom-code export's snippet
    assert "trust_remote_code=True" in snippet.split("AutoTokenizer.from_pretrained")[1].splitlines()[0]
    assert "**inputs" in snippet
    hf = export_run(runs["unified"], tmp_path / "hf")
    prompt = "ROMEO:\nO, she"
    code = (snippet.replace('"hf/unified"', repr(str(hf))).replace('"ROMEO:"', repr(prompt))
            .replace("max_new_tokens=40", "max_new_tokens=12"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/guide.md", "exec"), {})  # noqa: S102 (the guide's own snippet)
    capsys.readouterr()
    assert main(["generate", str(hf), "--prompt", prompt, "--max-new-tokens", "12", "--temperature", "0"]) == 0
    ours = capsys.readouterr().out
    assert out.getvalue().rstrip("\n") == "\n" + ours.rstrip("\n")  # the snippet's decode keeps the BOS newline
