"""``scalevec eval`` through lm-evaluation-harness on the bundled offline task (DESIGN.md §10)."""

from __future__ import annotations

import json

import pytest

from scalevec import ScaleConfig, build_model
from scalevec.cli import main
from scalevec.hf.evaluation import SHAKESPEARE_TASK, evaluate, write_shakespeare_task
from scalevec.training.eval_results import eval_columns, write_eval

ACC = "acc,none"


@pytest.fixture
def export_fixtures():
    """The fixtures of test_export (lm-eval and transformers are dev dependencies: missing, they fail)."""
    import lm_eval  # noqa: F401  (a dev dependency: a missing one fails, never skips)
    import transformers  # noqa: F401  (a dev dependency: a missing one fails, never skips)

    import test_export

    return test_export


def test_report_reads_eval_json_into_runs_csv(tmp_path):
    """eval.json written by `scalevec eval` becomes eval.<task>.<metric> columns of report's runs.csv rows."""
    import fakerun
    from scalevec.config import RunConfig
    from scalevec.config.codec import to_dict
    from scalevec.experiments.frames import runs_frame
    from scalevec.experiments.records import load_runs

    fakerun.write_run(tmp_path / "runs" / "r0", to_dict(RunConfig(strategy="unified")))
    write_eval(tmp_path / "runs" / "r0", {"hellaswag": {"acc,none": 0.31, "acc_stderr,none": 0.01,
                                                         "acc_norm,none": 0.35}}, None, 100)
    assert eval_columns(tmp_path / "runs" / "r0") == {"eval.hellaswag.acc": 0.31, "eval.hellaswag.acc_norm": 0.35}
    row = runs_frame(load_runs(tmp_path))[0]
    assert row["eval.hellaswag.acc"] == 0.31 and row["final_val_loss"] != ""
    assert eval_columns(tmp_path) == {}  # no eval.json: no columns


def test_an_eval_json_nested_too_deeply_adds_no_columns(tmp_path):
    """A run's eval.json nested 100,000 deep is an unreadable scores file to the report ({}), as a malformed one
    is, not a RecursionError traceback."""
    from scalevec.training.eval_results import EVAL, eval_columns

    (tmp_path / EVAL).write_text("[" * 100_000 + "]" * 100_000)
    assert eval_columns(tmp_path) == {}


def test_shakespeare_task_is_four_way_with_the_true_next_line(tmp_path):
    """Every item has 4 distinct candidates, one of them (at ``label``) the line that follows the passage."""
    from scalevec.data.documents import load_documents

    yaml = write_shakespeare_task(tmp_path, n_items=20)
    assert f"task: {SHAKESPEARE_TASK}" in yaml.read_text()
    items = [json.loads(ln) for ln in (tmp_path / f"{SHAKESPEARE_TASK}.jsonl").read_text().splitlines()]
    corpus = "\n".join(ln.strip() for d in load_documents("shakespeare")[-3:] for ln in d.splitlines())
    assert len(items) == 20 and len({it["label"] for it in items}) > 1
    for it in items:
        assert len(set(it["choices"])) == 4
        assert it["context"] + "\n" + it["choices"][it["label"]] in corpus


@pytest.mark.slow
@pytest.mark.parametrize("strategy, overrides", [("unified", {}), ("baseline", {})], ids=["unified", "baseline"])
def test_run_and_export_score_the_same(tmp_path, make_cfg, perturb_scales, export_fixtures, strategy, overrides):
    """`scalevec eval` gives the same accuracy for a run (bytes tokenizer, no prefix token passed by hand)
    and for its export, custom code (unified) or plain Llama (baseline), and writes eval.json in each."""
    model = build_model(make_cfg(vocab_size=256, max_seq_len=256, **overrides), ScaleConfig.preset(strategy), seed=0)
    perturb_scales(model)
    run = export_fixtures._run_dir(tmp_path / "run", model, strategy)
    assert main(["export", str(run), "--out", str(tmp_path / "hf")]) == 0
    for path in (run, tmp_path / "hf"):
        assert main(["eval", str(path), "--tasks", SHAKESPEARE_TASK, "--limit", "16"]) == 0
    ours, theirs = (json.loads((p / "eval.json").read_text())["tasks"][SHAKESPEARE_TASK]
                    for p in (run, tmp_path / "hf"))
    assert ours["metrics"][ACC] == theirs["metrics"][ACC]  # same weights, same code: equal, not close
    assert ours["metrics"]["acc_norm,none"] == theirs["metrics"]["acc_norm,none"]
    assert ours["limit"] == 16 and 0.0 <= ours["metrics"][ACC] <= 1.0


