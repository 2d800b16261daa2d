"""Configuration: strategy presets (DESIGN.md §3), validation errors, overrides and YAML round trips."""

from __future__ import annotations

import dataclasses
import math

import pytest

from scalevec import ModelConfig, RunConfig, ScaleConfig, build_model
from scalevec.config import PRESET_NAMES, MoEConfig
from scalevec.config.codec import apply_overrides, from_dict, save_yaml, to_dict
from scalevec.config.files import load_yaml
from scalevec.model.scales import scale_plan

# DESIGN.md §3 table, written out independently of config/schema.py: (scale, placement, param, wd).
PRESET_SWITCHES = {
    "none": ("none", "input", "direct", "none"),
    "baseline": ("shared", "input", "direct", "none"),
    "iwd": ("shared", "input", "direct", "input"),
    "hg": ("branch", "input", "direct", "none"),
    "dp": ("shared", "dual", "direct", "none"),
    "dnp": ("shared", "dual_norm", "direct", "none"),
    "or": ("shared", "input", "magdir", "none"),
    "er": ("shared", "input", "magdir_exp", "none"),
    "unified": ("branch", "dual_norm", "magdir", "input"),
    "unified_foldable": ("branch", "dual", "magdir", "input"),
}


@pytest.mark.parametrize("name", PRESET_NAMES)  # every strategy must have its row above
def test_strategy_preset_matches_design_table(name):
    """ScaleConfig.preset(name) sets the four §3 switches as the DESIGN.md table says."""
    cfg = ScaleConfig.preset(name)
    assert (cfg.scale, cfg.placement, cfg.param, cfg.wd) == PRESET_SWITCHES[name]
    assert cfg.foldable == (cfg.placement != "dual_norm")


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_foldable_agrees_with_the_plan(name):
    """ScaleConfig.foldable, read from the switches, says what scale_plan builds: no branch output that DNP
    normalizes, in the dense MLP or in an MoE's experts and shared experts (the plan is the switches' meaning)."""
    scfg = ScaleConfig.preset(name)
    plan = scale_plan(scfg, ModelConfig(moe=MoEConfig(n_shared_experts=1)))
    assert scfg.foldable == (not any(norm.normalized for norm in (plan.attn, plan.mlp, plan.moe, plan.head)))


def test_unknown_strategy_lists_the_choices():
    """An unknown strategy name raises ValueError that names it and lists the valid ones."""
    with pytest.raises(ValueError, match=r"'bogus'.*unified_foldable"):
        ScaleConfig.preset("bogus")


@pytest.mark.parametrize("kwargs, field", [
    (dict(scale="half"), "scale.scale"),
    (dict(placement="output"), "scale.placement"),
    (dict(param="log"), "scale.param"),
    (dict(wd="some"), "scale.wd"),
    (dict(apply="both"), "scale.apply"),
    (dict(scale="none", placement="dual"), "scale.placement"),
    (dict(scale="none", param="magdir"), "scale.param"),
    (dict(scale="none", wd="input"), "scale.wd"),
    (dict(per_expert=True), "scale.per_expert"),
    (dict(dual_sites=("q", "router")), "scale.dual_sites"),
    (dict(norm_sites=("q",)), "scale.norm_sites"),
])
def test_scale_config_validation_names_the_field(kwargs, field):
    """Every invalid ScaleConfig raises ValueError whose message names the offending field."""
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        ScaleConfig(**kwargs).validate()


@pytest.mark.parametrize("kwargs, field", [
    (dict(d_model=0), "model.d_model"),
    (dict(d_model=30), "model.n_heads"),
    (dict(n_kv_heads=3), "model.n_kv_heads"),
    (dict(layout="post"), "model.layout"),
    (dict(d_model=12, n_heads=4), "head_dim"),
    (dict(vocab_size=-1), "model.vocab_size"),
])
def test_model_config_validation_names_the_field(make_cfg, kwargs, field):
    """Every invalid ModelConfig raises ValueError whose message names the offending field."""
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        make_cfg(**kwargs).validate()


def test_build_model_validates_both_configs(make_cfg):
    """build_model refuses an invalid model or scale config with ValueError (no silent defaults)."""
    with pytest.raises(ValueError, match=r"model\.layout"):
        build_model(make_cfg(layout="post"), ScaleConfig(), seed=0)
    with pytest.raises(ValueError, match=r"scale\.param"):
        build_model(make_cfg(), ScaleConfig(param="log"), seed=0)


def test_run_config_checks_seq_len_against_the_model():
    """RunConfig.validate names train.seq_len when it exceeds model.max_seq_len."""
    cfg = RunConfig()
    cfg.train.seq_len = cfg.model.max_seq_len + 1
    with pytest.raises(ValueError, match=r"train\.seq_len"):
        cfg.validate()


def test_overrides_set_typed_values():
    """key=value overrides reach nested fields with the declared types (int, bool, tuple, moe section)."""
    cfg = apply_overrides(RunConfig(), [
        "model.d_model=256", "model.tie_embeddings=true", "model.rope_theta=5e5", "scale.scale=branch",
        "scale.dual_sites=q,k", "moe.n_experts=4", "optim.muon_lr=none", "strategy=hg",
    ])
    assert cfg.model.d_model == 256 and isinstance(cfg.model.d_model, int)
    assert cfg.model.tie_embeddings is True
    assert cfg.model.rope_theta == 5e5 and isinstance(cfg.model.rope_theta, float)
    assert cfg.scale.scale == "branch"
    assert cfg.scale.dual_sites == ("q", "k")
    assert cfg.model.moe == MoEConfig(n_experts=4)
    assert cfg.optim.muon_lr is None
    assert cfg.strategy == "hg"
    assert RunConfig().model.d_model == 128  # the input config is not mutated


