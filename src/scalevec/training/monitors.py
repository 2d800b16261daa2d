"""What a run reports while it trains: monitors, called back by the training loop (DESIGN.md §8).

A monitor is one class with up to four hooks: ``after_step(StepEvent)`` after every optimizer step,
``after_eval(EvalEvent)`` after every evaluation, ``on_row(row)`` for every row written to ``metrics.jsonl``
(rank 0) and ``close(wall)`` once at the end (``wall``: the run's training seconds when it finished,
``None`` when it stopped otherwise; closing twice is safe). Every rank calls every hook in the order of
``MONITORS``: a hook that gathers across ranks (``telemetry``'s statistics) must run on each, a hook that
writes checks ``trainer.write`` (rank 0). Adding a monitor is one class here and one line in ``MONITORS``
(OLMo-core's callbacks, without the zoo). Monitors read the trainer and the model and change nothing that
training reads: a run's numbers are the same with any set of monitors.

- ``MetricsRows``: the ``train`` and ``eval`` rows of ``metrics.jsonl`` (loss, lr, gradient norm, speed, MFU,
  per-scale-vector and MoE telemetry from ``telemetry``, and on CUDA the peak memory)
- ``Console``: the progress lines on stdout, or a progress bar on a terminal
- ``Probes``: the theory probes (``train.probe_every``, ``train.sharpness_every``) as ``probe`` rows
- ``Trackers``: TensorBoard / W&B mirrors of the rows (``tracking``)
- ``RunSummary``: ``summary.json``'s figures, read back from ``metrics.jsonl`` when the run finishes
"""

from __future__ import annotations

import math
import os
import statistics
import sys
from dataclasses import dataclass

import torch

from scalevec.config_codec import to_dict
from scalevec.model.params import count_params
from scalevec.run_budget import run_tokens, tokens_per_step
from scalevec.training import rundir, tracking
from scalevec.training.optim import group_table
from scalevec.training.schedule import warmup_warning
from scalevec.training.telemetry import moe_stats

GIB = 2 ** 30


@dataclass
class StepEvent:
    """One optimizer step, as the monitors see it. Figures are over the global batch, on the host."""

    step: int  # the step taken, from 0 (train rows are numbered by it)
    done: int  # steps completed: step + 1
    loss: float  # nats/token
    aux: float  # the MoE auxiliary loss (0 for a dense model)
    grad_norm: float  # before clipping
    lr: float  # the learning rate of the step (optim.lr x the schedule's multiplier)
    tokens: int  # tokens per step, over all processes
    step_time: float  # wall seconds of the step
    cpu_time: float  # CPU seconds of this process during the step (all threads)
    logged: bool  # a log step (every train.log_every steps, and the run's last)
    evaluates: bool  # an evaluation of checkpoint ``done`` follows (``after_eval``)


@dataclass
class EvalEvent:
    """One evaluation on the fixed validation set (DESIGN.md §8)."""

    step: int  # steps completed: the model evaluated is checkpoint ``step``'s
    val_loss: float  # nats/token
    val_bpb: float  # bits per UTF-8 byte


class Monitor:
    """A callback of the training loop; every hook is optional. ``trainer``: the ``trainer.Trainer``."""

    def __init__(self, trainer):
        self.trainer = trainer

    def after_step(self, ev: StepEvent) -> None:
        """Called on every rank after every optimizer step."""

    def after_eval(self, ev: EvalEvent) -> None:
        """Called on every rank after every evaluation (after the health guard passed it)."""

    def on_row(self, row: dict) -> None:
        """Called on rank 0 for every row written to ``metrics.jsonl``."""

    def close(self, wall: float | None) -> None:
        """Called once at the end (and again, harmlessly, on the way out): ``wall`` the run's training seconds
        when it finished, ``None`` when it stopped before its last step or failed."""


def memory_fields(device: torch.device) -> dict[str, float]:
    """``{"max_memory_gib": ...}`` on CUDA: the peak of memory allocated by tensors since the process started
    (``torch.cuda.max_memory_allocated``, GiB = 2**30 bytes; the caching allocator's reserve excluded); ``{}``
    elsewhere. A counter of the allocator: reading it does not synchronize the device."""
    if device.type != "cuda":
        return {}
    return {"max_memory_gib": torch.cuda.max_memory_allocated(device) / GIB}


