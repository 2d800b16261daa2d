"""Export to Hugging Face: fold, rename, write, load with plain transformers, same logits (DESIGN.md §10)."""

from __future__ import annotations

import dataclasses
import json
import os
import stat

import pytest
import torch
import transformers  # noqa: F401  (a dev dependency: a missing one fails, never skips)
from safetensors.torch import load_file, save_file, save_model
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast  # noqa: E402

from scalevec import MoEConfig, RunConfig, ScaleConfig, build_model  # noqa: E402
from scalevec.cli import main  # noqa: E402
from scalevec.config import DataConfig, TrainConfig
from scalevec.config.codec import save_yaml
from scalevec.data.tokenizer import load_tokenizer  # noqa: E402
from scalevec.hf.export import export_model  # noqa: E402
from scalevec.hf.verify import VerifyError, verify  # noqa: E402
from scalevec.model.fold import foldable_strategies

FOLDABLE = tuple(foldable_strategies())  # from the registry (config.STRATEGIES): a new strategy is exported here too


def some_fast(cases, fast):
    """pytest params over ``cases`` (tuples); those not in ``fast`` are ``slow`` (the whole suite runs them; the
    fast loop keeps a few that cover each path)."""
    return [pytest.param(*c, marks=() if c in fast else pytest.mark.slow) for c in cases]
MOE = MoEConfig(n_experts=4, top_k=2, d_expert=16)
INPUT_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight", "model.norm.weight")


def _trained_like(make_cfg, perturb_scales, strategy="unified_foldable", seed=0, **cfg_overrides):
    """A tiny model whose scale vectors all differ from 1, as after training (so folding matters)."""
    model = build_model(make_cfg(**cfg_overrides), ScaleConfig.preset(strategy), seed=seed)
    perturb_scales(model, seed=seed)
    return model


def _hf_state(out_dir):
    """Every tensor of an exported directory (one file or shards), by Hugging Face name."""
    state = {}
    for f in sorted(out_dir.glob("*.safetensors")):
        state.update(load_file(str(f)))
    return state


