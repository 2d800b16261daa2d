"""The trainer's parts (issue 37, DESIGN.md §8): monitors as callbacks, the health guard's own state, checkpoints
by default and the resume header (issue 38), the peak-memory field of the metrics rows on CUDA (issue 34)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import torch

from scalevec import build_model
from scalevec.config import RunConfig
from scalevec.resolve import resolve_config
from scalevec.training import monitors
from scalevec.training import trainer as train_mod
from scalevec.training.checkpoint import layout
from scalevec.training.health import HealthGuard
from scalevec.training.monitors import Monitor, StepEvent
from scalevec.training.telemetry import ScaleTelemetry
from scalevec.training.trainer import Trainer, train


def tiny_run(tmp_path, steps=6, **over):
    """A seconds-long config: tiny preset, bundled Shakespeare as bytes, small validation set."""
    items = {"train.steps": steps, "train.batch_size": 4, "train.seq_len": 32, "train.eval_every": 3,
             "train.log_every": 2, "train.eval_batch_size": 8, "data.val_tokens": 512,
             "data.cache_dir": str(tmp_path / "cache"), **over}
    return resolve_config("tiny", "unified", [f"{k}={v}" for k, v in items.items()])


def rows(run, kind):
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


def test_a_new_monitor_is_one_class(tmp_path, monkeypatch):
    """A monitor added to ``MONITORS`` sees every step, every evaluation, every row and one close with the wall
    time; the run's numbers do not change."""

    class Seen(Monitor):
        events: dict = {"steps": [], "evals": [], "rows": [], "walls": []}

        def after_step(self, ev):
            self.events["steps"].append(ev.step)

        def after_eval(self, ev):
            self.events["evals"].append(ev.step)

        def on_row(self, row):
            self.events["rows"].append(row["kind"])

        def close(self, wall):
            self.events["walls"].append(wall)

    plain = train(tiny_run(tmp_path), tmp_path / "plain", quiet=True)
    monkeypatch.setattr(monitors, "MONITORS", (*monitors.MONITORS, Seen))
    watched = train(tiny_run(tmp_path), tmp_path / "watched", quiet=True)
    seen = Seen.events
    assert seen["steps"] == list(range(6)) and seen["evals"] == [3, 6]
    assert seen["rows"].count("train") == 4 and seen["rows"].count("eval") == 2
    assert seen["walls"][0] > 0 and set(seen["walls"][1:]) <= {None}
    assert [r["loss"] for r in rows(tmp_path / "plain", "train")] == [r["loss"] for r in rows(tmp_path / "watched",
                                                                                              "train")]
    assert plain["final_val_loss"] == watched["final_val_loss"]


def test_health_guard_state_round_trips():
    """The guard's state survives ``state_dict`` -> JSON -> ``load_state_dict``; a step-0 checkpoint is a fresh
    start (the reference is the first loss again)."""
    cfg = RunConfig()
    guard = HealthGuard(cfg, "unused", write=False)
    for step, loss in enumerate([5.6, 5.2, 4.9]):
        guard.check_step(step, [loss, 0.0, 1.0])
    back = HealthGuard(cfg, "unused", write=False)
    back.load_state_dict(json.loads(json.dumps(guard.state_dict())))
    assert back.state_dict() == guard.state_dict() and back.reference == max(5.6, math.log(cfg.model.vocab_size))
    fresh = HealthGuard(cfg, "unused", write=False)
    fresh.load_state_dict(guard.state_dict(), fresh_start=True)
    assert fresh.reference is None


def test_peak_memory_in_rows_on_cuda(monkeypatch):
    """On a CUDA device a train row carries ``max_memory_gib`` (``torch.cuda.max_memory_allocated`` / 2**30);
    on CPU the row has no such field. CUDA is faked: only the allocator counter is read."""
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2 ** 30)
    cfg = resolve_config("tiny", "unified", [])
    logged = []
    for device in ("cuda", "cpu"):
        model = build_model(cfg.model, cfg.scale, seed=0)
        fake = SimpleNamespace(cfg=cfg, device=torch.device(device), flops_per_token=1.0, peak_flops=None,
                               model=model, telemetry=ScaleTelemetry(model), log=logged.append)
        monitors.MetricsRows(fake).after_step(StepEvent(0, 1, 5.0, 0.0, 1.0, 1e-3, 128, 0.5, 0.5, logged=True,
                                                        evaluates=False))
    assert logged[0]["max_memory_gib"] == 3.0 and "max_memory_gib" not in logged[1]


def test_runs_checkpoint_periodically_by_default():
    """``train.ckpt_every`` is on by default (issue 38): a kill loses at most that many steps."""
    assert RunConfig().train.ckpt_every > 0


def test_checkpoint_by_minutes_and_two_kept(tmp_path, monkeypatch):
    """With ``CKPT_MINUTES`` elapsed after every step, each step is checkpointed and pruning keeps the two newest
    (the guard's look-back off); the losses equal a run that checkpoints only at the end."""
    monkeypatch.setattr(train_mod, "CKPT_MINUTES", 0.0)
    cfg = tiny_run(tmp_path, **{"train.ckpt_every": 1000, "train.guard_dead_steps": 0})
    train(cfg, tmp_path / "often", quiet=True)
    assert [p.name for p in layout.checkpoint_dirs(tmp_path / "often")] == ["step_0000006", "step_0000005"]
    monkeypatch.setattr(train_mod, "CKPT_MINUTES", 1e9)
    train(cfg, tmp_path / "once", quiet=True)
    assert [p.name for p in layout.checkpoint_dirs(tmp_path / "once")] == ["step_0000006"]
    assert rows(tmp_path / "often", "train") != [] and (
        [r["loss"] for r in rows(tmp_path / "often", "train")] == [r["loss"] for r in rows(tmp_path / "once", "train")])


def test_resume_says_where_it_continues(tmp_path, capsys):
    """A resumed run prints one line naming the checkpoint and the step it continues from (issue 38)."""
    cfg = tiny_run(tmp_path, **{"train.ckpt_every": 2})
    out = tmp_path / "run"
    assert train(cfg, out, stop_at=3, quiet=True) == {"stopped_at": 3}
    capsys.readouterr()
    trainer = Trainer(cfg, out, resume=True)
    trainer.fit()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"resume: {out} continues from checkpoint {out / 'checkpoints' / 'step_0000003'} (step 3 of 6)"
