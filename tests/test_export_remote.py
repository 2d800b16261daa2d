"""Export of the strategies that cannot fold as a Hugging Face custom architecture (DESIGN.md §10).

``unified``, ``dnp``, the ``peri`` layout (with and without QK-norm) and MoE forms leave scalevec as
``ScalevecForCausalLM``: config.json's ``auto_map`` names the shipped ``modeling_scalevec.py``, which
plain transformers loads with ``trust_remote_code=True``; its logits match ours (fp32, 1e-5) and so do
greedy ids from its ``generate()``. Its tensor names come from the one name map (``names.REMOTE_NAMES``),
checked against the modeling file's parameters for every strategy of the preset table.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re

import pytest
import torch
import transformers  # noqa: F401  (a dev dependency: a missing one fails, never skips)
from transformers import AutoModelForCausalLM  # noqa: E402

from scalevec import MoEConfig, ScaleConfig, build_model  # noqa: E402
from scalevec.cli import main  # noqa: E402
from scalevec.config import PRESET_NAMES  # noqa: E402
from scalevec.hf.export import REMOTE_FILES, export_model, remote_config, remote_state_dict, remote_tensors
from scalevec.hf.remote.modeling_scalevec import ScalevecForCausalLM  # noqa: E402
from scalevec.hf.verify import verify  # noqa: E402
from scalevec.hf_format.names import REMOTE_NAMES, template_of  # noqa: E402

MOE = MoEConfig(n_experts=4, top_k=2, d_expert=16)
CASES = {  # name: (strategy, model overrides)
    "unified": ("unified", {}),
    "dnp": ("dnp", {}),
    "peri": ("baseline", {"layout": "peri"}),
    "peri_qk_norm": ("unified", {"layout": "peri", "qk_norm": True}),
    "moe_unified": ("unified", {"moe": MOE}),
    "moe_dnp_shared_dense_qk": ("dnp", {"moe": dataclasses.replace(MOE, n_shared_experts=1, first_dense=1),
                                        "qk_norm": True}),
    "peri_no_scales": ("none", {"layout": "peri"}),
}


def _model(make_cfg, perturb_scales, name, **extra):
    strategy, overrides = CASES[name]
    m = build_model(make_cfg(**overrides, **extra), ScaleConfig.preset(strategy), seed=0).eval()
    perturb_scales(m)  # every scale away from 1, so a scale folded wrongly or dropped shows in the logits
    return m


@pytest.mark.parametrize("name", [n if n in ("unified", "moe_unified") else pytest.param(n, marks=pytest.mark.slow)
                                  for n in CASES])  # the fast loop: one dense and one MoE export
def test_unfoldable_strategies_load_with_trust_remote_code_and_match(tmp_path, make_cfg, perturb_scales, tokens, name):
    """Each export loads as ScalevecForCausalLM (auto_map, shipped files) with no key problems, logits within
    1e-5 of ours in fp32, the same loss and the same greedy ids from transformers' generate()."""
    model = _model(make_cfg, perturb_scales, name)
    out = export_model(model, tmp_path / "hf", verify_tokens=tokens)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["ScalevecForCausalLM"] and config["model_type"] == "scalevec"
    assert set(config["auto_map"]) == {"AutoConfig", "AutoModelForCausalLM"}
    assert all((out / f).is_file() for f in REMOTE_FILES)
    r = verify(out, model, tokens)
    assert r["max_abs_logit_diff"] <= 1e-5 and abs(r["loss_ours"] - r["loss_hf"]) <= 1e-5 and r["greedy_equal"]
    assert not (r["loading_info"]["missing_keys"] or r["loading_info"]["unexpected_keys"])


def test_only_the_unfoldable_scales_are_kept(tmp_path, make_cfg, perturb_scales, tokens):
    """unified + peri + QK-norm keeps DNP's gate scale, the peri output norms and q/k norms; no input-norm
    weight, no up-side DNP scale (folded into W_down), nothing else besides the linear maps."""
    model = _model(make_cfg, perturb_scales, "peri_qk_norm")
    out = export_model(model, tmp_path / "hf")
    from safetensors.torch import load_file

    keys = set(load_file(str(out / "model.safetensors")))
    vectors = {k.split(".", 3)[-1] for k in keys if k.startswith("model.layers.") and not k.endswith("_proj.weight")}
    assert vectors == {"mlp.gate_norm", "attn_out_norm.weight", "mlp_out_norm.weight",
                       "self_attn.q_norm.weight", "self_attn.k_norm.weight"}
    assert not any("layernorm" in k or k == "model.norm.weight" for k in keys)


# every block kind the custom architecture holds: dense pre; peri with QK-norm; MoE with a shared expert, a dense
# first layer and QK-norm
NAME_MAP_SHAPES = {
    "dense": {},
    "peri_qk_norm": {"layout": "peri", "qk_norm": True},
    "moe_shared_dense_qk_norm": {"moe": dataclasses.replace(MOE, n_shared_experts=1, first_dense=1), "qk_norm": True},
}


