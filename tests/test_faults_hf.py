"""Hugging Face directories that are hostile or broken: each fails with one line, exit 2, and runs nothing.

- ``eval``/``generate`` trust an export's custom code only when it is byte for byte the code scalevec
  ships (``generate.check_hf_dir``); anything else needs ``--trust-remote-code``;
- weights are read only from safetensors: a pickled ``pytorch_model.bin`` is refused, never unpickled;
- ``--init-from`` checks config.json's types and values, the model's size against memory and the config
  against the safetensors headers before it builds or loads anything;
- a shard index cannot point outside its directory.

Models are tiny and local (transformers ``save_pretrained`` or ``export_model``); nothing downloads.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil

import pytest
import torch
import transformers  # noqa: F401  (a dev dependency: a missing one fails, never skips)

from scalevec import ScaleConfig, build_model
from scalevec.cli import main
from scalevec.data.tokenizer import load_tokenizer
from scalevec.hf import evaluation
from scalevec.hf.evaluation import SHAKESPEARE_TASK
from scalevec.hf.export import export_model
from scalevec.hf.generate import check_hf_dir, custom_code_trusted
from scalevec.hf_format.hf_import import check_size, model_config_from_hf, param_count, read_hf

GENERATE = ["--prompt", "Thou", "--max-new-tokens", "3", "--temperature", "0"]


def _one_line_error(capsys, command: str) -> str:
    """The stderr of a failed command: one line, ``scalevec COMMAND: error: ...``, no traceback."""
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"scalevec {command}: error: ") and "\n" not in err, err
    return err


def _export(path, make_cfg, strategy: str):
    """A tiny model of ``strategy`` exported with a bytes tokenizer (``unified``: the custom architecture)."""
    load_tokenizer("bytes").save(path.parent / f"{path.name}-tok")
    model = build_model(make_cfg(vocab_size=256), ScaleConfig.preset(strategy), seed=0).eval()
    return export_model(model, path, tokenizer_dir=path.parent / f"{path.name}-tok")


@pytest.fixture
def custom_export(tmp_path, make_cfg):
    """A scalevec custom-code export (strategy unified: ScalevecForCausalLM, auto_map, shipped files)."""
    out = _export(tmp_path / "custom", make_cfg, "unified")
    assert "auto_map" in json.loads((out / "config.json").read_text())
    return out


def _tamper(hf_dir, marker) -> None:
    """Make the export's modeling file write ``marker`` when it is imported: code that must not run."""
    f = hf_dir / "modeling_scalevec.py"
    future = "from __future__ import annotations\n"  # must stay the first statement
    payload = f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
    f.write_text(f.read_text().replace(future, future + payload, 1))


# ------------------------------------------------------------------------------------------- remote code


def test_scalevec_custom_code_export_generates_without_the_flag(custom_export, capsys):
    """scalevec's own custom-code export is its shipped code byte for byte: generate loads it with no flag."""
    assert main(["generate", str(custom_export), *GENERATE]) == 0
    assert capsys.readouterr().out.startswith("Thou")
    assert custom_code_trusted(custom_export) is True


def test_tampered_custom_code_is_refused_and_never_runs(tmp_path, custom_export, capsys):
    """A modeling file that differs from the shipped one: generate and eval exit 2 naming the file and the
    flag, and the file's code does not run; with --trust-remote-code generate loads it (and it runs)."""
    marker = tmp_path / "marker"
    _tamper(custom_export, marker)
    assert main(["generate", str(custom_export), *GENERATE]) == 2
    err = _one_line_error(capsys, "generate")
    assert "modeling_scalevec.py" in err and "--trust-remote-code" in err
    assert main(["eval", str(custom_export), "--tasks", SHAKESPEARE_TASK, "--no-write"]) == 2
    err = _one_line_error(capsys, "eval")
    assert "modeling_scalevec.py" in err and "--trust-remote-code" in err
    assert not marker.exists()
    # this process may hold the genuine classes from another test, registered under the unchanged config
    # class: change the configuration file too, so that transformers imports the tampered modeling file
    with (custom_export / "configuration_scalevec.py").open("a") as f:
        f.write("# changed\n")
    assert main(["generate", str(custom_export), *GENERATE, "--trust-remote-code"]) == 0
    assert marker.read_text() == "ran"


@pytest.mark.parametrize("change", ["extra_py", "other_repo", "missing_module", "tokenizer_auto_map"])
def test_unverifiable_custom_code_is_refused(custom_export, change):
    """Any .py in the directory, an auto_map into another repository, a module the directory lacks, or a
    tokenizer auto_map naming unshipped code: not scalevec's code, so refused without the flag."""
    config = json.loads((custom_export / "config.json").read_text())
    if change == "extra_py":
        (custom_export / "helpers.py").write_text("import os\n")
    elif change == "other_repo":
        config["auto_map"]["AutoModelForCausalLM"] = "someone/else--modeling_scalevec.ScalevecForCausalLM"
    elif change == "missing_module":
        config["auto_map"]["AutoModelForCausalLM"] = "modeling_other.ScalevecForCausalLM"
    else:
        tok = json.loads((custom_export / "tokenizer_config.json").read_text())
        tok["auto_map"] = {"AutoTokenizer": [None, "tokenization_evil.EvilTokenizer"]}
        (custom_export / "tokenizer_config.json").write_text(json.dumps(tok))
        (custom_export / "tokenization_evil.py").write_text("import os\n")
    (custom_export / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="--trust-remote-code"):
        check_hf_dir(custom_export)
    assert check_hf_dir(custom_export, trust_remote_code=True) is True


