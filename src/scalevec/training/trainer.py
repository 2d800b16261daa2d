"""The trainer: one CPU or many GPUs, exact resume, a self-describing run directory (DESIGN.md §8).

``train(cfg, out_dir)`` validates everything first (config, data, model) and only then creates the
run directory, so a bad input writes nothing. The step: the global batch of ``train.batch_size``
sequences is split across ranks and micro-batches; the loss is summed in nats and divided by the
number of target tokens of the whole global batch (so accumulation and world size do not change
it); gradients are clipped; a non-finite loss or gradient norm stops the run with the last good
checkpoint kept. Checkpoints are written atomically (temporary directory, then rename) and hold the
model (safetensors), optimizer, step and RNG states; the data sampler is stateless (batch = f(seed,
step)), so resume is exact. Only rank 0 writes.

Run directory: ``config.yaml``, ``meta.json``, ``optim_groups.txt``, ``metrics.jsonl``,
``summary.json``, ``tokenizer/``, ``checkpoints/step_XXXXXXX/`` + ``checkpoints/latest``, ``DONE``.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

from scalevec import __version__
from scalevec.config import (
    EXECUTION_FIELDS,
    RunConfig,
    ScaleConfig,
    apply_overrides,
    checkpoint_blocks,
    from_dict,
    load_yaml,
    save_yaml,
    to_dict,
    usable_cpus,
)
from scalevec.data.corpus import prepare_data
from scalevec.data.sampler import TrainSampler, val_batches
from scalevec.model.flops import flops_per_token, peak_flops
from scalevec.model.scales import scale_vectors
from scalevec.model.transformer import Transformer, build_model
from scalevec.presets import get_preset
from scalevec.training import autocompile, distributed, init_from, rundir, tracking
from scalevec.training.checkpoint import load_checkpoint, save_checkpoint
from scalevec.training.optim import build_optimizers, group_table, param_groups, set_lr
from scalevec.training.rundir import CKPT_DIR, RunDirError, write_json
from scalevec.training.schedule import lr_at, warmup_warning


class TrainingDiverged(RuntimeError):
    """The health guard stopped the run (non-finite loss or gradient norm, a dead model, a loss spike);
    ``DIVERGED`` records the step and reason, and the checkpoint from before the trouble is kept."""


class TrainingFailed(RuntimeError):
    """Training could not go on (an ``OSError`` such as a full disk while writing); the run resumes
    from its last checkpoint with ``--resume`` once the cause is fixed."""


class Preempted(RuntimeError):
    """SIGTERM (how SLURM and Kubernetes preempt): a checkpoint was written at the step boundary."""


DIVERGED_EXIT = 3  # `scalevec train` exit codes (README "Run directories"): 2 bad input or unusable run directory,
FAILED_EXIT = 3  # 3 the run diverged or failed during training (DIVERGED tells which),
PREEMPTED_EXIT = 75  # 75 (EX_TEMPFAIL) SIGTERM: checkpointed, continue with --resume, 130 Ctrl-C (also checkpointed)


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


def make_config(preset: str = "small", strategy: str = "baseline", overrides: list[str] | None = None,
                file_data: dict | None = None) -> RunConfig:
    """Resolve a run's config: preset and strategy defaults, then a YAML mapping, then ``key=value`` overrides.

    Raises ``ValueError`` for unknown presets, strategies or keys, and invalid values.
    """
    file_data = dict(file_data or {})
    preset = file_data.pop("preset", preset)
    strategy = file_data.pop("strategy", strategy)
    base = RunConfig(preset=preset, strategy=strategy, model=get_preset(preset), scale=ScaleConfig.preset(strategy))
    data = to_dict(base)
    for section, values in file_data.items():
        if section not in data or not isinstance(data[section], dict):
            raise ValueError(f"unknown config section {section!r}; known: {', '.join(k for k, v in data.items() if isinstance(v, dict))}")
        if not isinstance(values, dict):
            raise ValueError(f"config section {section!r} must be a mapping")
        if section == "model" and "moe" in values and isinstance(values["moe"], dict) and data["model"]["moe"]:
            values = {**values, "moe": {**data["model"]["moe"], **values["moe"]}}
        data[section] = {**data[section], **values}
    cfg = apply_overrides(from_dict(RunConfig, data), overrides or [])
    cfg.validate()
    return cfg




def config_diff(a: RunConfig, b: RunConfig) -> list[str]:
    """Dotted names of the fields that differ between two configs, execution fields excepted."""
    def flat(d, prefix=""):
        out = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    fa, fb = flat(to_dict(a)), flat(to_dict(b))
    return [k for k in sorted(fa.keys() | fb.keys()) if k not in EXECUTION_FIELDS and fa.get(k) != fb.get(k)]


def total_steps(cfg: RunConfig) -> int:
    """Optimizer steps of the run: ``train.steps``, or ``ceil(train.tokens / tokens per step)`` if set."""
    if cfg.train.tokens > 0:
        return math.ceil(cfg.train.tokens / (cfg.train.batch_size * cfg.train.seq_len))
    return cfg.train.steps


# ----------------------------------------------------------------------------------------- run directory


def check_out_dir(out: Path, resume: bool, overwrite: bool) -> None:
    """Refuse to clobber an existing run (``FileExistsError`` naming ``--resume``/``--overwrite``). Checked
    again under the run's lock before anything is written (``Trainer.setup_run_dir``)."""
    if resume and overwrite:
        raise ValueError("--resume and --overwrite exclude each other; pick one")
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out} exists and is not a directory; choose another --out")
    parent = next((p for p in out.absolute().parents if p.exists()), None)
    if not out.exists() and parent is not None and not parent.is_dir():
        raise NotADirectoryError(f"{parent} is a file, so --out {out} cannot be created; choose another --out")
    existing = out.is_dir() and any(p.name != rundir.LOCK for p in out.iterdir())
    if resume:
        if not rundir.is_run(out):
            raise FileNotFoundError(f"{out} is not a scalevec run directory (no config.yaml), so there is nothing to "
                                    f"resume; drop --resume to start a new run")
        div = rundir.read_diverged(out)
        if div:
            raise ValueError(f"{out} diverged at step {div['step']} ({div['reason']}); it is kept as a result "
                             f"(DIVERGED); start a new --out with a lower lr, or --overwrite it")
    elif existing and not (out / "config.yaml").is_file():
        # --overwrite removes the directory: never do that to one that is not a scalevec run
        raise FileExistsError(f"{out} is not empty and is not a scalevec run directory (no config.yaml); "
                              f"choose a new or empty --out")
    elif existing and not overwrite:
        raise FileExistsError(f"{out} already holds a run; pass --resume to continue it (from its last checkpoint, "
                              f"or step 0 when it has none) or --overwrite to replace it")


