"""One JSON reader (``config/files.py``: ``parse_json``, ``load_json``) for every file a user or an earlier run wrote:
an object that sets one key twice is refused in one line naming the file and the key (``json.loads`` kept the last
silently, as PyYAML did before ``check_unique_keys``), and a valid file reads as ``json.loads`` reads it."""

from __future__ import annotations

import json
import math
import re

import pytest
import transformers  # a dev dependency: missing it fails these tests, never skips

from scalevec.cli import main
from scalevec.config.files import DuplicateKey, JSONProblem, load_json, parse_json
from scalevec.data.documents import iter_documents
from scalevec.data.prepared import MANIFEST, read_manifest
from scalevec.hf.evaluation import check_eval_file
from scalevec.hf_format.hf_import import read_config_json
from scalevec.training import rundir
from scalevec.training.checkpoint import integrity, layout
from source_grep import lines_outside_config
from test_faults_inputs import one_line_error

JSON_PARSE = re.compile(r"\bjson\.loads?\(")
# JSON parsed outside the config package that no user or earlier run wrote, each with the reason
ALLOWED = [
    ("experiments/sweep_grid.py", "json.loads(model_json)"),  # a cache key this process made with json.dumps
    ("experiments/sweep_grid.py", "json.loads(scale_json)"),  # the same
    ("data/tokenizer.py", "json.loads(self.hf.to_str())"),  # the tokenizers library's serialization, in memory
]
TWICE = "sets the key 'lr' twice in one object"


def test_no_json_parse_of_a_file_outside_the_config_package():
    """Outside scalevec/config, no module calls ``json.load(`` / ``json.loads(`` except the allow-listed in-memory
    texts: every file goes through ``load_json`` / ``parse_json``, which refuse a key set twice."""
    found = lines_outside_config(JSON_PARSE, ALLOWED)
    assert not found, "JSON parsed outside scalevec.config.files; use load_json or parse_json:\n" + "\n".join(found)


@pytest.mark.parametrize("text", ['{"lr": 0.01, "lr": 0.003}', '{"a": [1, {"lr": 1, "b": 2, "lr": 3}]}'])
def test_a_key_set_twice_in_any_object_is_refused_naming_the_key(text):
    """A key twice, at the top or nested in a list, is ``DuplicateKey`` (a ValueError) naming the key."""
    with pytest.raises(DuplicateKey, match=f"^{TWICE} \\(the last would win silently\\); keep one$"):
        parse_json(text)


def test_a_valid_file_reads_as_json_loads_reads_it(tmp_path):
    """Distinct keys: the same value, key order, NaN and infinities (a train state writes them) as ``json.loads``;
    the same key in two different objects is no duplicate."""
    text = json.dumps({"b": 1, "a": [{"lr": 0.1}, {"lr": 0.2}], "x": float("inf"), "n": float("nan"),
                       "s": "é", "z": None, "t": True}, allow_nan=True)
    (tmp_path / "f.json").write_text(text, encoding="utf-8")
    got, want = load_json(tmp_path / "f.json", "file", "fix it"), json.loads(text)
    assert list(got) == list(want) and math.isnan(got.pop("n")) and math.isnan(want.pop("n"))
    assert got == want


def test_load_json_names_the_file_the_key_and_the_fix(tmp_path):
    """load_json's error is one line: what the file is, its path, the problem, the fix."""
    (tmp_path / "f.json").write_text('{"lr": 1, "lr": 2}')
    with pytest.raises(JSONProblem) as e:
        load_json(tmp_path / "f.json", "the scores file", "fix it")
    file = tmp_path / "f.json"
    assert str(e.value) == f"the scores file {file} {TWICE} (the last would win silently); keep one; fix it"


def test_hf_config_json_with_a_key_twice_is_refused(tmp_path):
    """A config.json saying max_position_embeddings twice (hand-merged) is refused naming the file and the key."""
    (tmp_path / "config.json").write_text('{"model_type": "llama", "lr": 1, "lr": 2}')
    with pytest.raises(ValueError, match=f"^config.json {tmp_path / 'config.json'} {TWICE}"):
        read_config_json(tmp_path)


