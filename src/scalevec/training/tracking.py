"""Experiment trackers: TensorBoard or Weights & Biases mirrors of ``metrics.jsonl`` (DESIGN.md §8).

``train.tracker`` (``--tracker``) is ``none`` (default), ``tensorboard`` or ``wandb``; both are optional
dependencies (``pip install tensorboard`` / ``pip install wandb``). ``metrics.jsonl`` stays the record
that ``report`` reads; a tracker only forwards each row as it is written, flattened by ``flatten_row``:
every numeric top-level field as ``<kind>/<field>`` (``train/loss``, ``train/lr``, ``train/grad_norm``,
``train/tok_per_s``, ``train/mfu`` when the row holds it, ``eval/val_loss``, ``eval/val_bpb``,
``probe/sharpness``, ...) plus a summary of the scale vectors (``scales/mean`` of their means,
``scales/std`` of their stds, ``scales/min``, ``scales/max``), at the row's ``step``. Each scale vector is also
a series of its own, grouped by its role so that a dashboard keeps one section per role:
``scales.<role>/<stat>/<vector>`` for the stats ``rms``, ``min``, ``max``, ``grad_norm``, ``update_norm``
(``scales.input_scale/rms/layers.0.attn.proj.branches.q.in_scale``; TensorBoard and W&B both group panels by
the part before the first ``/``), and each layer's matrix gradient norm as ``grad_norm.layers/<layer>``
(``telemetry.ScaleTelemetry`` makes both).

TensorBoard events go to ``RUN/tensorboard/``; a resumed run purges the events past its checkpoint
(``SummaryWriter(purge_step=...)``), as ``metrics.jsonl`` drops those rows (the eval rows at the
checkpoint's own step are written again). Weights & Biases logs into
``RUN/wandb/`` under a run id kept in ``RUN/wandb_id`` so that ``--resume`` continues the same W&B
run; set ``WANDB_MODE=offline`` to log without a network, ``WANDB_PROJECT`` to pick the project
(default ``scalevec``). Only rank 0 tracks.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from scalevec.config.typed import is_number
from scalevec.outpath import read_regular
from scalevec.training import rundir

TRACKERS = ("none", "tensorboard", "wandb")
VECTOR_SERIES = ("rms", "min", "max", "grad_norm", "update_norm")  # per scale vector, its own series


def flatten_row(row: dict) -> dict[str, float]:
    """The scalars of one metrics row: ``{"<kind>/<field>": value}``, the scale-vector summary, one series per
    scale vector and stat (``scales.<role>/<stat>/<vector>``) and per layer (``grad_norm.layers/<layer>``).

    Non-numeric, boolean and non-finite values are skipped; ``step`` and ``kind`` name the point.
    """
    kind = row.get("kind", "train")
    out: dict[str, float] = {}
    for key, value in row.items():
        if key not in ("kind", "step") and is_number(value):
            out[f"{kind}/{key}"] = float(value)
    scales = row.get("scales")
    if isinstance(scales, dict) and scales:
        stats = list(scales.values())
        out["scales/mean"] = sum(s["mean"] for s in stats) / len(stats)
        out["scales/std"] = sum(s["std"] for s in stats) / len(stats)
        out["scales/min"] = min(s["min"] for s in stats)
        out["scales/max"] = max(s["max"] for s in stats)
        for name, s in scales.items():
            role = s.get("role", "scale")
            for stat in VECTOR_SERIES:
                value = s.get(stat)
                if is_number(value):
                    out[f"scales.{role}/{stat}/{name}"] = float(value)
    layers = row.get("grad_norms")
    if isinstance(layers, dict):
        for name, value in layers.items():
            if is_number(value):
                out[f"grad_norm.layers/{name}"] = float(value)
    return out


def check(name: str) -> None:
    """Raise ``ValueError`` naming the fix if tracker ``name`` is unknown or its package is missing
    (called before the run directory is written)."""
    if name not in TRACKERS:
        raise ValueError(f"train.tracker={name!r} is unknown; use {', '.join(TRACKERS)}")
    if name == "tensorboard":
        _summary_writer()
    elif name == "wandb":
        _wandb()


def _summary_writer():
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # torch.utils.tensorboard imports the tensorboard package
        raise ValueError("--tracker tensorboard needs the tensorboard package; pip install tensorboard "
                         "(or use --tracker none)") from None
    return SummaryWriter


def _wandb():
    try:
        import wandb
    except ImportError:
        raise ValueError("--tracker wandb needs the wandb package; pip install wandb (or use --tracker none)") from None
    return wandb


class Tracker:
    """No tracking (``none``): the interface the trainer calls."""

    def log(self, row: dict) -> None:
        """Forward one metrics row (``kind``, ``step`` and its fields)."""

    def close(self) -> None:
        """Flush and finish; safe to call twice."""


class TensorBoardTracker(Tracker):
    """Scalars into ``run_dir/tensorboard`` with ``torch.utils.tensorboard.SummaryWriter``."""

    def __init__(self, run_dir: Path, config: dict, purge_step: int | None = None):
        SummaryWriter = _summary_writer()
        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / rundir.TENSORBOARD), purge_step=purge_step)
        if not purge_step:
            import yaml

            self.writer.add_text("config", "```\n" + yaml.safe_dump(config, sort_keys=False) + "```", 0)
            return
        # the purge removes every event at step >= purge_step, also the eval/probe rows at exactly that
        # step, which metrics.jsonl keeps (they belong to the checkpoint): write them again (the trainer has
        # cut metrics.jsonl back to its checkpoint before, so reading it finds no damage)
        for row in rundir.read_metrics(run_dir):
            if row["step"] == purge_step and row["kind"] != "train":
                self.log(row)

    def log(self, row: dict) -> None:
        step = int(row.get("step", 0))
        for tag, value in flatten_row(row).items():
            self.writer.add_scalar(tag, value, step)
        if row.get("kind") != "train":
            self.writer.flush()  # eval rows are rare and the ones a reader waits for

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class WandbTracker(Tracker):
    """A Weights & Biases run in ``run_dir/wandb``; its id is kept in ``run_dir/wandb_id`` for ``--resume``."""

    def __init__(self, run_dir: Path, config: dict, resume: bool = False):
        wandb = _wandb()
        run_dir = Path(run_dir)
        id_file = run_dir / rundir.WANDB_ID
        kept = read_regular(id_file).decode().strip() if resume and id_file.is_file() else ""
        run_id = kept or uuid.uuid4().hex[:12]
        rundir.write_atomic(id_file, run_id + "\n")
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "scalevec"), name=run_dir.name, id=run_id,
                              resume="allow", dir=str(run_dir), config=config)

    def log(self, row: dict) -> None:
        self.run.log(flatten_row(row), step=int(row.get("step", 0)))

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


def open_tracker(name: str, run_dir: str | Path, config: dict, start_step: int = 0) -> Tracker:
    """The tracker ``name`` for ``run_dir``; ``start_step > 0`` for a resumed run. ``config`` is the run's
    config as a dict (stored by both trackers). Raises ``ValueError`` as ``check`` does."""
    check(name)
    if name == "tensorboard":
        return TensorBoardTracker(Path(run_dir), config, purge_step=start_step or None)
    if name == "wandb":
        return WandbTracker(Path(run_dir), config, resume=start_step > 0)
    return Tracker()


__all__ = ["TRACKERS", "VECTOR_SERIES", "TensorBoardTracker", "Tracker", "WandbTracker", "check", "flatten_row",
           "open_tracker"]
