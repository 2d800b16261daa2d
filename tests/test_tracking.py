"""Trackers: TensorBoard and Weights & Biases mirror metrics.jsonl; a missing package is a clear error."""

import json
import math
import sys

import pytest

from scalevec.cli import main
from scalevec.resolve import resolve_config
from scalevec.training import tracking
from scalevec.training.trainer import train


def tiny_run(tmp_path, steps=6, **over):
    items = {"train.steps": steps, "train.batch_size": 2, "train.seq_len": 16, "train.eval_every": 3,
             "train.log_every": 1, "train.eval_batch_size": 8, "data.val_tokens": 512,
             "data.cache_dir": str(tmp_path / "cache"), **over}
    return resolve_config("tiny", "unified", [f"{k}={v}" for k, v in items.items()])


def rows(run):
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]


def test_flatten_row_forwards_every_number_and_a_scale_summary():
    """Numeric fields become <kind>/<field> (mfu included, whatever the row holds); scales are summarized."""
    row = {"kind": "train", "step": 4, "loss": 2.5, "lr": 1e-3, "grad_norm": 0.7, "tok_per_s": 900.0, "mfu": 0.12,
           "flag": True, "bad": math.nan, "moe": {"x": 1},
           "scales": {"a": {"mean": 1.0, "std": 0.1, "min": 0.5, "max": 2.0},
                      "b": {"mean": 3.0, "std": 0.3, "min": 0.2, "max": 4.0}}}
    assert tracking.flatten_row(row) == {
        "train/loss": 2.5, "train/lr": 1e-3, "train/grad_norm": 0.7, "train/tok_per_s": 900.0, "train/mfu": 0.12,
        "scales/mean": 2.0, "scales/std": pytest.approx(0.2), "scales/min": 0.2, "scales/max": 4.0,
        # one series per vector and stat, grouped by role (a vector without a role: "scale")
        "scales.scale/min/a": 0.5, "scales.scale/max/a": 2.0, "scales.scale/min/b": 0.2, "scales.scale/max/b": 4.0}
    assert tracking.flatten_row({"kind": "eval", "step": 3, "val_loss": 2.0, "val_bpb": 2.9}) == {
        "eval/val_loss": 2.0, "eval/val_bpb": 2.9}


@pytest.mark.slow  # trains and resumes
def test_tensorboard_holds_the_metrics_rows_across_resume(tmp_path):
    """TensorBoard scalars equal metrics.jsonl, step by step, after 3 steps + resume + 3 (no stale points)."""
    import tensorboard  # noqa: F401  (a dev dependency: a missing one fails, never skips)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    cfg = tiny_run(tmp_path, **{"train.tracker": "tensorboard"})
    train(cfg, run, stop_at=3, quiet=True)
    train(cfg, run, resume=True, quiet=True)
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    metrics = rows(run)
    for tag, kind, key in (("train/loss", "train", "loss"), ("train/lr", "train", "lr"),
                           ("eval/val_loss", "eval", "val_loss")):
        got = {e.step: e.value for e in acc.Scalars(tag)}
        want = {r["step"]: r[key] for r in metrics if r["kind"] == kind}
        assert sorted(got) == sorted(want) and len(want) >= 2
        for step, value in want.items():
            assert got[step] == pytest.approx(value, rel=1e-6)  # stored as float32 by TensorBoard
    assert "scales/max" in acc.Tags()["scalars"]


class FakeWandb:
    """Records what the trainer calls on the wandb module (the real package needs a service process)."""

    def __init__(self):
        self.inits, self.logged, self.finished = [], [], 0

    def init(self, **kwargs):
        self.inits.append(kwargs)
        fake = self

        class Run:
            def log(self, data, step):
                fake.logged.append((step, data))

            def finish(self):
                fake.finished += 1

        return Run()


@pytest.mark.slow  # trains and resumes
def test_wandb_logs_the_rows_and_resumes_the_same_run(tmp_path, monkeypatch):
    """wandb.init gets the config and a run id kept for --resume; every row is logged at its step; finish is called."""
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setenv("WANDB_PROJECT", "proj")
    run = tmp_path / "run"
    cfg = tiny_run(tmp_path, steps=4, **{"train.tracker": "wandb"})
    train(cfg, run, stop_at=2, quiet=True)
    train(cfg, run, resume=True, quiet=True)
    assert len(fake.inits) == 2 and fake.finished == 2
    assert fake.inits[0]["id"] == fake.inits[1]["id"] == (run / "wandb_id").read_text().strip()
    assert fake.inits[0]["project"] == "proj" and fake.inits[0]["config"]["train"]["tracker"] == "wandb"
    assert fake.inits[0]["dir"] == str(run)
    expected = [(r["step"], tracking.flatten_row(r)) for r in rows(run)]
    assert fake.logged == expected


