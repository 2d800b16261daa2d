"""The family records (``hf_format/families.py``) beyond the four of tests/test_integrations.py: Mistral, Qwen2 (q/k/v
biases), Gemma 3 (pre/post feed-forward norms, GeGLU, the ``1 + w`` gain) and OLMo 2 / OLMo 3 (post-norm order,
QK-norm over all heads): every strategy at init, the fold/save round trip, and the drop-in API's guards
(``save_pretrained`` before fold, a ``model.config`` that disagrees with the modules, the measured flag).

Every model is a tiny one built locally from a transformers 5.25 config (no hub download), 2 layers, d_model 64,
its norm gains drawn away from 1 (effective γ = 1 + 0.3·N(0, 1), whatever the convention stores) so that where γ
goes is tested, not hidden by ones. Tolerance: LOGIT_TOL = 2e-5 on logits of size O(1) in fp32, as in
tests/test_integrations.py: a foldable strategy re-associates ``γ ⊙ u`` and ``W diag(γ)`` (2^-24 relative per op);
the measured gap over these 5 families × every foldable strategy is at most 1.2e-6 (the table in
docs/integrations.md), while a γ misplaced by one site moves the logits by > 1e-2.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers  # a dev dependency: missing it fails these tests, never skips

from scalevec.config import PRESET_NAMES, ScaleConfig
from scalevec.integrations import apply_strategy, fold, param_groups, save
from scalevec.integrations.hf_model import model_family, probe, probe_tolerance

LOGIT_TOL = 2e-5
FAMILIES = ("mistral", "qwen2", "gemma3_text", "olmo2", "olmo3")
REORDERED = ("olmo2", "olmo3")  # post-norm order: no Input-Norm for HG to split
HG = ("hg", "unified", "unified_foldable")


def tiny(family: str, seed: int = 0, tie: bool = False):
    """A random 2-layer model of ``family`` (vocab 256), its effective norm gains 1 + 0.3·N(0, 1), in eval mode."""
    torch.manual_seed(seed)
    common = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=96, max_position_embeddings=128, tie_word_embeddings=tie)
    cfg = {
        "mistral": lambda: transformers.MistralConfig(sliding_window=None, **common),
        "qwen2": lambda: transformers.Qwen2Config(**common),
        "gemma3_text": lambda: transformers.Gemma3TextConfig(head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
                                                             **common),
        "olmo2": lambda: transformers.Olmo2Config(**common),
        "olmo3": lambda: transformers.Olmo3Config(sliding_window=8, **common),
    }[family]()
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # Gemma stores w with γ = 1 + w
                p.copy_((0 if family == "gemma3_text" else 1) + 0.3 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))  # Qwen2's q/k/v biases, away from 0
    return model.eval()


def test_hg_on_a_post_norm_family_lists_the_strategies_to_use_unambiguously():
    """The refusal of HG on OLMo 2 is the exact sentence, its strategies listed with commas only: with "a, b or c"
    the strategy named ``or`` read "dnp, or or er"."""
    with pytest.raises(ValueError) as e:
        apply_strategy(tiny("olmo2"), "hg")
    assert str(e.value) == ("olmo2 cannot carry strategy hg: HG splits an Input-Norm's γ per branch, and olmo2 has "
                            "none before attention and MLP (its norms follow them: post-norm order); use one of these "
                            "strategies on it: baseline, iwd, dp, dnp, or, er")


def batch(seed: int = 1, b: int = 2, t: int = 24) -> torch.Tensor:
    return torch.randint(0, 256, (b, t), generator=torch.Generator().manual_seed(seed))


def logits(model, x):
    with torch.no_grad():
        return model(input_ids=x).logits


@pytest.mark.parametrize("family,strategy", [
    pytest.param(f, s, marks=() if s in ("unified_foldable", "dp", "none") else pytest.mark.slow)
    for f in FAMILIES for s in PRESET_NAMES])
def test_family_keeps_the_function_of_every_foldable_strategy(family, strategy):
    """Every strategy on every new family: a foldable one keeps the logits (LOGIT_TOL) and the measured flag says so;
    DNP, and ``none`` where an Output-Norm γ ≠ 1 has no slot, change them and the flag says so; HG on a post-norm
    family is refused in one line naming the family, the strategy and what to use instead."""
    model, x = tiny(family), batch()
    cls, ref = type(model), logits(model, x)
    if family in REORDERED and strategy in HG:
        with pytest.raises(ValueError, match=f"^{family} cannot carry strategy {strategy}: HG .* on it: baseline"):
            apply_strategy(model, strategy)
        assert type(model.model.layers[0].self_attn.q_proj) is torch.nn.Linear  # nothing changed
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert apply_strategy(model, strategy) is model
    assert type(model) is cls
    gap = (logits(model, x) - ref).abs().max().item()
    lost = strategy == "none" and family in ("gemma3_text", *REORDERED)  # Output-Norm γ ≠ 1: no slot under none
    info = model.scalevec_info
    if ScaleConfig.preset(strategy).foldable and not lost:
        assert gap <= LOGIT_TOL
        assert info.function_preserved and not caught
    else:
        assert gap > 1e-3
        assert not info.function_preserved and any("THE FUNCTION CHANGES" in str(w.message) for w in caught)


def _train_a_little(model, steps: int = 3):
    """A few AdamW steps so that every γ and s moves away from its init (a fold of ones would hide a misplacement)."""
    model.train()
    opt = torch.optim.AdamW(param_groups(model, lr=1e-2, weight_decay=0.1))  # the strategy's decay (wd_guard)
    for step in range(steps):
        x = batch(seed=10 + step)
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    return model.eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_fold_then_save_pretrained_loads_back_in_plain_transformers(tmp_path, family):
    """A trained foldable strategy (DP + OR on every family; HG too where the family has Input-Norms) folds back to
    the plain modules in place with the same logits; its save_pretrained loads in plain transformers with no missing
    or unexpected key and the same logits (LOGIT_TOL); Gemma's norms store γ - 1."""
    strategy = "dp" if family in REORDERED else "unified_foldable"
    model = _train_a_little(apply_strategy(tiny(family, tie=family == "mistral"), strategy, param="magdir"))
    x = batch()
    before = logits(model, x)
    fold(model)
    assert not hasattr(model, "scalevec_info")
    layer = model.model.layers[0]
    assert type(layer.self_attn.q_proj) is torch.nn.Linear and "Norm" in type(layer.self_attn.o_proj).__name__ + \
        type(model.model.norm).__name__
    assert (logits(model, x) - before).abs().max().item() <= LOGIT_TOL
    model.save_pretrained(tmp_path / "plain")
    again, loading = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "plain", output_loading_info=True)
    assert not any(loading.values()), loading
    assert (logits(again.eval(), x) - before).abs().max().item() <= LOGIT_TOL


