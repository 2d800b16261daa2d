"""What a run reports while it trains: monitors, passed to the trainer and called back by its loop (DESIGN.md §8).

A monitor is one object with up to five hooks: ``start(RunContext)`` once before the first step of a session (a
resumed run's too), ``after_step(StepEvent)`` after every optimizer step, ``after_eval(EvalEvent)`` after every
evaluation, ``on_row(row)`` for every row written to ``metrics.jsonl`` (rank 0) and ``close()`` once at the end
(closing twice is safe). A monitor with state that a resume must keep (a running mean, a spike detector) returns
it from ``state_dict()`` as JSON-ready values (``checkpoint_state`` refuses others at the checkpoint); every
checkpoint stores it under the monitor's ``name``, beside the
health guard's, and a resumed run hands it back to ``load_state_dict`` before ``start`` (OLMo-core's callbacks,
without the zoo). A monitor with no state returns ``{}`` and stores nothing, so checkpoints of runs without
one are those of a trainer without monitor state: either kind resumes under the other.

The trainer takes its monitors (``Trainer(..., monitors=[...])``; ``default()`` when none are given) and calls
every hook on every rank in list order: a hook that gathers across ranks (``telemetry``'s statistics) must
run on each, a hook that writes or prints checks ``ctx.write`` (rank 0). Monitors read the ``RunContext`` and
change nothing that training reads: a run's numbers are the same with any set of monitors.

- ``MetricsRows``: the ``train`` and ``eval`` rows of ``metrics.jsonl`` (loss, lr and each optimizer group's
  ``lr.<role>``, gradient norm, speed, MFU,
  per-scale-vector and MoE telemetry from ``telemetry``, and on CUDA the peak memory)
- ``Progress``: the step lines on the console (``console.Console``), or a progress bar on a terminal
- ``Probes``: the theory probes (``train.probe_every``, ``train.sharpness_every``) as ``probe`` rows
- ``Trackers``: TensorBoard / W&B mirrors of the rows (``tracking``)

``run_summary`` is ``summary.json``'s figures, which the trainer's loop returns when the run finishes.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from scalevec.config import RunConfig
from scalevec.config.codec import to_dict
from scalevec.config.run_budget import run_tokens, tokens_per_step
from scalevec.model.params import count_params
from scalevec.training import rundir, tracking
from scalevec.training.console import GIB, Console, format_seconds, peak_memory_gib
from scalevec.training.telemetry import ScaleTelemetry, moe_stats


@dataclass(frozen=True)
class RunContext:
    """What monitors may read about the run, fixed for one session of it (``Trainer.fit`` builds it)."""

    cfg: RunConfig  # the run's validated config
    out: Path  # the run directory
    model: torch.nn.Module  # the unwrapped model: read it, never change it
    device: torch.device
    write: bool  # this process writes the run's files and prints (rank 0)
    steps: int  # the run's steps
    first: int  # the first step of this session (0, or the step of the checkpoint it resumed)
    end: int  # the step this session stops at (``steps``, or ``fit``'s ``stop_at``)
    flops_per_token: float  # model FLOPs per token, forward and backward (``flops.flops_per_token``)
    peak_flops: float | None  # this device's matmul peak in FLOP/s on rank 0 (``flops.peak_flops``); None: unknown
    telemetry: ScaleTelemetry  # the per-vector statistics of logged steps (every rank collects)
    val_batch: tuple[torch.Tensor, torch.Tensor]  # the first validation batch ``(x, y)``, on the host
    log: Callable[[dict], None]  # writes one metrics row (rank 0) and hands it to every monitor's ``on_row``
    console: Console  # the run's progress lines (rank 0, unless quiet)


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
    elapsed: float  # wall seconds of training so far, earlier sessions of a resumed run included
    logged: bool  # a log step (every train.log_every steps, and the run's last)
    evaluates: bool  # an evaluation of checkpoint ``done`` follows (``after_eval``)
    group_lrs: dict[str, float] = field(default_factory=dict)  # {"lr.<role>": lr} each group stepped with


@dataclass
class EvalEvent:
    """One evaluation on the fixed validation set (DESIGN.md §8)."""

    step: int  # steps completed: the model evaluated is checkpoint ``step``'s
    val_loss: float  # nats/token
    val_bpb: float  # bits per UTF-8 byte


class Monitor:
    """A callback of the training loop; every hook is optional. Construct it before the trainer; ``start``
    gives it the run."""

    ctx: RunContext
    _name: str | None = None
    run_dir: Path | None = None  # the run this instance was passed to (``Trainer``): its state is that run's

    @property
    def name(self) -> str:
        """The key of this monitor's state in a checkpoint, unique among a run's monitors: the class name unless
        set (two monitors of one class need distinct names)."""
        return self._name or type(self).__name__

    @name.setter
    def name(self, value: str) -> None:
        # the checkpoint's JSON key: any other type comes back a str and the resumed monitor would find no state
        if not isinstance(value, str) or not value:
            raise TypeError(f"a monitor's name is a non-empty str (its checkpoint key), got {value!r}")
        self._name = value

    def start(self, ctx: RunContext) -> None:
        """Called on every rank before the first step of each session, after ``load_state_dict`` on resume."""
        self.ctx = ctx

    def after_step(self, ev: StepEvent) -> None:
        """Called on every rank after every optimizer step."""

    def after_eval(self, ev: EvalEvent) -> None:
        """Called on every rank after every evaluation (after the health guard passed it)."""

    def on_row(self, row: dict) -> None:
        """Called on rank 0 for every row written to ``metrics.jsonl``."""

    def close(self) -> None:
        """Called once at the end (and again, harmlessly, on the way out)."""

    def state_dict(self) -> dict:
        """This monitor's state for a checkpoint, JSON-ready (``{}``: none, nothing is stored)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict``'s output from the checkpoint a run resumes (only when it stored some)."""


def checkpoint_state(monitor: Monitor) -> dict:
    """``monitor.state_dict()``, checked to be a dict that comes back from a checkpoint's JSON as it is: dicts with
    ``str`` keys, lists, ``str``, ``int``, ``float``, ``bool`` and ``None`` only. Raises ``TypeError`` naming the
    monitor and a state that is not a dict (a resume refuses every checkpoint holding one) or the first other value
    (an ``int`` key would come back a ``str``, a tuple a list, a tensor or set not at all)."""
    state = monitor.state_dict()
    if not isinstance(state, dict):  # stored, every checkpoint of the run would fail the resume's check of its extras
        raise TypeError(f"monitor {monitor.name!r}: state_dict() returned a {type(state).__name__}, not a dict; "
                        f"return a dict of its state ({{}} for none)")

    def check(value, where: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(k, str):
                    raise TypeError(f"monitor {monitor.name!r}: state_dict() has the key {k!r} "
                                    f"({type(k).__name__}) in {where}, which a checkpoint's JSON turns into a str; "
                                    f"use str keys")
                check(v, f"{where}[{k!r}]")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                check(v, f"{where}[{i}]")
        elif value is not None and not isinstance(value, (str, int, float, bool)):
            raise TypeError(f"monitor {monitor.name!r}: state_dict() holds a {type(value).__name__} at {where}, "
                            f"which a checkpoint's JSON does not keep as it is; return dicts with str keys, lists, "
                            f"str, int, float, bool or None (.tolist() / .item() for tensors and arrays)")

    check(state, "state")
    return state


def speed(ctx: RunContext, ev: StepEvent) -> dict[str, float | None]:
    """``tok_per_s`` and ``flops_per_s`` of a step (tokens and model FLOPs over its wall time) and ``mfu``, the
    FLOP rate over ``ctx.peak_flops`` (None when the peak is unknown)."""
    flops = ctx.flops_per_token * ev.tokens / ev.step_time
    return {"tok_per_s": ev.tokens / ev.step_time, "flops_per_s": flops,
            "mfu": flops / ctx.peak_flops if ctx.peak_flops else None}


def memory_fields(device: torch.device) -> dict[str, float]:
    """``{"max_memory_gib": ...}`` on CUDA: the peak of memory allocated by tensors since the process started
    (``torch.cuda.max_memory_allocated``, GiB = 2**30 bytes; the caching allocator's reserve excluded); ``{}``
    elsewhere. A counter of the allocator: reading it does not synchronize the device."""
    if device.type != "cuda":
        return {}
    return {"max_memory_gib": torch.cuda.max_memory_allocated(device) / GIB}


class MetricsRows(Monitor):
    """The ``train`` row of every log step and the ``eval`` row of every evaluation (``metrics.jsonl``). The
    scale-vector statistics (``ctx.telemetry``, which captured the step's gradients from an optimizer hook) and
    the MoE statistics gather across ranks, so every rank builds the row; rank 0 writes."""

    def after_step(self, ev: StepEvent) -> None:
        if not ev.logged:
            return
        ctx, fast = self.ctx, speed(self.ctx, ev)
        row = {"kind": "train", "step": ev.step, "tokens": ev.done * ev.tokens, "lr": ev.lr, **ev.group_lrs,
               "loss": ev.loss, "grad_norm": ev.grad_norm, "tok_per_s": fast["tok_per_s"], "step_time": ev.step_time,
               # process CPU seconds of the step (all threads): comparable on a loaded machine
               "cpu_time": ev.cpu_time, "flops_per_s": fast["flops_per_s"], "mfu": fast["mfu"],
               **memory_fields(ctx.device), **ctx.telemetry.collect()}
        if ctx.cfg.model.moe is not None:
            row["aux_loss"] = ev.aux
            row["moe"] = moe_stats(ctx.model)
        ctx.log(row)

    def after_eval(self, ev: EvalEvent) -> None:
        self.ctx.log({"kind": "eval", "step": ev.step, "tokens": ev.step * tokens_per_step(self.ctx.cfg),
                      "val_loss": ev.val_loss, "val_bpb": ev.val_bpb})


class Progress(Monitor):
    """The steps on the console (``ctx.console``): a tqdm bar when it is a terminal, else one line per log step
    (loss, lr, gradient norm, tokens/s, MFU, memory, elapsed time and the ETA of this session's last step) and
    one per evaluation. The ETA extrapolates this session's wall time per step (evaluations and checkpoints
    included), so a resumed run's start-up counts once."""

    def start(self, ctx: RunContext) -> None:
        super().start(ctx)
        self.bar, self.t0 = None, time.perf_counter()

    def after_step(self, ev: StepEvent) -> None:
        console = self.ctx.console
        if self.bar is None and console.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=self.ctx.end, initial=ev.step, unit="step", dynamic_ncols=True)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{ev.loss:.4f}")
        elif ev.logged and not console.quiet:
            console.say(self.line(ev))

    def line(self, ev: StepEvent) -> str:
        """``step N/END loss … lr … grad … T tok/s mfu M% mem G GiB elapsed E eta R`` (mfu and memory where known)."""
        fast, mem = speed(self.ctx, ev), peak_memory_gib(self.ctx.device)
        per_step = (time.perf_counter() - self.t0) / (ev.done - self.ctx.first)
        return " ".join(x for x in (
            f"step {ev.step:>6}/{self.ctx.end} loss {ev.loss:.4f} lr {ev.lr:.2e} grad {ev.grad_norm:.3f}",
            f"{fast['tok_per_s']:,.0f} tok/s",
            f"mfu {100 * fast['mfu']:.2f}%" if fast["mfu"] is not None else "",
            f"{mem[0]} {mem[1]:.2f} GiB" if mem else "",
            f"elapsed {format_seconds(ev.elapsed)} eta {format_seconds(per_step * (self.ctx.end - ev.done))}") if x)

    def after_eval(self, ev: EvalEvent) -> None:
        if self.bar is None:
            self.ctx.console.say(f"step {ev.step:>6} val_loss {ev.val_loss:.4f} val_bpb {ev.val_bpb:.4f}")

    def close(self) -> None:
        if getattr(self, "bar", None) is not None:
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
        ctx, t = self.ctx, self.ctx.cfg.train
        if not ctx.write:
            return
        row = {}
        if t.probe_every and done % t.probe_every == 0:
            from scalevec.training.probes import probe_scales

            row["norms"] = probe_scales(ctx.model)
        if t.sharpness_every and done % t.sharpness_every == 0:
            from scalevec.training.probes import batch_loss, sharpness

            x, y = ctx.val_batch
            row["sharpness"] = sharpness(ctx.model, batch_loss(x.to(ctx.device), y.to(ctx.device)), n_iters=20)
            row["sharpness_iters"] = 20
        if row:
            ctx.log({"kind": "probe", "step": done, "tokens": done * tokens_per_step(ctx.cfg), **row})


class Trackers(Monitor):
    """Forwards every row to ``train.tracker`` (``tracking``), opened at the first row (rank 0): a resumed run's
    first row is past its checkpoint, which is where TensorBoard purges from."""

    tracker = None

    def on_row(self, row: dict) -> None:
        cfg = self.ctx.cfg
        if cfg.train.tracker == "none":
            return
        if self.tracker is None:
            self.tracker = tracking.open_tracker(cfg.train.tracker, self.ctx.out, to_dict(cfg),
                                                 start_step=int(row.get("step", 0)))
        self.tracker.log(row)

    def close(self) -> None:
        if self.tracker is not None:
            self.tracker.close()
            self.tracker = None


def default() -> list[Monitor]:
    """The monitors of a run when none are given, in calling order (rows before the lines that print them;
    probes after the rows of their step). A run with more: ``[*monitors.default(), Mine()]``; without
    ``MetricsRows`` a run writes no metrics rows and its summary has no figures."""
    return [MetricsRows(), Progress(), Probes(), Trackers()]


def run_summary(ctx: RunContext, wall: float, compiled: bool, world: int) -> dict:
    """The final figures of a finished run, ``summary.json``: read back from ``metrics.jsonl`` so that a resumed
    run reports the whole run (every rank calls; only rank 0 reads the file, the others get NaN figures).
    ``wall``: the run's training seconds; ``step_time_s`` the median time of the logged training steps after
    the first 5 (warm-up). ``evals`` repeats the eval rows, so that a run kept without its metrics.jsonl (a
    study's committed runs, DESIGN.md §9) still reports its validation curve."""
    cfg = ctx.cfg
    rows = rundir.read_metrics(ctx.out) if ctx.write else []
    evals = [r for r in rows if r["kind"] == "eval"]
    times = [r["step_time"] for r in rows if r["kind"] == "train" and r["step"] >= 5]
    cpu_times = [r["cpu_time"] for r in rows if r["kind"] == "train" and r["step"] >= 5 and "cpu_time" in r]
    final = evals[-1] if evals else {"val_loss": math.nan, "val_bpb": math.nan}
    counts = count_params(ctx.model)
    return {
        "preset": cfg.preset, "strategy": cfg.strategy, "optimizer": cfg.optim.name,
        "schedule": cfg.schedule.name, "lr": cfg.optim.lr, "seed": cfg.train.seed,
        "final_val_loss": final["val_loss"], "final_val_bpb": final["val_bpb"],
        "best_val_loss": min((e["val_loss"] for e in evals), default=math.nan),
        "steps": ctx.steps, "tokens": run_tokens(cfg),
        "wall_time_s": wall, "step_time_s": statistics.median(times) if times else math.nan,
        "cpu_time_s": statistics.median(cpu_times) if cpu_times else math.nan,
        "compiled": compiled, "peak_flops": ctx.peak_flops,
        "params": counts["params"], "non_embedding_params": counts["non_embedding_params"],
        "active_params": counts["active_params"], "scale_params": counts["scale_params"],
        "world_size": world, "evals": evals,
    }


__all__ = ["EvalEvent", "MetricsRows", "Monitor", "Probes", "Progress", "RunContext", "StepEvent", "Trackers",
           "checkpoint_state", "default", "memory_fields", "run_summary", "speed"]