@pytest.mark.slow
def test_a_bpe_tokenizer_export_evaluates(tmp_path, make_cfg, perturb_scales, export_fixtures):
    """A model with a BPE tokenizer (BOS/EOS, no pad) evaluates; eval.json keeps earlier tasks when merging."""
    from scalevec.hf.export import export_model

    tok = export_fixtures._tokenizer_dir(tmp_path / "tok", vocab_size=300)
    model = build_model(make_cfg(vocab_size=320, max_seq_len=256), ScaleConfig.preset("dnp"), seed=0)
    perturb_scales(model)
    out = export_model(model, tmp_path / "hf", tokenizer_dir=tok)
    (out / "eval.json").write_text(json.dumps({"tasks": {"other": {"metrics": {ACC: 0.5}}}}))
    r = evaluate(out, [SHAKESPEARE_TASK], limit=8)
    assert 0.0 <= r[SHAKESPEARE_TASK][ACC] <= 1.0
    assert set(json.loads((out / "eval.json").read_text())["tasks"]) == {"other", SHAKESPEARE_TASK}


@pytest.mark.slow  # lm-eval on a one-item task
def test_a_request_that_fits_exactly_gives_no_length_warning(tmp_path, make_cfg, export_fixtures, capfd):
    """A request of max_length + 1 tokens (BOS + 32 bytes for a 32-token model) fits lm-eval's window exactly
    (its last token is only a target), so nothing warns about its length: transformers said "33 > 32" before
    fit_tokenizer_limit; one byte more is cut, and lm-eval itself says so."""
    from scalevec.data.tokenizer import load_tokenizer
    from scalevec.hf.export import export_model

    load_tokenizer("bytes").save(tmp_path / "tok")
    out = export_model(build_model(make_cfg(vocab_size=256, max_seq_len=32), ScaleConfig.preset("baseline"), seed=0),
                       tmp_path / "hf", tokenizer_dir=tmp_path / "tok")
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name, context in (("fits", "a" * 20), ("cut", "a" * 21)):  # + "\n" + 11 bytes + BOS: 33 and 34 tokens
        (tasks / f"{name}.jsonl").write_text(json.dumps({"context": context, "choices": ["b" * 11, "c" * 11],
                                                         "label": 0}) + "\n")
        (tasks / f"{name}.yaml").write_text(
            f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {tasks / name}.jsonl\n"
            f"test_split: test\noutput_type: multiple_choice\ndoc_to_text: \"{{{{context}}}}\"\n"
            f"target_delimiter: \"\\n\"\ndoc_to_choice: choices\ndoc_to_target: label\n"
            f"metric_list:\n  - metric: acc\n")
    import logging

    class Records(logging.Handler):  # transformers' own handler writes to the stderr of its import, not capfd's
        def __init__(self):
            super().__init__(logging.WARNING)
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    records = Records()
    logging.getLogger("transformers").addHandler(records)
    logging.getLogger("lm_eval").addHandler(records)  # lm-eval's warning goes to its logger or to stderr
    try:
        evaluate(out, ["fits"], include_path=tasks, write=False)
        assert not any("longer than the specified maximum" in m for m in records.messages), records.messages
        capfd.readouterr()
        evaluate(out, ["cut"], include_path=tasks, write=False)
    finally:
        logging.getLogger("transformers").removeHandler(records)
        logging.getLogger("lm_eval").removeHandler(records)
    assert any("(34 > 33)" in m for m in records.messages)  # past the window: transformers' warning, one token on
    lm_eval_said = capfd.readouterr().err + "\n".join(records.messages)  # and lm-eval's own
    assert "exceeds model's maximum length (32). Truncating" in lm_eval_said