def test_gemma_input_norms_fold_to_its_identity_gain_zero():
    """Gemma's ``1 + w`` convention: after the fold the Input-Norms hold w = 0 (γ = 1, their γ went into the
    projections) and an Output-Norm holds w = γ - 1 (its trained γ, not γ itself)."""
    model = _train_a_little(apply_strategy(tiny("gemma3_text"), "baseline"))
    layer = model.model.layers[0]
    post = layer.post_attention_layernorm.scale().detach().clone()
    fold(model)
    layer = model.model.layers[0]
    assert torch.equal(layer.input_layernorm.weight, torch.zeros(64))
    assert torch.equal(layer.pre_feedforward_layernorm.weight, torch.zeros(64))
    assert (layer.post_attention_layernorm.weight - (post - 1)).abs().max().item() <= 1e-7


def test_qwen2_biases_follow_the_output_scale_through_the_fold():
    """Qwen2's q/k/v biases: under DP the output scale s multiplies the bias too (y = s ⊙ (W u + b)), so the fold
    writes b' = s ⊙ b; the folded model's logits equal the trained one's (LOGIT_TOL)."""
    model = _train_a_little(apply_strategy(tiny("qwen2"), "dp"))
    q = model.model.layers[0].self_attn.q_proj
    s, b = q.out_scale().detach().clone(), q.bias.detach().clone()
    assert (s - 1).abs().max().item() > 1e-3  # trained: s moved
    x = batch()
    before = logits(model, x)
    fold(model)
    assert torch.allclose(model.model.layers[0].self_attn.q_proj.bias, s * b)
    assert (logits(model, x) - before).abs().max().item() <= LOGIT_TOL


# ------------------------------------------------------------------------------------------ the guards


def test_save_pretrained_is_refused_until_fold(tmp_path):
    """save_pretrained on a model carrying a strategy is refused in one line naming fold and save, writing nothing;
    after fold it writes the plain checkpoint."""
    model = apply_strategy(tiny("mistral"), "unified_foldable")
    with pytest.raises(ValueError, match=r"carries strategy unified_foldable unfolded.*scalevec.fold\(model\)"):
        model.save_pretrained(tmp_path / "x")
    assert not (tmp_path / "x").exists()
    fold(model).save_pretrained(tmp_path / "x")
    assert (tmp_path / "x" / "model.safetensors").is_file()


