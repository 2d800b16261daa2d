"""A run's numbers depend only on its config, seed, CPU type and thread count.

The same `tiny` run is trained in-process, by `scalevec train --config` in a subprocess, and by a
sweep's subprocess, with a freshly built and a warm token cache, and next to busy-loop processes;
every per-step loss must be bitwise equal. The cause of the difference first measured (compare
vs train on one machine) was how many threads each used: torch's default counts physical cores,
a sweep set ``OMP_NUM_THREADS`` to the CPU count; the thread count is now an explicit config field.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from scalevec.config.codec import to_dict
from scalevec.config.run_budget import usable_cpus
from scalevec.experiments.sweep import assigned_config, run_sweep, spec_from_dict
from scalevec.training.trainer import train

BASE = {"preset": "tiny", "strategy": "unified", "train.steps": 8, "train.batch_size": 4, "train.seq_len": 32,
        "train.log_every": 1, "train.eval_every": 8, "schedule.warmup": 2, "data.val_tokens": 2048}
CLI = [sys.executable, "-m", "scalevec"]


def _losses(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r["loss"] for r in rows if r["kind"] == "train"] + [r["val_loss"] for r in rows if r["kind"] == "eval"]


def _busy(stop) -> None:
    while not stop.is_set():
        pass


@pytest.mark.slow  # reproducibility: the same run started three ways
def test_same_numbers_however_the_run_is_started(tmp_path):
    """In-process, CLI subprocess and sweep subprocess; fresh and warm cache; idle and loaded: bitwise equal."""
    fresh, warm = tmp_path / "cache-a", tmp_path / "cache-b"
    cfg = assigned_config({**BASE, "train.threads": 1, "data.cache_dir": str(fresh)})
    train(cfg, tmp_path / "inproc", quiet=True)  # builds cache-a
    reference = _losses(tmp_path / "inproc")
    assert len(reference) == 9

    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))  # cache-a, now warm
    subprocess.run([*CLI, "train", "--config", str(cfg_file), "--out", str(tmp_path / "cli"), "--quiet"], check=True)
    assert _losses(tmp_path / "cli") == reference

    spec = spec_from_dict({"name": "r", "base": {**BASE, "train.threads": 1, "data.cache_dir": str(warm)},
                           "grid": {"seed": [0]}})  # cache-b: built fresh by the sweep's trainer
    assert run_sweep(spec, tmp_path / "sweep", report=False, quiet=True) == 0
    assert _losses(tmp_path / "sweep" / "runs" / "s0") == reference

    stop = mp.Event()
    loaders = [mp.Process(target=_busy, args=(stop,)) for _ in range(2)]
    for p in loaders:
        p.start()
    try:  # two busy loops on a 2-core machine: the trainer's threads are preempted, the sums are not reordered
        subprocess.run([*CLI, "train", "--config", str(cfg_file), "--out", str(tmp_path / "loaded"), "--quiet"],
                       check=True)
    finally:
        stop.set()
        for p in loaders:
            p.join()
    assert _losses(tmp_path / "loaded") == reference


@pytest.mark.slow  # reproducibility: the same run started three ways
def test_thread_count_is_explicit_and_recorded(tmp_path):
    """`scalevec train` without --threads uses every usable CPU and says so in config.yaml and meta.json;
    a sweep gives each of its --jobs an equal share."""
    out = tmp_path / "cli"
    subprocess.run([*CLI, "train", "--preset", "tiny", "--steps", "2", "--batch-size", "2", "--seq-len", "16",
                    "--out", str(out), "--quiet", "data.val_tokens=512", f"data.cache_dir={tmp_path / 'c'}"],
                   check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})  # an inherited setting does not decide
    stored = yaml.safe_load((out / "config.yaml").read_text())
    assert stored["train"]["threads"] == usable_cpus()
    assert json.loads((out / "meta.json").read_text())["threads"] == usable_cpus()

    spec = spec_from_dict({"name": "j", "base": {**BASE, "train.steps": 2, "data.cache_dir": str(tmp_path / "c")},
                           "grid": {"seed": [0, 1]}})
    assert run_sweep(spec, tmp_path / "sweep", jobs=2, report=False, quiet=True) == 0
    for name in ("s0", "s1"):
        got = yaml.safe_load((tmp_path / "sweep" / "runs" / name / "config.yaml").read_text())["train"]["threads"]
        assert got == max(1, usable_cpus() // 2)
    # rerunning with another --jobs is allowed: the thread count is how a run executes, not what it is
    assert run_sweep(spec, tmp_path / "sweep", jobs=1, report=False, quiet=True) == 0


@pytest.mark.slow  # trains (and tokenizes a fresh cache): ~5 s
def test_train_threads_apply_to_the_run_only(tmp_path):
    """train() with train.threads=2 leaves the caller's thread count as it was (tests run with 1)."""
    import torch

    before = torch.get_num_threads()
    cfg = assigned_config({**BASE, "train.steps": 2, "train.threads": before + 1,
                           "data.cache_dir": str(tmp_path / "c")})
    train(cfg, tmp_path / "run", quiet=True)
    assert json.loads((tmp_path / "run" / "meta.json").read_text())["threads"] == before + 1
    assert torch.get_num_threads() == before
