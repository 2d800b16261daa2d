"""--init-from a Hugging Face checkpoint: every foldable strategy computes the HF model's logits (DESIGN.md §1, §10).

Small random Llama (tied embeddings, explicit head_dim, Llama 3 rope scaling), Qwen3 (QK-norm),
Mixtral and Qwen3-MoE models are built with transformers, their norm weights moved away from 1 so
that every γ matters, and written with ``save_pretrained`` (no hub). Tolerance 1e-5 on fp32 logits of
magnitude ~2-3: the two implementations order the same fp32 operations differently (γ in the weight
vs on the activation, grouped expert matmuls), which costs ~1e-6 (measured); a wrong γ, head_dim or
rope frequency costs > 1e-2.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers  # a dev dependency: missing it fails these tests, never skips

from scalevec import ScaleConfig, build_model
from scalevec.config import ModelConfig, RopeScalingConfig, RunConfig
from scalevec.config.codec import apply_overrides, to_dict
from scalevec.hf.export import export_model
from scalevec.hf_format.hf_import import (
    import_hf,
    load_plain,
    model_config_from_hf,
    plain_from_model,
    read_hf,
    set_scale,
)
from scalevec.model.fold import foldable_strategies
from scalevec.model.scales import SCALE_KINDS, scale_plan
from scalevec.model.transformer import rope_cos_sin

FOLDABLE = tuple(foldable_strategies())  # from the registry (config.STRATEGIES): a new strategy is converted here too
TOL = 1e-5  # see the module docstring
COMMON = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=64, rms_norm_eps=1e-5, initializer_range=0.1)
ROPE = dict(rope_type="default", rope_theta=100.0)


def _hf(family: str):
    """A small random fp32 HF model of ``family`` whose norm weights are not 1."""
    torch.manual_seed(0)
    if family == "llama":  # tied, head_dim 16 != 32/4, Llama 3 rope scaling that touches every band
        cfg = transformers.LlamaConfig(intermediate_size=48, head_dim=16, tie_word_embeddings=True,
                                       rope_parameters=dict(rope_type="llama3", rope_theta=100.0, factor=4.0,
                                                            low_freq_factor=1.0, high_freq_factor=4.0,
                                                            original_max_position_embeddings=8), **COMMON)
        model = transformers.LlamaForCausalLM(cfg)
    elif family == "qwen3":
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(intermediate_size=48, head_dim=16,
                                                                       rope_parameters=ROPE, **COMMON))
    elif family == "mixtral":
        model = transformers.MixtralForCausalLM(transformers.MixtralConfig(
            intermediate_size=24, num_local_experts=4, num_experts_per_tok=2, rope_parameters=ROPE, **COMMON))
    else:
        model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
            intermediate_size=48, moe_intermediate_size=24, num_experts=4, num_experts_per_tok=2,
            norm_topk_prob=True, mlp_only_layers=[0], head_dim=16, rope_parameters=ROPE, **COMMON))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.5 * torch.randn_like(p))
    return model.float().eval()


@pytest.fixture(scope="module", params=["llama", "qwen3", "mixtral", "qwen3_moe"])
def hf_dir(request, tmp_path_factory):
    """``(family, directory written by save_pretrained, the HF model, tokens (2, 12))``."""
    model = _hf(request.param)
    d = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(d)
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    return request.param, d, model, tokens


def _logits(model, tokens):
    with torch.no_grad():
        out = model(tokens) if isinstance(model, torch.nn.Module) and hasattr(model, "scfg") else \
            model(input_ids=tokens).logits
    return out


@pytest.mark.parametrize("strategy", FOLDABLE)
def test_foldable_strategy_keeps_hf_logits(hf_dir, strategy):
    """After conversion into a foldable strategy the logits equal the HF model's (fp32, 1e-5). A strategy without
    scale vectors (``none``) has no slot for the final norm's γ in a tied model (refused, naming it) nor for a
    QK-norm γ (Qwen3's are not 1: ``load_plain`` names those sites)."""
    family, d, hf, tokens = hf_dir
    scfg = ScaleConfig.preset(strategy)
    _, plain = read_hf(d)
    plan = scale_plan(scfg, plain.cfg)
    if plain.cfg.tie_embeddings and plan.head.gamma is None and plan.head.branches["lm_head"].gamma is None:
        with pytest.raises(ValueError, match="tied embeddings cannot hold the final norm's γ"):
            import_hf(d, scfg)
        return
    if plan.qk_norm is not None and plan.qk_norm.gamma is None:
        lost = load_plain(build_model(plain.cfg, scfg, seed=0), plain)
        assert lost == [f"layers.{i}.attn.{qk}_norm" for i in range(plain.cfg.n_layers) for qk in "qk"]
        return
    fmt, model = import_hf(d, scfg)
    assert fmt == family
    ref = _logits(hf, tokens)
    assert ref.abs().max() > 1.0  # non-trivial logits
    assert (_logits(model, tokens) - ref).abs().max().item() <= TOL


@pytest.mark.parametrize("strategy", ["dnp", "unified"])
def test_dnp_changes_the_function(hf_dir, strategy):
    """DNP normalizes W_gate/W_up outputs: the converted model loads but computes another function."""
    _, d, hf, tokens = hf_dir
    _, model = import_hf(d, ScaleConfig.preset(strategy))
    assert (_logits(model, tokens) - _logits(hf, tokens)).abs().max().item() > 1e-2


def test_round_trip_hf_scalevec_export_hf(hf_dir, tmp_path):
    """HF -> scalevec (HG, per-branch γ) -> export -> HF: the exported model's logits equal the original's."""
    _, d, hf, tokens = hf_dir
    _, model = import_hf(d, ScaleConfig.preset("unified_foldable"))
    export_model(model, tmp_path / "out")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    assert (_logits(back, tokens) - _logits(hf, tokens)).abs().max().item() <= TOL


def test_model_config_from_hf_reads_the_family_fields(hf_dir):
    """head_dim, rope scaling, tied embeddings, QK-norm and the MoE shape come from config.json."""
    family, d, hf, _ = hf_dir
    _, plain = read_hf(d)
    cfg = plain.cfg
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.norm_eps) == (32, 2, 4, 2, 1e-5)
    assert cfg.qk_norm == (family in ("qwen3", "qwen3_moe"))
    assert cfg.head_dim == (8 if family == "mixtral" else 16)
    if family == "llama":
        assert cfg.tie_embeddings and cfg.rope_scaling == RopeScalingConfig(4.0, 1.0, 4.0, 8)
    if family == "qwen3_moe":
        assert (cfg.moe.n_experts, cfg.moe.top_k, cfg.moe.d_expert, cfg.moe.first_dense, cfg.d_ff) == (4, 2, 24, 1, 48)