def _tokenizer_dir(path, vocab_size=64):
    """A small byte-level BPE tokenizer with <|bos|>/<|eos|>, saved as tokenizer.json + tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|bos|>", "<|eos|>"], show_progress=False)
    tok.train_from_iterator(["to be or not to be, that is the question"] * 4, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>").save_pretrained(str(path))
    return path


@pytest.mark.parametrize("strategy, tie", some_fast([(s, t) for s in FOLDABLE for t in (False, True)],
                                                   {("baseline", False), ("or", False), ("unified_foldable", True)}))
def test_dense_round_trip_verifies(tmp_path, make_cfg, perturb_scales, tokens, strategy, tie):
    """Export + verify: a folded foldable model loads in transformers with no key problems, same logits and loss."""
    model = _trained_like(make_cfg, perturb_scales, strategy, tie_embeddings=tie)
    out = export_model(model, tmp_path / "hf", verify_tokens=tokens)
    r = verify(out, model, tokens)
    assert r["max_abs_logit_diff"] <= 1e-4 and abs(r["loss_ours"] - r["loss_hf"]) <= 1e-4
    assert not (r["loading_info"]["missing_keys"] or r["loading_info"]["unexpected_keys"])
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]


@pytest.mark.parametrize("strategy, tie", some_fast([(s, t) for s in FOLDABLE for t in (False, True)],
                                                   {("unified_foldable", True)}))
def test_qk_norm_round_trip_is_qwen3(tmp_path, make_cfg, perturb_scales, tokens, strategy, tie):
    """QK-norm models export as Qwen3ForCausalLM; their (trained) q/k-norm γ become q_norm/k_norm weights."""
    model = _trained_like(make_cfg, perturb_scales, strategy, qk_norm=True, tie_embeddings=tie)
    out = export_model(model, tmp_path / "hf", verify_tokens=tokens)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    hf = _hf_state(out)
    q_norm = model.layers[1].attn.q_norm.scale
    expected = q_norm() if q_norm is not None else torch.ones(model.cfg.head_dim)
    assert torch.equal(hf["model.layers.1.self_attn.q_norm.weight"], expected.detach())


@pytest.mark.parametrize("strategy, qk_norm, arch", some_fast(
    [(s, *f) for s in FOLDABLE for f in ((False, "MixtralForCausalLM"), (True, "Qwen3MoeForCausalLM"))],
    {("baseline", False, "MixtralForCausalLM"), ("unified_foldable", True, "Qwen3MoeForCausalLM")}))
def test_moe_round_trip_verifies(tmp_path, make_cfg, perturb_scales, tokens, strategy, qk_norm, arch):
    """MoE models export as Mixtral (Qwen3-MoE with QK-norm); routing and experts reproduce our logits."""
    model = _trained_like(make_cfg, perturb_scales, strategy, qk_norm=qk_norm, moe=MOE)
    out = export_model(model, tmp_path / "hf", verify_tokens=tokens)
    assert json.loads((out / "config.json").read_text())["architectures"] == [arch]


def test_moe_per_expert_scales_and_dense_layers_fold(tmp_path, make_cfg, perturb_scales, tokens):
    """HG per-expert scales fold into each expert; Qwen3-MoE keeps moe.first_dense blocks dense (mlp_only_layers)."""
    moe = dataclasses.replace(MOE, first_dense=1)
    cfg = make_cfg(qk_norm=True, moe=moe, tie_embeddings=True)
    model = build_model(cfg, dataclasses.replace(ScaleConfig.preset("unified_foldable"), per_expert=True), seed=0)
    perturb_scales(model)
    out = export_model(model, tmp_path / "hf", verify_tokens=tokens)
    assert json.loads((out / "config.json").read_text())["mlp_only_layers"] == [0]
    assert "model.layers.0.mlp.gate_proj.weight" in _hf_state(out)


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_exported_embedding_is_bitwise_the_trained_one(tmp_path, make_cfg, perturb_scales, tie):
    """The exported embed_tokens equals the trained embedding bitwise; tied heads are untied (tie false)."""
    model = _trained_like(make_cfg, perturb_scales, tie_embeddings=tie)
    out = export_model(model, tmp_path / "hf")
    hf = _hf_state(out)
    assert torch.equal(hf["model.embed_tokens.weight"], model.embed.weight.detach())
    assert not torch.equal(hf["lm_head.weight"], hf["model.embed_tokens.weight"])  # γ_final folded into the head
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False


@pytest.mark.parametrize("moe", [None, MOE], ids=["dense", "moe"])
def test_every_input_norm_weight_is_exactly_one(tmp_path, make_cfg, perturb_scales, moe):
    """After folding, every written input-norm weight is exactly 1.0 (its γ now lives in the weights)."""
    model = _trained_like(make_cfg, perturb_scales, moe=moe)
    hf = _hf_state(export_model(model, tmp_path / "hf"))
    norms = [k for k in hf if k.endswith(INPUT_NORMS)]
    assert len(norms) == 2 * model.cfg.n_layers + 1
    assert all(torch.equal(hf[k], torch.ones_like(hf[k])) for k in norms)


def test_config_carries_rope_theta_eps_and_shape(tmp_path, make_cfg, perturb_scales, tokens):
    """Non-default rope_theta and norm eps, GQA heads, head_dim, sizes and bos/eos ids round-trip via config.json."""
    model = _trained_like(make_cfg, perturb_scales, rope_theta=500.0, norm_eps=1e-5)
    tok_dir = _tokenizer_dir(tmp_path / "tok")
    out = export_model(model, tmp_path / "hf", tokenizer_dir=tok_dir, verify_tokens=tokens)
    c = AutoConfig.from_pretrained(str(out))
    assert c.rope_parameters["rope_theta"] == 500.0 and c.rms_norm_eps == 1e-5
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (4, 2, 8)
    assert (c.vocab_size, c.max_position_embeddings, c.intermediate_size) == (64, 16, 48)
    assert c.tie_word_embeddings is False
    tok = PreTrainedTokenizerFast.from_pretrained(str(out))
    assert (c.bos_token_id, c.eos_token_id) == (tok.bos_token_id, tok.eos_token_id) == (0, 1)
    gen = json.loads((out / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"]) == (0, 1)


def test_verify_fails_loudly_on_a_wrong_checkpoint(tmp_path, make_cfg, perturb_scales, tokens):
    """verify is not vacuous: LM-head rows off by one fail the logits check, a missing tensor the key check."""
    model = _trained_like(make_cfg, perturb_scales)
    out = export_model(model, tmp_path / "hf")
    state = _hf_state(out)
    head = state["lm_head.weight"].roll(1, dims=0)
    save_file({**state, "lm_head.weight": head}, str(out / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(VerifyError, match="logits differ"):
        verify(out, model, tokens)
    del state["model.norm.weight"]
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(VerifyError, match="missing_keys"):
        verify(out, model, tokens)


def test_sharded_export_loads(tmp_path, make_cfg, perturb_scales, tokens):
    """Above max_shard_size the weights are split into shards with an index that transformers loads."""
    model = _trained_like(make_cfg, perturb_scales)
    out = export_model(model, tmp_path / "hf", max_shard_size="20KB", verify_tokens=tokens)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 1 and shards == {f.name for f in out.glob("*.safetensors")}


def test_bfloat16_export(tmp_path, make_cfg, perturb_scales, tokens):
    """--dtype bfloat16 writes bf16 tensors and config dtype; it reproduces our folded model rounded to bf16."""
    model = _trained_like(make_cfg, perturb_scales)
    out = export_model(model, tmp_path / "hf", dtype="bfloat16", verify_tokens=tokens)
    assert all(t.dtype == torch.bfloat16 for t in _hf_state(out).values())
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


def test_format_must_hold_the_model(tmp_path, make_cfg):
    """An explicit --format that cannot hold the model (llama for QK-norm) is a ValueError naming the right one."""
    model = build_model(make_cfg(qk_norm=True), ScaleConfig.preset("baseline"), seed=0)
    with pytest.raises(ValueError, match="use --format qwen3"):
        export_model(model, tmp_path / "hf", format="llama")
    assert not (tmp_path / "hf").exists()


# ------------------------------------------------------------------------------------------- the command


def _run_dir(path, model, strategy, tokenizer=True):
    """A run directory in the trainer's contract: config.yaml, checkpoints/step_*/model.safetensors, latest,
    DONE, and a bytes tokenizer; its data is a small text file (validation tokens for --verify)."""
    path.mkdir()
    text = path / "corpus.txt"
    text.write_text("Shall I compare thee to a summer's day?\nThou art more lovely and more temperate.\n" * 30)
    data = DataConfig(source=str(text), tokenizer="bytes", cache_dir=str(path / "cache"))
    train = TrainConfig(seq_len=model.cfg.max_seq_len)
    save_yaml(RunConfig(strategy=strategy, model=model.cfg, scale=model.scfg, data=data, train=train),
              path / "config.yaml")
    ckpt = path / "checkpoints" / "step_0000010"
    ckpt.mkdir(parents=True)
    save_model(model, str(ckpt / "model.safetensors"))
    (path / "checkpoints" / "latest").write_text(ckpt.name)
    if tokenizer:
        load_tokenizer("bytes").save(path / "tokenizer")
    (path / "DONE").write_text("")
    return path


def test_cli_export_with_verify(tmp_path, make_cfg, perturb_scales, capsys):
    """`scalevec export RUN --out DIR --verify` writes a loadable checkpoint with the run's tokenizer; exit 0."""
    model = _trained_like(make_cfg, perturb_scales, tie_embeddings=True, vocab_size=256)
    run = _run_dir(tmp_path / "run", model, "unified_foldable")
    assert main(["export", str(run), "--out", str(tmp_path / "hf"), "--verify"]) == 0
    printed = capsys.readouterr().out
    assert "validation tokens of" in printed and "verify: OK" in printed
    out = tmp_path / "hf"
    exported = PreTrainedTokenizerFast.from_pretrained(str(out))
    text = "Thou art more lovely, ÿ\n"
    assert exported.encode(text, add_special_tokens=False) == list(text.encode("utf-8"))  # the run's byte ids
    # bytes has no special tokens: the export declares the newline byte as BOS (prefix) and pad
    assert exported.bos_token_id == exported.pad_token_id == 10 and exported.encode("ab") == [10, 97, 98]
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask  # an ordinary directory, not mkdtemp's 0700
    hf = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    x = torch.randint(0, 256, (1, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, model(x), rtol=0, atol=1e-4)


@pytest.mark.parametrize("strategy, layout, offending", [
    ("dnp", "pre", "layers.0.mlp.proj.branches.gate"),
    ("unified", "pre", "layers.0.mlp.proj.branches.up"),
    ("baseline", "peri", "layers.0.attn_out"),
])
def test_unfoldable_run_is_refused_as_a_plain_family(tmp_path, make_cfg, capsys, strategy, layout, offending):
    """DNP, unified and peri runs asked for as --format llama exit 2 naming the scales, the custom format and
    unified_foldable; nothing is written (auto exports them as custom code: test_export_remote.py)."""
    model = build_model(make_cfg(layout=layout), ScaleConfig.preset(strategy), seed=0)
    run = _run_dir(tmp_path / "run", model, strategy, tokenizer=False)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["export", str(run), "--out", str(tmp_path / "hf"), "--format", "llama", "--verify"]) == 2
    err = capsys.readouterr().err
    assert offending in err and "unified_foldable" in err and "--format auto or scalevec" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_existing_out_is_never_overwritten(tmp_path, make_cfg):
    """A non-empty --out is refused with exit 2 and left untouched."""
    model = build_model(make_cfg(), ScaleConfig.preset("baseline"), seed=0)
    run = _run_dir(tmp_path / "run", model, "baseline", tokenizer=False)
    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["export", str(run), "--out", str(out)]) == 2
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("target", ["missing", "empty-dir"])
def test_a_symlinked_out_is_refused_in_one_line(tmp_path, make_cfg, capsys, target):
    """--out as a symbolic link (dangling, or to an empty folder) was a raw '[Errno 20] Not a directory' from the
    final rename; it is refused before any work, naming the link and its target, and the link is left as it was."""
    model = build_model(make_cfg(), ScaleConfig.preset("baseline"), seed=0)
    run = _run_dir(tmp_path / "run", model, "baseline", tokenizer=False)
    dest = tmp_path / target
    if target == "empty-dir":
        dest.mkdir()
    link = tmp_path / "hf"
    link.symlink_to(dest)
    assert main(["export", str(run), "--out", str(link)]) == 2
    err = capsys.readouterr().err
    assert "is a symbolic link" in err and str(dest) in err and "Errno" not in err
    assert link.is_symlink() and os.readlink(link) == str(dest)
    left = sorted(p.name for p in tmp_path.iterdir())  # no temporary export folder left behind
    assert left == sorted(["run", "hf"] + (["empty-dir"] if dest.exists() else []))


