"""Hugging Face -> scalevec's own Transformer through each family's record (``hf_format/families.py``): the families
it computes exactly are imported (checkpoint directories by ``hf_import.import_hf``, as ``scalevec convert`` and
``train --init-from`` read them; live models by ``to_scalevec``), every other one is refused in one line naming the
family, what scalevec's model lacks and the drop-in ``apply_strategy`` instead.

Llama, Qwen3, Mixtral and Qwen3-MoE are imported and round-tripped in tests/test_hf_import.py and
tests/test_integrations.py; this file covers Mistral (Llama's weights; its sliding window is full attention only when
it is at least the context) and the refusals (Qwen2, Gemma 3, OLMo 2, OLMo 3). The models are tests/test_families.py's
tiny ones (2 layers, d_model 64, effective norm gains 1 + 0.3·N(0, 1), built locally from transformers configs).

Tolerance: LOGIT_TOL = 2e-5 on fp32 logits of size O(1), as tests/test_families.py: scalevec's model computes the
same products in another association (γ on the activation or folded into W, its own attention call), each op
rounding at 2^-24 relative; the measured gap on the Mistral here is 3e-7, while a misplaced γ or a window the import
ignored moves the logits by > 1e-2 (``test_a_short_window_changes_the_function``).
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import transformers  # a dev dependency: missing it fails these tests, never skips

from scalevec.config import ScaleConfig
from scalevec.hf.export import export_model
from scalevec.hf_format.families import FAMILIES, IMPORTS
from scalevec.hf_format.hf_import import import_hf, model_config_from_hf
from scalevec.integrations import apply_strategy, fold, save, to_scalevec
from test_cli_errors import fails
from test_families import batch, logits, tiny

LOGIT_TOL = 2e-5
REFUSED = ("qwen2", "gemma3_text", "olmo2", "olmo3")
LACKS = {"qwen2": "q/k/v biases", "gemma3_text": "gelu_tanh gated MLP", "olmo2": "post-norm order",
         "olmo3": "post-norm order"}


def mistral(window: int | None = None, seed: int = 0):
    """tests/test_families.py's tiny Mistral (max_position_embeddings 128) with sliding window ``window``."""
    model = tiny("mistral", seed=seed)
    model.config.sliding_window = window
    return model


def test_the_record_decides_which_families_import():
    """Exactly the families whose record lacks nothing of scalevec's model import: the four scalevec exports plus
    Mistral; Qwen2, Gemma 3, OLMo 2/3 and the two frameworks are refused."""
    assert set(IMPORTS) == {"llama", "qwen3", "mixtral", "qwen3_moe", "mistral"}
    for name, fam in FAMILIES.items():
        assert (fam.import_refusal() is None) == (name in IMPORTS)


@pytest.mark.parametrize("window", [None, 128])
@pytest.mark.parametrize("strategy", ["baseline", "unified_foldable"])
def test_mistral_checkpoint_imports_with_its_logits(tmp_path, window, strategy):
    """A Mistral checkpoint without a window, or with one as long as the context, imports into scalevec's model with
    the HF model's logits (LOGIT_TOL) on a 24-token batch."""
    hf = mistral(window)
    hf.save_pretrained(tmp_path / "hf")
    fmt, model = import_hf(tmp_path / "hf", ScaleConfig.preset(strategy))
    assert fmt == "mistral" and model.cfg.max_seq_len == 128
    x = batch()
    ref = logits(hf, x)
    assert ref.abs().max() > 0.5  # non-trivial logits (init std 0.02: of size 0.7)
    with torch.no_grad():
        assert (model(x) - ref).abs().max().item() <= LOGIT_TOL


def test_mistral_round_trip_through_scalevecs_export(tmp_path):
    """Mistral -> scalevec (HG, per-branch γ) -> ``scalevec export`` -> HF: the export (a LlamaForCausalLM, the family
    that holds Mistral's weights without a window) computes the original's logits (LOGIT_TOL)."""
    hf = mistral(128)
    hf.save_pretrained(tmp_path / "hf")
    _, model = import_hf(tmp_path / "hf", ScaleConfig.preset("unified_foldable"))
    export_model(model, tmp_path / "out")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    assert type(back).__name__ == "LlamaForCausalLM"
    x = batch()
    assert (logits(back, x) - logits(hf, x)).abs().max().item() <= LOGIT_TOL