def test_eval_errors_exit_2(tmp_path, capsys):
    """A path with no model, an empty --tasks or an unknown task exits 2 with one line."""
    assert main(["eval", str(tmp_path), "--tasks", SHAKESPEARE_TASK]) == 2
    assert "neither a scalevec run directory" in capsys.readouterr().err
    assert main(["eval", str(tmp_path), "--tasks", ","]) == 2
    assert "--tasks is empty" in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--text", "t.txt", "--limit", "5"], "--limit only apply to --tasks"),  # --text ignored it
    (["--text", "t.txt", "--num-fewshot", "2"], "--num-fewshot only apply to --tasks"),
    (["--tasks", SHAKESPEARE_TASK, "--limit", "inf"], "--limit=inf must be a finite number > 0"),  # OverflowError
    (["--tasks", SHAKESPEARE_TASK, "--limit", "nan"], "--limit=nan must be a finite number > 0"),
    (["--tasks", SHAKESPEARE_TASK, "--num-fewshot", "-1"], "--num-fewshot=-1 must be >= 0"),
])
def test_task_settings_are_checked_before_anything_is_scored(tmp_path, capsys, extra, message):
    """--limit / --num-fewshot without --tasks, an infinite or NaN --limit and a negative --num-fewshot are one line,
    exit 2, before a model is read or a text scored (the path here holds no model at all)."""
    (tmp_path / "t.txt").write_text("some held-out text\n")
    extra = [str(tmp_path / "t.txt") if e == "t.txt" else e for e in extra]
    assert main(["eval", str(tmp_path), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("scalevec eval: error: ") and message in err, err


# -------------------------------------------------------------------------- --text: held-out perplexity

HELD_OUT = ("In the beginning God created the heaven and the earth. — And the earth was without form, and void;\n"
            "and darkness was upon the face of the deep.\n") * 3  # 2 non-ASCII bytes a line: bytes != characters


def test_windows_score_every_target_once_as_the_trainer_does():
    """Full windows are the trainer's (val_batches), a last short one takes the rest: the targets are
    stream[1:] in order, once each, and a uniform model gives ln V nats/token, perplexity V, 8 bits/byte."""
    import math

    import numpy as np
    import torch

    from scalevec.data.sampler import val_batches
    from scalevec.data.tokenizer import ByteTokenizer
    from scalevec.data.tokens import TokenData
    from scalevec.training.perplexity import perplexity, text_stream, windows

    tok = ByteTokenizer()
    stream = text_stream(HELD_OUT, tok)
    assert stream[0] == 10 and len(stream) == len(HELD_OUT.encode()) + 1  # the newline start token, then every byte
    batches, n_bytes = windows(stream, 64, tok.token_bytes(), batch_size=3)
    assert n_bytes == len(HELD_OUT.encode())
    assert torch.equal(torch.cat([y.flatten() for _, y in batches]), torch.from_numpy(stream[1:]))
    assert torch.equal(torch.cat([x.flatten() for x, _ in batches]), torch.from_numpy(stream[:-1]))
    trainer, _ = val_batches(TokenData(stream[:0], stream, tok, tok.token_bytes()), 64, len(stream), 3)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(trainer, batches))
    assert len(batches) == len(trainer) + 1  # the tail the trainer drops

    def uniform(x, y):
        return torch.tensor(math.log(256) * y.numel(), dtype=torch.float64)

    r = perplexity(uniform, stream, 64, tok.token_bytes())
    assert r["tokens"] == len(stream) - 1 and r["bytes"] == len(HELD_OUT.encode())
    assert math.isclose(r["perplexity"], 256) and math.isclose(r["bits_per_byte"], 8)
    with pytest.raises(ValueError, match="outside the tokenizer"):
        perplexity(lambda x, y: torch.zeros(()), np.array([1, 300]), 8, tok.token_bytes())


def _ppl(capsys, argv):
    """Run `scalevec eval ... --text`; return its printed perplexity line's three numbers."""
    assert main(argv) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("perplexity "))
    return [float(v) for v in line.split()[1::2]], out


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["unified", "baseline"])
def test_run_and_export_give_the_same_perplexity(tmp_path, make_cfg, perturb_scales, export_fixtures, capsys,
                                                 strategy):
    """`eval RUN --text F` and `eval EXPORT --text F` agree (our Transformer vs transformers on the export:
    custom code for unified, folded plain Llama for baseline) within 1e-5 nats/token. Why 1e-5: both are fp32
    forwards of the same function, differing only in operation order (folded scales, another attention
    kernel); export --verify already bounds their logits by 1e-4, and the per-token errors, of either sign,
    average out in the mean (measured here: 0.0, bit-equal sums). bits/byte and token/byte counts agree likewise."""
    from scalevec.hf.evaluation import text_perplexity

    model = build_model(make_cfg(vocab_size=256, max_seq_len=64), ScaleConfig.preset(strategy), seed=0)
    perturb_scales(model)
    run = export_fixtures._run_dir(tmp_path / "run", model, strategy)
    assert main(["export", str(run), "--out", str(tmp_path / "hf")]) == 0
    held_out = tmp_path / "held_out.txt"
    held_out.write_text(HELD_OUT, encoding="utf-8")
    ours, out = _ppl(capsys, ["eval", str(run), "--text", str(held_out)])
    theirs, _ = _ppl(capsys, ["eval", str(tmp_path / "hf"), "--text", str(held_out)])
    assert f"{len(HELD_OUT.encode()):,} bytes" in out and "windows of 64" in out
    a, b = text_perplexity(run, held_out), text_perplexity(tmp_path / "hf", held_out)
    assert abs(a["nats_per_token"] - b["nats_per_token"]) <= 1e-5
    assert abs(a["bits_per_byte"] - b["bits_per_byte"]) <= 1e-5
    assert (a["tokens"], a["bytes"]) == (b["tokens"], b["bytes"]) == (len(HELD_OUT.encode()), len(HELD_OUT.encode()))
    assert ours == pytest.approx(theirs, rel=1e-4)  # printed with 4 decimals
    # shorter windows (more of them): still one definition; nats/token changes, the counts do not
    c = text_perplexity(run, held_out, seq_len=16)
    assert c["tokens"] == a["tokens"] and c["nats_per_token"] != a["nats_per_token"]
    if strategy == "unified":  # the trust rule of check_hf_dir holds for --text: changed custom code is refused
        py = next((tmp_path / "hf").glob("*.py"))
        py.write_text(py.read_text() + "\n# changed\n")
        assert main(["eval", str(tmp_path / "hf"), "--text", str(held_out)]) == 2
        assert "--trust-remote-code" in capsys.readouterr().err


