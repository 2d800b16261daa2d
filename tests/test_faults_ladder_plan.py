"""scripts/ladder_plan.py as a careless user or an attacker would call it: it never overwrites a file,
refuses invalid arguments with one line and exit 2, and writes nothing then; and its horizon cells (tokens per
parameter ≠ 20) are centred on the 20-token picks shifted by the measured horizon exponent."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def lp():
    spec = importlib.util.spec_from_file_location("ladder_plan", ROOT / "scripts" / "ladder_plan.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["ladder_plan"] = mod
    spec.loader.exec_module(mod)
    return mod


def fake_results(root: Path) -> None:
    """A 20-token ladder cell cpu-10k KJV (picks 0.02 / 0.03 / 0.04) and the horizon evidence: the first
    protocol's cells with picks moving ×1, ×1, ×2 (cpu-10k) and ×1, ×1, ×1/4 (cpu-25k) from 20 to 100."""
    head = ("cell,strategy,tuned,best_value,at_grid_edge,seeds,val_loss_mean,val_loss_std,delta,ci_lo,ci_hi,"
            "non_embedding_params\n")
    cells = {"ladder-cpu-10k-kjv": (0.02, 0.03, 0.04), "cpu-10k-shakespeare": (0.02, 0.02, 0.02),
             "cpu-10k-shakespeare-tpp100": (0.02, 0.02, 0.04), "cpu-25k-shakespeare": (0.02, 0.01, 0.08),
             "cpu-25k-shakespeare-tpp100": (0.02, 0.01, 0.02)}
    for name, lrs in cells.items():
        (root / name).mkdir(parents=True)
        (root / name / "results.csv").write_text(head + "".join(
            f"c,{s},optim.lr,{lr},False,6,2.0,0.01,,,,9660\n" for s, lr in zip(("baseline", "none", "unified"), lrs)))


def call(lp, capsys, *argv) -> tuple[int, str]:
    try:
        rc = lp.main(list(argv))
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    return rc, capsys.readouterr().err


def snapshot(root: Path) -> dict:
    return {p: (p.read_bytes() if p.is_file() else None) for p in root.rglob("*")}


BAD = [
    ("--grid-factor", "0"), ("--grid-factor", "1"), ("--grid-factor", "-2"), ("--grid-factor", "nan"),
    ("--grid-factor", "inf"), ("--val-tokens", "0"), ("--val-tokens", "-5"), ("--max-seeds", "0"),
    ("--tuning-seeds", "0"), ("--batch-size", "0"), ("--seq-len", "-1"), ("--eval-every", "0"),
    ("--lr-scale", "0"), ("--lr-scale", "nan"), ("--tokens-per-param", "0"), ("--tokens-per-param", "-20"),
    ("--tokens-per-param", "inf"), ("--target", "0"), ("--grid-factor", "x"), ("--max-seeds", "1.5"),
    ("--tokens-per-param", "1e308"), ("--tokens-per-param", "1e-300"),  # overflowed; planned a 1-step run
    ("--grid-factor", "1.00005"),  # neighbours one lr to run names' rounding: share_lrs would have merged them
]


@pytest.mark.parametrize("flag, value", BAD)
def test_invalid_arguments_are_one_line_and_write_nothing(lp, capsys, tmp_path, flag, value):
    fake_results(tmp_path / "results")
    before = snapshot(tmp_path)
    rc, err = call(lp, capsys, "cpu-10k", "kjv", "--results", str(tmp_path / "results"),
                   "--out", str(tmp_path / "new.yaml"), flag, value)
    assert rc == 2 and err.count("\n") == 1 and err.startswith("ladder_plan: ") and "Traceback" not in err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("argv, words", [
    (("cpu-3k", "kjv"), "unknown rung"),
    (("cpu-10k", "kjv", "--schedule", "wsd", "--predicted-only"), "horizon cell"),  # WSD is tuned on CPU only
    (("cpu-25k", "kjv", "--tokens-per-param", "100"), "has not reported"),  # no 20-token cell to centre on
    (("cpu-10k", "bible"), "invalid choice"),
    (("cpu-10k", "kjv", "--device", "banana"), "invalid choice"),
])
def test_impossible_plans_are_refused(lp, capsys, tmp_path, argv, words):
    fake_results(tmp_path / "results")
    before = snapshot(tmp_path)
    rc, err = call(lp, capsys, *argv, "--results", str(tmp_path / "results"), "--out", str(tmp_path / "new.yaml"))
    assert rc == 2 and words in err and err.count("\n") == 1
    assert snapshot(tmp_path) == before


