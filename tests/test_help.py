"""Config discoverability: ``train --help`` lists every config field, ``--print-config``
prints the resolved config without training or writing anything."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import typing
from dataclasses import replace

import pytest
import yaml

from scalevec.cli import SUBCOMMANDS, main
from scalevec.config import RunConfig
from scalevec.config.codec import from_dict, to_dict
from scalevec.config.fieldhelp import config_fields, field_docs
from scalevec.config.run_budget import usable_cpus
from scalevec.resolve import resolve_config
from scalevec.training import rundir


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEVEC_CACHE", str(tmp_path / "cache"))


def dataclass_fields() -> list[tuple[str, typing.Any]]:
    """``(dotted name, default)`` of every field, walked from the dataclasses here (not through the code
    under test): a section's fields, and an optional section (``X | None``) itself and then its fields at
    their class's defaults. Defaults: a run with no options (``resolve_config()``)."""
    out = []

    def walk(cls, values, prefix):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            if dataclasses.is_dataclass(tp):
                walk(tp, values[f.name], f"{prefix}{f.name}.")
                continue
            out.append((prefix + f.name, values[f.name]))
            inner = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]
            if inner:
                walk(inner[0], values[f.name] or to_dict(inner[0]()), f"{prefix}{f.name}.")

    walk(RunConfig, to_dict(resolve_config()), "")
    return out


def shown(value) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=1 << 16).removesuffix("...\n").strip()


def train_help(capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


def test_help_lists_every_field_with_type_and_default(capsys):
    expected = dataclass_fields()
    assert len(expected) > 80  # the walk found the sections (model, model.moe, scale, ..., train)
    listing = train_help(capsys).partition("\nconfig fields")[2]
    rows = {line.split()[0]: line + "  " for line in listing.splitlines() if line.startswith("  ")}
    for name, default in expected:
        assert name in rows, f"{name} is missing from `scalevec train --help`"
        assert f"  {shown(default)}  " in rows[name], (name, default, rows[name])
    # the optional sections' own fields, at their classes' defaults
    assert "  8  " in rows["model.moe.n_experts"] and "  8192  " in rows[
        "model.rope_scaling.original_max_position_embeddings"]
    assert "int | None" in rows["model.head_dim"] and "tuple[str, ...]" in rows["scale.dual_sites"]


def config_classes() -> list[type]:
    """RunConfig and every section class reachable from it (optional ones too), walked from the type hints."""
    out, todo = [], [RunConfig]
    while todo:
        cls = todo.pop(0)
        out.append(cls)
        for tp in typing.get_type_hints(cls).values():
            todo += [a for a in (tp, *typing.get_args(tp)) if dataclasses.is_dataclass(a) and a not in out + todo]
    return out


def test_every_field_has_a_description():
    """Every field of every config class has a one-line description (its attribute docstring), a first line
    that is a whole paragraph (what `train --help` shows): a field added without one fails here, named."""
    classes = config_classes()
    assert {c.__name__ for c in classes} >= {"RunConfig", "ModelConfig", "MoEConfig", "RopeScalingConfig",
                                             "ScaleConfig", "OptimConfig", "ScheduleConfig", "DataConfig",
                                             "TrainConfig"}
    missing, long, cut = [], [], []
    for cls in classes:
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            first, _, rest = docs.get(f.name, "").partition("\n")
            if not first.strip():
                missing.append(f"{cls.__name__}.{f.name}")
            elif len(first) > 115:  # one line of `train --help` after the name, type and default columns
                long.append(f"{cls.__name__}.{f.name} ({len(first)} characters)")
            if rest and not rest.startswith("\n"):  # `train --help` shows only the first line
                cut.append(f"{cls.__name__}.{f.name}")
    assert not missing, f"give these fields a description (a docstring line right under the field): {missing}"
    assert not long, f"shorten these descriptions' first line to 115 characters: {long}"
    assert not cut, f"end these descriptions' first line with its sentence, more after a blank line: {cut}"


def test_every_option_of_every_subcommand_has_a_help_text():
    """`scalevec SUBCOMMAND --help` says what each of its options and arguments does: none is listed bare."""
    bare = []

    class Recording(argparse.ArgumentParser):  # what each add_arguments declares, through the public call
        def add_argument(self, *names, **kwargs):
            if not kwargs.get("help"):
                bare.append(f"{self.prog} {'/'.join(names) or kwargs.get('dest')}")
            return super().add_argument(*names, **kwargs)

    for name, module, _ in SUBCOMMANDS:
        importlib.import_module(module).add_arguments(Recording(prog=f"scalevec {name}"))
    assert len(SUBCOMMANDS) >= 14 and not bare, f"give these a help= text: {bare}"


def test_field_docs_reads_only_the_docstring_under_a_field():
    """A field without a docstring of its own gets none: not its neighbour's, not a comment, not the class's."""

    @dataclasses.dataclass
    class Probe:
        """``a``: a clause of the class docstring that names a field."""

        a: int = 1  # a trailing comment
        b: int = 2
        """B's description.

        More about b."""
        # a comment above c
        c: int = 3

    assert field_docs(Probe) == {"b": "B's description.\n\nMore about b."}


def test_help_shows_each_description(capsys):
    """`train --help` shows each field's description (its first line), after the field's flag if it has one."""
    rows = {line.split()[0]: line for line in train_help(capsys).splitlines() if line.startswith("  ")}
    docs = {f.name: f.doc for f in config_fields()}
    assert len(docs) > 80
    for name, doc in docs.items():
        assert rows[name].endswith("  " + doc) or rows[name].endswith("] " + doc), (name, rows[name])
    assert rows["optim.grad_clip"].endswith("0 disables clipping.")
    assert "[--threads] CPU threads for torch's kernels" in rows["train.threads"] and "[--lr]" in rows["optim.lr"]
    assert "fp32 sums" not in rows["train.threads"]  # a description's further lines stay in the source


def print_config(capsys, argv) -> str:
    assert main(["train", *argv, "--print-config"]) == 0
    return capsys.readouterr().out


def test_print_config_round_trips_and_writes_nothing(tmp_path, capsys, monkeypatch):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "my.yaml").write_text("optim: {weight_decay: 0.05}\ntrain: {seq_len: 64}\n")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    out = work / "run"
    text = print_config(capsys, ["--config", str(tmp_path / "in" / "my.yaml"), "--strategy", "unified",
                                 "--lr", "0.01", "--schedule", "wsd", "--steps", "7", "model.moe.n_experts=4",
                                 "--out", str(out)])
    data = yaml.safe_load(text)
    expected = resolve_config(None, "unified", ["optim.lr=0.01", "schedule.name=wsd", "train.steps=7",
                                                "model.moe.n_experts=4"],
                              {"optim": {"weight_decay": 0.05}, "train": {"seq_len": 64}})
    expected = replace(expected, train=replace(expected.train, threads=usable_cpus()))  # as `train` stores it
    assert data == to_dict(expected)
    assert from_dict(RunConfig, data) == expected
    assert data["schedule"]["min_lr_ratio"] == 0.0 and data["model"]["moe"]["n_experts"] == 4
    assert not out.exists() and list(work.iterdir()) == []  # no run directory, no runs/ default
    # the printed YAML is a --config file that resolves to itself
    (tmp_path / "in" / "printed.yaml").write_text(text)
    assert print_config(capsys, ["--config", str(tmp_path / "in" / "printed.yaml")]) == text

    # a bpe:N tokenizer: the vocabulary fitted as the trainer fits it, said in a YAML comment
    text = print_config(capsys, ["--tokenizer", "bpe:1024"])
    assert text.startswith("# model.vocab_size") and yaml.safe_load(text)["model"]["vocab_size"] == 1024
    assert list(work.iterdir()) == []


