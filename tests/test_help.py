"""Config discoverability (issue 26): ``train --help`` lists every config field, ``--print-config``
prints the resolved config without training or writing anything."""

from __future__ import annotations

import dataclasses
import typing

import pytest
import yaml

from scalevec.cli import main
from scalevec.config import RunConfig, from_dict, replace, to_dict, usable_cpus
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


def test_help_descriptions_come_from_the_source(capsys):
    """Trailing comments, the comment block above a field and the class docstrings' ``name``: clauses."""
    rows = {line.split()[0]: line for line in train_help(capsys).splitlines() if line.startswith("  ")}
    assert rows["optim.grad_clip"].endswith("0 disables clipping")  # a trailing comment
    assert rows["model.layout"].endswith("pre | peri")
    assert "CPU threads for torch's kernels" in rows["train.threads"]  # the comment block above it
    assert "[--threads]" in rows["train.threads"] and "[--lr]" in rows["optim.lr"]
    assert "one γ per norm" in rows["scale.scale"]  # ScaleConfig's docstring bullet
    assert "SwiGLU width" in rows["model.moe.d_expert"]  # MoEConfig's docstring
    assert "guard_spike_window losses" in rows["train.guard_spike_window"]  # a comment clause naming it
    assert all(len(line) < 260 for line in rows.values())  # one line each


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