def test_save_of_a_new_family_writes_the_folded_family_and_keeps_the_model(tmp_path):
    """``scalevec.save`` on a foldable strategy of a family scalevec's model does not compute writes the folded
    model through its own save_pretrained (same logits on reload) and leaves the model carrying its strategy; DNP
    there is refused naming the family and unified_foldable."""
    model = _train_a_little(apply_strategy(tiny("olmo2"), "dp"))
    x = batch()
    before = logits(model, x)
    save(model, tmp_path / "out")
    assert hasattr(model, "scalevec_info") and (logits(model, x) - before).abs().max().item() == 0
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert (logits(again, x) - before).abs().max().item() <= LOGIT_TOL
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dnp = apply_strategy(tiny("olmo2"), "dnp")
    with pytest.raises(ValueError, match=r"cannot fold \(DNP\), and no custom code computes olmo2; train unified_f"):
        save(dnp, tmp_path / "dnp")


@pytest.mark.parametrize("field,value,match", [
    ("tie_word_embeddings", True, r"model.config.tie_word_embeddings=True but the modules compute False"),
    ("rms_norm_eps", 1e-2, r"model.config.rms_norm_eps=0.01 but the modules compute 1e-06 \(the ε of "),
    ("head_dim", 8, r"model.config.head_dim=8 but the modules compute 16"),
])
def test_a_config_edited_after_the_build_is_refused(field, value, match):
    """A model.config that disagrees with the modules (edited after the build) is refused in one line naming the
    field, both values and the fix, before anything changes."""
    model = tiny("qwen2") if field != "head_dim" else tiny("gemma3_text")
    setattr(model.config, field, value)
    with pytest.raises(ValueError, match=match + r".*; set model.config"):
        apply_strategy(model, "baseline")
    assert not hasattr(model, "scalevec_info")


def test_function_preserved_is_measured_on_the_probe():
    """The flag is the probe's measurement: the recorded gap is the change of the probe's logits, the flag is that gap
    against probe_tolerance; a lost γ (none on a post-norm family) is measured as a change and said."""
    model = tiny("olmo2")
    ref = probe(model, model_family(model))
    apply_strategy(model, "or")
    info = model.scalevec_info
    got = probe(model, model_family(model))
    assert info.logit_gap == (got - ref).abs().max().item()
    assert info.function_preserved == (info.logit_gap <= probe_tolerance(torch.float32, ref))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply_strategy(tiny("olmo2"), "none")  # its post-norm γ ≠ 1 has no slot: measured as changed
    said = [str(w.message) for w in caught]
    assert any("THE FUNCTION CHANGES: " in m and "the logits on the probe moved by" in m for m in said)


@pytest.mark.parametrize("field,value", [("tie_word_embeddings", True), ("rms_norm_eps", 1e-2)])
def test_save_refuses_a_config_edited_after_apply(tmp_path, field, value):
    """A model.config edited after apply_strategy (the modules unchanged) is refused by ``save`` and ``to_scalevec``
    in one line naming the field, before anything is written: the export would describe another function."""
    import transformers as tf

    from scalevec.integrations import to_scalevec

    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                                               tie_word_embeddings=False))
    apply_strategy(model, "baseline")
    setattr(model.config, field, value)
    with pytest.raises(ValueError, match=f"model.config.{field}="):
        save(model, tmp_path / "out")
    with pytest.raises(ValueError, match=f"model.config.{field}="):
        to_scalevec(model)
    assert not (tmp_path / "out").exists()


def test_save_refuses_an_embedding_resized_after_apply(tmp_path):
    """``resize_token_embeddings`` after ``apply_strategy`` (config and modules agree, the recorded vocabulary does
    not) is refused by ``save`` and ``to_scalevec`` in one line naming the fix, not load_state_dict's size report,
    before anything is written."""
    import transformers as tf

    from scalevec.integrations import to_scalevec

    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, intermediate_size=96))
    apply_strategy(model, "baseline")
    model.resize_token_embeddings(272, mean_resizing=False)
    for call in (lambda: save(model, tmp_path / "out"), lambda: to_scalevec(model)):
        with pytest.raises(ValueError, match="the embedding has 272 rows but LlamaForCausalLM carried a vocabulary "
                                             "of 256") as err:
            call()
        assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()
