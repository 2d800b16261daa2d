"""``scalevec bench`` (docs/performance.md): runs end to end on the tiny preset and reports a well-formed result.

Speed is a measured figure, never asserted here: these tests check the structure of the JSON, the
equal-work checks the benchmark carries (every candidate starts from the same loss), the memory
accounting and the folded parameter count, and the CLI's error handling.
"""

from __future__ import annotations

import json
import os
from contextlib import nullcontext

import pytest
import torch
import transformers  # noqa: F401  (a dev dependency: a missing one fails, never skips)

from scalevec import ScaleConfig, build_model, get_preset
from scalevec.bench.candidates import make_candidate, parse_candidates
from scalevec.bench.memory import state_bytes, step_peak_bytes
from scalevec.cli import main
from scalevec.config import OptimConfig
from scalevec.model.params import count_params

CANDIDATES = ["baseline", "unified", "unified_foldable", "hf-llama"]


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    """``scalevec bench --preset tiny --steps 2 --json`` on a small batch, parsed from stdout."""
    save = tmp_path_factory.mktemp("bench") / "bench.json"
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["bench", "--preset", "tiny", "--strategies", ",".join(CANDIDATES), "--steps", "2",
                     "--warmup", "1", "--batch-size", "2", "--seq-len", "16", "--device", "cpu", "--json",
                     "--save", str(save)])
    assert code == 0
    r = json.loads(out.getvalue())
    assert json.loads(save.read_text()) == r  # --save writes the same document
    return r


@pytest.mark.slow  # the module's bench run: ~3 s
def test_bench_json_structure(result):
    """Every candidate has a row, in order, with 2 timed rounds, positive medians and an IQR around them."""
    assert result["preset"] == "tiny" and result["steps"] == 2 and result["tokens_per_step"] == 2 * 16
    assert result["reference"] == "baseline"
    assert [row["name"] for row in result["train"]] == CANDIDATES
    for row in result["train"]:
        assert len(row["times_s"]) == 2 and all(t > 0 for t in row["times_s"])
        assert row["q25_s"] <= row["median_s"] <= row["q75_s"]
        assert row["tokens_per_s"] == pytest.approx(result["tokens_per_step"] / row["median_s"])
        assert row["ratio_q25"] <= row["ratio"] <= row["ratio_q75"]
    assert result["train"][0]["ratio"] == 1.0  # the reference against itself, round by round
    assert len(result["loadavg_start"]) == 3


@pytest.mark.slow  # the module's bench run
def test_bench_targets_are_reported_for_the_right_candidates(result):
    """Strategies get step/memory targets (1.02 foldable, 1.05 unified); hf-llama gets baseline ≤ 1.0× it."""
    rows = {row["name"]: row for row in result["train"]}
    assert rows["baseline"]["targets"] == {}
    assert rows["unified_foldable"]["targets"]["step"]["limit"] == 1.02
    assert rows["unified"]["targets"]["step"]["limit"] == 1.05
    assert rows["unified"]["targets"]["memory"]["limit"] == 1.01
    hf = rows["hf-llama"]["targets"]["baseline_vs_hf"]
    assert hf["limit"] == 1.0 and isinstance(hf["met"], bool)


@pytest.mark.slow  # the module's bench run
def test_bench_candidates_do_equal_work(result):
    """Same matrices, same batch: every foldable strategy and hf-llama start from the baseline's loss."""
    rows = {row["name"]: row for row in result["train"]}
    for name in ("unified_foldable", "hf-llama"):
        assert rows[name]["loss_init"] == pytest.approx(rows["baseline"]["loss_init"], rel=1e-5)
    assert rows["hf-llama"]["params"] == rows["baseline"]["params"]


@pytest.mark.slow  # the module's bench run
def test_bench_memory_accounting(result):
    """Peak = persistent state + the step's peak; the state holds at least params + AdamW's two moments."""
    for row in result["train"]:
        assert row["mem_peak_bytes"] == row["mem_state_bytes"] + row["mem_step_bytes"]
        assert row["mem_step_bytes"] > 0
        assert row["mem_state_bytes"] >= 3 * 4 * row["params"]


@pytest.mark.slow  # the module's bench run
def test_bench_inference_folded_models_are_plain_llamas(result):
    """Folded foldable strategies have exactly a plain Llama's parameter count; DNP (unified) is not folded."""
    inf = result["inference"]
    rows = {row["name"]: row for row in inf["rows"]}
    assert set(rows) == {*CANDIDATES, "baseline+folded", "unified_foldable+folded"}
    plain = count_params(build_model(get_preset("tiny"), ScaleConfig.preset("none"), device="meta"))["params"]
    assert inf["plain_llama_params"] == plain
    assert inf["hf_llama_params"] == rows["hf-llama"]["params"]  # transformers counts the norm weights too
    for name in ("baseline+folded", "unified_foldable+folded"):
        assert rows[name]["params"] == plain
        assert rows[name]["targets"]["params"]["met"] is True
        assert isinstance(rows[name]["targets"]["forward"]["met"], bool)


