"""The family records of the frameworks (``hf_format/families.py``): torchtitan 0.3.0's ``Llama3Model`` (its
``debugmodel``: 6 layers, d_model 256, fused wqkv) and OLMo-core 3.0.0's ``Transformer`` (``llama_like``, 2 layers,
d_model 64), built and initialized on the CPU with their own code, their norm gains drawn away from 1
(γ = 1 + 0.3·N(0, 1)): every strategy at init, and the fold back to the framework's own modules.

torchtitan's flex attention has no CPU backward: forward only (its first forward compiles, ~15-110 s: the module
fixture builds once). OLMo-core runs forward and backward on the CPU. Tolerance LOGIT_TOL = 2e-5 as in
tests/test_integrations.py (fp32 logits of size O(1)): measured gaps are ≤ 1.2e-6 (torchtitan, 6 layers) and
≤ 2.4e-7 (OLMo-core), a misplaced γ moves them by > 1e-2.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from scalevec.config import PRESET_NAMES, ScaleConfig
from scalevec.integrations import apply_strategy, fold, param_groups, save
from scalevec.integrations.hf_model import model_family

LOGIT_TOL = 2e-5


def _gains_away_from_one(model, seed: int = 0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
    return model.eval()


def _apply(model, strategy):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DNP's "the function changes": asserted through the measured flag
        return apply_strategy(model, strategy)


# ------------------------------------------------------------------------------------------ OLMo-core


def olmo_core(seed: int = 0):
    """OLMo-core's ``TransformerConfig.llama_like`` at tiny sizes, built by OLMo-core on the CPU."""
    from olmo_core.nn.transformer import TransformerConfig

    torch.manual_seed(seed)
    model = TransformerConfig.llama_like(d_model=64, vocab_size=256, n_layers=2, n_heads=4).build(init_device="cpu")
    return _gains_away_from_one(model, seed)