@pytest.mark.parametrize("item", ["train.tokens=-5", "train.micro_batch_size=-1", "train.ckpt_every=-1",
                                  "train.seed=-1", "train.probe_every=-2", "train.sharpness_every=-3",
                                  "moe.n_shared_experts=-1", "moe.first_dense=-1", "moe.lb_coef=-0.5",
                                  "moe.z_loss_coef=nan"])
def test_a_negative_field_is_named_alone(item):
    """A negative value of a field where 0 means off is refused naming that field and its value, and no other."""
    cfg = apply_overrides(RunConfig(), ["moe.n_experts=4", item])
    with pytest.raises(ValueError) as err:
        cfg.validate()
    key, value = item.split("=")
    assert str(err.value) == f"{key}={float(value) if '.' in value or value == 'nan' else int(value)!r} must be >= 0"


def test_a_seed_beyond_64_bits_is_refused():
    with pytest.raises(ValueError, match=r"^train.seed=99999999999999999999 must be below 2\*\*63"):
        apply_overrides(RunConfig(), ["train.seed=99999999999999999999"]).validate()
    apply_overrides(RunConfig(), [f"train.seed={2**63 - 1}"]).validate()


@pytest.mark.parametrize("item", ["moe.lb_coef=.inf", "moe.z_loss_coef=1e400"])
def test_an_infinite_coefficient_is_refused(item):
    cfg = apply_overrides(RunConfig(), ["moe.n_experts=4", item])
    with pytest.raises(ValueError, match=rf"^{item.split('=')[0]}=inf must be finite$"):
        cfg.validate()


@pytest.mark.parametrize("item, message", [
    ("model.d_model", "key=value"),
    ("model.width=3", "model.width"),
    ("modle.d_model=3", "modle.d_model"),
    ("model.d_model=abc", "model.d_model"),
    ("model.qk_norm=maybe", "model.qk_norm"),
    ("model.d_model=1.5", "model.d_model"),
    ("optim=adamw", "optim is a section, not a field; set one of its fields, e.g. optim.name="),
    ("model=3", "model is a section, not a field"),
])
def test_bad_override_names_the_key(item, message):
    """A malformed, unknown or ill-typed override raises ValueError naming the key (or the syntax)."""
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        apply_overrides(RunConfig(), [item])


def test_yaml_round_trip(tmp_path):
    """save_yaml then load_yaml + from_dict gives back an equal RunConfig, tuples and moe included."""
    cfg = apply_overrides(RunConfig(), ["scale.scale=branch", "scale.dual_sites=q,v,up", "moe.top_k=1",
                                        "model.qk_norm=true", "train.seq_len=64", "optim.betas=[0.8, 0.99]"])
    path = tmp_path / "config.yaml"
    save_yaml(cfg, path)
    back = from_dict(RunConfig, load_yaml(path))
    assert back == cfg
    assert back.scale.dual_sites == ("q", "v", "up") and back.optim.betas == (0.8, 0.99)
    assert to_dict(back) == to_dict(cfg)


def test_from_dict_rejects_unknown_keys():
    """from_dict names an unknown key with its section path."""
    with pytest.raises(ValueError, match=r"model\.widht"):
        from_dict(RunConfig, {"model": {"widht": 3}})


def test_load_yaml_errors(tmp_path):
    """load_yaml raises ValueError naming the path for a missing file, bad YAML or a non-mapping."""
    with pytest.raises(ValueError, match="does not exist"):
        load_yaml(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_yaml(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("3\n")
    with pytest.raises(ValueError, match="mapping"):
        load_yaml(scalar)


def test_head_dim_is_d_model_over_heads():
    """ModelConfig.head_dim = d_model // n_heads (DESIGN.md §2)."""
    assert dataclasses.replace(ModelConfig(), d_model=96, n_heads=3).head_dim == 32


def test_typed_input_tests_refuse_bools_and_text():
    """``config.typed.is_int`` / ``is_number``, the one type test of parsed YAML or JSON: ``true`` is no count and no
    number (Python's bool is an int), ``2.0`` no whole number, text no number; bounds and finiteness as asked."""
    from scalevec.config.typed import is_int, is_number

    assert [is_int(v) for v in (0, -3, 2**70, True, False, 2.0, "2", None)] == [True] * 3 + [False] * 5
    assert is_int(5, least=5, most=5) and not is_int(4, least=5) and not is_int(6, most=5)
    assert [is_number(v) for v in (0, 1e-3, -2, True, "1e-3", None, math.inf, math.nan)] == [True] * 3 + [False] * 5
    assert is_number(math.inf, finite=False) and is_number(math.nan, finite=False) and not is_number(True, finite=False)
    assert not is_number(0, above=0) and is_number(0, least=0) and not is_number(-1e-9, least=0)


@pytest.mark.parametrize("items, widest", [(["model.d_model=100000000000000000000"], "n_heads·head_dim"),
                                           (["model.vocab_size=100000000000000000000000000"], "vocab_size"),
                                           (["moe.n_experts=100000000000", "moe.d_expert=100000000"],
                                            "moe.n_experts·d_expert")])
def test_a_model_whose_largest_weight_torch_cannot_make_is_refused(items, widest, capsys):
    """Sizes whose largest weight passes 2**60 values (torch's storage limit, even on the meta device) are one
    ValueError naming d_model and the widest size; ``scalevec info`` (which builds on meta) raised a TypeError."""
    from scalevec.cli import main

    with pytest.raises(ValueError, match=rf"^model\.d_model=[\d,]+ × {widest}=[\d,]+ is a weight of .* past torch's"):
        apply_overrides(RunConfig(), items).validate()
    assert main(["info", "--preset", "tiny", *items]) == 2
    assert "Traceback" not in capsys.readouterr().err