def test_scalevec_convert_refuses_a_config_json_with_a_key_twice_and_writes_nothing(tmp_path, capsys):
    """`scalevec convert` on a Llama whose config.json sets hidden_size twice: exit 2, one line naming the file, the
    key and the fix; no output folder."""
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=32, max_position_embeddings=32)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(path.read_text().replace('"hidden_size": 16,', '"hidden_size": 16, "hidden_size": 32,', 1))
    assert main(["convert", str(tmp_path / "hf"), "--strategy", "baseline", "--out", str(tmp_path / "c")]) == 2
    one_line_error(capsys, str(path), "sets the key 'hidden_size' twice", "fix config.json")
    assert not (tmp_path / "c").exists()


def test_a_prepared_manifest_with_a_key_twice_is_refused(tmp_path):
    """A prepared folder's manifest.json with a key twice is refused naming the file, before any shard is read."""
    (tmp_path / MANIFEST).write_text('{"format": 1, "lr": 1, "lr": 2}')
    with pytest.raises(ValueError, match=f"^manifest {tmp_path / MANIFEST} {TWICE}"):
        read_manifest(tmp_path)


def test_run_files_with_a_key_twice_are_damaged_files(tmp_path):
    """summary.json is a RunDirError and a checkpoint's train state and manifest a CorruptCheckpoint, each naming
    the file and the key (a resume skips such a checkpoint, as any damaged one)."""
    (tmp_path / rundir.SUMMARY).write_text('{"final_val_loss": 1.0, "lr": 1, "lr": 2}')
    with pytest.raises(rundir.RunDirError, match=f"{rundir.SUMMARY} cannot be read \\({TWICE}"):
        rundir.read_summary(tmp_path)
    ckpt = tmp_path / layout.CKPT_DIR / "step_0000004"
    ckpt.mkdir(parents=True)
    for name in (layout.MANIFEST, layout.TRAIN_STATE):
        (ckpt / name).write_text('{"step": 4, "lr": 1, "lr": 2}')
    with pytest.raises(integrity.CorruptCheckpoint, match=f"{layout.MANIFEST} cannot be read \\({TWICE}"):
        integrity.verify_checkpoint(ckpt)
    with pytest.raises(integrity.CorruptCheckpoint, match=f"{layout.TRAIN_STATE} cannot be read \\({TWICE}"):
        integrity.read_train_state(ckpt)


@pytest.mark.parametrize("last", [False, True])
def test_a_metrics_row_with_a_key_twice_is_damage_even_on_the_last_line(tmp_path, last):
    """A metrics row setting loss twice is damage naming the line and the key, never dropped as a cut-off write."""
    rows = ['{"kind": "train", "step": 1, "loss": 2.0}', '{"kind": "train", "step": 2, "loss": 1.0, "loss": 9.0}']
    rows = rows if last else [*rows, '{"kind": "train", "step": 3, "loss": 0.5}']
    (tmp_path / rundir.METRICS).write_text("\n".join(rows) + ("" if last else "\n"))
    with pytest.raises(rundir.RunDirError, match="line 2 sets the key 'loss' twice"):
        rundir.read_metrics(tmp_path)


def test_a_jsonl_document_with_text_twice_is_refused_naming_the_line(tmp_path):
    """A .jsonl corpus line with "text" twice is refused naming the file and the line (the first text was dropped)."""
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "ok"}\n{"text": "a", "text": "b"}\n')
    with pytest.raises(ValueError, match=f"^data file {path} line 2 sets the key 'text' twice .*; fix or remove"):
        list(iter_documents(str(path)))


def test_an_eval_json_with_a_key_twice_is_refused_before_evaluating(tmp_path):
    """eval.json with a task twice is refused before an evaluation runs (its scores would be merged into one)."""
    (tmp_path / "eval.json").write_text('{"tasks": {"hellaswag": {}, "hellaswag": {}}}')
    with pytest.raises(ValueError, match="sets the key 'hellaswag' twice"):
        check_eval_file(tmp_path)
