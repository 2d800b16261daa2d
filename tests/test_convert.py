"""scalevec convert: a Hugging Face model or a run into another strategy, with no training (hf/convert.py).

A small random Llama written with transformers' ``save_pretrained`` (no hub), its norm weights away from 1 so
that a lost or doubled γ shows in the logits; runs use the ``tiny`` preset on the bundled Shakespeare bytes.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
import transformers  # a dev dependency: missing it fails these tests, never skips
import yaml

from scalevec.cli import main
from scalevec.hf.generate import load_text_model
from test_cli_errors import fails

# fp32 logits of the same function computed in two orders (γ applied by the norm vs folded into the next
# matrix, HF's kernels vs ours): measured 9.5e-7 here for logits up to 1.9 (baseline run and HG export alike,
# a few ulps); 1e-5 is tests/test_init_from.py's bound, far below a real change (unified moves them > 1e-3)
TOL = 1e-5
# a small run: its first validation batch is the report's, train.steps the config a resume trains
SMALL = ["train.seq_len=32", "train.batch_size=4", "train.eval_batch_size=8", "data.val_tokens=2048", "train.steps=6",
         "train.eval_every=3", "train.log_every=1"]
X = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEVEC_CACHE", str(tmp_path / "cache"))


def convert(src, out, strategy, *extra) -> int:
    return main(["convert", str(src), "--strategy", strategy, "--out", str(out), "--threads", "1", *extra, *SMALL])


def max_diff(a, b) -> float:
    return (a - b).abs().max().item()


def test_hf_to_baseline_is_exact(tmp_path, hf_llama, capsys):
    """Into baseline the converted run computes the HF model's logits (within TOL) and says so; it is a run at
    step 0 (config, meta with the source, tokenizer, step_0000000, no DONE)."""
    hf_dir, hf = hf_llama
    run = tmp_path / "run"
    assert convert(hf_dir, run, "baseline") == 0
    out = capsys.readouterr().out
    assert "strategy baseline: weights converted through the plain form; the function is unchanged" in out
    with torch.no_grad():
        assert max_diff(load_text_model(run).logits(X), hf(input_ids=X).logits) <= TOL
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step_0000000"]
    assert not (run / "DONE").exists() and (run / "tokenizer" / "tokenizer.json").is_file()
    info = json.loads((run / "meta.json").read_text())["init_from"]
    assert (info["kind"], info["family"], info["function_preserved"]) == ("hf", "llama", True)


def test_hf_to_a_foldable_strategy_as_an_export(tmp_path, hf_llama):
    """--format hf into HG: the export (folded back to a plain Llama) still computes the source's logits."""
    hf_dir, hf = hf_llama
    assert convert(hf_dir, tmp_path / "out", "hg", "--format", "hf") == 0
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "auto_map" not in config
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    with torch.no_grad():
        assert max_diff(back(input_ids=X).logits, hf(input_ids=X).logits) <= TOL


def test_dnp_prints_the_function_change_report(tmp_path, hf_llama, capsys):
    """Into unified (DNP cannot fold) convert prints train --init-from's report: THE FUNCTION CHANGES, why, and
    the step-0 loss before and after on the first validation batch; meta.json holds both losses."""
    hf_dir, hf = hf_llama
    assert convert(hf_dir, tmp_path / "run", "unified") == 0
    cap = capsys.readouterr()
    assert "strategy unified: weights converted through the plain form; THE FUNCTION CHANGES" in cap.err
    assert "DNP normalizes the outputs of W_gate/W_up" in cap.out
    assert "loss at step 0 on the first validation batch:" in cap.out
    info = json.loads((tmp_path / "run" / "meta.json").read_text())["init_from"]
    assert not info["function_preserved"] and info["loss_before"] != info["loss_after"]
    with torch.no_grad():  # the report is about a real change: the logits moved
        assert max_diff(load_text_model(tmp_path / "run").logits(X), hf(input_ids=X).logits) > 1e-3


@pytest.mark.slow  # two 6-step trainings
def test_converted_run_resumes_as_train_init_from(tmp_path, hf_llama):
    """`convert` then `train --resume` gives bit for bit the losses of `train --init-from` with the same options:
    a step-0 checkpoint resumes as a fresh start (without Trainer.load's rule, AdamW's first update shrank)."""
    hf_dir, _ = hf_llama
    assert convert(hf_dir, tmp_path / "conv", "hg") == 0
    assert main(["train", "--resume", "--out", str(tmp_path / "conv"), "--quiet"]) == 0
    assert main(["train", "--init-from", str(hf_dir), "--strategy", "hg", "--out", str(tmp_path / "direct"),
                 "--threads", "1", "--quiet", *SMALL]) == 0
    rows = [[(r["kind"], r["step"], r.get("loss"), r.get("val_loss")) for r in map(json.loads, lines)]
            for lines in ((tmp_path / d / "metrics.jsonl").read_text().splitlines() for d in ("conv", "direct"))]
    assert rows[0] == rows[1] and len(rows[0]) == 8  # 6 train rows, 2 evaluations