def test_an_existing_out_is_never_overwritten(lp, capsys, tmp_path):
    """README.md was once overwritten with exit 0: an existing --out, or a link there to any file, is
    refused and left as it was; an --out in a missing folder is one line, not a traceback."""
    fake_results(tmp_path / "results")
    keep = tmp_path / "README.md"
    keep.write_text("keep me")
    link = tmp_path / "link.yaml"
    link.symlink_to(keep)
    for out in (keep, link):
        rc, err = call(lp, capsys, "cpu-10k", "kjv", "--tokens-per-param", "100", "--results",
                       str(tmp_path / "results"), "--out", str(out))
        assert rc == 2 and "never overwritten" in err and err.count("\n") == 1
    assert keep.read_text() == "keep me" and link.is_symlink()
    rc, err = call(lp, capsys, "cpu-10k", "kjv", "--results", str(tmp_path / "results"), "--out",
                   str(tmp_path / "missing" / "x.yaml"))
    assert rc == 2 and "does not exist" in err and not (tmp_path / "missing").exists()


def test_horizon_cell_is_centred_on_the_20_token_pick_times_the_shift(lp, capsys, tmp_path):
    """The evidence above gives s = mean(log ratio)/log 5 = log(1/2)/6/log 5; at 400 tokens per parameter each
    strategy's grid is 3 values ×√2 around pick × 20^s; the file is a valid study with held-out seeds 2-5."""
    from scalevec.config.files import load_yaml
    from scalevec.experiments.study import parse

    fake_results(tmp_path / "results")
    out = tmp_path / "h.yaml"
    rc, err = call(lp, capsys, "cpu-10k", "kjv", "--tokens-per-param", "400", "--results", str(tmp_path / "results"),
                   "--out", str(out))
    assert rc == 0, err
    s = math.log(0.5) / 6 / math.log(5)
    spec, plan, _ = parse(load_yaml(out))
    for strategy, pick in zip(("baseline", "none", "unified"), (0.02, 0.03, 0.04)):
        g = plan.lr_grids[strategy]
        assert g[1] == pytest.approx(pick * 20 ** s, rel=1e-5)
        assert g[2] / g[1] == pytest.approx(math.sqrt(2), rel=1e-5)
    assert spec.base["tokens_per_param"] == 400 and plan.confirm_seeds == [2, 3, 4, 5]
    assert plan.target_halfwidth == lp.HELD_OUT_TARGET == 0.015 and plan.halfwidth_on == "held-out"
    assert spec.name == "ladder-cpu-10k-kjv-tpp400"
    assert "2.20 passes" in out.read_text() and "DATA REPEATS" in out.read_text()


def test_committed_horizon_evidence_and_passes():
    """On the committed first-protocol cells the exponent is log(2 · 1/4)/6/log 5 = −0.0718 (4 picks unchanged,
    unified ×2 and ×1/4), and cpu-25k at 100 tokens per parameter makes 0.91 passes over Shakespeare."""
    from reproduction import ladder

    s, pairs = ladder.horizon_exponent(ROOT / "results")
    assert s == pytest.approx(math.log(0.5) / 6 / math.log(5), rel=1e-9)
    assert sorted(r for _, _, r in pairs) == [0.25, 1, 1, 1, 1, 2]
    tokens = ladder.run_tokens(41056, 100)
    assert tokens == 4106240 and ladder.passes(tokens, "shakespeare") == pytest.approx(0.907, abs=5e-4)


def test_prose_cells_start_from_shakespeares_picks_and_name_the_built_corpus(lp, capsys, tmp_path):
    """The third corpus (prose) has no 20-token ladder: ``--centre-corpus shakespeare`` centres its 20-token cell
    on Shakespeare's picks of the same rung (no horizon shift at 20), reads the built file beside sweeps/, and
    says how to build it; without the flag a 20-token prose cell is refused (there is nothing to predict from),
    and the flag is refused on a GPU-ladder rung."""
    from reproduction import ladder

    from scalevec.config.files import load_yaml
    from scalevec.experiments.study import parse

    fake_results(tmp_path / "results")
    shk = tmp_path / "results" / "ladder-cpu-10k-shakespeare"
    shk.mkdir()
    text = (tmp_path / "results" / "ladder-cpu-10k-kjv" / "results.csv").read_text()
    (shk / "results.csv").write_text(text.replace(",0.02,", ",0.005,").replace(",0.03,", ",0.006,")
                                     .replace(",0.04,", ",0.007,"))
    out = tmp_path / "p.yaml"
    rc, err = call(lp, capsys, "cpu-10k", "prose", "--tokens-per-param", "20", "--centre-corpus", "shakespeare",
                   "--results", str(tmp_path / "results"), "--out", str(out))
    assert rc == 0, err
    spec, plan, _ = parse(load_yaml(out))
    for strategy, pick in zip(("baseline", "none", "unified"), (0.005, 0.006, 0.007)):
        assert plan.lr_grids[strategy][1] == pytest.approx(pick, rel=1e-5)  # (20/20)^s = 1
    corpus = ROOT / "data" / "corpora" / "gutenberg-sotu.txt"  # resolved beside the file, wherever it is written
    assert spec.name == "ladder-cpu-10k-prose" and (out.parent / spec.base["data.source"]).resolve() == corpus
    assert (ROOT / "sweeps" / ladder.SOURCES["prose"]).resolve() == corpus
    assert "python3 data/corpora/build_gutenberg_sotu.py" in out.read_text()
    assert (ROOT / "data" / "corpora" / "build_gutenberg_sotu.py").is_file()
    for argv, words in ((("cpu-10k", "prose"), "--centre-corpus"),
                        (("cpu-10k", "prose", "--centre-corpus", "shakespeare", "--predicted-only"), "horizon cell")):
        before = snapshot(tmp_path)
        rc, err = call(lp, capsys, *argv, "--results", str(tmp_path / "results"), "--out", str(tmp_path / "q.yaml"))
        assert rc == 2 and words in err and err.count("\n") == 1
        assert snapshot(tmp_path) == before