class MetricsRows(Monitor):
    """The ``train`` row of every log step and the ``eval`` row of every evaluation (``metrics.jsonl``). The
    scale-vector statistics (``trainer.telemetry``, a ``telemetry.ScaleTelemetry`` that captured the step's
    gradients from an optimizer hook) and the MoE statistics gather across ranks, so every rank builds the row;
    rank 0 writes."""

    def after_step(self, ev: StepEvent) -> None:
        if not ev.logged:
            return
        tr = self.trainer
        flops = tr.flops_per_token * ev.tokens / ev.step_time
        row = {"kind": "train", "step": ev.step, "tokens": ev.done * ev.tokens, "lr": ev.lr, "loss": ev.loss,
               "grad_norm": ev.grad_norm, "tok_per_s": ev.tokens / ev.step_time, "step_time": ev.step_time,
               # process CPU seconds of the step (all threads): comparable on a loaded machine
               "cpu_time": ev.cpu_time, "flops_per_s": flops,
               "mfu": flops / tr.peak_flops if tr.peak_flops else None, **memory_fields(tr.device),
               **tr.telemetry.collect()}
        if tr.cfg.model.moe is not None:
            row["aux_loss"] = ev.aux
            row["moe"] = moe_stats(tr.model)
        tr.log(row)

    def after_eval(self, ev: EvalEvent) -> None:
        self.trainer.log({"kind": "eval", "step": ev.step, "tokens": ev.step * tokens_per_step(self.trainer.cfg),
                          "val_loss": ev.val_loss, "val_bpb": ev.val_bpb})


class Console(Monitor):
    """Progress on rank 0 unless quiet: a tqdm bar on a terminal, else one line per log step and evaluation.
    ``say`` is the trainer's line on stdout; a reader that went away (``train ... | head``) ends the lines,
    not the run: its files are the record, and a broken pipe is no write error."""

    def __init__(self, trainer):
        super().__init__(trainer)
        self.quiet = trainer.quiet or not trainer.write
        self.bar = None

    def say(self, msg: str) -> None:
        """One line on stdout (rank 0, unless quiet)."""
        if self.quiet:
            return
        try:
            print(msg, flush=True)
        except BrokenPipeError:
            self.quiet = True
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the final flush must not fail

    def header(self) -> None:
        """The lines that open a new run (rank 0): a warmup warning on stderr (even when quiet); the run, the
        corpus's documents and which are validation, the parameter groups and the compile decision on stdout."""
        tr = self.trainer
        if not tr.write:
            return
        note = warmup_warning(tr.steps, tr.cfg.schedule)
        if note:
            print(f"warning: {note}", file=sys.stderr, flush=True)
        per_step = tokens_per_step(tr.cfg)
        self.say(f"run {tr.out} · {tr.cfg.preset} · {tr.cfg.strategy} · {count_params(tr.model)['params']:,} params "
                 f"· {tr.steps} steps × {per_step:,} tokens · {tr.world} process(es) on {tr.device}")
        self.say(tr.data.describe())
        self.say(group_table(tr.groups))
        self.say(f"compile: {'on' if tr.compiled else 'off'} ({tr.compile_why})")

    def after_step(self, ev: StepEvent) -> None:
        if self.bar is None and not self.quiet and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=self.trainer.end, initial=ev.step, unit="step", dynamic_ncols=True)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{ev.loss:.4f}")
        elif ev.logged:
            self.say(f"step {ev.step:>6} loss {ev.loss:.4f} lr {ev.lr:.2e} grad {ev.grad_norm:.3f} "
                     f"{ev.tokens / ev.step_time:,.0f} tok/s")

    def after_eval(self, ev: EvalEvent) -> None:
        if self.bar is None:
            self.say(f"step {ev.step:>6} val_loss {ev.val_loss:.4f} val_bpb {ev.val_bpb:.4f}")

    def close(self, wall: float | None) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class Probes(Monitor):
    """Theory probes (DESIGN.md §4), off by default: every ``train.probe_every`` steps the preconditioner
    spectrum each scale vector induces and the column norms it acts on; every ``train.sharpness_every`` steps
    the top Hessian eigenvalue of the loss on the first validation batch (power iteration, 20 Hessian-vector
    products; ``probes.sharpness``). Logged as ``kind: probe`` rows by rank 0, after the step's eval row."""

    def after_step(self, ev: StepEvent) -> None:
        if not ev.evaluates:
            self.probe(ev.done)

    def after_eval(self, ev: EvalEvent) -> None:
        self.probe(ev.step)

    def probe(self, done: int) -> None:
        tr, t = self.trainer, self.trainer.cfg.train
        if not tr.write:
            return
        row = {}
        if t.probe_every and done % t.probe_every == 0:
            from scalevec.training.probes import probe_scales

            row["norms"] = probe_scales(tr.model)
        if t.sharpness_every and done % t.sharpness_every == 0:
            from scalevec.training.probes import batch_loss, sharpness

            x, y = tr.val[0]
            row["sharpness"] = sharpness(tr.model, batch_loss(x.to(tr.device), y.to(tr.device)), n_iters=20)
            row["sharpness_iters"] = 20
        if row:
            tr.log({"kind": "probe", "step": done, "tokens": done * tokens_per_step(tr.cfg), **row})