def wandb_history(run_dir) -> dict[int, dict]:
    """``{step: logged values}`` read back from the offline run files under ``run_dir/wandb`` (every
    ``offline-run-*/run-ID.wandb``, oldest first: a resumed run writes a second one, and a step logged in both,
    the checkpoint's, holds the union). wandb 0.31 has no Python reader of its
    transaction log, so this one follows its format: a 7-byte header (``:W&B``, magic, version), then
    LevelDB-log records in 32 KiB blocks (crc32c 4 bytes, length 2, type 1: full, or first/middle/last parts),
    each a ``wandb_internal_pb2.Record``; a history record holds ``key``/``value_json`` items and the step."""
    import struct

    from wandb.proto import wandb_internal_pb2

    block, out = 32768, {}
    for path in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        data = path.read_bytes()
        assert data[:4] == b":W&B"
        pos, part = 7, b""
        while pos + 7 <= len(data):
            if block - pos % block < 7:  # a block's tail too short for a header is padding
                pos += block - pos % block
                continue
            _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
            part, pos = part + data[pos + 7:pos + 7 + length], pos + 7 + length
            if kind in (1, 4):  # a full record, or the last part of one
                record = wandb_internal_pb2.Record()
                record.ParseFromString(part)
                part = b""
                if record.WhichOneof("record_type") == "history":
                    items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                    out.setdefault(record.history.step.num, {}).update(
                        {k: v for k, v in items.items() if not k.startswith("_")})  # _runtime, _timestamp: wandb's
    return out


@pytest.mark.slow  # trains and resumes with the real wandb (a service process, offline)
def test_wandb_offline_run_holds_the_metrics_rows(tmp_path, monkeypatch):
    """With the real wandb in offline mode, the values read back from the run files equal metrics.jsonl's rows,
    step by step (a row's train/eval/probe values are merged at its step), across a resume."""
    import wandb  # a dev dependency: a missing one fails, never skips

    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    cfg = tiny_run(tmp_path, **{"train.tracker": "wandb"})
    train(cfg, run, stop_at=3, quiet=True)
    train(cfg, run, resume=True, quiet=True)
    wandb.teardown()  # run.finish() returns before the service has written the last run's file to the end
    want: dict[int, dict] = {}
    for r in rows(run):
        want.setdefault(r["step"], {}).update(tracking.flatten_row(r))
    got = wandb_history(run)
    assert sorted(got) == sorted(want) == list(range(7))  # steps 0-5 trained, 3 and 6 evaluated
    for step, values in want.items():
        assert got[step] == pytest.approx(values, rel=1e-12), step  # JSON round trip of float64: exact
    assert len(list((run / "wandb").glob("offline-run-*"))) == 2  # the resume continued the same id
    assert all(p.name.endswith((run / "wandb_id").read_text().strip()) for p in (run / "wandb").glob("offline-run-*"))


def test_missing_tracker_package_fails_before_writing(tmp_path, monkeypatch, capsys):
    """--tracker wandb without wandb installed: one-line error naming pip install, exit 2, no run directory."""
    monkeypatch.setitem(sys.modules, "wandb", None)
    out = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--steps", "2", "--tracker", "wandb", "--out", str(out),
                 f"data.cache_dir={tmp_path / 'cache'}"]) == 2
    assert "pip install wandb" in capsys.readouterr().err and not out.exists()
    with pytest.raises(ValueError, match="train.tracker='mlflow' is unknown"):
        tiny_run(tmp_path, **{"train.tracker": "mlflow"})


@pytest.mark.slow  # trains and resumes
def test_resume_may_switch_the_tracker_on(tmp_path, monkeypatch):
    """train.tracker is an execution field: `--resume --tracker wandb` continues a run begun without one."""
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    run = tmp_path / "run"
    train(tiny_run(tmp_path, steps=4), run, stop_at=2, quiet=True)
    assert main(["train", "--resume", "--out", str(run), "--tracker", "wandb", "--quiet"]) == 0
    assert [s for s, _ in fake.logged] == [r["step"] for r in rows(run) if r["step"] >= 2]