def test_run_to_another_strategy_keeps_its_function(tmp_path, capsys):
    """A trained DP run converted into OR computes the run's logits; meta.json names the parent and its step."""
    parent = tmp_path / "parent"
    assert main(["train", "--preset", "tiny", "--strategy", "dp", "--out", str(parent), "--threads", "1", "--quiet",
                 *SMALL[:4], "train.steps=4"]) == 0
    assert convert(parent, tmp_path / "or", "or") == 0
    assert f"run {parent} at step 4 (strategy dp) -> strategy or" in capsys.readouterr().out
    with torch.no_grad():
        assert max_diff(load_text_model(tmp_path / "or").logits(X), load_text_model(parent).logits(X)) <= TOL
    info = json.loads((tmp_path / "or" / "meta.json").read_text())["init_from"]
    assert (info["kind"], info["step"], info["strategy"], info["weights"]) == ("run", 4, "dp", "converted")


def test_overwrite_replaces_only_what_scalevec_wrote(tmp_path, hf_llama):
    """--overwrite on a converted run converts again (rundir's rule: a file scalevec did not write stays)."""
    hf_dir, _ = hf_llama
    run = tmp_path / "run"
    assert convert(hf_dir, run, "baseline") == 0
    (run / "notes.txt").write_text("mine")
    assert convert(hf_dir, run, "hg", "--overwrite") == 0
    assert (run / "notes.txt").read_text() == "mine"
    assert yaml.safe_load((run / "config.yaml").read_text())["strategy"] == "hg"


def test_a_full_disk_leaves_no_run_to_train_from_random_weights(tmp_path, hf_llama, capsys, monkeypatch):
    """A checkpoint that cannot be written (ENOSPC) ends convert with one line naming the cause and the fix, and
    removes the run it set up: no config.yaml is left for `train --resume` to start from a random init, the new
    folder is gone, and in an --overwrite folder the user's file stays."""
    import errno

    import scalevec.training.trainer as trainer_module

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    hf_dir, _ = hf_llama
    monkeypatch.setattr(trainer_module, "save_checkpoint", full_disk)
    assert convert(hf_dir, tmp_path / "new", "unified") == 2
    err = capsys.readouterr().err  # the conversion's notes, then the error
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("scalevec convert: error: cannot write")
    assert all(w in err for w in ("No space left on device", "free space", "partial run was removed"))
    assert not (tmp_path / "new").exists()
    monkeypatch.undo()
    run = tmp_path / "run"
    assert convert(hf_dir, run, "baseline") == 0
    (run / "notes.txt").write_text("mine")
    monkeypatch.setattr(trainer_module, "save_checkpoint", full_disk)
    assert convert(hf_dir, run, "hg", "--overwrite") == 2
    assert sorted(p.name for p in run.iterdir()) == [".lock", "notes.txt"]


def test_custom_code_needs_trust_and_never_runs(tmp_path, hf_llama, capsys):
    """An HF directory whose config.json names custom code is refused without --trust-remote-code; with it the
    weights convert, and the code (which would exit if imported) is not run."""
    src = tmp_path / "custom"
    shutil.copytree(hf_llama[0], src)
    conf = json.loads((src / "config.json").read_text())
    conf["auto_map"] = {"AutoModelForCausalLM": "modeling_x.LlamaX"}
    (src / "config.json").write_text(json.dumps(conf))
    (src / "modeling_x.py").write_text("raise SystemExit('the source code ran')\n")
    fails(capsys, ["convert", str(src), "--strategy", "baseline", "--out", str(tmp_path / "a")], "--trust-remote-code",
          "modeling_x.py")
    assert not (tmp_path / "a").exists()
    assert convert(src, tmp_path / "b", "baseline", "--trust-remote-code") == 0


