"""One validator for a Hugging Face config.json (hf_import.read_config_json, check_hf_config): `generate`, `eval`
and `convert` refuse the same hostile values in one line, exit 2, before transformers builds anything (19 of
them were tracebacks in `generate` and `eval`); a 200k-deep config.json is one line, not a RecursionError; an
unknown rope type, a NaN rope_theta and max_position_embeddings -1 are refused. And a run and its own export score
the same by default in `eval --text` (the same windows).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from scalevec.cli import main
from test_faults_inputs import one_line_error
from test_rundir_faults import tiny_setup  # the fault suite's tiny run


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A finished tiny run, its export and a short text."""
    env = tiny_setup(tmp_path_factory.mktemp("faults-hf-config"), "run")
    assert main(["export", str(env["run"]), "--out", str(env["root"] / "exp")]) == 0
    (env["root"] / "t.txt").write_text("ROMEO: what light through yonder window breaks? It is the east, and "
                                       "Juliet is the sun.\n" * 8)
    return {**env, "exp": env["root"] / "exp", "text": env["root"] / "t.txt"}


def _rope(**kv):
    return lambda c: c["rope_parameters"].update(kv)


# (edit of config.json, a word the one-line error must hold)
HOSTILE = {
    "rope_theta NaN": (_rope(rope_theta=float("nan")), "rope_theta"),
    "rope_theta -1": (_rope(rope_theta=-1), "rope_theta"),
    "rope type bogus": (_rope(rope_type="bogus"), "rope type"),
    "rope type yarn": (_rope(rope_type="yarn"), "rope type"),
    "rope type a list": (_rope(rope_type=["default"]), "rope type ['default']"),  # a TypeError (unhashable) before
    "rope_parameters a string": (lambda c: c.update(rope_parameters="x"), "rope_parameters"),
    "max_position_embeddings -1": (lambda c: c.update(max_position_embeddings=-1), "max_position_embeddings"),
    "max_position_embeddings 0": (lambda c: c.update(max_position_embeddings=0), "max_position_embeddings"),
    "max_position_embeddings a string": (lambda c: c.update(max_position_embeddings="x"), "max_position_embeddings"),
    "hidden_size a string": (lambda c: c.update(hidden_size="x"), "hidden_size"),
    "num_attention_heads 0": (lambda c: c.update(num_attention_heads=0), "num_attention_heads"),
    "num_attention_heads 3": (lambda c: c.update(num_attention_heads=3, head_dim=None), "num_attention_heads"),
    "num_key_value_heads 0": (lambda c: c.update(num_key_value_heads=0), "num_key_value_heads"),
    "num_hidden_layers a string": (lambda c: c.update(num_hidden_layers="4"), "num_hidden_layers"),
    "head_dim a string": (lambda c: c.update(head_dim="x"), "head_dim"),
    "rms_norm_eps -1": (lambda c: c.update(rms_norm_eps=-1), "rms_norm_eps"),
    "hidden_act bogus": (lambda c: c.update(hidden_act="bogus"), "hidden_act"),
    "tie_word_embeddings a string": (lambda c: c.update(tie_word_embeddings="no"), "tie_word_embeddings"),
    "model_type a number": (lambda c: c.update(model_type=5), "model_type"),
}


def hostile(models, tmp_path: Path, edit) -> Path:
    d = tmp_path / "hf"
    shutil.copytree(models["exp"], d)
    conf = json.loads((d / "config.json").read_text())
    edit(conf)
    (d / "config.json").write_text(json.dumps(conf, allow_nan=True))
    return d


def argv_of(command: str, d: Path, models, tmp_path: Path) -> list[str]:
    return {"generate": ["generate", str(d), "--prompt", "a", "--max-new-tokens", "2", "--temperature", "0"],
            "eval": ["eval", str(d), "--text", str(models["text"])],
            "convert": ["convert", str(d), "--strategy", "unified", "--out", str(tmp_path / "c")]}[command]


@pytest.mark.parametrize("case", list(HOSTILE))
def test_generate_refuses_a_hostile_config_json_in_one_line(models, tmp_path, capsys, case):
    """`generate` on an export whose config.json holds a bad value: one line naming the field, exit 2."""
    edit, word = HOSTILE[case]
    d = hostile(models, tmp_path, edit)
    assert main(argv_of("generate", d, models, tmp_path)) == 2
    one_line_error(capsys, word)


@pytest.mark.parametrize("command", ["eval", "convert"])
@pytest.mark.parametrize("case", ["rope_theta NaN", "max_position_embeddings -1", "rope type bogus",
                                  "rope type a list", "num_attention_heads 0"])