def tokens(vocab: int, b: int = 2, t: int = 16) -> torch.Tensor:
    return torch.randint(0, vocab, (b, t), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("strategy", PRESET_NAMES)
def test_olmo_core_keeps_the_function_of_every_foldable_strategy_and_folds_back(strategy):
    """Every strategy on OLMo-core's llama_like: a foldable one keeps the logits (LOGIT_TOL) and folds back to
    OLMo-core's own modules and parameter names with the same logits; DNP changes them and the measured flag says so;
    either way the loss has a gradient for every parameter (backward on the CPU)."""
    model, x = olmo_core(), tokens(256)
    names = [n for n, _ in model.named_parameters()]
    classes = {n: type(m) for n, m in model.named_modules()}
    with torch.no_grad():
        ref = model(x)
    _apply(model, strategy)
    assert model_family(model).name == "olmo_core"
    with torch.no_grad():
        gap = (model(x) - ref).abs().max().item()
    foldable = ScaleConfig.preset(strategy).foldable
    assert model.scalevec_info.function_preserved is foldable
    assert gap <= LOGIT_TOL if foldable else gap > 1e-2
    model.train()
    model(x).logsumexp(-1).mean().backward()
    assert all(p.grad is not None for p in model.parameters())
    if foldable:
        fold(model.eval())
        assert [n for n, _ in model.named_parameters()] == names
        assert {n: type(m) for n, m in model.named_modules()} == classes
        with torch.no_grad():
            assert (model(x) - ref).abs().max().item() <= LOGIT_TOL


def test_olmo_core_groups_keep_embeddings_and_norms_out_of_decay():
    """param_groups on OLMo-core's model carrying unified: the embedding undecayed, the LM head and the matrices
    decayed, unified's Input-Norm scales decayed (IWD), OR's direction vectors not."""
    model = _apply(olmo_core(), "unified")
    groups = {g["role"]: g["weight_decay"] for g in param_groups(model, lr=1e-3, weight_decay=0.1)}
    assert groups["embedding"] == 0.0 and groups["matrix"] == 0.1 and groups["lm_head"] == 0.1
    assert groups["scale_direction"] == 0.0


# ------------------------------------------------------------------------------------------ torchtitan


@pytest.fixture(scope="module")
def titan():
    """``(build, tokens, reference logits)`` of torchtitan's Llama3 debugmodel (flex attention, compiled once)."""
    from torchtitan.models.llama3 import llama3_configs

    def build():
        torch.manual_seed(0)
        model = llama3_configs["debugmodel"](attn_backend="flex").build()
        model.init_states()
        return _gains_away_from_one(model)

    x = tokens(2048, b=1)
    model = build()
    return build, x, titan_logits(model, x)


def titan_logits(model, x):
    positions = torch.arange(x.shape[1]).expand_as(x)
    with torch.no_grad():
        return model(x, positions, model.get_attention_masks(positions))


@pytest.mark.slow  # the first flex-attention forward compiles (15 s warm, ~110 s cold on 2 cores)
@pytest.mark.parametrize("strategy", PRESET_NAMES)
def test_torchtitan_keeps_the_function_of_every_foldable_strategy_and_folds_back(titan, strategy):
    """Every strategy on torchtitan's Llama3 debugmodel (forward only): a foldable one keeps the logits (LOGIT_TOL)
    and folds back to the fused ``FusedQKVLinear`` and torchtitan's own modules (same state-dict keys, torchtitan's
    Module protocol holds again) with the same logits; DNP changes them and the measured flag says so."""
    build, x, ref = titan
    model = build()
    keys = list(model.state_dict())
    fused = type(model.layers["0"].attention.qkv_linear)
    _apply(model, strategy)
    gap = (titan_logits(model, x) - ref).abs().max().item()
    foldable = ScaleConfig.preset(strategy).foldable
    assert model.scalevec_info.function_preserved is foldable
    assert gap <= LOGIT_TOL if foldable else gap > 1e-2
    if foldable:
        fold(model)
        assert type(model.layers["0"].attention.qkv_linear) is fused and list(model.state_dict()) == keys
        model.verify_module_protocol()
        assert (titan_logits(model, x) - ref).abs().max().item() <= LOGIT_TOL


def _move_scales(model, seed: int = 2):
    """Every 1-D parameter (γ, s, OR's magnitude and direction) times 1 + 0.2·N(0, 1): a trained-like strategy,
    so that an export that dropped or misplaced one would show."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.mul_(1 + 0.2 * torch.randn_like(p))
    return model


def test_olmo_core_export_has_one_home(tmp_path):
    """``scalevec.save`` of an OLMo-core model names the one export for it (OLMo-core's own HF converter,
    ``integrations/olmo_core.export_hf``, tested in tests/test_olmo_core.py) and writes nothing."""
    model = _apply(olmo_core(), "unified_foldable")
    with pytest.raises(ValueError, match="scalevec.integrations.olmo_core.export_hf"):
        save(model, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


@pytest.mark.slow  # torchtitan's flex attention compiles on its first forward
def test_torchtitan_export_converts_into_scalevecs_own_model(titan, tmp_path):
    """torchtitan's debugmodel carrying unified_foldable (scales moved off 1): ``scalevec.save`` names its one export
    (``integrations/torchtitan.export_hf``, torchtitan's own HF converter); that export, converted back into
    scalevec's own model with the strategy (``convert``'s path), computes the framework's logits (LOGIT_TOL)."""
    from scalevec.hf_format.hf_import import import_hf
    from scalevec.integrations.torchtitan import export_hf

    build, x, _ = titan
    model = _move_scales(_apply(build(), "unified_foldable"))
    ref = titan_logits(model, x)
    with pytest.raises(ValueError, match="scalevec.integrations.torchtitan.export_hf"):
        save(model, tmp_path / "no")
    export_hf(model, tmp_path / "hf")
    ours = import_hf(tmp_path / "hf", ScaleConfig.preset("unified_foldable"))[1].eval()
    with torch.no_grad():
        assert (ours(x) - ref).abs().max().item() <= LOGIT_TOL
