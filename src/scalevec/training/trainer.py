"""The trainer: one CPU or many GPUs, exact resume, a self-describing run directory (DESIGN.md §8).

``train(cfg, out_dir)`` takes a validated ``RunConfig`` (``resolve.resolve_config`` validates, once),
checks everything else first (data, model, the run directory) and only then creates the run
directory, so a bad input writes nothing. The step (``step.accumulate_gradients``): the global batch of
``train.batch_size`` sequences is split across ranks and micro-batches; the loss is summed in nats and divided by the
number of target tokens of the whole global batch (so accumulation and world size do not change
it); gradients are clipped; a non-finite loss or gradient norm stops the run with the last good
checkpoint kept. Checkpoints are written atomically (temporary directory, then rename) and hold the
model (safetensors), optimizer, step and RNG states; the data sampler is stateless (batch = f(seed,
step)), so resume is exact. Only rank 0 writes.

Run directory (its files: ``rundir``; its checkpoints: the ``checkpoint`` package): ``config.yaml``,
``meta.json`` (``environment``), ``optim_groups.txt``, ``metrics.jsonl`` (with ``telemetry``),
``summary.json``, ``tokenizer/``, ``checkpoints/step_XXXXXXX/`` + ``checkpoints/latest``, ``DONE``. The
command line: ``command``.

The trainer keeps construction, the step, evaluation, the loop and checkpointing; its parts live beside it:
the run directory's lock, checks and rank-0 writes in ``run_owner.RunDirOwner``, the health guard and its
state in ``health.HealthGuard``, its lines in ``console.Console``, and what the run reports in the monitors
it is given (``monitors``; by default metrics rows, step lines, probes, trackers), called back after each step
and evaluation, each one's state kept in the checkpoints; ``fit`` returns the summary
(``monitors.run_summary``). Checkpoints are periodic
(``train.ckpt_every`` steps, and at least every ``CKPT_MINUTES`` of training) and at the end; a resumed run
says which checkpoint and step it continues from.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path

import torch

from scalevec.config import RunConfig, checkpoint_blocks
from scalevec.config.codec import config_diff, format_diff
from scalevec.config.run_budget import tokens_per_step, total_steps
from scalevec.config.typed import is_number, short
from scalevec.data.corpus import prepare_data
from scalevec.data.sampler import TrainSampler, val_batches, val_window_record, val_window_starts
from scalevec.model.flops import flops_per_token, peak_flops
from scalevec.model.params import count_params
from scalevec.model.transformer import build_model
from scalevec.resolve import fit_vocab
from scalevec.training import autocompile, distributed, init_from, rundir, tracking
from scalevec.training import monitors as monitors_mod
from scalevec.training.checkpoint import layout
from scalevec.training.checkpoint.save_load import resume_checkpoint, save_checkpoint, writer_tag
from scalevec.training.console import Console
from scalevec.training.environment import run_meta
from scalevec.training.exits import Preempted, deferred_sigint
from scalevec.training.health import BLOWUP_RATIO, BLOWUP_STEPS, HealthGuard, TrainingDiverged
from scalevec.training.monitors import EvalEvent, Monitor, RunContext, StepEvent, run_summary
from scalevec.training.optim import build_optimizers, group_lrs, group_table, param_groups, set_lr
from scalevec.training.run_owner import RunDirOwner, TrainingFailed, check_target
from scalevec.training.schedule import lr_multiplier, warmup_warning
from scalevec.training.step import accumulate_gradients, evaluate
from scalevec.training.telemetry import ScaleTelemetry

# Periodic checkpoints by wall time too: with train.ckpt_every > 0, a checkpoint is also written
# after the first step that ends CKPT_MINUTES of training after the last one, so a slow run (a big model, a
# loaded machine) never loses more than that to a kill. 0 turns both off (a checkpoint at the end only).
CKPT_MINUTES = 30.0


def check_train_extra(extra: dict) -> None:
    """Raise ``ValueError`` naming the key where a checkpoint's trainer extras (``Trainer.checkpoint`` writes them)
    are not what ``Trainer.load`` reads: ``best_val`` a number (infinite before any evaluation), ``elapsed_s`` a
    finite number >= 0, ``guard`` the health guard's state (``HealthGuard.check_state``), ``monitors`` a mapping of
    each monitor's mapping; any may be absent. ``resume_checkpoint`` skips a checkpoint that fails, naming its
    ``train_state.json``: an edited ``"best_val": "x"`` was a TypeError traceback at the first evaluation."""
    if "best_val" in extra and not is_number(extra["best_val"], finite=False):
        raise ValueError(f"extra.best_val is {short(extra['best_val'])}, not a loss")
    if "elapsed_s" in extra and not is_number(extra["elapsed_s"], least=0):
        raise ValueError(f"extra.elapsed_s is {short(extra['elapsed_s'])}, not a number of seconds >= 0")
    HealthGuard.check_state(extra.get("guard"))
    stored = extra.get("monitors") or {}
    if not isinstance(stored, dict) or not all(isinstance(v, dict) for v in stored.values()):
        raise ValueError(f"extra.monitors is {short(stored)}, not a mapping of each monitor's state")


class Trainer:
    """Builds everything for one run and trains it; see the module docstring for the contract.

    ``cfg``: a validated ``RunConfig``; ``out_dir``: the run directory; ``resume`` / ``overwrite``: continue the
    run there, or replace it; ``quiet``: no progress lines; ``init``: ``--init-from`` (``init_from.InitFrom``);
    ``monitors``: what the run reports (``monitors.Monitor``; default ``monitors.default()``), each under a
    distinct ``name``, and none with state from another run (an instance is bound to its run: ``run_dir``). Raises
    as ``train`` does, before anything is written for bad input."""

    def __init__(self, cfg: RunConfig, out_dir: str | Path, resume: bool = False, overwrite: bool = False,
                 quiet: bool = False, init: init_from.InitFrom | None = None,
                 monitors: Sequence[Monitor] | None = None):
        self.monitors = list(monitors_mod.default() if monitors is None else monitors)
        names = [m.name for m in self.monitors]
        if len(set(names)) < len(names):
            raise ValueError(f"two monitors are named {next(n for n in names if names.count(n) > 1)!r}: their "
                             f"checkpoint states would collide; give one a distinct `name`")
        run = Path(os.path.abspath(out_dir))  # not resolve(): a link loop as --out is refused below, in one line
        for m in self.monitors:  # a stateful instance reused for another run would carry its state into that run's
            ran = getattr(m, "run_dir", None)
            if ran is not None and ran != run and monitors_mod.checkpoint_state(m):
                raise ValueError(f"monitor {m.name!r} holds the state of run {ran}; pass a new instance to {run}")
        for m in self.monitors:
            m.run_dir = run
        self.init = init  # --init-from: a Hugging Face model or a parent run (init_from.py)
        self.cfg, self.out, self.resume = cfg, Path(out_dir), resume
        self.steps = total_steps(cfg)
        check_target(self.out, resume, overwrite)
        tracking.check(cfg.train.tracker)  # a missing optional package fails before anything is written

        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        self.dist = distributed.setup(cfg.train)
        self.device = self.dist.device
        self.rank, self.world = self.dist.rank, self.dist.world_size
        self.write = self.rank == 0
        self.console = Console(quiet=quiet or not self.write)
        self.run_dir = RunDirOwner(self.out, resume, overwrite, self.dist)
        self.run_dir.lock_existing()  # a second writer is refused at once, before any work
        t = cfg.train
        self.local_batch = t.batch_size // self.world
        self.micro = min(t.micro_batch_size or t.batch_size, self.local_batch)
        if t.batch_size % self.world or self.local_batch % self.micro:
            raise ValueError(f"train.batch_size={t.batch_size} must split evenly over {self.world} process(es) and "
                             f"micro-batches of {self.micro}; choose a batch size divisible by both")

        # Data and model: everything that can fail on user input happens before the run dir exists.
        # Each machine's first process fills the token cache (and trains a BPE) first; the others then read it.
        if self.dist.local_rank == 0:
            self.data = prepare_data(cfg.data)
        distributed.barrier()
        if self.dist.local_rank != 0:
            self.data = prepare_data(cfg.data)
        # the stored config.yaml holds the grown vocabulary (resolve.fit_vocab: a preset's is a default)
        cfg.model.vocab_size = fit_vocab(cfg, self.data.tokenizer.vocab_size).model.vocab_size
        if resume:
            diff = config_diff(rundir.load_config(self.out), cfg)
            if diff:
                raise ValueError(f"--resume with a config that differs from {self.out / rundir.CONFIG} in: "
                                 f"{format_diff(diff)}; "
                                 f"resume with the stored config (scalevec train --resume --out {self.out})")
        self.sampler = TrainSampler(self.data.train, t.seq_len, t.batch_size, seed=t.seed,
                                    pin_memory=self.device.type == "cuda")  # copied with non_blocking
        self.val, self.val_bytes = val_batches(self.data, t.seq_len, cfg.data.val_tokens, t.eval_batch_size,
                                               cfg.data.val_windows)
        self.val_windows = val_window_record(val_window_starts(self.data, t.seq_len, cfg.data.val_tokens,
                                                               cfg.data.val_windows),
                                             cfg.data.val_windows, self.data, t.seq_len)
        self.model = build_model(cfg.model, cfg.scale, seed=t.seed, device=self.device)
        self.model.set_memory_options(checkpoint_blocks(t.activation_checkpointing, cfg.model.n_layers),
                                      t.loss_chunk_tokens)
        if init is not None:  # on the plain parameters, before any wrapping; prints what changed (or not)
            x, y = self.val[0]
            for line in init_from.load_weights(init, cfg, self.model, (x.to(self.device), y.to(self.device))):
                if self.rank == 0:
                    print(line, file=sys.stderr if "CHANGES" in line else sys.stdout, flush=True)
            if init.start_step >= self.steps:
                raise ValueError(f"--schedule-from continue starts at the parent's step {init.start_step}, but the run "
                                 f"has {self.steps} steps; set --steps (or --tokens) beyond it")
        self.roles = self.model.param_roles()
        self.wrapped = distributed.wrap(self.model, t, self.dist)  # FSDP2 replaces the parameters: groups after
        self.groups = param_groups(self.model, cfg.optim, cfg.scale, self.roles)
        self.optimizers = distributed.shard_aware_optimizers(build_optimizers(self.groups, cfg.optim))
        if init is not None:
            init.info["optimizer"] = init_from.carry_optimizer(init, cfg, self.model, self.optimizers, self.device)
            self.console.say(f"init-from: optimizer state {init.info['optimizer']}; schedule {init.schedule_from} "
                             f"(first step {init.start_step})")
        cuda_bf16 = self.device.type == "cuda" and t.dtype != "float32"
        self.autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if cuda_bf16
                         else torch.autocast("cpu", dtype=torch.bfloat16) if t.dtype == "bfloat16" else nullcontext())
        self.step = init.start_step if init is not None else 0
        # attached after carry_optimizer, whose state-building step must not reach the per-vector metrics' hook
        self.telemetry = ScaleTelemetry(self.model, self.roles).attach(  # per-vector metrics on logged steps
            self.optimizers, due=lambda: self.step % t.log_every == 0 or self.step + 1 == self.steps)
        self.best_val = math.inf
        self.elapsed = 0.0  # seconds of training before this session (restored on resume)
        self.kept_states: dict[str, dict] = {}  # stored states of monitors not passed to this session (load)
        self.guard = HealthGuard(cfg, self.out, self.write)  # its state is saved with every checkpoint
        # temporary checkpoint names carry rank 0's PID (every rank writes into the same directory)
        self.tmp_tag = writer_tag()
        self.compiled, self.compile_why = autocompile.resolve(t.compile, self.device, self.steps, t.sharpness_every > 0)
        # the mfu / flops_per_s metrics: FLOPs per token from the config, a peak resolved once (it may measure)
        self.flops_per_token = flops_per_token(cfg.model, t.seq_len)
        self.peak_flops = None
        if self.write:
            mm_dtype = torch.bfloat16 if self.device.type == "cuda" and t.dtype != "float32" else torch.float32
            self.peak_flops, _ = peak_flops(self.device, mm_dtype, t.peak_flops)

    # -- the run directory ----------------------------------------------------------------------------

    def release(self) -> None:
        """Release the run directory's lock (``fit`` and ``train`` do it when they end)."""
        self.run_dir.release()

    def setup_run_dir(self) -> None:
        """Lock and check the run directory, then resume from its newest checkpoint that loads
        (``checkpoint.resume_checkpoint``: a damaged one, or one that does not load, is skipped with a note; a
        run without one restarts from step 0) or write a new run (``RunDirOwner.prepare``). An unusable target
        (read-only, full disk) is a one-line ``RunDirError``, exit 2, on every rank."""
        self.run_dir.prepare(self._write_run_files)
        if self.resume:
            state = resume_checkpoint(self.out, self.model, self.optimizers, self.device, notice=self.run_dir.notice,
                                      check_extra=check_train_extra)
            if state is not None:
                self.load(state)
                self.run_dir.truncate_metrics(self.step)  # rows past the checkpoint belong to a lost future
                ckpt = self.out / layout.CKPT_DIR / layout.step_name(self.step)
                self.console.say(f"resume: {self.out} continues from checkpoint {ckpt} (step {self.step} of "
                                 f"{self.steps})")
            else:
                self.run_dir.restart(self._write_run_files)
        distributed.barrier()

    def _write_run_files(self) -> None:
        """``rundir.write_run_files``: meta (with the compile decision, which changes the last bits of the losses,
        the ``--init-from`` source, the validation split's record, ``split.SplitRecord``: which documents are
        validation, and the scored windows' record, ``sampler.val_window_record``), config, group table, tokenizer."""
        split = self.data.meta.get("validation")
        rundir.write_run_files(self.out, {**run_meta(self.cfg), "compiled": self.compiled,
                                          "compile_why": self.compile_why,
                                          **({"validation_split": split} if split else {}),
                                          "validation_windows": self.val_windows,
                                          **({"init_from": self.init.info} if self.init else {})},
                               self.cfg, group_table(self.groups), self.data.tokenizer)

    def log(self, row: dict) -> None:
        """Write one metrics row (rank 0) and hand it to the monitors' ``on_row`` (the trackers)."""
        if self.write:
            self.run_dir.append_metrics(row)
            for m in self.monitors:
                m.on_row(row)

    def close_monitors(self) -> None:
        """Close every monitor (``Monitor.close``; safe to call again); a close that raises does not keep the others
        open (a tracker unflushed): the first error is raised after all were closed."""
        error = None
        for m in self.monitors:
            try:
                m.close()
            except Exception as e:
                error = error or e
        if error is not None:
            raise error

    def header(self) -> None:
        """The lines that open a new run (rank 0): a warmup warning on stderr (even when quiet); the run, the
        corpus's documents and which are validation, the parameter groups and the compile decision on stdout."""
        note = warmup_warning(self.steps, self.cfg.schedule)
        if note and self.write:
            print(f"warning: {note}", file=sys.stderr, flush=True)
        say = self.console.say
        say(f"run {self.out} · {self.cfg.preset} · {self.cfg.strategy} · {count_params(self.model)['params']:,} "
            f"params · {self.steps} steps × {tokens_per_step(self.cfg):,} tokens · {self.world} process(es) on "
            f"{self.device}")
        say(self.data.describe())
        say(group_table(self.groups))
        say(f"compile: {'on' if self.compiled else 'off'} ({self.compile_why})")

    # -- checkpoints -------------------------------------------------------------------------------------

    def checkpoint(self) -> None:
        """Write checkpoint ``self.step`` (every rank: DCP writes each rank's shards, rank 0 the rest;
        ``checkpoint.save_checkpoint``) with the train state: best validation loss, time so far, the guard's
        state and, under ``monitors``, each monitor's that has one (by name). Pruning keeps the checkpoint that
        ``DIVERGED`` would name (``HealthGuard.keep_window``)."""
        extra = {"best_val": self.best_val, "elapsed_s": self.elapsed, "guard": self.guard.state_dict()}
        states = {m.name: s for m in self.monitors if (s := monitors_mod.checkpoint_state(m))}
        states = {**self.kept_states, **states}
        save_checkpoint(self.out, self.step, self.model, self.optimizers, {**extra, **({"monitors": states}
                                                                                       if states else {})},
                        tag=self.tmp_tag, keep_window=self.guard.keep_window(self.step))

    def load(self, state: dict) -> None:  # its extras passed check_train_extra (resume_checkpoint)
        """Restore the trainer from a loaded checkpoint's train state (``resume_checkpoint`` loaded the
        model, optimizer and RNG states): step, best validation loss, time so far, the guard's state, and each
        monitor's stored state (a monitor the checkpoint holds none for starts empty: one added since, or any
        before monitors kept state; the state of one not passed now is kept, unread, in later checkpoints; a
        ``load_state_dict`` that raises is a ``ValueError`` naming the monitor, before anything is written). The
        step is the checkpoint's and within the run's steps (``integrity`` skips a checkpoint that is not)."""
        self.step = state["step"]
        extra = state["extra"]
        self.best_val = extra.get("best_val", math.inf)
        self.elapsed = extra.get("elapsed_s", 0.0)
        self.guard.load_state_dict(extra.get("guard"), fresh_start=self.step == 0)
        stored = extra.get("monitors") or {}
        for m in self.monitors:
            if m.name in stored:
                try:
                    m.load_state_dict(stored[m.name])
                except Exception as e:  # the user's code: name the monitor and the checkpoint, not only its error
                    raise ValueError(f"monitor {m.name!r}: load_state_dict() raised {e!r} on the state of checkpoint "
                                     f"{layout.step_name(self.step)} ({short(stored[m.name])}); fix its "
                                     f"load_state_dict, or resume without it (its state is kept)") from e
        # a monitor not passed this session (a CLI resume of a run trained with one) keeps its state for the next
        self.kept_states = {k: v for k, v in stored.items() if k not in {m.name for m in self.monitors}}
        if self.kept_states:
            self.run_dir.notice(f"the checkpoint holds state of monitor(s) {', '.join(map(repr, self.kept_states))}, "
                                f"not passed to this run; it is kept in later checkpoints for a resume with them")
        if self.step == 0:
            # written before any step (`scalevec convert`): resume it as the fresh start it is. Its optimizer state
            # is torch's, not a step's: get_state_dict fills an untouched optimizer with one zero-gradient step at lr
            # 0, whose step count (1) would shrink AdamW's first update (bias correction)
            for opt in self.optimizers:
                opt.state.clear()

    # -- the step and evaluation ----------------------------------------------------------------------------

    def train_step(self, step: int) -> tuple[float, float, float]:
        """One optimizer step; returns (loss in nats/token over the global batch, aux loss, grad norm).

        One host sync (DESIGN.md §8): the guard's three scalars, copied together; the batch is copied without
        waiting (pinned on CUDA) and the target count stays on the device (``step.accumulate_gradients``)."""
        set_lr(self.optimizers, lr_multiplier(step, self.steps, self.cfg.schedule))
        x, y = self.sampler.batch(step, self.rank, self.world)
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        micro = [(x[i:i + self.micro], y[i:i + self.micro]) for i in range(0, self.local_batch, self.micro)]
        loss, aux = accumulate_gradients(self.wrapped, micro, self.autocast)
        clip = self.cfg.optim.grad_clip
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip if clip > 0 else float("inf"))
        if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor
            grad_norm = grad_norm.full_tensor()
        stats = torch.stack([loss, aux, grad_norm.float().to(loss.device)]).tolist()
        self.guard.check_step(step, stats)  # before the update: a diverged step never reaches the weights
        for opt in self.optimizers:
            opt.step()
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        return stats[0], stats[1], stats[2]

    def evaluate(self) -> tuple[float, float]:
        """Validation loss in nats/token and bits-per-byte over the fixed validation set (``step.evaluate``)."""
        return evaluate(self.wrapped, self.val, self.val_bytes, self.device, self.autocast)

    # -- the loop ---------------------------------------------------------------------------------------

    def fit(self, stop_at: int | None = None) -> dict:
        """Train to the end (or until ``stop_at`` steps are done, for tests and preemption) and return the run's
        summary (``monitors.run_summary``; ``{"stopped_at": step}`` when it stopped before its last step)."""
        try:
            if self.resume and rundir.is_done(self.out):
                self.console.say(f"{self.out} is already finished; nothing to resume")
                return rundir.read_summary(self.out, fix="retrain the run with --overwrite")
            self.setup_run_dir()
            try:  # from here an OSError (a full disk, a read-only remount, a vanished mount) leaves a resumable run
                end = min(self.steps, stop_at) if stop_at is not None else self.steps
                if self.step == 0:
                    self.header()
                ctx = RunContext(self.cfg, self.out, self.model, self.device, self.write, self.steps, self.step, end,
                                 self.flops_per_token, self.peak_flops, self.telemetry, self.val[0], self.log,
                                 self.console)
                for m in self.monitors:
                    m.start(ctx)
                t_start = time.perf_counter() - self.elapsed
                self.wrapped.train()
                with deferred_sigint(sigint=self.world == 1) as interrupt:
                    self._loop(end, t_start, interrupt)
                if self.step < self.steps:
                    return {"stopped_at": self.step}
                summary = run_summary(ctx, time.perf_counter() - t_start, self.compiled, self.world)
                self.close_monitors()
                self.run_dir.finish(summary)
                self.console.say(f"done: val_loss {summary['final_val_loss']:.4f} nats/token, "
                                 f"{summary['final_val_bpb']:.4f} bits/byte")
                distributed.barrier()
                return summary
            except OSError as e:
                raise self.run_dir.failed(e, self.step) from None
        finally:
            try:
                self.close_monitors()
            finally:  # a monitor's failing close must not leave the run locked by this process
                self.release()

    def _loop(self, end: int, t_start: float, interrupt: dict) -> None:
        """The steps of ``fit`` up to ``end``, each followed by the monitors' ``after_step`` (and, on an evaluation
        step, the evaluation, the guard's check and ``after_eval``), then by a checkpoint every ``train.ckpt_every``
        steps, after the step that ends ``CKPT_MINUTES`` since the last one, and at the end. On Ctrl-C
        (``interrupt["set"]``) it checkpoints the completed steps and raises ``KeyboardInterrupt``; on SIGTERM
        (``interrupt["term"]``, agreed by every rank) it does the same and raises ``Preempted``; ``--resume``
        continues from there, bit for bit."""
        t = self.cfg.train
        per_step = tokens_per_step(self.cfg)
        saved, saved_at = self.step, time.perf_counter()
        while self.step < end:
            term = interrupt["term"]
            overdue = bool(t.ckpt_every) and time.perf_counter() - saved_at >= CKPT_MINUTES * 60
            if self.world > 1:  # every rank must agree: a stop and a checkpoint are collectives
                flags = torch.tensor([float(term), float(overdue)], device=self.device)
                term, overdue = (v > 0 for v in distributed.all_reduce_sum(flags).tolist())
            if term or interrupt["set"]:  # checkpoint the completed steps, then stop: --resume continues
                if self.step > saved:
                    self.elapsed = time.perf_counter() - t_start
                    self.checkpoint()
                again = f"continue with: scalevec train --resume --out {self.out}"
                if term:
                    raise Preempted(f"SIGTERM: stopped after step {self.step}" + (
                        f" with a checkpoint; {again}" if layout.checkpoint_dirs(self.out) else
                        f" before any checkpoint; {again} (starts at step 0)"))
                if self.write:
                    print(f"interrupted after step {self.step}; {again}" if self.step > 0 else
                          f"interrupted before the first step; {again} (starts at step 0)", file=sys.stderr, flush=True)
                raise KeyboardInterrupt
            step = self.step
            t0, c0 = time.perf_counter(), time.process_time()
            loss, aux, grad_norm = self.train_step(step)
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
            self.step = step + 1
            evaluates = self.step % t.eval_every == 0 or self.step == self.steps
            ev = StepEvent(step, self.step, loss, aux, grad_norm,
                           self.cfg.optim.lr * lr_multiplier(step, self.steps, self.cfg.schedule), per_step, dt, cpu,
                           elapsed=time.perf_counter() - t_start,
                           logged=step % t.log_every == 0 or self.step == self.steps, evaluates=evaluates,
                           group_lrs=group_lrs(self.optimizers))
            for m in self.monitors:
                m.after_step(ev)
            if evaluates:
                val_loss, val_bpb = self.evaluate()
                self.guard.check_eval(self.step, val_loss)
                self.best_val = min(self.best_val, val_loss)
                for m in self.monitors:
                    m.after_eval(EvalEvent(self.step, val_loss, val_bpb))
            if overdue or (t.ckpt_every and self.step % t.ckpt_every == 0) or self.step in (end, self.steps):
                self.elapsed = time.perf_counter() - t_start
                self.checkpoint()
                saved, saved_at = self.step, time.perf_counter()


