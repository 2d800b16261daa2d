"""Hugging Face directories whose files are damaged or disagree with config.json: ``generate`` and ``eval``
refuse them with one line and exit 2 (``generate.load_hf_dir``, the loader both commands share).

- a truncated ``model.safetensors``: named, as ``scalevec convert`` names it (``hf_import.tensor_shapes``),
  not a ``SafetensorError`` traceback;
- a config.json whose sizes or ``model_type`` do not describe the weights: transformers would reinitialise
  what does not fit at random (and only log a table, or raise a RuntimeError for a shape): refused by its
  loading report, so no command prints or scores a random model;
- a ``tokenizer.json`` that is not JSON, or JSON that is no tokenizer: the file is named.

The model is a tiny plain Llama exported by ``export_model`` with a bytes tokenizer; nothing downloads.
"""

from __future__ import annotations

import json
import shutil

import pytest
import transformers  # noqa: F401  (a dev dependency: a missing one fails, never skips)

from scalevec import ModelConfig, ScaleConfig, build_model
from scalevec.cli import main
from scalevec.data.tokenizer import load_tokenizer
from scalevec.hf.evaluation import SHAKESPEARE_TASK
from scalevec.hf.export import export_model

TINY = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48, vocab_size=256, max_seq_len=64)
GENERATE = ["--prompt", "Thou", "--max-new-tokens", "3", "--temperature", "0"]


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    """An intact export of a tiny Llama (baseline strategy: a plain LlamaForCausalLM, no custom code);
    the tests damage copies of it."""
    base = tmp_path_factory.mktemp("hf_load")
    load_tokenizer("bytes").save(base / "tok")
    model = build_model(TINY, ScaleConfig.preset("baseline"), seed=0).eval()
    return export_model(model, base / "hf", tokenizer_dir=base / "tok")


def _damaged(export_dir, tmp_path, damage: str):
    """A copy of the export with one fault (the four of the bug report, plus a tokenizer that is JSON)."""
    d = shutil.copytree(export_dir, tmp_path / "hf")
    conf = json.loads((d / "config.json").read_text())
    if damage == "truncated":
        f = d / "model.safetensors"
        data = f.read_bytes()
        f.write_bytes(data[:len(data) // 2])
    elif damage == "hidden_size":
        conf["hidden_size"] = 2 * conf["hidden_size"]
    elif damage == "model_type":
        conf["model_type"] = "bert"
    elif damage == "tokenizer_not_json":
        (d / "tokenizer.json").write_text("{not json")
    elif damage == "tokenizer_not_a_tokenizer":
        (d / "tokenizer.json").write_text("{}")
    (d / "config.json").write_text(json.dumps(conf))
    return d


def _expected(d, damage: str) -> list[str]:
    """What the one line must say: the file or directory, and the problem."""
    return {"truncated": [f"{d / 'model.safetensors'} is not a readable safetensors file", "truncated"],
            "hidden_size": [f"{d}'s weights do not match its config.json", "has shape", "fix config.json"],
            "model_type": [f"{d}'s weights do not match its config.json", "model_type 'bert'", "fix config.json"],
            "tokenizer_not_json": [f"{d / 'tokenizer.json'} is not valid JSON"],
            "tokenizer_not_a_tokenizer": [f"{d / 'tokenizer.json'} is not a tokenizer transformers can read"]}[damage]


def _commands(d, tmp_path) -> dict[str, list[str]]:
    text = tmp_path / "held_out.txt"
    text.write_text("Thou art a villain and a knave.\nO Romeo, Romeo, wherefore art thou Romeo?\n")
    return {"generate": ["generate", str(d), *GENERATE], "eval": ["eval", str(d), "--text", str(text)]}


DAMAGES = ["truncated", "hidden_size", "model_type", "tokenizer_not_json", "tokenizer_not_a_tokenizer"]


@pytest.mark.parametrize("command", ["generate", "eval"])
@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_hf_dir_is_one_line(export_dir, tmp_path, capsys, damage, command):
    """generate and eval --text on a damaged export: exit 2, one stderr line naming the file or directory
    and the problem, no traceback, and nothing generated or scored (a model_type edited to bert used to
    print the text of a random BERT and a perplexity of ~250, with exit 0)."""
    d = _damaged(export_dir, tmp_path, damage)
    assert main(_commands(d, tmp_path)[command]) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "LOAD REPORT" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"scalevec {command}: error: "), err
    for needle in _expected(d, damage):
        assert needle in lines[0], lines[0]
    assert out == ""


@pytest.mark.parametrize("damage", ["model_type", "hidden_size"])
def test_eval_tasks_refuses_weights_config_json_does_not_describe(export_dir, tmp_path, capsys, damage):
    """eval --tasks (lm-eval loads the model itself) refuses the same directories before scoring anything:
    no task result for a randomly initialised model, no eval.json."""
    d = _damaged(export_dir, tmp_path, damage)
    assert main(["eval", str(d), "--tasks", SHAKESPEARE_TASK, "--limit", "2"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("scalevec eval: error: ") and "Traceback" not in err, err
    assert all(needle in lines[0] for needle in _expected(d, damage)), lines[0]
    assert not (d / "eval.json").exists()


def test_an_intact_export_loads_with_an_empty_loading_report(export_dir, capsys):
    """The check is not a false alarm: the intact export loads and generates."""
    from scalevec.hf.generate import load_hf_dir

    model, tok = load_hf_dir(export_dir)
    assert type(model).__name__ == "LlamaForCausalLM" and tok.bos_token_id is not None
    assert main(["generate", str(export_dir), *GENERATE]) == 0
    assert capsys.readouterr().out.startswith("Thou")