@pytest.mark.parametrize("how", ["dangling", "relative", "loop"])
def test_a_broken_link_above_out_is_refused_before_any_work(tmp_path, make_cfg, capsys, how):
    """--out below a symbolic link that leads nowhere (absolute or relative: read from the link's own folder) or
    that loops was a raw errno from mkdir; one line (exit 2) names the link and what it truly is, before the model
    is loaded, and nothing is created or changed."""
    model = build_model(make_cfg(), ScaleConfig.preset("baseline"), seed=0)
    run = _run_dir(tmp_path / "run", model, "baseline", tokenizer=False)
    (tmp_path / "sub").mkdir()
    link = tmp_path / "sub" / "dang"
    link.symlink_to({"dangling": str(tmp_path / "nowhere"), "relative": "../nowhere", "loop": "dang"}[how])
    out = link / "a" / "hf"
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    assert main(["export", str(run), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "Errno" not in err, err
    what = (f"a symbolic link loop ({os.path.realpath(link)} -> {os.path.realpath(link)})" if how == "loop" else
            f"a symbolic link that leads nowhere (to {os.path.realpath(tmp_path / 'nowhere')})")
    assert f"--out {out}: {link} is {what}; remove it or choose another --out" in err, err
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("size", ["abc", "0", "-5GB", ""])
def test_a_bad_max_shard_size_names_the_flag(tmp_path, size):
    """--max-shard-size that huggingface_hub cannot read, or that is not positive, is refused naming the flag,
    before any model is loaded (the run directory here does not even exist)."""
    from scalevec.hf.export import export_run

    with pytest.raises(ValueError, match="--max-shard-size .* is not a size; use bytes or a number with KB, MB"):
        export_run(tmp_path / "no-run", tmp_path / "out", max_shard_size=size)
    assert not (tmp_path / "out").exists()
