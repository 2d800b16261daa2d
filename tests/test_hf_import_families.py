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
            "num_attention_heads": 4, "intermediate_size": 16, "num_local_experts": 4, "num_experts_per_tok": 2,
            "max_position_embeddings": 64}
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


# a tiny config of each family, as save_pretrained writes it; only the keys under test are then removed
SMALL = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=96, head_dim=16)


def saved_config_without(tmp_path, config, *keys) -> dict:
    """``config`` written by save_pretrained into ``tmp_path``, then its config.json without ``keys``; returns it."""
    config.save_pretrained(tmp_path)
    conf = json.loads((tmp_path / "config.json").read_text())
    for key in keys:
        del conf[key]
    (tmp_path / "config.json").write_text(json.dumps(conf))
    return conf


@pytest.mark.parametrize("config", [transformers.LlamaConfig, transformers.Qwen3Config, transformers.MixtralConfig])
def test_a_config_without_max_position_embeddings_gets_its_familys_default(tmp_path, config):
    """A config.json without max_position_embeddings imports with the context transformers builds from the same file
    (Llama 2048, Qwen3 32768, Mixtral 131072): before, every family got 2048."""
    conf = saved_config_without(tmp_path, config(**SMALL), "max_position_embeddings")
    want = transformers.AutoConfig.from_pretrained(tmp_path).max_position_embeddings
    assert model_config_from_hf(conf)[1].max_seq_len == want


def test_the_families_defaults_differ_where_the_import_reads_them(tmp_path):
    """The test above can fail: Llama's and Qwen3's default contexts differ, and so do Llama's and Mixtral's RMSNorm
    eps, which a config.json without rms_norm_eps takes from transformers too."""
    seen = {}
    for config in (transformers.LlamaConfig, transformers.Qwen3Config, transformers.MixtralConfig):
        conf = saved_config_without(tmp_path / config.model_type, config(**SMALL), "max_position_embeddings",
                                    "rms_norm_eps")
        cfg = model_config_from_hf(conf)[1]
        loaded = transformers.AutoConfig.from_pretrained(tmp_path / config.model_type)
        assert (cfg.max_seq_len, cfg.norm_eps) == (loaded.max_position_embeddings, loaded.rms_norm_eps)
        seen[config.model_type] = (cfg.max_seq_len, cfg.norm_eps)
    assert seen["llama"][0] != seen["qwen3"][0] and seen["llama"][1] != seen["mixtral"][1], seen
