"""Sampling text from a run directory or an exported Hugging Face directory (DESIGN.md §10)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_model

from scalevec import RunConfig, ScaleConfig, build_model
from scalevec.cli import main
from scalevec.config import save_yaml
from scalevec.data import load_tokenizer
from scalevec.generate import generate_ids, sample

V = 16


def _successor(tokens):
    """Fake logits (1, T, V): the last token's successor (t + 1) % V scores 5, its successor's successor 4."""
    last = tokens[0, -1]
    logits = torch.zeros(1, tokens.shape[1], V)
    logits[0, -1, (last + 1) % V] = 5.0
    logits[0, -1, (last + 2) % V] = 4.0
    return logits


@pytest.fixture
def model(make_cfg, perturb_scales):
    """A tiny dense model with a bytes vocabulary and non-trivial scales."""
    m = build_model(make_cfg(vocab_size=256), ScaleConfig.preset("unified_foldable"), seed=0)
    perturb_scales(m)
    return m


def _run_dir(path, model):
    """A run directory in the train.py contract with a bytes tokenizer."""
    path.mkdir()
    save_yaml(RunConfig(strategy="unified_foldable", model=model.cfg, scale=model.scfg), path / "config.yaml")
    ckpt = path / "checkpoints" / "step_0000005"
    ckpt.mkdir(parents=True)
    save_model(model, str(ckpt / "model.safetensors"))
    (path / "checkpoints" / "latest").write_text(ckpt.name)
    load_tokenizer("bytes").save(path / "tokenizer")
    (path / "DONE").write_text("")
    return path


def test_greedy_follows_the_argmax():
    """Temperature 0 picks the argmax every step: successor logits give prompt+1, +2, ... exactly."""
    assert sample(_successor, [3], max_new_tokens=5, temperature=0.0) == [4, 5, 6, 7, 8]


def test_greedy_tokens_are_the_models_argmax(model):
    """Greedy ids from our model equal the argmax of its teacher-forced logits at every generated position."""
    prompt = [83, 104, 97]
    new = sample(model, prompt, max_new_tokens=6, temperature=0.0, context=model.cfg.max_seq_len)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + new]))[0]
    assert new == logits[len(prompt) - 1:-1].argmax(-1).tolist()


def test_sampling_is_deterministic_for_a_seed(model):
    """The same seed gives the same ids; another seed gives other ids (near-uniform logits over 256 tokens)."""
    a = sample(model, [65], max_new_tokens=20, temperature=1.0, seed=7, context=16)
    b = sample(model, [65], max_new_tokens=20, temperature=1.0, seed=7, context=16)
    c = sample(model, [65], max_new_tokens=20, temperature=1.0, seed=8, context=16)
    assert a == b and a != c and len(a) == 20


def test_top_k_restricts_the_choices():
    """top_k=1 is greedy at any temperature; top_k=2 only ever picks the two best-scoring tokens."""
    assert sample(_successor, [0], 8, temperature=5.0, top_k=1, seed=1) == list(range(1, 9))
    ids = [0] + sample(_successor, [0], 40, temperature=5.0, top_k=2, seed=1)
    steps = {(b - a) % V for a, b in zip(ids, ids[1:])}
    assert steps == {1, 2}


def test_stops_at_eos():
    """Generation stops right after emitting the EOS id."""
    assert sample(_successor, [1], max_new_tokens=10, temperature=0.0, eos_id=4) == [2, 3, 4]


@pytest.mark.parametrize("kwargs", [dict(temperature=-1.0), dict(top_k=0), dict(max_new_tokens=-1)])
def test_bad_sampling_arguments_raise(kwargs):
    """Negative temperature or max_new_tokens, and top_k < 1, are ValueErrors."""
    args = dict(max_new_tokens=3, temperature=1.0) | kwargs
    with pytest.raises(ValueError):
        sample(_successor, [1], **args)


def test_run_and_export_generate_the_same_ids(tmp_path, model):
    """Greedy generation from the run directory and from its Hugging Face export gives the same ids."""
    pytest.importorskip("transformers")
    run = _run_dir(tmp_path / "run", model)
    assert main(["export", str(run), "--out", str(tmp_path / "hf")]) == 0
    ours, _ = generate_ids(run, "Thou art", max_new_tokens=8, temperature=0.0)
    theirs, _ = generate_ids(tmp_path / "hf", "Thou art", max_new_tokens=8, temperature=0.0)
    assert ours == theirs and len(ours) == 8


def test_cli_generate_prints_prompt_and_continuation(tmp_path, model, capsys):
    """`scalevec generate RUN --prompt P` prints P followed by the sampled text; a bad path exits 2."""
    run = _run_dir(tmp_path / "run", model)
    args = ["generate", str(run), "--prompt", "Shall I", "--max-new-tokens", "5", "--seed", "3"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert first.startswith("Shall I") and len(first) > len("Shall I\n")
    assert main(args) == 0 and capsys.readouterr().out == first
    assert main(["generate", str(tmp_path / "nowhere"), "--prompt", "x"]) == 2
    assert "neither a scalevec run directory" in capsys.readouterr().err