def test_a_plain_export_needs_no_trust(tmp_path, make_cfg):
    """A Llama export has no auto_map: no custom code, loaded with trust_remote_code=False."""
    out = _export(tmp_path / "plain", make_cfg, "baseline")
    assert check_hf_dir(out) is False and check_hf_dir(out, trust_remote_code=True) is False


class _FakeLM:
    """Stands in for lm-eval's HFLM: records how it was asked to load the directory."""

    calls: list[dict] = []
    max_length = 256  # what evaluation.fit_tokenizer_limit reads of a real HFLM

    def __init__(self, **kwargs):
        _FakeLM.calls.append(kwargs)
        self.tokenizer = type("Tokenizer", (), {"model_max_length": 256})()


class _FakeTasks:
    def __init__(self, include_path=None, include_defaults=True):
        pass

    def match_tasks(self, tasks):
        return tasks


def test_eval_passes_the_checked_trust_to_lm_eval(tmp_path, make_cfg, custom_export, monkeypatch):
    """eval loads scalevec's own custom code with trust_remote_code=True and a plain Llama with False,
    and asks for safetensors only (lm-eval itself stubbed: this is the wiring, not the scores)."""
    fake_lm_eval = type("lm_eval", (), {"simple_evaluate": staticmethod(lambda **kw: {"results": {}})})
    monkeypatch.setattr(evaluation, "_import_lm_eval", lambda: (fake_lm_eval, _FakeLM, _FakeTasks))
    _FakeLM.calls = []
    plain = _export(tmp_path / "plain", make_cfg, "baseline")
    for hf_dir in (custom_export, plain):
        evaluation.evaluate_hf_dir(hf_dir, [SHAKESPEARE_TASK])
    assert [c["trust_remote_code"] for c in _FakeLM.calls] == [True, False]
    assert all(c["use_safetensors"] for c in _FakeLM.calls)


# ------------------------------------------------------------------------------------------- pickles


class _Payload:
    """Unpickling this writes a marker file: the proof that a pickle was (not) loaded."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('unpickled')",))


def test_a_pickled_checkpoint_is_refused_unread(tmp_path, make_cfg, capsys):
    """generate, eval and --init-from on a directory with only pytorch_model.bin: the same one-line
    'no model.safetensors' error, exit 2, and the pickle is never opened."""
    out = _export(tmp_path / "hf", make_cfg, "baseline")
    (out / "model.safetensors").unlink()
    marker = tmp_path / "marker"
    (out / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(marker)))
    assert main(["generate", str(out), *GENERATE]) == 2
    err = _one_line_error(capsys, "generate")
    assert "has no model.safetensors" in err
    assert main(["eval", str(out), "--tasks", SHAKESPEARE_TASK, "--no-write"]) == 2
    assert _one_line_error(capsys, "eval").split(": error: ")[1] == err.split(": error: ")[1]
    assert main(["train", "--init-from", str(out), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    assert _one_line_error(capsys, "train").split(": error: ")[1] == err.split(": error: ")[1]
    assert not marker.exists() and not (tmp_path / "run" / "config.yaml").exists()


# ------------------------------------------------------------------------------------------- --init-from


@pytest.fixture(scope="module")
def hf_dir(hf_llama):
    """The directory of conftest's random Llama (these tests damage copies of its files)."""
    return hf_llama[0]


def _copy(hf_dir, tmp_path, **config_changes):
    """A copy of the Llama directory with config.json fields replaced (a value None removes the field)."""
    d = shutil.copytree(hf_dir, tmp_path / "src")
    conf = json.loads((d / "config.json").read_text())
    conf.update(config_changes)
    conf = {k: v for k, v in conf.items() if v is not None}
    (d / "config.json").write_text(json.dumps(conf))
    return d


def _init_from(d, tmp_path, capsys) -> str:
    """``train --init-from d``: must exit 2 with one line and write no run; returns the line."""
    out = tmp_path / "run"
    assert main(["train", "--init-from", str(d), "--out", str(out), "--quiet",
                 f"data.cache_dir={tmp_path / 'cache'}"]) == 2
    assert not (out / "config.yaml").exists()
    return _one_line_error(capsys, "train")