@pytest.mark.parametrize("case, words", [
    ("out exists", ["already exists and is not empty", "--overwrite"]),
    ("out is the source", ["is the source"]),
    ("hf out exists, --overwrite", ["never deletes one"]),
    ("overwrite a non-run", ["is not a scalevec run directory"]),
    ("unknown strategy", ["strategy"]),
    ("missing source", ["SRC ", "does not exist"]),
    ("verify a run", ["--verify checks a Hugging Face export"]),
])
def test_bad_inputs_exit_2_and_write_nothing(tmp_path, hf_llama, capsys, case, words):
    """Each refusal is one line on stderr, exit 2, and leaves the file system as it was."""
    hf_dir = hf_llama[0]
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    src, extra = hf_dir, []
    if case == "out is the source":
        src, out = tmp_path / "src", tmp_path / "src"
        shutil.copytree(hf_dir, src)
    elif case == "hf out exists, --overwrite":
        extra = ["--format", "hf", "--overwrite"]
    elif case == "overwrite a non-run":
        extra = ["--overwrite"]
    elif case == "missing source":
        src, out = tmp_path / "nope", tmp_path / "new"
    elif case == "verify a run":
        out, extra = tmp_path / "new", ["--verify"]
    elif case == "unknown strategy":
        out = tmp_path / "new"
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    strategy = "no-such-strategy" if case == "unknown strategy" else "baseline"
    fails(capsys, ["convert", str(src), "--strategy", strategy, "--out", str(out), *extra], *words)
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before and (tmp_path / "out" / "keep.txt").read_text() == "x"


@pytest.fixture
def no_conversion(monkeypatch):
    """The conversion made unreachable: a call of the trainer's set-up or of either writer is recorded (and fails),
    so a refusal that comes only after the conversion ran shows."""
    import scalevec.hf.convert as convert_module

    calls = []

    def record(name):
        def called(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"{name} ran: the out folder was not checked first")
        return called

    for name in ("_trainer", "_write_run", "_write_export"):
        monkeypatch.setattr(convert_module, name, record(name))
    return calls


@pytest.mark.parametrize("target", ["empty-dir", "missing"])
def test_format_hf_refuses_a_linked_out_before_converting(tmp_path, hf_llama, capsys, no_conversion, target):
    """convert --format hf --out LINK (an export is never written through a link) was refused only after the whole
    conversion ran (the export's final check); it is refused first, one line naming the link and where it leads,
    and the link and its target are left as they were."""
    dest = tmp_path / target
    if target == "empty-dir":
        dest.mkdir()
    link = tmp_path / "hf"
    link.symlink_to(dest)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    what = "a symbolic link to" if target == "empty-dir" else "a symbolic link that leads nowhere (to"
    err = fails(capsys, ["convert", str(hf_llama[0]), "--strategy", "baseline", "--out", str(link), "--format", "hf"],
                f"--out {link} is {what} {os.path.realpath(dest)}")
    assert "Errno" not in err and no_conversion == []
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before and os.readlink(link) == str(dest)


@pytest.mark.parametrize("fmt", ["run", "hf"])
def test_a_dangling_link_above_out_is_refused_before_converting(tmp_path, hf_llama, capsys, no_conversion, fmt):
    """--out below a symbolic link that leads nowhere (here a relative one, read from its own folder) was mkdir's
    raw errno after the conversion; it is refused first, in one line naming the link, for both formats."""
    (tmp_path / "sub").mkdir()
    link = tmp_path / "sub" / "dang"
    link.symlink_to("../nowhere")
    out = link / "out"
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    err = fails(capsys, ["convert", str(hf_llama[0]), "--strategy", "baseline", "--out", str(out), "--format", fmt],
                f"--out {out}: {link} is a symbolic link that leads nowhere (to "
                f"{os.path.realpath(tmp_path / 'nowhere')}); remove it or choose another --out")
    assert "Errno" not in err and no_conversion == []
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_init_from_hf_without_tokenizer_names_the_tokenizer_used(tmp_path, hf_llama, capsys):
    """An HF directory without tokenizer.json: train --init-from says on the console that it uses the bytes
    tokenizer on shakespeare and how to pass --tokenizer/--data; with the model's tokenizer.json it says nothing."""
    from scalevec.data.tokenizer import load_tokenizer

    hf_dir = hf_llama[0]
    argv = ["train", "--strategy", "baseline", "--threads", "1", "--quiet", *SMALL[:4], "train.steps=2"]
    assert main([*argv, "--init-from", str(hf_dir), "--out", str(tmp_path / "a")]) == 0
    note = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("note:")]
    assert len(note) == 1 and "bytes tokenizer on shakespeare" in note[0]
    assert "--tokenizer" in note[0] and "--data" in note[0]
    with_tok = tmp_path / "with_tok"
    shutil.copytree(hf_dir, with_tok)
    load_tokenizer("bytes").save(tmp_path / "tok")
    shutil.copy(tmp_path / "tok" / "tokenizer.json", with_tok / "tokenizer.json")
    assert main([*argv, "--init-from", str(with_tok), "--out", str(tmp_path / "b")]) == 0
    assert "note:" not in capsys.readouterr().err