@pytest.mark.slow
def test_a_bpe_export_counts_the_bytes_of_the_text(tmp_path, make_cfg, export_fixtures):
    """With a BPE tokenizer (BOS/EOS) every token of the text and the EOS are targets; bits/byte divides by the
    text's UTF-8 bytes, which for a byte-level BPE are the bytes the targets stand for (the trainer's count)."""
    import numpy as np

    from scalevec.data.tokenizer import BOS, EOS, Tokenizer, train_bpe
    from scalevec.hf.evaluation import text_perplexity
    from scalevec.hf.export import export_model
    from scalevec.training.perplexity import text_stream, windows

    tok = Tokenizer(train_bpe(300, ["to be or not to be, that is the question"] * 4), "bpe:300", BOS, EOS)
    tok.save(tmp_path / "tok")
    stream = text_stream(HELD_OUT, tok)
    assert windows(stream, 32, tok.token_bytes(), 8)[1] == len(HELD_OUT.encode())  # lossless: the same count
    model = build_model(make_cfg(vocab_size=320, max_seq_len=32), ScaleConfig.preset("dnp"), seed=0)
    out = export_model(model, tmp_path / "hf", tokenizer_dir=tmp_path / "tok")
    held_out = tmp_path / "held_out.txt"
    held_out.write_text(HELD_OUT, encoding="utf-8")
    r = text_perplexity(out, held_out, batch_size=2)
    assert stream[0] == tok.bos_id and stream[-1] == tok.eos_id
    assert r["tokens"] == len(tok.encode(HELD_OUT)) + 1 == len(stream) - 1  # + EOS
    assert r["bytes"] == len(HELD_OUT.encode()) and np.isfinite(r["perplexity"]) and r["perplexity"] > 1


def test_text_on_a_prepared_folder_scores_its_validation_split(tmp_path, make_cfg, export_fixtures, capsys):
    """`--text DIR` on a `scalevec prepare-data` folder scores every target of its validation split."""
    import numpy as np

    from scalevec.data.documents import DOC_SEP
    from scalevec.data.prepared import load_prepared, prepare_shards
    from scalevec.hf.evaluation import text_perplexity

    model = build_model(make_cfg(vocab_size=256, max_seq_len=32), ScaleConfig.preset("unified"), seed=0)
    run = export_fixtures._run_dir(tmp_path / "run", model, "unified")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(DOC_SEP.join(f"document {i}: " + HELD_OUT for i in range(20)), encoding="utf-8")
    prepare_shards(str(corpus), "bytes", tmp_path / "prep", val_frac=0.2)
    val = np.asarray(load_prepared(tmp_path / "prep").val)
    r = text_perplexity(run, tmp_path / "prep")
    assert r["tokens"] == len(val) - 1 and r["bytes"] == len(val) - 1 and "validation split" in r["source"]
    assert main(["eval", str(run), "--text", str(tmp_path / "prep")]) == 0
    assert "perplexity" in capsys.readouterr().out