@pytest.mark.parametrize("shape", NAME_MAP_SHAPES)
@pytest.mark.parametrize("strategy", PRESET_NAMES)
def test_remote_name_map_holds_every_parameter_both_ways(make_cfg, strategy, shape):
    """Every parameter of ours reaches an exported tensor (folded or kept); each has a name in names.REMOTE_NAMES;
    those names are exactly ScalevecForCausalLM's parameters with their shapes; and each of its names maps back
    through the table to the one tensor of ours it holds. For every strategy of the preset table."""
    model = build_model(make_cfg(**NAME_MAP_SHAPES[shape]), ScaleConfig.preset(strategy), seed=0)
    ours = remote_tensors(model)
    missing = [k for k in ours if template_of(k)[0] not in REMOTE_NAMES]
    assert not missing, f"exported tensors with no entry in names.REMOTE_NAMES: {missing}"
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(sum(t.sum() for t in ours.values()), params, allow_unused=True)
    names = {id(p): n for n, p in model.named_parameters()}
    dropped = [names[id(p)] for p, g in zip(params, grads) if g is None]
    assert not dropped, f"parameters that reach no exported tensor: {dropped}"
    # ours -> theirs: the modeling file's parameters, no more, no fewer, with the same shapes
    state = remote_state_dict(model)
    hf = ScalevecForCausalLM(remote_config(model.cfg, model.scfg))
    assert {k: tuple(t.shape) for k, t in state.items()} == {k: tuple(t.shape) for k, t in hf.state_dict().items()}
    # theirs -> ours: the table read backwards (one-to-one) finds the tensor each name holds
    back = {theirs: mine for mine, theirs in REMOTE_NAMES.items()}
    assert len(back) == len(REMOTE_NAMES), "two of our names map to one name of the custom architecture"
    for name, t in state.items():
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.*)", name)
        template, i = (f"model.layers.{{i}}.{m.group(2)}", int(m.group(1))) if m else (name, None)
        assert template in back, f"{name} is not in names.REMOTE_NAMES"
        assert torch.equal(t, ours[back[template].format(i=i)].detach()), name


def test_modeling_file_needs_only_torch_and_transformers():
    """The shipped files import nothing from scalevec: torch, transformers, the standard library, each other."""
    from importlib import resources

    for name in REMOTE_FILES:
        tree = ast.parse(resources.files("scalevec.hf.remote").joinpath(name).read_text())
        roots = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                roots.add("." if node.level else node.module.split(".")[0])
        assert roots <= {"__future__", "math", "torch", "transformers", "."}, (name, roots)


def test_generate_with_cache_and_padding(tmp_path, make_cfg, perturb_scales):
    """generate() with and without the KV cache gives the same ids, and a left-padded batch row (masked pads)
    generates what the same prompt generates alone."""
    model = _model(make_cfg, perturb_scales, "moe_unified")
    out = export_model(model, tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=True).eval()
    prompt = torch.tensor([[5, 9, 2, 33]])
    args = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        alone = hf.generate(prompt, attention_mask=torch.ones_like(prompt), **args)[0, 4:]
        no_cache = hf.generate(prompt, attention_mask=torch.ones_like(prompt), use_cache=False, **args)[0, 4:]
        batch = torch.tensor([[0, 0, 5, 9, 2, 33], [7, 7, 1, 4, 8, 8]])
        mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
        padded = hf.generate(batch, attention_mask=mask, **args)[0, 6:]
    assert alone.tolist() == no_cache.tolist() == padded.tolist()


def test_bfloat16_remote_export_verifies(tmp_path, make_cfg, perturb_scales, tokens):
    """A bfloat16 custom export loads and its fp32-computed loss is within 0.05 nats of ours."""
    model = _model(make_cfg, perturb_scales, "unified")
    out = export_model(model, tmp_path / "hf", dtype="bfloat16", verify_tokens=tokens)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


def test_cli_exports_a_unified_run_as_custom_code(tmp_path, make_cfg, perturb_scales, capsys):
    """`scalevec export RUN --verify` on a unified run exits 0 and says it wrote custom code; `--format scalevec`
    also holds a foldable model."""
    from test_export import _run_dir  # the same run-directory fixture as the plain-family export

    model = _model(make_cfg, perturb_scales, "unified", vocab_size=256)
    run = _run_dir(tmp_path / "run", model, "unified")
    assert main(["export", str(run), "--out", str(tmp_path / "hf"), "--verify"]) == 0
    printed = capsys.readouterr().out
    assert "trust_remote_code=True" in printed and "verify: OK" in printed and "greedy: " in printed
    foldable = build_model(make_cfg(vocab_size=256), ScaleConfig.preset("baseline"), seed=0)
    run2 = _run_dir(tmp_path / "run2", foldable, "baseline")
    assert main(["export", str(run2), "--out", str(tmp_path / "hf2"), "--format", "scalevec", "--verify"]) == 0
    assert json.loads((tmp_path / "hf2" / "config.json").read_text())["architectures"] == ["ScalevecForCausalLM"]
