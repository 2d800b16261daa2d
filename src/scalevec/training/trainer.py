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

from scalevec.config import RunConfig, checkpoint_blocks
from scalevec.config_codec import config_diff, format_diff, to_dict
from scalevec.data.corpus import prepare_data
from scalevec.data.sampler import TrainSampler, val_batches
from scalevec.model.flops import flops_per_token, peak_flops
from scalevec.model.params import count_params
from scalevec.model.transformer import build_model
from scalevec.resolve import fit_vocab
from scalevec.run_budget import run_tokens, tokens_per_step, total_steps
from scalevec.training import autocompile, distributed, init_from, rundir, tracking
from scalevec.training.checkpoint import layout
from scalevec.training.checkpoint.integrity import resumable_checkpoint
from scalevec.training.checkpoint.save_load import point_latest, resume_checkpoint, save_checkpoint, writer_tag
from scalevec.training.environment import run_meta
from scalevec.training.exits import Preempted
from scalevec.training.optim import build_optimizers, group_table, param_groups, set_lr
from scalevec.training.rundir import RunDirError, check_out_dir
from scalevec.training.schedule import lr_multiplier, warmup_warning
from scalevec.training.step import accumulate_gradients
from scalevec.training.telemetry import ScaleTelemetry, moe_stats


class TrainingDiverged(RuntimeError):
    """The health guard stopped the run (non-finite loss or gradient norm, a loss blow-up, a dead model,
    a loss spike); ``DIVERGED`` records the step and reason, and the checkpoint from before the trouble
    is kept."""


class TrainingFailed(RuntimeError):
    """Training could not go on (an ``OSError`` such as a full disk while writing); the run resumes
    from its last checkpoint with ``--resume`` once the cause is fixed."""


# The blow-up rule of the health guard (always on, like the non-finite check). A model can always reach
# the uniform-prediction loss ln(V): a fresh model starts there (tiny: 5.53-5.56 at step 0 for ln 256 =
# 5.545) and training only lowers it. A loss of BLOWUP_RATIO x ln(V) gives the targets a geometric-mean
# probability of V^-3, V^2 times less than guessing uniformly: the weights blew up (lr 10 on tiny:
# 500-2500 nats from step 1), it is never a healthy state. One training batch can still be far off (a confident
# model on a batch of garbage bytes), hence BLOWUP_STEPS steps in a row; the validation loss averages
# the whole held-out set, so one evaluation above the threshold is enough. The reference is the larger
# of ln(V) and the run's first loss, so that an unusual initialisation that starts above uniform is
# judged against where it started. Healthy runs stay at or below ln(V) and never come near 3 ln(V).
BLOWUP_RATIO = 3.0
BLOWUP_STEPS = 5


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


def check_target(out: Path, resume: bool, overwrite: bool) -> None:
    """``rundir.check_out_dir``, with the way on named for a run that cannot be resumed: a finished run
    (``DONE``: extend it as a branch, ``--init-from RUN --schedule-from continue``) or a diverged one
    (``DIVERGED``: a result). Raises as ``check_out_dir``; the refusal of an existing run is always a
    ``FileExistsError`` saying that ``out`` already holds a run."""
    try:
        check_out_dir(out, resume, overwrite)
    except FileExistsError:
        if resume or overwrite or not rundir.is_run(out):
            raise
        if rundir.is_done(out):
            raise FileExistsError(
                f"{out} already holds a run, and it is finished (DONE), so --resume has nothing left to do; to "
                f"train it further branch it into a new --out: scalevec train --init-from {out} --schedule-from "
                f"continue --steps N --out NEW (N beyond its steps); or pass --overwrite to replace it, or choose "
                f"a new --out") from None
        if (out / rundir.DIVERGED).exists():
            raise FileExistsError(
                f"{out} already holds a run, and it diverged (DIVERGED), so --resume would refuse it; it is kept as "
                f"a result: choose a new --out (with a lower lr), or pass --overwrite to replace it") from None
        raise


# ----------------------------------------------------------------------------------------- the trainer


