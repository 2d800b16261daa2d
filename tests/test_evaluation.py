"""``scalevec eval`` through lm-evaluation-harness on the bundled offline task (issue 15, DESIGN.md §10)."""

from __future__ import annotations

import json

import pytest

from scalevec import ScaleConfig, build_model
from scalevec.cli import main
from scalevec.hf.evaluation import SHAKESPEARE_TASK, evaluate, write_shakespeare_task
from scalevec.training.rundir import eval_columns, write_eval

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
    from scalevec.config import RunConfig, to_dict
    from scalevec.experiments.frames import runs_frame
    from scalevec.experiments.records import load_runs

    fakerun.write_run(tmp_path / "runs" / "r0", to_dict(RunConfig(strategy="unified")))
    write_eval(tmp_path / "runs" / "r0", {"hellaswag": {"acc,none": 0.31, "acc_stderr,none": 0.01,
                                                         "acc_norm,none": 0.35}}, None, 100)
    assert eval_columns(tmp_path / "runs" / "r0") == {"eval.hellaswag.acc": 0.31, "eval.hellaswag.acc_norm": 0.35}
    row = runs_frame(load_runs(tmp_path))[0]
    assert row["eval.hellaswag.acc"] == 0.31 and row["final_val_loss"] != ""
    assert eval_columns(tmp_path) == {}  # no eval.json: no columns


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


def test_eval_errors_exit_2(tmp_path, capsys):
    """A path with no model, an empty --tasks or an unknown task exits 2 with one line."""
    assert main(["eval", str(tmp_path), "--tasks", SHAKESPEARE_TASK]) == 2
    assert "neither a scalevec run directory" in capsys.readouterr().err
    assert main(["eval", str(tmp_path), "--tasks", ","]) == 2
    assert "--tasks is empty" in capsys.readouterr().err