@pytest.mark.slow  # a real training step per strategy
def test_step_peak_bytes_sees_the_activations():
    """The CPU memory probe grows with the batch: 4× the tokens allocate more than 2× the step memory."""
    cfg = get_preset("tiny")
    peaks = []
    for batch in (2, 8):
        data = torch.randint(0, cfg.vocab_size, (batch, 33), generator=torch.Generator().manual_seed(0))
        c = make_candidate("baseline", cfg, data[:, :-1], data[:, 1:], torch.device("cpu"), nullcontext(), False, 0,
                           OptimConfig())
        c.step()  # creates the optimizer state
        assert state_bytes(c) >= 3 * 4 * c.params
        peaks.append(step_peak_bytes(c, torch.device("cpu")))
    assert peaks[1] > 2 * peaks[0] > 0


def test_parse_candidates_rejects_unknown_and_duplicates():
    """Unknown names, bad apply modes and duplicates are user errors naming the choices."""
    assert parse_candidates("baseline, unified:activation,hf-llama") == ["baseline", "unified:activation", "hf-llama"]
    for bad in ("baseline,nope", "baseline:sideways", "baseline,baseline", " , "):
        with pytest.raises(ValueError):
            parse_candidates(bad)


def test_bench_cli_user_error_exits_2(capsys):
    """An unknown strategy exits with code 2 and a one-line message naming the problem."""
    assert main(["bench", "--preset", "tiny", "--strategies", "baseline,bogus", "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bogus" in err[0]


@pytest.mark.parametrize("argv, words", [
    (["--batch-size", "0"], "--batch-size 0 / --seq-len 128"),
    (["--seq-len", "0"], "--batch-size 16 / --seq-len 0"),
    (["--steps", "0"], "--steps 0 / --warmup 3"),
    (["--generate", "--steps", "0"], "--steps 0: use 1 or more"),
    (["--generate", "--threads", "0"], "--threads 0: use 1 or more"),
    (["--generate", "--device", "cuda"], "--generate times greedy generation on CPU and does not use --device"),
    (["--generate", "--compile", "--batch-size", "4"], "does not use --batch-size, --compile; drop them"),
])
def test_bench_zero_is_refused_not_read_as_the_default(argv, words, capsys):
    """A 0 asked for (batch, sequence length, rounds, threads), or a flag --generate does not read, is refused in one
    line with exit 2, never replaced by the default or ignored and benchmarked."""
    assert main(["bench", "--preset", "tiny", "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_bench_refuses_a_dangling_link_above_save(tmp_path, capsys, monkeypatch):
    """--save below a symbolic link that leads nowhere was open()'s bare '[Errno 2] No such file or directory',
    after the whole benchmark: one line (exit 2) naming the link, where it leads and the fix, before the benchmark
    runs; nothing is created."""
    from scalevec.bench import command

    ran = []
    monkeypatch.setattr(command, "bench", lambda *a, **k: ran.append(1) or {})
    link = tmp_path / "dang"
    os.symlink(tmp_path / "nowhere", link)
    save = link / "sub" / "bench.json"
    assert main(["bench", "--preset", "tiny", "--device", "cpu", "--save", str(save)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"scalevec bench: error: --save {save}: {link} is a symbolic link that leads nowhere (to "
                   f"{os.path.realpath(tmp_path / 'nowhere')}); remove it or choose another --save")
    assert "Errno" not in err and not ran and [p.name for p in tmp_path.iterdir()] == ["dang"]


def test_bench_save_creates_missing_folders_and_refuses_a_folder_before_the_run(tmp_path, capsys, monkeypatch):
    """--save missing/dir/b.json was open()'s bare '[Errno 2]' after the whole benchmark: the missing folders are
    created, as every --out's are. --save at an existing folder was '[Errno 21] Is a directory', also after the
    benchmark: one line (exit 2) naming the folder and the fix, before the benchmark runs; nothing is created."""
    from scalevec.bench import command

    ran = []
    monkeypatch.setattr(command, "bench", lambda *a, **k: ran.append(1) or {"candidates": []})
    save = tmp_path / "missing" / "dir" / "b.json"
    assert main(["bench", "--preset", "tiny", "--device", "cpu", "--json", "--save", str(save)]) == 0
    assert ran == [1] and json.loads(save.read_text()) == {"candidates": []}
    capsys.readouterr()
    folder = tmp_path / "missing"
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    assert main(["bench", "--preset", "tiny", "--device", "cpu", "--save", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"scalevec bench: error: --save {folder} is a folder; give the path of a file to write, e.g. "
                   f"{folder / 'bench.json'}")
    assert "Errno" not in err and ran == [1] and sorted(str(p) for p in tmp_path.rglob("*")) == before
