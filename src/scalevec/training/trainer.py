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

Run directory (its layout and readers: ``rundir``): ``config.yaml``, ``meta.json`` (``environment``),
``optim_groups.txt``, ``metrics.jsonl`` (with ``telemetry``), ``summary.json``, ``tokenizer/``,
``checkpoints/step_XXXXXXX/`` + ``checkpoints/latest``, ``DONE``. The command line: ``command``.
"""

from __future__ import annotations

import math
import os
import signal
import statistics
import sys
import threading
import time
from collections import deque
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

from scalevec.config import (
    RunConfig,
    checkpoint_blocks,
    config_diff,
    fit_vocab,
    format_diff,
    run_tokens,
    save_yaml,
    to_dict,
    tokens_per_step,
    total_steps,
)
from scalevec.data.corpus import prepare_data
from scalevec.data.sampler import TrainSampler, val_batches
from scalevec.model.flops import flops_per_token, peak_flops
from scalevec.model.params import count_params
from scalevec.model.transformer import build_model
from scalevec.training import autocompile, distributed, init_from, rundir, tracking
from scalevec.training.checkpoint import load_checkpoint, save_checkpoint
from scalevec.training.environment import run_meta
from scalevec.training.optim import build_optimizers, group_table, param_groups, set_lr
from scalevec.training.rundir import CKPT_DIR, RunDirError, check_out_dir, write_json
from scalevec.training.schedule import lr_multiplier, warmup_warning
from scalevec.training.step import accumulate_gradients
from scalevec.training.telemetry import moe_stats, scale_stats


class TrainingDiverged(RuntimeError):
    """The health guard stopped the run (non-finite loss or gradient norm, a dead model, a loss spike);
    ``DIVERGED`` records the step and reason, and the checkpoint from before the trouble is kept."""


class TrainingFailed(RuntimeError):
    """Training could not go on (an ``OSError`` such as a full disk while writing); the run resumes
    from its last checkpoint with ``--resume`` once the cause is fixed."""


class Preempted(RuntimeError):
    """SIGTERM (how SLURM and Kubernetes preempt): a checkpoint was written at the step boundary."""


@contextmanager
def deferred_sigint(enabled: bool = True, sigint: bool = True):
    """Within the block, a first Ctrl-C only sets ``flag["set"]`` and SIGTERM sets ``flag["term"]``
    (both checked between steps, so a step is never cut in half); a second Ctrl-C interrupts at once.
    Off outside the main thread or when disabled; SIGINT is left alone when ``sigint`` is false or when
    someone else handles it."""
    flag = {"set": False, "term": False}
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def on_int(signum, frame):
        if flag["set"]:
            signal.default_int_handler(signum, frame)
        flag["set"] = True

    def on_term(signum, frame):
        flag["term"] = True

    own_int = sigint and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    old_term = signal.getsignal(signal.SIGTERM)
    if own_int:
        signal.signal(signal.SIGINT, on_int)
    signal.signal(signal.SIGTERM, on_term)
    try:
        yield flag
    finally:
        if own_int:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, old_term)


# ----------------------------------------------------------------------------------------- the trainer


class Trainer:
    """Builds everything for one run and trains it; see the module docstring for the contract."""

    def __init__(self, cfg: RunConfig, out_dir: str | Path, resume: bool = False, overwrite: bool = False,
                 quiet: bool = False, init: init_from.InitFrom | None = None):
        self.init = init  # --init-from: a Hugging Face model or a parent run (init_from.py)
        self.cfg, self.out, self.resume, self.quiet = cfg, Path(out_dir), resume, quiet
        self.overwrite = overwrite
        self.steps = total_steps(cfg)
        check_out_dir(self.out, resume, overwrite)
        tracking.check(cfg.train.tracker)  # a missing optional package fails before anything is written
        self.lock = rundir.RunLock(self.out)

        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        self.dist = distributed.setup(cfg.train)
        self.device = self.dist.device
        self.rank, self.world = self.dist.rank, self.dist.world_size
        if self.out.is_dir():
            self._lock()  # a second writer is refused at once, before any work
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
        # the stored config.yaml holds the grown vocabulary (config.fit_vocab: a preset's is a default)
        cfg.model.vocab_size = fit_vocab(cfg, self.data.tokenizer.vocab_size).model.vocab_size
        if resume:
            diff = config_diff(rundir.load_config(self.out), cfg)
            if diff:
                raise ValueError(f"--resume with a config that differs from {self.out}/config.yaml in: "
                                 f"{format_diff(diff)}; "
                                 f"resume with the stored config (scalevec train --resume --out {self.out})")
        self.sampler = TrainSampler(self.data.train, t.seq_len, t.batch_size, seed=t.seed)
        self.val, self.val_bytes = val_batches(self.data, t.seq_len, cfg.data.val_tokens, t.eval_batch_size)
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
            if self.rank == 0 and not quiet:
                print(f"init-from: optimizer state {init.info['optimizer']}; schedule {init.schedule_from} "
                      f"(first step {init.start_step})", flush=True)
        cuda_bf16 = self.device.type == "cuda" and t.dtype != "float32"
        self.autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if cuda_bf16
                         else torch.autocast("cpu", dtype=torch.bfloat16) if t.dtype == "bfloat16" else nullcontext())
        self.step = init.start_step if init is not None else 0
        self.best_val = math.inf
        self.elapsed = 0.0  # seconds of training before this session (restored on resume)
        self.write = self.rank == 0
        self.recent: deque[float] = deque(maxlen=t.guard_spike_window)  # the health guard's state (saved)
        self.dead_run = 0
        # temporary checkpoint names carry rank 0's PID (every rank writes into the same directory)
        self.tmp_tag = os.getpid() if self.world == 1 else int(distributed.all_reduce_sum(
            torch.tensor(float(os.getpid() if self.rank == 0 else 0), dtype=torch.float64, device=self.device)).item())
        self.compiled, self.compile_why = autocompile.resolve(t.compile, self.device, self.steps, t.sharpness_every > 0)
        # the mfu / flops_per_s metrics (issue 17): FLOPs per token from the config, a peak resolved once
        self.flops_per_token = flops_per_token(cfg.model, t.seq_len)
        self.peak_flops = None
        if self.write:
            mm_dtype = torch.bfloat16 if self.device.type == "cuda" and t.dtype != "float32" else torch.float32
            self.peak_flops, self.peak_source = peak_flops(self.device, mm_dtype, t.peak_flops)

    # -- lifecycle ------------------------------------------------------------------------------------

    def _lock(self) -> None:
        """Rank 0 takes the run directory's lock (``rundir.RunLock``); all ranks fail together if it cannot."""
        err = None
        if self.rank == 0:
            try:
                self.lock.acquire()
            except RunDirError as e:
                err = e
            except OSError as e:
                err = RunDirError(f"cannot create the lock file {self.lock.path} ({e.strerror}); choose a writable "
                                  "--out")
        if self.world > 1:
            failed = distributed.all_reduce_sum(torch.tensor(float(err is not None), device=self.device)).item()
            if failed and err is None:
                err = rundir.RunLocked(f"{self.out} is in use by another process (rank 0 could not lock it)")
        if err is not None:
            raise err

    def release(self) -> None:
        """Release the run directory's lock (``fit`` and ``train`` do it when they end)."""
        self.lock.release()

    def notice(self, msg: str) -> None:
        """A line on stderr from rank 0, even with --quiet (skipped checkpoints, repaired metrics)."""
        if self.write:
            print(f"note: {msg}", file=sys.stderr, flush=True)

    def setup_run_dir(self) -> None:
        """Lock the run directory, check it again under the lock (a run that appeared meanwhile is never
        touched), then resume from its newest intact checkpoint (from step 0 when it has none), or write a
        new run (``--overwrite`` first empties a scalevec run directory, and nothing else). An unusable
        target (read-only, full disk) is a one-line ``RunDirError``, exit 2. Rank 0 does the writing; every
        rank fails together if it fails."""
        err, ckpt = None, None
        if self.write:
            try:
                ckpt = self._prepare_run_dir()
            except (ValueError, OSError) as e:
                err = e
        if self.world > 1:
            failed = distributed.all_reduce_sum(torch.tensor(float(err is not None), device=self.device)).item()
            if failed and err is None:
                err = RunDirError(f"rank 0 could not prepare the run directory {self.out} (see its error)")
        if isinstance(err, OSError) and not isinstance(err, (FileExistsError, FileNotFoundError, NotADirectoryError)):
            raise RunDirError(f"cannot write the run directory: {err.filename or self.out}: {err.strerror or err}; "
                              f"choose a writable --out with free space") from None
        if err is not None:
            raise err
        if self.resume and not self.write:
            ckpt, _ = rundir.resumable_checkpoint(self.out)
        if ckpt is not None:
            self.load(ckpt)
        distributed.barrier()

    def _prepare_run_dir(self) -> Path | None:
        """Rank 0's part of ``setup_run_dir``; returns the checkpoint to resume from (or None)."""
        self.out.mkdir(parents=True, exist_ok=True)
        self.lock.acquire()
        check_out_dir(self.out, self.resume, self.overwrite)  # again, now that no other writer can change it
        for name in rundir.clean_temporaries(self.out):
            self.notice(f"removed {name}, a temporary file left by an interrupted writer")
        if self.resume:
            ckpt, skipped = rundir.resumable_checkpoint(self.out)
            for line in skipped:
                self.notice(f"skipped checkpoint {line}")
            if ckpt is not None:
                if skipped:
                    self.notice(f"resuming from {ckpt.name}, the newest intact checkpoint")
                return ckpt
            self.notice(f"{self.out} has no intact checkpoint; training it from step 0")
            rundir.rewrite_metrics(self.out, keep=lambda r: False)
        elif rundir.is_run(self.out):  # --overwrite (check_out_dir passed): empty this scalevec run, nothing else
            rundir.remove_run(self.out)
        save_yaml(self.cfg, self.out / "config.yaml")
        write_json(self.out / "meta.json",
                   {**run_meta(self.cfg), **({"init_from": self.init.info} if self.init else {})})
        rundir.write_atomic(self.out / "optim_groups.txt", group_table(self.groups) + "\n")
        self.data.tokenizer.save(self.out / "tokenizer")
        return None

    def load(self, ckpt: Path) -> None:
        state = load_checkpoint(ckpt, self.model, self.optimizers, self.device, verified=True)
        self.step = state["step"]
        self.best_val = state["extra"].get("best_val", math.inf)
        self.elapsed = state["extra"].get("elapsed_s", 0.0)
        guard = state["extra"].get("guard") or {}
        self.recent.extend(guard.get("recent", []))
        self.dead_run = guard.get("dead_run", 0)
        if self.write:  # metrics past the checkpoint belong to a lost future: drop them
            self.truncate_metrics(self.step)

    def truncate_metrics(self, step: int) -> None:
        """Drop the metrics rows past ``step`` (and a cut-off last line, with a notice)."""
        # train rows are numbered by the step taken, eval rows by the steps completed
        rundir.rewrite_metrics(self.out,
                               keep=lambda r: r["step"] < step or (r["kind"] != "train" and r["step"] == step),
                               notice=self.notice)

    def log(self, row: dict) -> None:
        if self.write:
            rundir.append_metrics(self.out, row)
            self.track(row)

    def track(self, row: dict) -> None:
        """Forward a metrics row to ``train.tracker`` (tracking.py), opened at the first row (rank 0 only)."""
        if self.cfg.train.tracker == "none":
            return
        if getattr(self, "tracker", None) is None:
            self.tracker = tracking.open_tracker(self.cfg.train.tracker, self.out, to_dict(self.cfg),
                                                 start_step=int(row.get("step", 0)))
        self.tracker.log(row)

    def close_tracker(self) -> None:
        if getattr(self, "tracker", None) is not None:
            self.tracker.close()
            self.tracker = None

    def say(self, msg: str) -> None:
        if self.write and not self.quiet:
            print(msg, flush=True)

    # -- the step ---------------------------------------------------------------------------------------

    def train_step(self, step: int) -> tuple[float, float, float]:
        """One optimizer step; returns (loss in nats/token over the global batch, aux loss, grad norm)."""
        set_lr(self.optimizers, lr_multiplier(step, self.steps, self.cfg.schedule))
        x, y = self.sampler.batch(step, self.rank, self.world)
        x, y = x.to(self.device), y.to(self.device)
        micro = [(x[i:i + self.micro], y[i:i + self.micro]) for i in range(0, self.local_batch, self.micro)]
        loss, aux = accumulate_gradients(self.wrapped, micro, self.autocast)
        clip = self.cfg.optim.grad_clip
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip if clip > 0 else float("inf"))
        if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor
            grad_norm = grad_norm.full_tensor()
        stats = torch.stack([loss, aux, grad_norm.float().to(loss.device)]).tolist()
        self.guard(step, stats)
        for opt in self.optimizers:
            opt.step()
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        return stats[0], stats[1], stats[2]

    def guard(self, step: int, stats: list[float]) -> None:
        """The health guard, before the optimizer step (DESIGN.md §8). Stops the run (``diverge``) on a
        non-finite loss or gradient norm; on a dead model, ``train.guard_dead_steps`` steps in a row at
        the uniform loss ln(vocab) (relative 1e-4) with a gradient norm <= 1e-6 (what an lr that blew
        the model up leaves: nothing can be learnt any more); and on a loss spike, a loss above both
        ``train.guard_spike_ratio`` x the mean of the last ``train.guard_spike_window`` losses and that
        mean + 6 std (OLMo-core's stability monitor flags mean + k std; the ratio keeps ordinary noise
        and early-training drops far from the threshold). Every rank sees the same global figures."""
        t = self.cfg.train
        loss, grad_norm = stats[0], stats[2]
        if not all(math.isfinite(v) for v in stats):
            self.diverge(step, step, f"non-finite loss or gradient norm at step {step} (loss {loss}, grad norm "
                                     f"{grad_norm})", "lower the lr or raise the warmup")
        uniform = math.log(self.cfg.model.vocab_size)
        self.dead_run = self.dead_run + 1 if abs(loss - uniform) <= 1e-4 * uniform and grad_norm <= 1e-6 else 0
        if t.guard_dead_steps and self.dead_run >= t.guard_dead_steps:
            first = step - self.dead_run + 1
            self.diverge(step, first, f"dead model at step {step}: loss {loss:.4f} = ln({self.cfg.model.vocab_size}) "
                                      f"with gradient norm {grad_norm:.1e} for {self.dead_run} steps "
                                      f"since step {first}",
                         "lower the lr or raise the warmup")
        if t.guard_spike_ratio and len(self.recent) == self.recent.maxlen:
            mean, std = statistics.fmean(self.recent), statistics.pstdev(self.recent)
            if loss > t.guard_spike_ratio * mean and loss > mean + 6 * std:
                self.diverge(step, step, f"loss spike at step {step}: {loss:.4f}, {loss / mean:.1f}x the mean "
                                         f"{mean:.4f} "
                                         f"of the last {len(self.recent)} steps",
                             "lower the lr or raise the warmup (or raise train.guard_spike_ratio)")
        self.recent.append(loss)

    def diverge(self, step: int, first_bad: int, reason: str, fix: str) -> None:
        """Write ``DIVERGED`` naming the newest intact checkpoint from before step ``first_bad`` (and point
        ``checkpoints/latest`` at it), then raise ``TrainingDiverged``."""
        kept = None
        if self.write:
            ckpt, _ = rundir.resumable_checkpoint(self.out, before=first_bad)  # checkpoint N = the model used at step N
            kept = ckpt.name if ckpt is not None else None
            rundir.mark_diverged(self.out, step, first_bad, reason, kept)
            if kept:
                rundir.write_atomic(self.out / CKPT_DIR / rundir.LATEST, kept)
        where = (f"the checkpoint from before it is kept: {self.out / CKPT_DIR / kept}" if kept else
                 f"no checkpoint from before step {first_bad} was written (rerun with --overwrite)")
        raise TrainingDiverged(f"{reason}: {fix}; {where}; {self.out / rundir.DIVERGED} records it")

    @torch.no_grad()
    def evaluate(self) -> tuple[float, float]:
        """Validation loss in nats/token and bits-per-byte over the fixed validation set."""
        self.wrapped.eval()
        ce_sum = torch.zeros((), device=self.device, dtype=torch.float64)
        n = torch.zeros((), device=self.device, dtype=torch.float64)
        mine = self.val[self.rank::self.world]
        for i in range(-(-len(self.val) // self.world)):  # the same number of forwards on every rank (FSDP2
            x, y = mine[i] if i < len(mine) else self.val[0]  # all-gathers in each); a spare one is not counted
            with self.autocast:
                ce, cnt, _ = self.wrapped(x.to(self.device), y.to(self.device))
            if i < len(mine):
                ce_sum += ce.double()
                n += cnt
        ce_sum, n = distributed.all_reduce_sum(ce_sum), distributed.all_reduce_sum(n)
        self.wrapped.train()
        loss = (ce_sum / n).item()
        return loss, ce_sum.item() / (math.log(2) * self.val_bytes)

    # -- the loop ---------------------------------------------------------------------------------------

    def fit(self, stop_at: int | None = None) -> dict:
        """Train to the end (or until ``stop_at`` steps are done, for tests and preemption); return the summary."""
        try:
            return self._fit(stop_at)
        finally:
            self.release()

    def _fit(self, stop_at: int | None) -> dict:
        if self.resume and rundir.is_done(self.out):
            self.say(f"{self.out} is already finished; nothing to resume")
            return rundir.read_json(self.out / rundir.SUMMARY, fix="retrain the run with --overwrite")
        self.setup_run_dir()
        try:
            return self._train(stop_at)
        except OSError as e:  # a full disk, a read-only remount, a vanished mount: the run stays resumable
            ckpts = rundir.checkpoint_dirs(self.out)
            last = (f"its last checkpoint is {ckpts[0].name}" if ckpts else
                    "it has no checkpoint yet (resumes from step 0)")
            raise TrainingFailed(f"cannot write {e.filename or self.out} at step {self.step}: {e.strerror or e}; "
                                 f"free space or fix the filesystem, then continue with: scalevec train --resume "
                                 f"--out {self.out} ({last})") from None

    def _train(self, stop_at: int | None) -> dict:
        per_step = tokens_per_step(self.cfg)
        end = min(self.steps, stop_at) if stop_at is not None else self.steps
        note = warmup_warning(self.steps, self.cfg.schedule)
        if note and self.step == 0 and self.write:
            print(f"warning: {note}", file=sys.stderr, flush=True)
        if self.step == 0 and self.write:
            self.say(f"run {self.out} · {self.cfg.preset} · {self.cfg.strategy} · {self.model.num_params():,} params · "
                     f"{self.steps} steps × {per_step:,} tokens · {self.world} process(es) on {self.device}")
            self.say(group_table(self.groups))
            self.say(f"compile: {'on' if self.compiled else 'off'} ({self.compile_why})")
        bar = None
        if self.write and not self.quiet and sys.stderr.isatty():
            from tqdm import tqdm

            bar = tqdm(total=end, initial=self.step, unit="step", dynamic_ncols=True)
        t_start = time.perf_counter() - self.elapsed
        self.wrapped.train()
        with deferred_sigint(True, sigint=self.world == 1) as interrupt:
            self._fit_loop(end, t_start, bar, interrupt)
        if bar is not None:
            bar.close()
        if self.step < self.steps:
            return {"stopped_at": self.step}
        summary = self.summary(time.perf_counter() - t_start)
        if self.write:
            write_json(self.out / rundir.SUMMARY, summary)
            rundir.mark_done(self.out)
            self.say(f"done: val_loss {summary['final_val_loss']:.4f} nats/token, {summary['final_val_bpb']:.4f} "
                     "bits/byte")
        distributed.barrier()
        return summary

    def _fit_loop(self, end: int, t_start: float, bar, interrupt: dict) -> None:
        """The steps of ``fit``. On Ctrl-C (``interrupt["set"]``) it checkpoints the completed steps and
        raises ``KeyboardInterrupt``; on SIGTERM (``interrupt["term"]``, agreed by every rank) it does the
        same and raises ``Preempted``; ``--resume`` continues from there, bit for bit."""
        t = self.cfg.train
        per_step = tokens_per_step(self.cfg)
        saved = self.step
        while self.step < end:
            term = interrupt["term"]
            if self.world > 1:
                term = distributed.all_reduce_sum(torch.tensor(float(term), device=self.device)).item() > 0
            if term:
                if self.step > saved:
                    self.elapsed = time.perf_counter() - t_start
                    self.checkpoint()
                raise Preempted(f"SIGTERM: stopped after step {self.step}"
                                + (f" with a checkpoint; continue with: scalevec train --resume --out {self.out}"
                                   if rundir.checkpoint_dirs(self.out) else
                                   f" before any checkpoint; continue with: scalevec train --resume --out {self.out} "
                                   f"(starts at step 0)"))
            if interrupt["set"]:
                if self.step > saved:
                    self.elapsed = time.perf_counter() - t_start
                    self.checkpoint()
                if self.write:
                    print(f"interrupted after step {self.step}; continue with: scalevec train --resume --out {self.out}"
                          if self.step > 0 else f"interrupted before the first step; continue with: scalevec train "
                                                f"--resume --out {self.out} (starts at step 0)",
                          file=sys.stderr, flush=True)
                raise KeyboardInterrupt
            step = self.step
            t0, c0 = time.perf_counter(), time.process_time()
            loss, aux, grad_norm = self.train_step(step)
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
            self.step = step + 1
            if step % t.log_every == 0 or self.step == self.steps:
                row = {"kind": "train", "step": step, "tokens": self.step * per_step,
                       "lr": self.cfg.optim.lr * lr_multiplier(step, self.steps, self.cfg.schedule), "loss": loss,
                       "grad_norm": grad_norm, "tok_per_s": per_step / dt, "step_time": dt,
                       # process CPU seconds of the step (all threads): comparable on a loaded machine
                       "cpu_time": cpu, "flops_per_s": self.flops_per_token * per_step / dt,
                       "mfu": self.flops_per_token * per_step / dt / self.peak_flops if self.peak_flops else None,
                       "scales": scale_stats(self.model)}
                if self.cfg.model.moe is not None:
                    row["aux_loss"] = aux
                    row["moe"] = moe_stats(self.model)
                self.log(row)
                if bar is None:
                    self.say(f"step {step:>6} loss {loss:.4f} lr {row['lr']:.2e} grad {grad_norm:.3f} "
                             f"{row['tok_per_s']:,.0f} tok/s")
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}")
            if self.step % t.eval_every == 0 or self.step == self.steps:
                val_loss, val_bpb = self.evaluate()
                self.best_val = min(self.best_val, val_loss)
                self.log({"kind": "eval", "step": self.step, "tokens": self.step * per_step,
                          "val_loss": val_loss, "val_bpb": val_bpb})
                if bar is None:
                    self.say(f"step {self.step:>6} val_loss {val_loss:.4f} val_bpb {val_bpb:.4f}")
            self.probe()
            if (t.ckpt_every and self.step % t.ckpt_every == 0) or self.step in (end, self.steps):
                self.elapsed = time.perf_counter() - t_start
                self.checkpoint()
                saved = self.step

    def probe(self) -> None:
        """Theory probes (DESIGN.md §4), off by default: every ``probe_every`` steps the preconditioner
        spectrum each scale vector induces and the column norms it acts on; every ``sharpness_every``
        steps the top Hessian eigenvalue of the loss on the first validation batch (power iteration, 20
        Hessian-vector products; see ``theory.sharpness``). Logged as ``kind: probe`` rows."""
        t = self.cfg.train
        row = {}
        if t.probe_every and self.step % t.probe_every == 0 and self.write:
            from scalevec.training.probes import probe_scales

            row["norms"] = probe_scales(self.model)
        if t.sharpness_every and self.step % t.sharpness_every == 0 and self.write:
            from scalevec.training.probes import batch_loss, sharpness

            x, y = self.val[0]
            row["sharpness"] = sharpness(self.model, batch_loss(x.to(self.device), y.to(self.device)), n_iters=20)
            row["sharpness_iters"] = 20
        if row:
            self.log({"kind": "probe", "step": self.step, "tokens": self.step * tokens_per_step(self.cfg), **row})

    def checkpoint(self) -> None:
        # every rank: DCP writes each rank's shards; rank 0 writes the rest (checkpoint.py)
        save_checkpoint(self.out, self.step, self.model, self.optimizers,
                        {"best_val": self.best_val, "elapsed_s": self.elapsed,
                         "guard": {"recent": list(self.recent), "dead_run": self.dead_run}},
                        tag=self.tmp_tag, keep_window=max(self.cfg.train.guard_dead_steps, 1))

    def summary(self, wall: float) -> dict:
        """Final figures; read back from metrics.jsonl so that a resumed run reports the whole run.
        ``step_time_s`` is the median time of the logged training steps after the first 5 (warm-up)."""
        rows = rundir.read_metrics(self.out) if self.write else []
        evals = [r for r in rows if r["kind"] == "eval"]
        times = [r["step_time"] for r in rows if r["kind"] == "train" and r["step"] >= 5]
        cpu_times = [r["cpu_time"] for r in rows if r["kind"] == "train" and r["step"] >= 5 and "cpu_time" in r]
        final = evals[-1] if evals else {"val_loss": math.nan, "val_bpb": math.nan}
        counts = count_params(self.model)
        return {
            "preset": self.cfg.preset, "strategy": self.cfg.strategy, "optimizer": self.cfg.optim.name,
            "schedule": self.cfg.schedule.name, "lr": self.cfg.optim.lr, "seed": self.cfg.train.seed,
            "final_val_loss": final["val_loss"], "final_val_bpb": final["val_bpb"],
            "best_val_loss": min((e["val_loss"] for e in evals), default=math.nan),
            "steps": self.steps, "tokens": run_tokens(self.cfg),
            "wall_time_s": wall, "step_time_s": statistics.median(times) if times else math.nan,
            "cpu_time_s": statistics.median(cpu_times) if cpu_times else math.nan,
            "compiled": self.compiled, "peak_flops": self.peak_flops,
            "params": counts["params"], "non_embedding_params": counts["non_embedding_params"],
            "active_params": counts["active_params"], "scale_params": counts["scale_params"],
            "world_size": self.world,
        }


def train(cfg: RunConfig, out_dir: str | Path, resume: bool = False, overwrite: bool = False,
          stop_at: int | None = None, quiet: bool = False, init: init_from.InitFrom | None = None) -> dict:
    """Train one run into ``out_dir`` and return its summary (see ``Trainer``).

    Raises ``ValueError`` / ``FileNotFoundError`` / ``FileExistsError`` for bad input (before anything is
    written), ``rundir.RunDirError`` (a ``ValueError``) for an unusable or locked run directory,
    ``TrainingDiverged`` when the health guard stops the run, ``TrainingFailed`` for an ``OSError`` during
    training (a full disk) and ``Preempted`` after SIGTERM; the last three leave a resumable run.
    """
    threads = torch.get_num_threads()  # train.threads applies to this run only, not to the caller after it
    try:
        trainer = Trainer(cfg, out_dir, resume=resume, overwrite=overwrite, quiet=quiet, init=init)
        try:
            return trainer.fit(stop_at=stop_at)
        finally:
            trainer.close_tracker()
            distributed.teardown(trainer.dist)
    finally:
        torch.set_num_threads(threads)


