"""The trainer's parts (issue 37, DESIGN.md §8): monitors as callbacks, the health guard's own state."""

from __future__ import annotations

import json
import math

from scalevec.config import RunConfig
from scalevec.resolve import resolve_config
from scalevec.training import monitors
from scalevec.training.health import HealthGuard
from scalevec.training.monitors import Monitor
from scalevec.training.trainer import train


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