class Trackers(Monitor):
    """Forwards every row to ``train.tracker`` (``tracking``), opened at the first row (rank 0): a resumed run's
    first row is past its checkpoint, which is where TensorBoard purges from."""

    def __init__(self, trainer):
        super().__init__(trainer)
        self.tracker = None

    def on_row(self, row: dict) -> None:
        cfg = self.trainer.cfg
        if cfg.train.tracker == "none":
            return
        if self.tracker is None:
            self.tracker = tracking.open_tracker(cfg.train.tracker, self.trainer.out, to_dict(cfg),
                                                 start_step=int(row.get("step", 0)))
        self.tracker.log(row)

    def close(self, wall: float | None) -> None:
        if self.tracker is not None:
            self.tracker.close()
            self.tracker = None


class RunSummary(Monitor):
    """The final figures of a finished run (``result``), read back from ``metrics.jsonl`` so that a resumed run
    reports the whole run; the trainer writes them as ``summary.json``. ``step_time_s`` is the median time of
    the logged training steps after the first 5 (warm-up). ``evals`` repeats the eval rows, so that a run kept
    without its metrics.jsonl (a study's committed runs, DESIGN.md §9) still reports its validation curve."""

    def __init__(self, trainer):
        super().__init__(trainer)
        self.result: dict | None = None

    def close(self, wall: float | None) -> None:
        if wall is None or self.result is not None:
            return
        tr, cfg = self.trainer, self.trainer.cfg
        rows = rundir.read_metrics(tr.out) if tr.write else []
        evals = [r for r in rows if r["kind"] == "eval"]
        times = [r["step_time"] for r in rows if r["kind"] == "train" and r["step"] >= 5]
        cpu_times = [r["cpu_time"] for r in rows if r["kind"] == "train" and r["step"] >= 5 and "cpu_time" in r]
        final = evals[-1] if evals else {"val_loss": math.nan, "val_bpb": math.nan}
        counts = count_params(tr.model)
        self.result = {
            "preset": cfg.preset, "strategy": cfg.strategy, "optimizer": cfg.optim.name,
            "schedule": cfg.schedule.name, "lr": cfg.optim.lr, "seed": cfg.train.seed,
            "final_val_loss": final["val_loss"], "final_val_bpb": final["val_bpb"],
            "best_val_loss": min((e["val_loss"] for e in evals), default=math.nan),
            "steps": tr.steps, "tokens": run_tokens(cfg),
            "wall_time_s": wall, "step_time_s": statistics.median(times) if times else math.nan,
            "cpu_time_s": statistics.median(cpu_times) if cpu_times else math.nan,
            "compiled": tr.compiled, "peak_flops": tr.peak_flops,
            "params": counts["params"], "non_embedding_params": counts["non_embedding_params"],
            "active_params": counts["active_params"], "scale_params": counts["scale_params"],
            "world_size": tr.world, "evals": evals,
        }


# The monitors of every run, in calling order (rows before the lines that print them; probes after the rows
# of their step). A new monitor: one class above, one line here.
MONITORS: tuple[type[Monitor], ...] = (MetricsRows, Console, Probes, Trackers, RunSummary)

__all__ = ["MONITORS", "Console", "EvalEvent", "MetricsRows", "Monitor", "Probes", "RunSummary", "StepEvent",
           "Trackers", "memory_fields"]