class Trainer:
    """Builds everything for one run and trains it; see the module docstring for the contract."""

    def __init__(self, cfg: RunConfig, out_dir: str | Path, resume: bool = False, overwrite: bool = False,
                 quiet: bool = False, init: init_from.InitFrom | None = None):
        self.init = init  # --init-from: a Hugging Face model or a parent run (init_from.py)
        self.cfg, self.out, self.resume, self.quiet = cfg, Path(out_dir), resume, quiet
        self.overwrite = overwrite
        self.steps = total_steps(cfg)
        check_target(self.out, resume, overwrite)
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
        # the stored config.yaml holds the grown vocabulary (resolve.fit_vocab: a preset's is a default)
        cfg.model.vocab_size = fit_vocab(cfg, self.data.tokenizer.vocab_size).model.vocab_size
        if resume:
            diff = config_diff(rundir.load_config(self.out), cfg)
            if diff:
                raise ValueError(f"--resume with a config that differs from {self.out / rundir.CONFIG} in: "
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
        self.telemetry = ScaleTelemetry(self.model, self.roles).attach(  # per-vector metrics on logged steps
            self.optimizers, due=lambda: self.step % t.log_every == 0 or self.step + 1 == self.steps)
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
        self.high_run = 0  # steps in a row above the blow-up threshold
        self.bad_since: int | None = None  # first step of the current run of unhealthy steps (None: healthy)
        self.reference: float | None = None  # the blow-up rule's reference: max(ln V, the run's first loss)
        # temporary checkpoint names carry rank 0's PID (every rank writes into the same directory)
        self.tmp_tag = writer_tag()
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
        touched), then resume from its newest checkpoint that loads (``checkpoint.resume_checkpoint``: a
        damaged one, or one that does not load, is skipped with a note; from step 0 when none is left), or
        write a new run (``--overwrite`` first empties a scalevec run directory, and nothing else, naming
        what it leaves). An unusable target (read-only, full disk) is a one-line ``RunDirError``, exit 2.
        Rank 0 does the writing; every rank fails together if it fails."""
        self._rank0_writes(self._prepare_run_dir)
        if self.resume:
            state = resume_checkpoint(self.out, self.model, self.optimizers, self.device, notice=self.notice)
            if state is not None:
                self.load(state)
                # metrics past the checkpoint belong to a lost future: drop them
                self._rank0_writes(lambda: self.truncate_metrics(self.step))
            else:
                self._rank0_writes(self._restart_run_dir)
        distributed.barrier()

    def _rank0_writes(self, work) -> None:
        """Run ``work`` (writes into the run directory) on rank 0 and agree on its outcome: every rank raises
        when it failed; an ``OSError`` (read-only, full disk) becomes a one-line ``RunDirError``."""
        err = None
        if self.write:
            try:
                work()
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

    def _prepare_run_dir(self) -> None:
        """Rank 0's part of ``setup_run_dir`` before a checkpoint is chosen: lock, check again, remove dead
        writers' temporaries; for a new run, empty the target (``--overwrite``) and write the run files."""
        self.out.mkdir(parents=True, exist_ok=True)
        self.lock.acquire()
        check_target(self.out, self.resume, self.overwrite)  # again, now that no other writer can change it
        for name in rundir.clean_temporaries(self.out) + layout.clean_temporaries(self.out):
            self.notice(f"removed {name}, a temporary file left by an interrupted writer")
        if self.resume:
            return  # setup_run_dir resumes through resume_checkpoint (every rank), or restarts the run
        if self.overwrite and any(p.name != rundir.LOCK for p in self.out.iterdir()):
            # check_target passed: a scalevec run (or a set-up interrupted before config.yaml); empty it,
            # naming what scalevec did not write (it stays)
            rundir.remove_run(self.out, notice=self.notice)
        self._write_run_files()

    def _restart_run_dir(self) -> None:
        """Rank 0: a resumed run without a checkpoint that loads trains from step 0: its metrics are dropped
        and its run files written anew."""
        self.notice(f"{self.out} has no intact checkpoint; training it from step 0")
        rundir.rewrite_metrics(self.out, keep=lambda r: False, notice=self.notice)
        self._write_run_files()

    def _write_run_files(self) -> None:
        """``rundir.write_run_files``: meta (with the compile decision, which changes the last bits of the losses,
        the ``--init-from`` source and the validation split's record, ``split.SplitRecord``: which documents are
        validation), config, group table, tokenizer."""
        split = self.data.meta.get("validation")
        rundir.write_run_files(self.out, {**run_meta(self.cfg), "compiled": self.compiled,
                                          "compile_why": self.compile_why,
                                          **({"validation_split": split} if split else {}),
                                          **({"init_from": self.init.info} if self.init else {})},
                               self.cfg, group_table(self.groups), self.data.tokenizer)

    def load(self, state: dict) -> None:
        """Restore the trainer from a loaded checkpoint's train state (``resume_checkpoint`` loaded the
        model, optimizer and RNG states): step, best validation loss, time so far, the guard's state. The
        step is the checkpoint's and within the run's steps (``integrity`` skips a checkpoint that is not)."""
        self.step = state["step"]
        self.best_val = state["extra"].get("best_val", math.inf)
        self.elapsed = state["extra"].get("elapsed_s", 0.0)
        guard = state["extra"].get("guard") or {}
        self.recent.extend(guard.get("recent", []))
        self.dead_run = guard.get("dead_run", 0)
        self.high_run = guard.get("high_run", 0)
        self.bad_since = guard.get("bad_since")
        # a checkpoint from before the blow-up rule: judge against ln V (its first loss is not known)
        self.reference = guard.get("reference") or math.log(self.cfg.model.vocab_size)
        if self.step == 0:
            # written before any step (`scalevec convert`): resume it as the fresh start it is. Its optimizer state
            # is torch's, not a step's: get_state_dict fills an untouched optimizer with one zero-gradient step at lr
            # 0, whose step count (1) would shrink AdamW's first update (bias correction); the guard's reference is
            # the first loss, as in a new run
            for opt in self.optimizers:
                opt.state.clear()
            self.reference = None

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
        """A progress line on stdout from rank 0 unless quiet. A reader that went away (`train ... | head`) ends
        the lines, not the run: its files are the record (metrics.jsonl), and a broken pipe is no write error."""
        if self.write and not self.quiet:
            try:
                print(msg, flush=True)
            except BrokenPipeError:
                self.quiet = True
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the final flush must not fail

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
        non-finite loss or gradient norm; on a loss blow-up, ``BLOWUP_STEPS`` steps in a row above
        ``BLOWUP_RATIO`` x the reference (module constants: ln(vocab), or the run's first loss when that is
        higher); on a dead model, ``train.guard_dead_steps`` steps in a row at the uniform loss ln(vocab)
        (relative 1e-4) with a gradient norm <= 1e-6 (what an lr that blew the model up leaves: nothing
        can be learnt any more); and on a loss spike, a loss above both ``train.guard_spike_ratio`` x the
        mean of the last ``train.guard_spike_window`` losses and that mean + 6 std (OLMo-core's stability
        monitor flags mean + k std; the ratio keeps ordinary noise and early-training drops far from the
        threshold). The trouble starts at the first step of the unbroken run of unhealthy steps (blown-up
        or dead) that leads to the stop, so ``DIVERGED`` never names a checkpoint written after it. Every
        rank sees the same global figures; the guard only reads them (healthy runs are bitwise unchanged)."""
        t = self.cfg.train
        loss, grad_norm = stats[0], stats[2]
        uniform = math.log(self.cfg.model.vocab_size)
        if self.reference is None:  # the run's first step (a resumed run restored it from its checkpoint)
            self.reference = max(uniform, loss) if math.isfinite(loss) else uniform
        fix = "lower the lr or raise the warmup"
        if not all(math.isfinite(v) for v in stats):
            self.diverge(step, self.first_bad(step), f"non-finite loss or gradient norm at step {step} (loss {loss}, "
                                                     f"grad norm {grad_norm})", fix)
        dead = abs(loss - uniform) <= 1e-4 * uniform and grad_norm <= 1e-6
        high = loss > BLOWUP_RATIO * self.reference
        self.dead_run = self.dead_run + 1 if dead else 0
        self.high_run = self.high_run + 1 if high else 0
        self.bad_since = (step if self.bad_since is None else self.bad_since) if dead or high else None
        if self.high_run >= BLOWUP_STEPS:
            self.diverge(step, self.first_bad(step), f"loss blow-up at step {step}: {loss:.1f} nats, above "
                                                     f"{BLOWUP_RATIO:g}x {self.reference_text()} for "
                                                     f"{self.high_run} steps since step {step - self.high_run + 1}",
                         fix)
        if t.guard_dead_steps and self.dead_run >= t.guard_dead_steps:
            first = step - self.dead_run + 1
            self.diverge(step, self.first_bad(step), f"dead model at step {step}: loss {loss:.4f} = "
                                                     f"ln({self.cfg.model.vocab_size}) with gradient norm "
                                                     f"{grad_norm:.1e} for {self.dead_run} steps since step {first}",
                         fix)
        if t.guard_spike_ratio and len(self.recent) == self.recent.maxlen:
            mean, std = statistics.fmean(self.recent), statistics.pstdev(self.recent)
            if loss > t.guard_spike_ratio * mean and loss > mean + 6 * std:
                self.diverge(step, self.first_bad(step), f"loss spike at step {step}: {loss:.4f}, {loss / mean:.1f}x "
                                                         f"the mean {mean:.4f} of the last {len(self.recent)} steps",
                             f"{fix} (or raise train.guard_spike_ratio)")
        self.recent.append(loss)

    def guard_eval(self, val_loss: float) -> None:
        """The blow-up rule on an evaluation, before its row is logged: a non-finite validation loss, or
        one above ``BLOWUP_RATIO`` x the reference (one evaluation is enough: it averages the whole
        held-out set), stops the run. The model evaluated is checkpoint ``self.step``'s, so the trouble
        starts there at the latest."""
        if self.reference is None:  # no training step in this session yet
            self.reference = math.log(self.cfg.model.vocab_size)
        if math.isfinite(val_loss) and val_loss <= BLOWUP_RATIO * self.reference:
            return
        self.diverge(self.step, self.first_bad(self.step),
                     f"validation loss blow-up at step {self.step}: {val_loss:.1f} nats, above {BLOWUP_RATIO:g}x "
                     f"{self.reference_text()}", "lower the lr or raise the warmup")

    def first_bad(self, step: int) -> int:
        """The first step of the trouble found at ``step``: the start of the unbroken run of unhealthy
        steps before it, else ``step`` itself (checkpoint N holds the model used at step N)."""
        return step if self.bad_since is None else min(self.bad_since, step)

    def reference_text(self) -> str:
        """What the blow-up threshold is a multiple of, for the ``DIVERGED`` reason."""
        v = self.cfg.model.vocab_size
        if self.reference is None or self.reference <= math.log(v):
            return f"the uniform-prediction loss ln({v}) = {math.log(v):.2f}"
        return f"the run's first loss {self.reference:.2f}"

    def diverge(self, step: int, first_bad: int, reason: str, fix: str) -> None:
        """Write ``DIVERGED`` naming the newest intact checkpoint from before step ``first_bad`` (and point
        ``checkpoints/latest`` at it), then raise ``TrainingDiverged``."""
        kept = None
        if self.write:
            ckpt, _ = resumable_checkpoint(self.out, before=first_bad)  # checkpoint N = the model used at step N
            kept = ckpt.name if ckpt is not None else None
            rundir.mark_diverged(self.out, step, first_bad, reason, kept)
            if kept:
                point_latest(self.out, kept)
        where = (f"the checkpoint from before it is kept: {self.out / layout.CKPT_DIR / kept}" if kept else
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
            return rundir.read_summary(self.out, fix="retrain the run with --overwrite")
        self.setup_run_dir()
        try:
            return self._train(stop_at)
        except OSError as e:  # a full disk, a read-only remount, a vanished mount: the run stays resumable
            ckpts = layout.checkpoint_dirs(self.out)
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
            params = count_params(self.model)["params"]
            self.say(f"run {self.out} · {self.cfg.preset} · {self.cfg.strategy} · {params:,} params · "
                     f"{self.steps} steps × {per_step:,} tokens · {self.world} process(es) on {self.device}")
            self.say(self.data.describe())  # how many documents the corpus gave and which are validation
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
            rundir.write_summary(self.out, summary)
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
                                   if layout.checkpoint_dirs(self.out) else
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
                       **self.telemetry.collect()}
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
                self.guard_eval(val_loss)
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
        # every rank: DCP writes each rank's shards; rank 0 writes the rest (checkpoint/save_load.py). Pruning keeps
        # the checkpoint that DIVERGED would name: the newest one from before the current run of unhealthy
        # steps (bad_since), and as before the dead rule's look-back
        window = max(self.cfg.train.guard_dead_steps, 1,
                     self.step - self.bad_since + 1 if self.bad_since is not None else 0)
        save_checkpoint(self.out, self.step, self.model, self.optimizers,
                        {"best_val": self.best_val, "elapsed_s": self.elapsed,
                         "guard": {"recent": list(self.recent), "dead_run": self.dead_run,
                                   "high_run": self.high_run, "bad_since": self.bad_since,
                                   "reference": self.reference}},
                        tag=self.tmp_tag, keep_window=window)

    def summary(self, wall: float) -> dict:
        """Final figures; read back from metrics.jsonl so that a resumed run reports the whole run.
        ``step_time_s`` is the median time of the logged training steps after the first 5 (warm-up).
        ``evals`` repeats the eval rows, so that a run kept without its metrics.jsonl (a study's committed
        runs, DESIGN.md §9) still reports its validation curve."""
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
            "world_size": self.world, "evals": evals,
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