@pytest.mark.parametrize("changes, message", [
    (dict(num_attention_heads=0), "num_attention_heads must be a whole number >= 1; got 0;"),  # was ZeroDivisionError
    (dict(hidden_size="64"), "hidden_size must be a whole number >= 1; got '64';"),  # was TypeError
    (dict(hidden_size=32.0), "hidden_size must be a whole number >= 1; got 32.0;"),
    (dict(hidden_size=None), "config.json: hidden_size is missing; fix config.json"),  # was KeyError
    # a truthy string: silently tied
    (dict(tie_word_embeddings="false"), "tie_word_embeddings must be true or false; got 'false';"),
    (dict(rope_parameters=dict(rope_type="llama3", rope_theta=10000.0)), "config.json: factor is missing;"),  # KeyError
    (dict(rope_parameters="default"), "rope_parameters must be a mapping; got 'default';"),
    (dict(hidden_size=10**9), "memory"),  # was an allocator error
    (dict(vocab_size=10**12), "memory"),
    (dict(num_hidden_layers=10**5), "num_hidden_layers=100000"),  # was minutes of building layers
    (dict(num_hidden_layers=1), "num_hidden_layers=1 but the checkpoint's tensors hold 2 layers"),
    (dict(intermediate_size=64), "mlp.gate_proj.weight has shape (48, 32)"),
    (dict(num_key_value_heads=4), "self_attn.k_proj.weight has shape (32, 32)"),
])
def test_bad_hf_config_is_one_line(tmp_path, hf_dir, capsys, changes, message):
    """A config.json with wrong types, impossible or absurd values, or sizes that its tensors do not have:
    one line naming the field, exit 2, before any model is built."""
    err = _init_from(_copy(hf_dir, tmp_path, **changes), tmp_path, capsys)
    assert message in err


@pytest.mark.parametrize("damage", ["truncated", "pickle", "empty"])
def test_unreadable_safetensors_is_one_line(tmp_path, hf_dir, capsys, damage):
    """A truncated model.safetensors, a pickle under that name or an empty file: one line, not SafetensorError."""
    d = _copy(hf_dir, tmp_path)
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes({"truncated": data[:len(data) // 2], "pickle": pickle.dumps({"w": torch.zeros(2)}),
                   "empty": b""}[damage])
    assert "is not a readable safetensors file" in _init_from(d, tmp_path, capsys)


def test_size_check_counts_the_model(hf_dir):
    """param_count is the Hugging Face model's parameter count; check_size refuses what memory cannot hold."""
    fmt, cfg = model_config_from_hf(json.loads((hf_dir / "config.json").read_text()))
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir)
    assert param_count(cfg) == sum(p.numel() for p in hf.parameters())
    check_size(cfg, memory=4 * param_count(cfg))
    with pytest.raises(ValueError, match="memory"):
        check_size(cfg, memory=4 * param_count(cfg) - 1)


# ------------------------------------------------------------------------------------------- shard paths


def _sharded(hf_dir, tmp_path, shard_name):
    """The Llama as one shard named ``shard_name`` in a model.safetensors.index.json (the file is moved
    there when the name points outside the directory)."""
    d = _copy(hf_dir, tmp_path)
    target = (d / shard_name) if not os.path.isabs(shard_name) else type(d)(shard_name)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(d / "model.safetensors", target)
    from safetensors import safe_open

    with safe_open(str(target), "pt") as f:
        weight_map = {k: shard_name for k in f.keys()}
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d


@pytest.mark.parametrize("where", ["parent", "absolute", "symlink"])
def test_shards_outside_the_directory_are_refused(tmp_path, hf_dir, capsys, where):
    """An index naming ../outside.safetensors, an absolute path, or a shard symlinked to a file outside:
    refused (ValueError, exit 2), not read."""
    outside = tmp_path / "elsewhere" / "outside.safetensors"
    if where == "symlink":
        d = _sharded(hf_dir, tmp_path, "model-00001-of-00001.safetensors")
        outside.parent.mkdir()
        shutil.move(d / "model-00001-of-00001.safetensors", outside)
        (d / "model-00001-of-00001.safetensors").symlink_to(outside)
    else:
        d = _sharded(hf_dir, tmp_path, "../elsewhere/outside.safetensors" if where == "parent" else str(outside))
    assert outside.is_file()
    with pytest.raises(ValueError, match="outside"):
        read_hf(d)
    assert "lies outside" in _init_from(d, tmp_path, capsys)


def test_shards_inside_the_directory_load(tmp_path, hf_dir):
    """A shard in a subfolder of the model directory is inside: it loads."""
    d = _sharded(hf_dir, tmp_path, "shards/model-00001-of-00001.safetensors")
    fmt, plain = read_hf(d)
    assert fmt == "llama" and plain.cfg.n_layers == 2


def test_a_hub_cache_snapshot_with_symlinked_blobs_is_read(tmp_path):
    """The Hugging Face cache layout (snapshots/REV/model.safetensors -> ../../blobs/HASH) is the snapshot's own
    file: followed; a symlink from a snapshot to anywhere else is still refused."""
    from scalevec.hf_format.hf_import import weight_files

    repo = tmp_path / "models--org--m"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (repo / "blobs" / "deadbeef").write_bytes(b"x")
    (snap / "model.safetensors").symlink_to("../../blobs/deadbeef")
    assert weight_files(snap) == [snap / "model.safetensors"]
    (snap / "model.safetensors").unlink()
    (tmp_path / "elsewhere").write_bytes(b"x")
    (snap / "model.safetensors").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="outside"):
        weight_files(snap)