def cpu_model() -> str:
    """The CPU model as /proc/cpuinfo names it (``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_meta(cfg: RunConfig) -> dict:
    """Versions, code version, host and start time, for ``meta.json``."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                                cwd=Path(__file__).parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "scalevec": __version__, "torch": torch.__version__, "python": platform.python_version(),
        "git_commit": commit, "host": socket.gethostname(), "platform": platform.platform(),
        "start_time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv,
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "world_size": distributed.world_size(), "threads": torch.get_num_threads(),
        "cpu": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def load_run_config(run_dir: str | Path) -> RunConfig:
    """The ``RunConfig`` stored in ``run_dir/config.yaml`` (``rundir.load_config``)."""
    return rundir.load_config(run_dir)


def load_run_model(run_dir: str | Path, device: str = "cpu") -> tuple[RunConfig, Transformer]:
    """``(config, model)`` of a run: its newest intact checkpoint (the final one for a finished run; for a
    diverged run the one from before the trouble), verified, dead models refused (``rundir.load_model``)."""
    cfg, model, _ = rundir.load_model(run_dir, device=device)
    return cfg, model


def load_run_tokenizer(run_dir: str | Path):
    return rundir.load_tokenizer(run_dir)


# ----------------------------------------------------------------------------------------- telemetry


