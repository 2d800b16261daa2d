"""``scalevec plot RUN`` and report's γ trajectories: rms(γ) per scale vector over steps, a panel per
role."""

from __future__ import annotations

import json
import math
import os

import pytest

import fakerun
from scalevec.cli import main
from scalevec.config.codec import to_dict
from scalevec.experiments.gamma_plot import layer_of, plot_runs, trajectories
from scalevec.resolve import resolve_config


def rows():
    """Three logged steps of two layers' q-branch γ (input_scale) and a QK-norm γ (output_scale), plus an eval row."""
    out = []
    for step in (0, 10, 20):
        out.append({"kind": "train", "step": step, "scales": {
            "layers.0.attn.proj.branches.q.in_scale": {"role": "input_scale", "rms": 1.0 + step / 100},
            "layers.1.attn.proj.branches.q.in_scale": {"role": "input_scale", "rms": 1.0 - step / 100},
            "layers.0.attn.q_norm.scale": {"role": "output_scale", "rms": 2.0},
            "head.scale": {"mean": 0.6, "std": 0.8, "min": 0.0, "max": 1.0}}})  # an older row: rms from mean, std
        out.append({"kind": "eval", "step": step, "val_loss": 3.0})
    return out


def test_trajectories_are_rms_per_vector_by_role():
    t = trajectories(rows())
    assert set(t) == {"input_scale", "output_scale"}
    assert t["input_scale"]["layers.1.attn.proj.branches.q.in_scale"] == ([0, 10, 20], [1.0, 0.9, 0.8])
    assert t["input_scale"]["head.scale"][1] == [pytest.approx(math.hypot(0.6, 0.8))] * 3  # sqrt(mean² + std²)
    assert t["output_scale"]["layers.0.attn.q_norm.scale"] == ([0, 10, 20], [2.0, 2.0, 2.0])
    assert layer_of("model.layers.12.self_attn.q_proj.in_scale") == 12 and layer_of("head.scale") is None


def test_plot_runs_draws_a_row_per_run_and_says_when_there_is_nothing(tmp_path):
    assert plot_runs([("baseline", rows()), ("unified", rows())], tmp_path / "g.png")
    assert (tmp_path / "g.png").stat().st_size > 5000
    assert not plot_runs([("none", [{"kind": "train", "step": 0, "scales": {}}])], tmp_path / "n.png")
    assert not (tmp_path / "n.png").exists()


def test_plot_command_and_report(tmp_path, capsys):
    """``scalevec plot RUN`` writes RUN/gamma_trajectories.png and says what it drew; a folder that is not a run is
    one line, exit 2; ``report`` adds the figure per strategy of the cell."""
    runs = tmp_path / "sweep"
    for strategy in ("baseline", "unified"):
        cfg = to_dict(resolve_config("tiny", strategy, ["train.steps=50", f"train.seed={0}"]))
        fakerun.write_run(runs / f"{strategy}_s0", cfg)
    run = runs / "unified_s0"
    assert main(["plot", str(run)]) == 0
    out = capsys.readouterr().out
    assert (run / "gamma_trajectories.png").stat().st_size > 5000
    assert "plot: " in out and "input_scale: 1 vectors" in out and "5 logged steps" in out
    assert main(["plot", str(tmp_path)]) == 2
    assert "is not a scalevec run directory" in capsys.readouterr().err
    for bad in (tmp_path / "figure", tmp_path):  # matplotlib would write figure.png while we said "figure"
        assert main(["plot", str(run), "--out", str(bad)]) == 2
        assert "is not a figure file" in capsys.readouterr().err
    assert not (tmp_path / "figure.png").exists()
    assert main(["plot", str(run), "--out", str(tmp_path / "g.svg")]) == 0 and (tmp_path / "g.svg").is_file()
    capsys.readouterr()
    from scalevec.experiments.report import write_report

    write_report(runs, quiet=True)
    assert (runs / "gamma_trajectories.png").is_file()
    assert "![gamma_trajectories.png](gamma_trajectories.png)" in (runs / "report.md").read_text()
    assert json.loads((run / "summary.json").read_text())["strategy"] == "unified"


def test_plot_refuses_a_dangling_link_above_out(tmp_path, capsys):
    """--out below a symbolic link that leads nowhere was savefig's bare '[Errno 2] No such file or directory',
    after the drawing: one line (exit 2) naming the link, where it leads and the fix; nothing is created."""
    run = tmp_path / "run"
    fakerun.write_run(run, to_dict(resolve_config("tiny", "unified", ["train.steps=50"])))
    link = tmp_path / "dang"
    os.symlink(tmp_path / "nowhere", link)
    out = link / "sub" / "g.png"
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    assert main(["plot", str(run), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"scalevec plot: error: --out {out}: {link} is a symbolic link that leads nowhere (to "
                   f"{os.path.realpath(tmp_path / 'nowhere')}); remove it or choose another --out")
    assert "Errno" not in err and sorted(str(p) for p in tmp_path.rglob("*")) == before and link.is_symlink()


def test_plot_creates_missing_folders_of_out_and_refuses_a_folder_before_drawing(tmp_path, capsys, monkeypatch):
    """--out missing/dir/g.png was savefig's bare '[Errno 2] No such file or directory' after the drawing: the
    missing folders are created, as every --out's are (nothing to draw creates none). An existing folder as --out
    (even one named like a figure) is one line (exit 2) before anything is drawn; nothing is created."""
    from scalevec.experiments import gamma_plot

    run = tmp_path / "run"
    fakerun.write_run(run, to_dict(resolve_config("tiny", "unified", ["train.steps=50"])))
    out = tmp_path / "missing" / "dir" / "g.png"
    assert main(["plot", str(run), "--out", str(out)]) == 0
    assert out.stat().st_size > 5000 and f"plot: {out}" in capsys.readouterr().out
    assert not plot_runs([("none", [{"kind": "train", "step": 0, "scales": {}}])], tmp_path / "new" / "n.png")
    assert not (tmp_path / "new").exists()
    monkeypatch.setattr(gamma_plot, "plot_runs", lambda *a, **k: pytest.fail("the figure was drawn"))
    folder = tmp_path / "figs.png"
    folder.mkdir()
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    assert main(["plot", str(run), "--out", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--out {folder} is not a figure file" in err and "Errno" not in err
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_plot_replaces_a_link_at_out_instead_of_writing_through_it(tmp_path):
    """A symbolic or hard link at the figure's path is replaced by the new figure as a name (outpath's link rule):
    the user's file it named keeps its bytes; the figure is a regular PNG (``.svg``: an SVG, the suffix's format)."""
    victim = tmp_path / "notes.txt"
    victim.write_text("precious")
    (tmp_path / "sym.png").symlink_to(victim)
    os.link(victim, tmp_path / "hard.png")
    for name in ("sym.png", "hard.png", "g.svg"):
        assert plot_runs([("unified", rows())], tmp_path / name)
        out = tmp_path / name
        assert not out.is_symlink() and out.stat().st_nlink == 1
    assert victim.read_text() == "precious"
    assert (tmp_path / "sym.png").read_bytes().startswith(b"\x89PNG")
    assert b"<svg" in (tmp_path / "g.svg").read_bytes()[:2000]