def test_print_config_bad_key_exits_2(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--print-config", "optim.nope=1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1 and "optim.nope" in captured.err
    assert not out.exists()


@pytest.mark.slow  # one two-step tiny training
def test_print_config_is_what_a_run_stores(tmp_path, capsys):
    argv = ["--preset", "tiny", "--strategy", "hg", "--steps", "2", "--batch-size", "4", "--seq-len", "32",
            "--threads", "1", "--out", str(tmp_path / "run"), "data.val_tokens=1024", "train.eval_every=2",
            f"data.cache_dir={tmp_path / 'cache'}"]
    printed = yaml.safe_load(print_config(capsys, argv))
    assert not (tmp_path / "run").exists()
    assert main(["train", *argv, "--quiet"]) == 0
    assert printed == to_dict(rundir.load_config(tmp_path / "run"))


def test_print_config_of_a_hugging_face_start_is_a_config(tmp_path, hf_llama, capsys):
    """A run from a Hugging Face model records preset ``hf-llama`` (a label, not a preset): its printed config
    is a ``--config`` that resolves to itself (the model section holds the shape), while a label without a
    model section, or given as ``--preset``, is refused naming the presets."""
    hf_dir, _ = hf_llama
    text = print_config(capsys, ["--init-from", str(hf_dir), "--steps", "3", "--seq-len", "32"])
    data = yaml.safe_load(text)
    assert data["preset"] == "hf-llama" and data["model"]["d_model"] == 32 and data["model"]["head_dim"] == 16
    (tmp_path / "printed.yaml").write_text(text)
    again = print_config(capsys, ["--config", str(tmp_path / "printed.yaml")])
    assert again == text
    partial = {k: v for k, v in data["model"].items() if k != "n_kv_heads"}  # nothing filled in from `small`
    for i, (text, message) in enumerate([
            ("preset: hf-llama\n", "missing: d_model, n_layers, n_heads, n_kv_heads, head_dim and "),
            ("preset: hf-llama\nmodel: {}\n", "missing: d_model, n_layers, n_heads, n_kv_heads, head_dim and "),
            (yaml.safe_dump({"preset": "hf-llama", "model": partial}), "(missing: n_kv_heads)"),
            ("preset: tiny\nmodel: [1, 2]\n", "config section 'model' must be a mapping"),
            ("preset: hf-llama\nmodel: [1, 2]\n", "config section 'model' must be a mapping"),
            ("preset: hf-\nmodel: {d_model: 32}\n", "unknown preset 'hf-'"),
            ("preset: 0\n", "preset: 0 is not a name"), ("strategy: ''\n", "strategy: '' is not a name")]):
        (tmp_path / f"label{i}.yaml").write_text(text)
        assert main(["train", "--config", str(tmp_path / f"label{i}.yaml"), "--print-config"]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and message in err, err
    assert main(["train", "--preset", "hf-llama", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "unknown preset 'hf-llama'" in err and "cpu-10k" in err
    for item in ("preset=tiny", "strategy=unified"):  # would relabel the run without rebuilding it
        assert main(["train", item, "--print-config"]) == 2
        assert f"{item} is not an override; choose the {item.split('=')[0]} with --" in capsys.readouterr().err