def test_eval_and_convert_refuse_what_generate_refuses(models, tmp_path, capsys, command, case):
    """`eval --text` and `convert` refuse the same config.json values in the same words (one validator)."""
    edit, word = HOSTILE[case]
    d = hostile(models, tmp_path, edit)
    assert main(argv_of(command, d, models, tmp_path)) == 2
    last = one_line_error(capsys, word)
    assert "must be in [1, -1]" not in last  # eval's old message for max_position_embeddings -1
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("command", ["generate", "eval", "convert"])
def test_a_200k_deep_config_json_is_one_line(models, tmp_path, capsys, command):
    """A config.json nested 200,000 deep is one line naming the file (convert raised RecursionError)."""
    d = tmp_path / "hf"
    shutil.copytree(models["exp"], d)
    (d / "config.json").write_text('{"model_type": "llama", "x": ' + "[" * 200_000 + "]" * 200_000 + "}")
    assert main(argv_of(command, d, models, tmp_path)) == 2
    assert "custom code" not in one_line_error(capsys, str(d / "config.json"), "nests too deeply")


@pytest.mark.parametrize("command", ["generate", "eval", "convert", "train"])
@pytest.mark.parametrize("raw, words", [(b"", "is not valid JSON"), (b"\xff{}", "is not valid JSON"),
                                        (b"[1]", "is not a JSON object")])
def test_an_unreadable_config_json_is_named_by_every_command(models, tmp_path, capsys, command, raw, words):
    """An empty, non-UTF-8 or non-object config.json is one line naming config.json from every command; convert
    and train --init-from said the directory was "neither a Hugging Face model ... nor a run" (and a too-deep one
    was called custom code by convert). Nothing is written."""
    d = tmp_path / "hf"
    shutil.copytree(models["exp"], d)
    (d / "config.json").write_bytes(raw)
    argv = (["train", "--init-from", str(d), "--out", str(tmp_path / "c")] if command == "train"
            else argv_of(command, d, models, tmp_path))
    assert main(argv) == 2
    last = one_line_error(capsys, str(d / "config.json"), words)
    assert "custom code" not in last and not (tmp_path / "c").exists()


@pytest.mark.parametrize("command", ["generate", "convert", "train"])
def test_a_deeply_nested_safetensors_index_is_one_line(models, tmp_path, capsys, command):
    """A model.safetensors.index.json nested 100,000 deep (a RecursionError traceback before) is one line naming the
    index and the fix, from every command that reads the weights."""
    d = tmp_path / "hf"
    shutil.copytree(models["exp"], d)
    (d / "model.safetensors.index.json").write_text("[" * 100_000 + "]" * 100_000)
    argv = (["train", "--init-from", str(d), "--out", str(tmp_path / "c")] if command == "train"
            else argv_of(command, d, models, tmp_path))
    assert main(argv) == 2
    one_line_error(capsys, str(d / "model.safetensors.index.json"), "nests too deeply", "save_pretrained")
    assert not (tmp_path / "c").exists()


def perplexity_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("perplexity "))


def test_a_run_and_its_export_score_the_same_by_default(models, capsys):
    """`eval --text` of a run and of its own export, both without --seq-len, use the same windows and print the
    same perplexity (they differed: 56.1537 vs 56.1836, windows of train.seq_len vs the export's context)."""
    assert main(["eval", str(models["run"]), "--text", str(models["text"])]) == 0
    run_out = capsys.readouterr().out
    assert main(["eval", str(models["exp"]), "--text", str(models["text"])]) == 0
    exp_out = capsys.readouterr().out
    windows = [re.search(r"windows of (\d+)", o).group(1) for o in (run_out, exp_out)]
    assert windows[0] == windows[1] == str(models["cfg"].train.seq_len)
    # the run's model and its float32 export agree to ~1e-6 relative (export --verify's tolerance): 4 decimals equal
    assert perplexity_line(run_out) == perplexity_line(exp_out)


def test_convert_says_when_it_trains_on_another_corpus_than_the_sources(models, tmp_path, capsys):
    """`convert` of an export trained on the user's own text names the corpus its run will train on (the bundled
    Shakespeare by default) and the source's; an export trained on the default corpus gets no such note."""
    d = tmp_path / "hf"
    shutil.copytree(models["exp"], d)
    conf = json.loads((d / "config.json").read_text())
    assert conf["scalevec_data_source"] == "shakespeare"  # what export records of its run
    assert main(["convert", str(d), "--strategy", "baseline", "--out", str(tmp_path / "same")]) == 0
    assert "trains on" not in capsys.readouterr().err
    conf["scalevec_data_source"] = "/data/my_own.txt"
    (d / "config.json").write_text(json.dumps(conf))
    assert main(["convert", str(d), "--strategy", "baseline", "--out", str(tmp_path / "other")]) == 0
    err = capsys.readouterr().err
    assert "was trained on /data/my_own.txt, this run trains on shakespeare" in err
    assert "--data /data/my_own.txt" in err