def scale_stats(model: torch.nn.Module) -> dict[str, dict[str, float]]:
    """Mean, std, min, max of every effective scale vector (DESIGN.md §8 telemetry)."""
    out = {}
    for name, g in scale_vectors(model).items():
        g = distributed.full_tensor(g).float().flatten()  # FSDP2: gather the sharded vector (every rank calls)
        out[name] = {"mean": g.mean().item(), "std": g.std(unbiased=False).item(), "min": g.min().item(),
                     "max": g.max().item()}
    return out


def moe_stats(model: torch.nn.Module) -> dict:
    """Per-layer MoE telemetry that ``moe.MoE`` leaves in ``last_stats`` (load balance, entropy); with
    several processes every tensor is averaged over ranks (each rank's last micro-batch; every rank calls)."""
    out = {}
    world = distributed.world_size()
    for name, m in model.named_modules():
        stats = getattr(m, "last_stats", None)
        if stats:
            if world > 1:
                stats = {k: distributed.all_reduce_sum(v.float()) / world if torch.is_tensor(v) else v
                         for k, v in stats.items()}
            out[name] = {k: (v.tolist() if torch.is_tensor(v) else v) for k, v in stats.items()}
    return out


# ----------------------------------------------------------------------------------------- the step


def accumulate_gradients(model: torch.nn.Module, micro_batches: list[tuple[torch.Tensor, torch.Tensor]],
                         autocast=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward and backward over this rank's micro-batches of one global batch (DESIGN.md §8).

    The loss is the cross-entropy summed in nats over every target ``!= -100`` of the *global* batch
    (all micro-batches, all ranks) divided by their count, so the gradient does not depend on how the
    batch is split; MoE aux losses are averaged over micro-batches. DDP/FSDP average gradients over
    ranks, hence each rank's loss carries a factor ``world_size``. Gradients sync on the last
    micro-batch only. Returns the global (loss, aux) as detached scalars.
    """
    world = distributed.world_size()
    device = micro_batches[0][0].device
    n_local = sum(int((y != -100).sum()) for _, y in micro_batches)
    n_global = distributed.all_reduce_sum(torch.tensor(float(n_local), device=device))
    ce_total = torch.zeros((), device=device)
    aux_total = torch.zeros((), device=device)
    for i, (x, y) in enumerate(micro_batches):
        with distributed.grad_sync(model, last=i == len(micro_batches) - 1):
            with autocast or nullcontext():
                ce, _, aux = model(x, y)
            loss = ce * (world / n_global) + aux / len(micro_batches)
            loss.backward()
        ce_total += ce.detach()
        aux_total += aux.detach() / len(micro_batches)
    loss = distributed.all_reduce_sum(ce_total) / n_global
    return loss, distributed.all_reduce_sum(aux_total) / world


# ----------------------------------------------------------------------------------------- the trainer


class Trainer:
    """Builds everything for one run and trains it; see the module docstring for the contract."""

    def __init__(self, cfg: RunConfig, out_dir: str | Path, resume: bool = False, overwrite: bool = False,
                 quiet: bool = False, init: init_from.InitFrom | None = None):
        cfg.validate()
        self.init = init  # --init-from: a Hugging Face model or a parent run (init_from.py)
        self.cfg, self.out, self.resume, self.quiet = cfg, Path(out_dir), resume, quiet
        self.overwrite = overwrite
        self.steps = total_steps(cfg)
        check_out_dir(self.out, resume, overwrite)
        tracking.check(cfg.train.tracker)  # a missing optional package fails before anything is written
        self.lock = rundir.RunLock(self.out)

        if (cfg.train.sharpness_every or cfg.train.probe_every) and cfg.train.dist == "fsdp2":
            # rank 0 alone runs them, and FSDP2's sharded parameters need every rank for each gather
            raise ValueError("--probe-every and --sharpness-every need the whole model on one process; "
                             "use --dist ddp or drop them")
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
        if self.data.tokenizer.vocab_size > cfg.model.vocab_size:
            # A preset's vocabulary is a default, not a constraint: grow it to fit the tokenizer. The stored
            # config.yaml holds the resolved value.
            cfg.model.vocab_size = self.data.tokenizer.vocab_size
        if resume:
            stored = load_run_config(self.out)
            diff = config_diff(stored, cfg)
            if diff:
                raise ValueError(f"--resume with a config that differs from {self.out}/config.yaml in: {', '.join(diff)}; "
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
        self.autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if self.device.type == "cuda" and t.dtype != "float32"
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
                err = RunDirError(f"cannot create the lock file {self.lock.path} ({e.strerror}); choose a writable --out")
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
        rundir.rewrite_metrics(self.out, keep=lambda r: r["step"] < step or (r["kind"] != "train" and r["step"] == step),
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
        lr = lr_at(step, self.steps, self.cfg.optim.lr, self.cfg.schedule)
        set_lr(self.optimizers, lr / self.cfg.optim.lr)
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
                                      f"with gradient norm {grad_norm:.1e} for {self.dead_run} steps since step {first}",
                         "lower the lr or raise the warmup")
        if t.guard_spike_ratio and len(self.recent) == self.recent.maxlen:
            mean, std = statistics.fmean(self.recent), statistics.pstdev(self.recent)
            if loss > t.guard_spike_ratio * mean and loss > mean + 6 * std:
                self.diverge(step, step, f"loss spike at step {step}: {loss:.4f}, {loss / mean:.1f}x the mean {mean:.4f} "
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
            last = f"its last checkpoint is {ckpts[0].name}" if ckpts else "it has no checkpoint yet (resumes from step 0)"
            raise TrainingFailed(f"cannot write {e.filename or self.out} at step {self.step}: {e.strerror or e}; "
                                 f"free space or fix the filesystem, then continue with: scalevec train --resume "
                                 f"--out {self.out} ({last})") from None

    def _train(self, stop_at: int | None) -> dict:
        t = self.cfg.train
        tokens_per_step = t.batch_size * t.seq_len
        end = min(self.steps, stop_at) if stop_at is not None else self.steps
        note = warmup_warning(self.steps, self.cfg.schedule)
        if note and self.step == 0 and self.write:
            print(f"warning: {note}", file=sys.stderr, flush=True)
        if self.step == 0 and self.write:
            self.say(f"run {self.out} · {self.cfg.preset} · {self.cfg.strategy} · {self.model.num_params():,} params · "
                     f"{self.steps} steps × {tokens_per_step:,} tokens · {self.world} process(es) on {self.device}")
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
            self.say(f"done: val_loss {summary['final_val_loss']:.4f} nats/token, {summary['final_val_bpb']:.4f} bits/byte")
        distributed.barrier()
        return summary

    def _fit_loop(self, end: int, t_start: float, bar, interrupt: dict) -> None:
        """The steps of ``fit``. On Ctrl-C (``interrupt["set"]``) it checkpoints the completed steps and
        raises ``KeyboardInterrupt``; on SIGTERM (``interrupt["term"]``, agreed by every rank) it does the
        same and raises ``Preempted``; ``--resume`` continues from there, bit for bit."""
        t = self.cfg.train
        tokens_per_step = t.batch_size * t.seq_len
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
                row = {"kind": "train", "step": step, "tokens": self.step * tokens_per_step,
                       "lr": lr_at(step, self.steps, self.cfg.optim.lr, self.cfg.schedule), "loss": loss,
                       "grad_norm": grad_norm, "tok_per_s": tokens_per_step / dt, "step_time": dt,
                       # process CPU seconds of the step (all threads): comparable on a loaded machine
                       "cpu_time": cpu, "flops_per_s": self.flops_per_token * tokens_per_step / dt,
                       "mfu": self.flops_per_token * tokens_per_step / dt / self.peak_flops if self.peak_flops else None,
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
                self.log({"kind": "eval", "step": self.step, "tokens": self.step * tokens_per_step,
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
            self.log({"kind": "probe", "step": self.step, "tokens": self.step * self.cfg.train.batch_size *
                      self.cfg.train.seq_len, **row})

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
        from scalevec.model.params import count_params

        counts = count_params(self.model)
        return {
            "preset": self.cfg.preset, "strategy": self.cfg.strategy, "optimizer": self.cfg.optim.name,
            "schedule": self.cfg.schedule.name, "lr": self.cfg.optim.lr, "seed": self.cfg.train.seed,
            "final_val_loss": final["val_loss"], "final_val_bpb": final["val_bpb"],
            "best_val_loss": min((e["val_loss"] for e in evals), default=math.nan),
            "steps": self.steps, "tokens": self.steps * self.cfg.train.batch_size * self.cfg.train.seq_len,
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


# ----------------------------------------------------------------------------------------- CLI

FLAG_FIELDS = {  # --flag -> config field
    "optimizer": "optim.name", "lr": "optim.lr", "schedule": "schedule.name", "warmup": "schedule.warmup",
    "steps": "train.steps", "tokens": "train.tokens", "batch_size": "train.batch_size",
    "micro_batch_size": "train.micro_batch_size", "seq_len": "train.seq_len", "seed": "train.seed",
    "data": "data.source", "tokenizer": "data.tokenizer", "device": "train.device", "dtype": "train.dtype",
    "dist": "train.dist", "probe_every": "train.probe_every", "sharpness_every": "train.sharpness_every",
    "eval_every": "train.eval_every", "tracker": "train.tracker", "threads": "train.threads",
}


def add_arguments(p) -> None:
    p.add_argument("--config", help="YAML file with any RunConfig fields (preset, strategy, model, scale, optim, ...)")
    p.add_argument("--preset", help="model preset (default small; see `scalevec info`)")
    p.add_argument("--strategy", help="scale-vector strategy (default baseline)")
    p.add_argument("--optimizer", choices=["adamw", "muon"])
    p.add_argument("--schedule", choices=["cosine", "wsd", "linear", "constant"],
                   help="wsd decays to 0 unless schedule.min_lr_ratio is given")
    for flag, kind in (("lr", float), ("warmup", int), ("steps", int), ("tokens", int), ("batch-size", int),
                       ("micro-batch-size", int), ("seq-len", int), ("seed", int), ("eval-every", int),
                       ("probe-every", int), ("sharpness-every", int)):
        p.add_argument(f"--{flag}", type=kind)
    p.add_argument("--data", help="shakespeare (default), kjv, a .txt file or folder, .jsonl, .parquet, hf:NAME[:CONFIG], "
                                   "or a folder written by `scalevec prepare-data` (memory-mapped shards)")
    p.add_argument("--tokenizer", help="bytes (default), bpe:N, or a path to tokenizer.json")
    p.add_argument("--device", help="auto (default), cpu, cuda")
    p.add_argument("--threads", type=int, help="CPU threads (default: every CPU this process may use); the "
                   "thread count changes the last bits of fp32 sums, so reproduce a run with the same one")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--dist", choices=["none", "ddp", "fsdp2"], help="data parallelism under torchrun")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile each block (--no-compile: eager); default train.compile=auto: compiled on "
                        "CUDA for runs of 1000+ steps, eager on CPU (docs/performance.md)")
    p.add_argument("--out", help="run directory (default runs/<preset>-<strategy>-seed<seed>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run in --out")
    p.add_argument("--init-from", metavar="DIR",
                   help="start from a Hugging Face model directory (Llama, Qwen3, Mixtral, Qwen3-MoE) or branch a run: "
                        "RUN_DIR or RUN_DIR/checkpoints/step_N (its config is the base; flags change it)")
    p.add_argument("--reset-optimizer", action="store_true",
                   help="with --init-from RUN: do not carry the optimizer state")
    p.add_argument("--schedule-from", choices=list(init_from.SCHEDULE_FROM), default="restart",
                   help="with --init-from RUN: restart the schedule at step 0 (default) or continue from the "
                        "parent's step")
    p.add_argument("--tracker", choices=["none", "tensorboard", "wandb"],
                   help="mirror metrics.jsonl to TensorBoard (RUN/tensorboard) or Weights & Biases (default none)")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="any config field, e.g. model.d_model=256")


def config_from_args(args, base: dict | None = None) -> RunConfig:
    """The RunConfig of a ``train``-style command line (precedence: preset/strategy < file < flags < key=value).
    ``base``: sections below the file (``--init-from``: ``init_from.base_sections``)."""
    file_data = load_yaml(args.config) if args.config else {}
    if base:
        file_data = {**base, **{k: {**base[k], **v} if isinstance(base.get(k), dict) and isinstance(v, dict) else v
                                for k, v in file_data.items()}}
    preset = args.preset or file_data.get("preset", "small")
    strategy = args.strategy or file_data.get("strategy", "baseline")
    file_data = {k: v for k, v in file_data.items() if k not in ("preset", "strategy")}
    if args.preset and "model" in file_data:
        raise ValueError("--preset conflicts with the model section of --config; drop one of them")
    flags = []
    for name, key in FLAG_FIELDS.items():
        value = getattr(args, name, None)
        if value is not None:
            flags.append(f"{key}={value}")
    if getattr(args, "schedule", None) == "wsd" and not any(o.startswith("schedule.min_lr_ratio") for o in args.overrides):
        flags.append("schedule.min_lr_ratio=0.0")  # DESIGN.md §7: WSD decays to 0
    if getattr(args, "compile", None) is not None:
        flags.append(f"train.compile={'true' if args.compile else 'false'}")
    for item in args.overrides:
        if "=" not in item:
            raise ValueError(f"unexpected argument {item!r}; overrides are key=value (e.g. model.d_model=256)")
    return make_config(preset, strategy, flags + list(args.overrides), file_data)


def run(args) -> int:
    init = None
    if getattr(args, "init_from", None):
        if args.resume:
            raise ValueError("--resume continues the run in --out; drop --init-from (the branch's origin is in "
                             "its meta.json)")
        init = init_from.resolve(args.init_from, args.reset_optimizer, args.schedule_from)
    if args.resume and args.out and not args.config and (Path(args.out) / "config.yaml").is_file():
        cfg = load_run_config(args.out)
        execution = {"dist": "train.dist", "device": "train.device", "tracker": "train.tracker", "threads": "train.threads"}
        if args.overrides or any(getattr(args, n, None) is not None for n in FLAG_FIELDS if n not in execution):
            raise ValueError("--resume continues the stored config; drop the other options except --dist, --device, "
                             "--tracker, --threads and --compile (or start a new --out)")
        cfg = apply_overrides(cfg, [f"{key}={getattr(args, n)}" for n, key in execution.items()
                                    if getattr(args, n, None) is not None]
                            + ([f"train.compile={'true' if args.compile else 'false'}"] if args.compile is not None else []))
    else:
        cfg = config_from_args(args, init_from.base_sections(init, args.preset, args.strategy, args.tokenizer)
                               if init is not None else None)
        if init is not None:
            cfg.preset = init_from.preset_label(init, args.preset, cfg.preset)
    if not cfg.train.threads:  # explicit, so that the same command gives the same numbers however it is started
        cfg = apply_overrides(cfg, [f"train.threads={usable_cpus()}"])
    out = args.out or f"runs/{cfg.preset}-{cfg.strategy}-seed{cfg.train.seed}"
    try:
        train(cfg, out, resume=args.resume, overwrite=args.overwrite, quiet=args.quiet, init=init)
    except TrainingDiverged as e:
        print(f"scalevec train: {e}", file=sys.stderr)
        return DIVERGED_EXIT
    except TrainingFailed as e:
        print(f"scalevec train: error: {e}", file=sys.stderr)
        return FAILED_EXIT
    except Preempted as e:
        print(f"scalevec train: {e}", file=sys.stderr)
        return PREEMPTED_EXIT
    return 0
