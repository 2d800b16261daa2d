"""One config resolution (``resolve.resolve_config``) and the derived figures of ``config`` (DESIGN.md §12)."""

import argparse

import pytest

from scalevec.config import RunConfig
from scalevec.config.codec import apply_overrides, config_diff, format_diff, to_dict
from scalevec.config.run_budget import budget_tokens, run_tokens, total_steps
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
        with pytest.raises(ValueError, match="must be a finite number > 0"):
            budget_tokens(bad, 1000)
    with pytest.raises(ValueError, match="gives 0 tokens"):
        budget_tokens(1e-9, 1000)


@pytest.mark.parametrize("bad, match", [(float("inf"), "finite number > 0"), (True, "finite number > 0"),
                                        ("abc", "finite number > 0"), (1e300, "gives 1e[+]303 tokens")])
def test_budget_tokens_refuses_what_gives_no_int64_budget(bad, match):
    """A ratio that is infinite, a bool or non-numeric text, or a budget past 2**63 tokens (the int64 counters), is
    one ValueError naming tokens_per_param, not an OverflowError or a budget of True = 1 token per parameter."""
    with pytest.raises(ValueError, match=rf"^tokens_per_param.*{match}"):
        budget_tokens(bad, 1000)
    assert budget_tokens("1e3", 1000) == 1_000_000  # YAML 1.1 reads 1e3 as text: still the number


@pytest.mark.parametrize("items, match", [(["train.tokens=100", "train.batch_size=0"], "train.batch_size=0 must be"),
                                          (["train.tokens=1" + "0" * 400], "train.tokens=.* must be below 2")])
def test_a_token_budget_with_a_bad_batch_or_past_int64_is_named(items, match):
    """train.tokens with batch_size 0 (ZeroDivisionError before) or tokens of 401 digits (OverflowError of a float
    quotient before) is one ValueError naming the field: validation comes before the step count is derived."""
    with pytest.raises(ValueError, match=f"^{match}"):
        resolve_config("tiny", "baseline", items)
    assert total_steps(resolve_config("tiny", "baseline", [f"train.tokens={2**60 + 1}", "train.batch_size=1",
                                                           "train.seq_len=1"])) == 2**60 + 1  # exact, no float


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
    # the fix names the key=value too: convert, which a Hugging Face model of context 64 meets, has no --seq-len
    with pytest.raises(ValueError, match=r"exceeds the model's max_seq_len=256; set train\.seq_len=256 or less"):
        resolve_config("tiny", None, ["train.seq_len=100000"])


# -------------------------------------------------------------------------------- the default warmup


@pytest.mark.parametrize("items, warmup", [
    (["train.steps=40"], 4),  # a short run: its first tenth
    (["train.steps=800"], 50),  # the default run keeps 50, as every run of 500 steps or more
    (["train.steps=100000"], 50),
    (["train.steps=7"], 0),  # below 10 steps: no warmup at all
    (["train.steps=40", "schedule.warmup=50"], 50),  # set by the user: kept, even when it does not fit
    (["train.steps=40", "schedule.warmup_frac=0.05"], 50),  # warmup_frac rules; warmup stays the stored 50
    (["train.tokens=81920", "train.batch_size=16", "train.seq_len=128"], 4),  # 40 steps from a token budget
])
def test_default_warmup_is_a_tenth_of_the_run_at_most_50(items, warmup):
    """Unless a layer sets schedule.warmup or warmup_frac, a run warms up over min(50, steps // 10) steps."""
    assert resolve_config("tiny", None, items).schedule.warmup == warmup


def test_default_warmup_follows_the_layers_and_the_budget():
    """A config file's warmup counts as set; a stored config (--resume) keeps its own; a sweep's tokens_per_param
    budget decides the steps the default is a share of; the default never warns (it stays below the run)."""
    from scalevec.training.schedule import warmup_warning

    assert resolve_config("tiny", None, ["train.steps=40"], {"schedule": {"warmup": 30}}).schedule.warmup == 30
    stored = resolve_config("tiny", None, ["train.steps=40", "schedule.warmup=50"])
    assert resolve_config(base=stored).schedule.warmup == 50
    cfg = assigned_config({"preset": "tiny", "tokens_per_param": 0.01, "train.batch_size": 4, "train.seq_len": 32})
    assert 0 < cfg.schedule.warmup == total_steps(cfg) // 10 < 50
    assert all(warmup_warning(s, resolve_config("tiny", None, [f"train.steps={s}"]).schedule) is None
               for s in (1, 2, 9, 10, 11, 499, 500))


def test_the_warmup_warning_names_the_ramp_it_gets():
    """A warmup past the run is cut to it: the warning names the setting and the real ramp, the run's steps."""
    from scalevec.config import ScheduleConfig
    from scalevec.training.schedule import lr_multiplier, warmup_warning

    note = warmup_warning(10, ScheduleConfig(warmup=50))
    assert note.startswith("schedule.warmup=50 is not below the run's 10 steps: the lr ramps over all 10 steps")
    assert [lr_multiplier(s, 10, ScheduleConfig(warmup=50)) for s in (0, 9)] == [0.1, 1.0]  # what it says
    assert "schedule.warmup_frac=0.95 (10 steps)" in warmup_warning(10, ScheduleConfig(warmup_frac=0.95))


@pytest.mark.slow  # expands every stored study (about 10 s)
def test_committed_studies_resolve_to_their_stored_runs():
    """Every run kept under results/ whose study file lists it resolves to its stored config.yaml: a default
    that moved under a committed study would make the sweep refuse to resume it (as a new default warmup would)."""
    from pathlib import Path

    from scalevec.config.files import load_yaml
    from scalevec.experiments.study import parse
    from scalevec.experiments.sweep import expand, run_status, spec_from_dict
    from scalevec.experiments.sweepdir import MORE_SPECS, SPEC_FILE

    checked = 0
    for out in sorted((Path(__file__).resolve().parents[1] / "results").iterdir()):
        stored = [out / SPEC_FILE] if (out / SPEC_FILE).is_file() else []
        for path in stored + sorted((out / MORE_SPECS).glob("*.yaml")):
            data = load_yaml(path)
            spec = parse(data, str(path))[0] if "study" in data else spec_from_dict(data, str(path))
            for run in expand(spec):
                if (out / "runs" / run.name / "config.yaml").is_file():
                    run_status(run, out / "runs")  # ValueError naming the field that differs
                    checked += 1
    assert checked >= 200  # 272 when written: the check is not vacuous