def test_every_horizon_cell_on_prose_makes_under_one_pass():
    """The third corpus exists so that no planned cell repeats data: cpu-10k/25k/80k at 20 and 100 and
    cpu-10k/25k at 400 all stay under one pass over its 16,917,603 training tokens, and claims.HORIZON lists them."""
    from reproduction import claims, ladder

    planned = [(r, d) for r in ("cpu-10k", "cpu-25k", "cpu-80k") for d in (20, 100)] + [("cpu-10k", 400),
                                                                                         ("cpu-25k", 400)]
    for rung, d in planned:
        assert ladder.passes(ladder.run_tokens(ladder.total_params(rung), d), "prose") < 1, (rung, d)
        assert ladder.horizon_name(rung, "prose", d) in {s.name for s in claims.HORIZON}
    assert ladder.passes(ladder.run_tokens(ladder.total_params("cpu-80k"), 100), "shakespeare") > 2


@pytest.mark.parametrize("damage", ["torn", "columns", "text", "zero", "inf", "binary"])
def test_a_damaged_results_csv_is_named_in_one_line(lp, capsys, tmp_path, damage):
    """A 20-token cell's or an evidence cell's results.csv that is cut off, has other columns, or holds an lr that
    is not a finite number > 0 is refused in one line naming it (it was a traceback, or a plan with lr inf)."""
    fake_results(tmp_path / "results")
    cell = "cpu-10k-shakespeare" if damage == "zero" else "ladder-cpu-10k-kjv"
    target = tmp_path / "results" / cell / "results.csv"
    text = target.read_text()
    target.write_bytes({"torn": text[:len(text) - 30].encode(), "columns": b"a,b\n1,2\n",
                        "text": text.replace(",0.03,", ",abc,").encode(),
                        "zero": text.replace(",0.02,", ",0,").encode(),
                        "inf": text.replace(",0.04,", ",inf,").encode(), "binary": b"\x85\xff\x00" * 20}[damage])
    before = snapshot(tmp_path)
    rc, err = call(lp, capsys, "cpu-10k", "kjv", "--tokens-per-param", "100", "--results", str(tmp_path / "results"),
                   "--out", str(tmp_path / "new.yaml"))
    assert rc == 2 and err.count("\n") == 1 and str(target) in err and "Traceback" not in err, err
    assert snapshot(tmp_path) == before


def test_one_lr_reached_by_two_strategies_is_written_once(lp, capsys, tmp_path):
    """The committed cpu-10k Shakespeare picks (baseline 0.0566 = 0.04·√2, none 0.0283 = 0.04/√2) put baseline's
    lower and none's upper value on the same lr by two products, which 6-digit rounding wrote as 0.0356359 and
    0.035636: two lrs in every table and two run names for one lr. The plan writes the first one for both; no two
    lrs of the file lie within ladder.SAME_LR_REL of each other unless equal."""
    from reproduction import ladder

    from scalevec.config.files import load_yaml
    from scalevec.experiments.study import parse

    results = tmp_path / "results"  # the committed picks and evidence, without the cell that has run already
    for cell in ("ladder-cpu-10k-shakespeare", "cpu-10k-shakespeare", "cpu-10k-shakespeare-tpp100",
                 "cpu-25k-shakespeare", "cpu-25k-shakespeare-tpp100"):
        (results / cell).mkdir(parents=True)
        (results / cell / "results.csv").write_bytes((ROOT / "results" / cell / "results.csv").read_bytes())
    out = tmp_path / "h.yaml"
    rc, err = call(lp, capsys, "cpu-10k", "shakespeare", "--tokens-per-param", "100", "--results", str(results),
                   "--out", str(out))
    assert rc == 0, err
    _, plan, _ = parse(load_yaml(out))
    assert plan.lr_grids["baseline"][0] == plan.lr_grids["none"][2] == 0.0356359  # the same float, written once
    values = sorted({lr for g in plan.lr_grids.values() for lr in g})
    assert all(b / a > 1 + ladder.SAME_LR_REL for a, b in zip(values, values[1:])), values
    assert ladder.share_lrs({"a": [1.0, 2.0], "b": [2.00001, 3.0]}) == {"a": [1.0, 2.0], "b": [2.0, 3.0]}
    # only across strategies: a strategy's own values stay distinct (merged, its 3-value grid became 2 values)
    assert ladder.share_lrs({"a": [1.0, 1.00005, 2.0]}) == {"a": [1.0, 1.00005, 2.0]}
    assert ladder.share_lrs({"a": [1.0], "b": [1.00005, 2.0]}) == {"a": [1.0], "b": [1.0, 2.0]}