def test_llama3_rope_matches_transformers():
    """Our Llama 3-scaled RoPE frequencies equal transformers' ``_compute_llama3_parameters`` bitwise."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_cfg = transformers.LlamaConfig(hidden_size=512, num_attention_heads=4, rope_parameters=dict(
        rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=64))
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_cfg, "cpu")
    cos, sin = rope_cos_sin(32, 128, 500000.0, torch.device("cpu"), RopeScalingConfig(8.0, 1.0, 4.0, 64))
    angles = torch.outer(torch.arange(32).float(), inv_freq)
    full = torch.cat((angles, angles), -1)
    assert torch.equal(cos, full.cos()) and torch.equal(sin, full.sin())
    plain, _ = rope_cos_sin(32, 128, 500000.0, torch.device("cpu"))
    assert not torch.allclose(plain, cos)  # the scaling did something


def test_head_dim_default_is_derived_and_explicit_one_sticks():
    """head_dim None derives d_model // n_heads (also after replace / overrides); an explicit one is kept."""
    cfg = ModelConfig(d_model=128, n_heads=4)
    assert cfg.head_dim == 32 and to_dict(cfg)["head_dim"] is None
    assert dataclasses.replace(cfg, d_model=256).head_dim == 64
    explicit = dataclasses.replace(cfg, head_dim=16)
    assert dataclasses.replace(explicit, d_model=256).head_dim == 16 and to_dict(explicit)["head_dim"] == 16
    run = apply_overrides(RunConfig(), ["model.head_dim=16", "model.rope_scaling.factor=2"])
    assert run.model.head_dim == 16 and run.model.rope_scaling.factor == 2.0
    model = build_model(dataclasses.replace(ModelConfig(d_model=32, n_heads=4, n_kv_heads=2, d_ff=48, vocab_size=64,
                                                        n_layers=1), head_dim=16), ScaleConfig.preset("baseline"))
    assert model.layers[0].attn.proj.branches["q"].weight.shape == (64, 32)
    assert model.layers[0].attn.o.weight.shape == (32, 64)


@pytest.mark.parametrize("param", ["magdir", "magdir_exp"])
def test_magdir_scale_starts_as_rms_and_direction(param):
    """A magnitude-direction γ starts as β = rms(γ), α = γ / rms(γ) (ER: b = log rms(γ)); its value is γ."""
    gamma = torch.tensor([0.5, -1.0, 2.0, 3.0])
    sv = SCALE_KINDS[param]((4,), "input_scale")
    set_scale(sv, gamma)
    rms = gamma.pow(2).mean().sqrt()
    mag = sv.magnitude if param == "magdir" else sv.log_magnitude.exp()
    assert torch.allclose(mag, rms.reshape(1)) and torch.allclose(sv.direction, gamma / rms)
    assert torch.allclose(sv(), gamma, atol=1e-6)


def test_branch_between_strategies_keeps_logits(make_cfg, tokens):
    """A trained-looking HG MoE model converted through the plain form into OR computes the same logits."""
    from conftest import _perturb
    from scalevec import MoEConfig

    cfg = make_cfg(qk_norm=True, tie_embeddings=True, moe=MoEConfig(n_experts=4, top_k=2, d_expert=16, first_dense=1))
    src = build_model(cfg, dataclasses.replace(ScaleConfig.preset("unified_foldable"), per_expert=True), seed=0)
    _perturb(src)
    dst = build_model(cfg, ScaleConfig.preset("or"), seed=1)
    load_plain(dst, plain_from_model(src))
    with torch.no_grad():
        assert (dst(tokens) - src(tokens)).abs().max().item() <= TOL


@pytest.mark.parametrize("change, message", [
    (dict(model_type="gpt2"), "not supported"),
    (dict(model_type="qwen3_moe", norm_topk_prob=False), "norm_topk_prob"),
    (dict(attention_bias=True), "attention_bias"),
    (dict(rope_parameters=dict(rope_type="yarn", factor=2.0)), "yarn"),
])
def test_unsupported_hf_configs_are_refused(change, message):
    """A config.json with a feature our model does not compute is refused with a message naming it."""
    conf = {"model_type": "llama", **COMMON, "intermediate_size": 48, "num_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 8, **change}
    with pytest.raises(ValueError, match=message):
        model_config_from_hf(conf)
