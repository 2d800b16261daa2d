"""One config resolution (``resolve.resolve_config``) and the derived figures of ``config`` (issue 16)."""

import argparse

import pytest

from scalevec.config import (
    RunConfig,
    apply_overrides,
    budget_tokens,
    config_diff,
    format_diff,
    run_tokens,
    to_dict,
    total_steps,
)
from scalevec.experiments.sweep import assigned_config
from scalevec.resolve import resolve_config
from scalevec.training import command


def test_layers_in_order():
    """Preset/strategy defaults < sections < overrides; sections choose the preset when the argument does not."""
    cfg = resolve_config(None, None, ["optim.lr=0.02"], {"preset": "tiny", "optim": {"lr": 0.5, "weight_decay": 0.0}})
    assert (cfg.preset, cfg.strategy, cfg.model.d_model) == ("tiny", "baseline", 64)
    assert (cfg.optim.lr, cfg.optim.weight_decay) == (0.02, 0.0)
    assert resolve_config("small", "hg", [], {"preset": "tiny"}).preset == "small"  # an explicit argument wins
    # typed values (a sweep's flat assignments) resolve to the same config as the command-line strings
    assert to_dict(resolve_config("tiny", "or", {"optim.lr": 0.01, "data.source": "kjv"})) == to_dict(
        resolve_config("tiny", "or", ["optim.lr=0.01", "data.source=kjv"]))


@pytest.mark.parametrize("overrides, sections, floor", [
    (["schedule.name=wsd"], None, 0.0),  # the layer that picks wsd leaves the floor unset: decays to 0
    (["schedule.name=wsd", "schedule.min_lr_ratio=0.05"], None, 0.05),
    ([], {"schedule": {"name": "wsd"}}, 0.0),  # a config file's wsd as well
    ([], {"schedule": {"name": "wsd", "min_lr_ratio": 0.2}}, 0.2),
    (["schedule.name=wsd"], {"schedule": {"min_lr_ratio": 0.2}}, 0.0),  # as `train --config f --schedule wsd`
    (["schedule.min_lr_ratio=0.3"], {"schedule": {"name": "wsd"}}, 0.3),
    (["schedule.name=wsd", "schedule.name=cosine"], None, 0.1),  # the last name decides; cosine keeps 0.1
    ({"schedule.name": "wsd"}, None, 0.0),  # a sweep's typed value
])
def test_wsd_floor_rule(overrides, sections, floor):
    """DESIGN.md §7: wsd decays to 0 unless schedule.min_lr_ratio is given at or above the layer choosing it."""
    assert resolve_config("tiny", None, overrides, sections).schedule.min_lr_ratio == floor


def test_invalid_input_is_one_valueerror():
    """Unknown names and invalid values raise ValueError naming the key (validation is the resolver's)."""
    with pytest.raises(ValueError, match="unknown strategy"):
        resolve_config("tiny", "gamma")
    with pytest.raises(ValueError, match="unknown config section 'optimizer'"):
        resolve_config("tiny", None, [], {"optimizer": {"lr": 1}})
    with pytest.raises(ValueError, match="overrides are key=value"):
        resolve_config("tiny", None, ["optim.lr"])
    with pytest.raises(ValueError, match=r"model.d_model=31 is not divisible"):
        resolve_config("tiny", None, ["model.d_model=31"])
    with pytest.raises(ValueError, match="base config, not both"):
        resolve_config("tiny", base=RunConfig())


def test_base_config_is_resolved_and_validated():
    """``base`` (a stored config, ``--resume``) takes execution overrides and is validated like any input."""
    stored = resolve_config("tiny", "unified")
    cfg = resolve_config(base=stored, overrides=["train.device=cpu", "train.compile=false"])
    assert config_diff(stored, cfg) == {} and cfg.train.compile == "false"
    with pytest.raises(ValueError, match="train.device='tpu'"):
        resolve_config(base=stored, overrides=["train.device=tpu"])


def test_validates_once(monkeypatch):
    """``scalevec train``'s config is validated by the resolver and nowhere else before the trainer runs."""
    calls = []
    real = RunConfig.validate
    monkeypatch.setattr(RunConfig, "validate", lambda self: (calls.append(1), real(self))[1])
    args = argparse.Namespace(config=None, preset="tiny", strategy=None, overrides=["train.steps=3"], compile=None,
                              **{name: None for name in command.FLAG_FIELDS})
    cfg = command.config_from_args(args)
    assert calls == [1] and cfg.train.steps == 3
    calls.clear()
    run = assigned_config({"preset": "tiny", "strategy": "none", "tokens_per_param": 2})
    assert calls == [1] and run.train.tokens > 0


def test_step_counter():
    """total_steps rounds a token budget up to whole steps; run_tokens is those steps' tokens."""
    cfg = apply_overrides(RunConfig(), ["train.batch_size=4", "train.seq_len=32", "train.steps=7"])
    assert (total_steps(cfg), run_tokens(cfg)) == (7, 7 * 128)
    cfg = apply_overrides(cfg, ["train.tokens=1000"])  # 1000 / 128 = 7.8 -> 8 steps
    assert (total_steps(cfg), run_tokens(cfg)) == (8, 1024)


def test_budget_tokens():
    """tokens = round(tokens_per_param × params); a ratio that is not positive, or no token, is refused."""
    assert budget_tokens(20, 41_056) == 821_120
    assert budget_tokens(0.5, 3) == 2  # round half to even
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="must be > 0"):
            budget_tokens(bad, 1000)
    with pytest.raises(ValueError, match="gives 0 tokens"):
        budget_tokens(1e-9, 1000)


def test_one_diff_for_resume_and_sweep():
    """config_diff: dotted names with both values, execution fields excepted; a section present on one side
    only is one entry; format_diff writes it as the resume and sweep errors show it."""
    a = resolve_config("tiny", "baseline")
    b = apply_overrides(a, ["optim.lr=0.5", "train.threads=2", "moe.n_experts=4"])
    diff = config_diff(a, b)
    assert list(diff) == ["model.moe", "optim.lr"] and diff["optim.lr"] == (a.optim.lr, 0.5)
    assert diff["model.moe"][0] is None and diff["model.moe"][1]["n_experts"] == 4
    assert format_diff({"optim.lr": (0.003, 0.5)}) == "optim.lr: 0.003 -> 0.5"
    assert config_diff(to_dict(a), to_dict(b)) == diff  # mappings (a stored config.yaml) work the same


def test_cross_section_rules_are_the_configs():
    """Rules across sections (probes need the whole model, seq_len within max_seq_len) are RunConfig's, so the
    resolver refuses them before any trainer is built."""
    with pytest.raises(ValueError, match="need the whole model on one process"):
        resolve_config("tiny", None, ["train.dist=fsdp2", "train.probe_every=10"])
    with pytest.raises(ValueError, match="exceeds the model's max_seq_len"):
        resolve_config("tiny", None, ["train.seq_len=100000"])