def test_to_scalevec_of_a_mistral_computes_its_function():
    """``to_scalevec`` of a Mistral carrying a foldable strategy is scalevec's model with the same logits (LOGIT_TOL);
    ``fold`` then gives back the MistralForCausalLM with them too."""
    model, x = apply_strategy(mistral(), "unified_foldable", param="magdir"), batch()
    ref = logits(model, x)
    with torch.no_grad():
        assert (to_scalevec(model)(x) - ref).abs().max().item() <= LOGIT_TOL
    assert type(fold(model)).__name__ == "MistralForCausalLM"
    assert (logits(model, x) - ref).abs().max().item() <= LOGIT_TOL


def test_save_of_a_mistral_with_dnp_writes_the_custom_code_export(tmp_path):
    """DNP cannot fold: ``save`` of a Mistral carrying it goes through scalevec's model to the custom-code
    ScalevecForCausalLM, which computes the strategy's logits (LOGIT_TOL)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DNP's "the function changes"
        model = apply_strategy(mistral(), "unified")
    x = batch()
    ref = logits(model, x)
    save(model, tmp_path / "out")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", trust_remote_code=True,
                                                             dtype=torch.float32).eval()
    assert type(back).__name__ == "ScalevecForCausalLM"
    assert (logits(back, x) - ref).abs().max().item() <= LOGIT_TOL


def test_a_short_window_changes_the_function():
    """Why a window shorter than the context is refused: on 24 tokens, a Mistral with window 8 computes logits that
    differ by > 1e-2 from the same weights under full attention (what scalevec's model would compute)."""
    x = batch()
    full, short = logits(mistral(None), x), logits(mistral(8), x)
    assert (full - short).abs().max().item() > 1e-2


def test_a_short_window_is_refused_in_one_line(tmp_path):
    """A Mistral (or Mixtral) whose sliding window is shorter than max_position_embeddings is refused by import_hf
    and to_scalevec in one line naming the window, the context and apply_strategy; apply_strategy itself takes it."""
    hf = mistral(8)
    hf.save_pretrained(tmp_path / "hf")
    want = r"^(MistralForCausalLM: )?config.json has sliding_window=8 < max_position_embeddings=128: .*apply_strategy"
    with pytest.raises(ValueError, match=want) as err:
        import_hf(tmp_path / "hf", ScaleConfig.preset("baseline"))
    assert "\n" not in str(err.value)
    apply_strategy(hf, "baseline")  # the drop-in path keeps HF's own attention: the window stays
    with pytest.raises(ValueError, match=want):
        to_scalevec(hf)
    conf = {"model_type": "mixtral", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 16, "num_local_experts": 4,
            "num_experts_per_tok": 2, "max_position_embeddings": 64}
    assert model_config_from_hf({**conf, "sliding_window": 64})[1].moe.n_experts == 4
    with pytest.raises(ValueError, match="sliding_window=63 < max_position_embeddings=64"):
        model_config_from_hf({**conf, "sliding_window": 63})


@pytest.mark.parametrize("family", REFUSED)
def test_a_family_scalevec_does_not_compute_is_refused_in_one_line(tmp_path, family):
    """Qwen2, Gemma 3, OLMo 2 and OLMo 3 checkpoints and live models are refused by import_hf and to_scalevec in one
    line naming the family, the feature scalevec's model lacks and the drop-in apply_strategy; nothing is built."""
    hf = tiny(family)
    hf.save_pretrained(tmp_path / "hf")
    want = rf"^({type(hf).__name__}: )?{family}: scalevec's Transformer does not compute .*{LACKS[family]}.*" \
           r"use the drop-in scalevec.apply_strategy\(model, STRATEGY\) on the Hugging Face model instead"
    with pytest.raises(ValueError, match=want) as err:
        import_hf(tmp_path / "hf", ScaleConfig.preset("baseline"))
    assert "\n" not in str(err.value)
    apply_strategy(hf, "dp")
    with pytest.raises(ValueError, match=want):
        to_scalevec(hf)


def test_scalevec_convert_refuses_a_family_in_one_line_and_writes_nothing(tmp_path, capsys):
    """``scalevec convert`` of a Qwen2 checkpoint exits 2 with one line naming the family, its q/k/v biases and
    apply_strategy, and creates no --out."""
    tiny("qwen2").save_pretrained(tmp_path / "hf")
    capsys.readouterr()  # save_pretrained's progress bar on stderr
    fails(capsys, ["convert", str(tmp_path / "hf"), "--strategy", "baseline", "--out", str(tmp_path / "out")],
          "qwen2: scalevec's Transformer does not compute q/k/v biases", "scalevec.apply_strategy")
    assert not (tmp_path / "out").exists()


# a tiny config of each family as save_pretrained writes it, and the keys then removed from its config.json: every
# field whose default differs between the families' transformers config classes (Mistral's KV heads default to 8,
# removed with 16 attention heads; Qwen3's 32 would not divide them, nor Mixtral's 8 the 4 heads of its MoE config)
SMALL = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=96, head_dim=16)
DEFAULTED = ["max_position_embeddings", "rms_norm_eps", "rope_parameters", "head_dim"]
LEFT_OUT = {
    "llama": (transformers.LlamaConfig(**SMALL), [*DEFAULTED, "num_key_value_heads"]),
    "mistral": (transformers.MistralConfig(**{**SMALL, "num_attention_heads": 16, "head_dim": 4}, sliding_window=None),
                [*DEFAULTED, "num_key_value_heads"]),
    "qwen3": (transformers.Qwen3Config(**SMALL), DEFAULTED),
    "mixtral": (transformers.MixtralConfig(**SMALL, num_local_experts=4), DEFAULTED),
}