def train(cfg: RunConfig, out_dir: str | Path, resume: bool = False, overwrite: bool = False,
          stop_at: int | None = None, quiet: bool = False, init: init_from.InitFrom | None = None,
          monitors: Sequence[Monitor] | None = None) -> dict:
    """Train one run into ``out_dir`` and return its summary (see ``Trainer``; ``monitors``: its monitors).

    Raises ``ValueError`` / ``FileNotFoundError`` / ``FileExistsError`` for bad input (before anything is
    written), ``rundir.RunDirError`` (a ``ValueError``) for an unusable or locked run directory,
    ``TrainingDiverged`` when the health guard stops the run, ``TrainingFailed`` for an ``OSError`` during
    training (a full disk) and ``Preempted`` after SIGTERM; the last three leave a resumable run.
    """
    threads = torch.get_num_threads()  # train.threads applies to this run only, not to the caller after it
    try:
        trainer = Trainer(cfg, out_dir, resume=resume, overwrite=overwrite, quiet=quiet, init=init, monitors=monitors)
        try:
            return trainer.fit(stop_at=stop_at)
        finally:
            try:
                trainer.close_monitors()
            finally:
                distributed.teardown(trainer.dist)
    finally:
        torch.set_num_threads(threads)


# TrainingDiverged, TrainingFailed and the blow-up constants are part of this module's interface (command.py, tests)
__all__ = ["BLOWUP_RATIO", "BLOWUP_STEPS", "CKPT_MINUTES", "Trainer", "TrainingDiverged", "TrainingFailed",
           "check_target", "train"]