def test_text_errors_exit_2_with_one_line(tmp_path, make_cfg, export_fixtures, capsys):
    """A missing, empty, binary or non-text --text, a plain folder, a bad --seq-len, or neither --tasks nor --text:
    exit 2, one line."""
    model = build_model(make_cfg(vocab_size=256, max_seq_len=32), ScaleConfig.preset("unified"), seed=0)
    run = export_fixtures._run_dir(tmp_path / "run", model, "unified")
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "garbage.bin").write_bytes(bytes(range(128, 256)) * 4)
    (tmp_path / "nul.bin").write_bytes(b"ab\x00\x00cd")
    (tmp_path / "plain").mkdir()
    (tmp_path / "ok.txt").write_text(HELD_OUT)
    cases = [(["--text", str(tmp_path / "missing.txt")], "no such file"),
             (["--text", str(tmp_path / "empty.txt")], "is empty"),
             (["--text", "/dev/null"], "/dev/null is empty"),  # a device, not a missing file
             (["--text", str(tmp_path / "garbage.bin")], "is not UTF-8 text"),
             (["--text", str(tmp_path / "nul.bin")], "NUL bytes"),
             (["--text", str(tmp_path / "plain")], "not a `scalevec prepare-data` output"),
             (["--text", str(tmp_path / "ok.txt"), "--seq-len", "33"], "must be in [1, 32]"),
             ([], "pass --tasks")]
    for extra, message in cases:
        assert main(["eval", str(run), *extra]) == 2, extra
        err = capsys.readouterr().err
        errors = [ln for ln in err.splitlines() if not ln.startswith("note: ")]  # the fixture run has no MANIFEST
        assert len(errors) == 1 and errors[0].startswith("scalevec eval: error: ") and message in errors[0], err
    assert main(["eval", str(tmp_path / "plain"), "--text", str(tmp_path / "ok.txt")]) == 2
    assert "neither a scalevec run directory" in capsys.readouterr().err


def test_an_include_path_that_is_no_folder_is_refused(tmp_path):
    """eval --include-path naming no folder is refused in one line (lm-eval would ignore it silently)."""
    from scalevec.hf.evaluation import evaluate_hf_dir

    with pytest.raises(FileNotFoundError, match="--include-path .*missing is not a folder"):
        evaluate_hf_dir(tmp_path / "hf", ["scalevec_shakespeare"], include_path=tmp_path / "missing")


def test_eval_settings_are_lm_evals_on_cuda_and_exact_on_cpu():
    """`eval --dtype auto --batch-size auto` runs lm-eval in bfloat16 with its own batch search on CUDA (as lm-eval
    is run on exports), in float32 with batch 8 on CPU; explicit values pass through; bad ones are refused."""
    from scalevec.hf.evaluation import eval_settings

    assert eval_settings("cuda") == ("bfloat16", "auto")
    assert eval_settings("cuda:1", "float32", "16") == ("float32", 16)
    assert eval_settings("cpu") == ("float32", 8)
    assert eval_settings("cpu", "bfloat16", 4) == ("bfloat16", 4)
    for dtype, batch in (("fp16", "auto"), ("auto", "0"), ("auto", "x")):
        with pytest.raises(ValueError, match="--dtype|--batch-size"):
            eval_settings("cpu", dtype, batch)


def test_eval_passes_its_dtype_and_batch_size_to_lm_eval(tmp_path, make_cfg, export_fixtures, monkeypatch):
    """The resolved dtype and batch size reach lm-eval's model (it was given float32 and batch 8 whatever the
    device)."""
    from scalevec.hf import evaluation
    from scalevec.hf.export import export_model

    seen = {}

    class Stop(Exception):
        pass

    class FakeHFLM:  # records what lm-eval's HFLM is built with, then stops the evaluation
        def __init__(self, **kwargs):
            seen.update(kwargs)
            raise Stop

    real = evaluation._import_lm_eval()
    monkeypatch.setattr(evaluation, "_import_lm_eval", lambda: (real[0], FakeHFLM, real[2]))
    tok = export_fixtures._tokenizer_dir(tmp_path / "tok")
    out = export_model(build_model(make_cfg(), ScaleConfig.preset("baseline"), seed=0), tmp_path / "hf",
                       tokenizer_dir=tok)
    with pytest.raises(Stop):
        evaluation.evaluate_hf_dir(out, [SHAKESPEARE_TASK], limit=2, dtype="bfloat16", batch_size="3")
    assert (seen["dtype"], seen["batch_size"]) == ("bfloat16", 3)
    with pytest.raises(Stop):
        evaluation.evaluate_hf_dir(out, [SHAKESPEARE_TASK], limit=2)
    assert (seen["dtype"], seen["batch_size"]) == ("float32", 8)  # auto on CPU