def shape_of(d_model: int, heads: int, kv_heads: int | None, head_dim: int | None, max_pos: int, eps: float,
             theta: float) -> tuple:
    """The fields a config.json's defaults decide, head_dim resolved (None: d_model / heads)."""
    return (head_dim or d_model // heads, kv_heads or heads, max_pos, eps, theta)


@pytest.mark.parametrize("family", list(LEFT_OUT))
def test_a_config_json_that_leaves_fields_out_imports_as_transformers_builds_it(tmp_path, family):
    """A config.json without max_position_embeddings, rms_norm_eps, rope_theta, head_dim (and the KV heads) imports
    with the values transformers builds from the same file: before, every family got Llama's (2048, 1e-6, 1e4,
    d_model / heads, heads), so a Mixtral had another eps and RoPE base, a Qwen3 or Mistral the wrong shapes."""
    config, keys = LEFT_OUT[family]
    config.save_pretrained(tmp_path)
    conf = json.loads((tmp_path / "config.json").read_text())
    for key in keys:
        del conf[key]
    (tmp_path / "config.json").write_text(json.dumps(conf))
    hf = transformers.AutoConfig.from_pretrained(tmp_path)
    cfg = model_config_from_hf(conf)[1]
    ours = shape_of(cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.max_seq_len, cfg.norm_eps,
                    cfg.rope_theta)
    assert ours == shape_of(hf.hidden_size, hf.num_attention_heads, hf.num_key_value_heads,
                            getattr(hf, "head_dim", None), hf.max_position_embeddings, hf.rms_norm_eps,
                            hf.rope_parameters["rope_theta"])


def test_kv_heads_left_to_a_default_that_does_not_divide_the_heads_is_refused_naming_the_default():
    """A Mixtral config.json with 4 attention heads and no num_key_value_heads: transformers builds 8 KV heads
    (MixtralConfig's default), which do not divide 4; the refusal says the 8 is that default, not a written value."""
    conf = {"model_type": "mixtral", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 4, "intermediate_size": 16, "num_local_experts": 4, "num_experts_per_tok": 2}
    with pytest.raises(ValueError, match=r"num_key_value_heads=8 \(transformers' mixtral default: config.json leaves"):
        model_config_from_hf(conf)


def test_the_families_defaults_differ_where_the_import_reads_them():
    """The test above can fail: the defaults it checks differ from Llama's in at least one field per other family
    (Mistral: context and KV heads; Qwen3: context and head_dim; Mixtral: context, eps and RoPE base)."""
    llama = transformers.AutoConfig.for_model("llama", hidden_size=64, num_attention_heads=16)
    for family, fields in (("mistral", ["max_position_embeddings", "num_key_value_heads"]),
                           ("qwen3", ["max_position_embeddings", "head_dim"]),
                           ("mixtral", ["max_position_embeddings", "rms_norm_eps"])):
        other = transformers.AutoConfig.for_model(family, hidden_size=64, num_attention_heads=16)
        assert all(getattr(other, f) != getattr(llama, f) for f in fields), family
    mixtral = transformers.AutoConfig.for_model("mixtral")
    assert mixtral.rope_parameters["rope_theta"] != llama.rope_parameters["rope_theta"]
