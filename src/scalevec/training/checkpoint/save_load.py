"""Writing and loading checkpoints: atomic, verified, exact resume, with any number of processes (DESIGN.md §8).

A checkpoint is a directory ``RUN/checkpoints/step_XXXXXXX`` (names in ``layout``) holding

- ``dcp/``: the model and optimizer tensors from ``get_state_dict``, written by
  ``torch.distributed.checkpoint`` (DCP) through torch's safetensors storage
  (``HuggingFaceStorageWriter(save_distributed=True)``): each rank writes one safetensors file with its
  shards (FSDP2) or one copy of replicated tensors (DDP, one process), and records each shard's offsets
  in the file's JSON header. ``HuggingFaceStorageReader`` rebuilds DCP's metadata from those headers,
  so a run saved by N processes resumes on M, with DDP, FSDP2 or none, and nothing is unpickled (DCP's
  default ``FileSystemReader`` unpickles ``.metadata`` and loads non-tensor items with
  ``weights_only=False``; our choice, DESIGN.md §8);
- ``train_state.json``: the step, rank 0's RNG states, trainer extras and every non-tensor leaf of the
  model and optimizer state (param groups: lr, betas, parameter names), as JSON (``integrity``);
- ``model.safetensors``: the consolidated model (full tensors, gathered to rank 0), what export and
  generate read (``run_model``); tied weights are stored once, as ``safetensors.torch.save_model`` does;
- ``MANIFEST.json``: size and SHA-256 of every file above, written last (``integrity``).

Everything is written into a temporary directory (unique per writer, the same on every rank) and
renamed into place by rank 0, so a killed run never leaves a half-written checkpoint; a failure (a full
disk) removes the temporary directory and is an ``OSError`` whatever library wrote the file. A symbolic
link is never written through. Every rank calls ``save_checkpoint``, ``load_checkpoint`` and
``resume_checkpoint`` (they hold collectives). A checkpoint that passes its manifest but does not load
(a rewritten manifest over malformed files) is ``integrity.CorruptCheckpoint``, and ``resume_checkpoint``
falls back to the next older one. Under several nodes the run directory must be on a filesystem that
every node sees.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors import SafetensorError
from safetensors.torch import save_file
from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from scalevec.config.typed import is_number
from scalevec.training import distributed, rundir
from scalevec.training.checkpoint import integrity
from scalevec.training.checkpoint.integrity import CorruptCheckpoint
from scalevec.training.checkpoint.layout import (
    CKPT_DIR,
    DCP_DIR,
    LATEST,
    MODEL_FILE,
    TRAIN_STATE,
    checkpoint_dirs,
    step_name,
    step_of,
    tmp_checkpoint,
)

__all__ = ["load_checkpoint", "merge_state", "point_latest", "resume_checkpoint", "save_checkpoint",
           "save_consolidated", "split_state", "write_error", "writer_tag"]


def split_state(obj: Any, path: tuple = ()) -> tuple[dict[str, torch.Tensor], list]:
    """Split a nested state (dicts, lists) into ``{"a/b/c": tensor}`` and ``[[path, plain value], ...]``.

    Lists and tuples are walked when they hold a tensor, else kept whole as one plain value.
    """
    tensors: dict[str, torch.Tensor] = {}
    plain: list = []
    if torch.is_tensor(obj):
        tensors["/".join(map(str, path))] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            t, p = split_state(v, (*path, k))
            tensors.update(t)
            plain += p
    elif isinstance(obj, (list, tuple)) and any(torch.is_tensor(v) or isinstance(v, (dict, list, tuple)) for v in obj):
        for i, v in enumerate(obj):
            t, p = split_state(v, (*path, i))
            tensors.update(t)
            plain += p
    else:
        plain.append([list(path), list(obj) if isinstance(obj, tuple) else obj])
    return tensors, plain


def merge_state(layout: Any, plain: list, where: Path) -> Any:
    """``layout`` (a nested state whose tensors were loaded in place) with its plain leaves replaced by
    the stored ``plain`` values (``split_state``'s); tuples stay tuples. ``CorruptCheckpoint`` when the
    stored leaves are not those of ``layout`` (another model or optimizer)."""
    stored = {tuple(p): v for p, v in plain}
    _, want = split_state(layout)
    if {tuple(p) for p, _ in want} != set(stored):
        raise CorruptCheckpoint(f"{where / TRAIN_STATE} does not describe this run's model and optimizer state")
    for p, v in want:
        if not _same_form(v, stored[tuple(p)]):
            raise CorruptCheckpoint(f"{where / TRAIN_STATE} holds {stored[tuple(p)]!r} for {'/'.join(map(str, p))}, "
                                    f"where this run's state has {v!r} (damaged or edited)")

    def walk(obj, path):
        if torch.is_tensor(obj):
            return obj
        if isinstance(obj, dict):
            return {k: walk(v, (*path, k)) for k, v in obj.items()}
        if path in stored:
            v = stored[path]
            return tuple(v) if isinstance(obj, tuple) else v
        return type(obj)(walk(v, (*path, i)) for i, v in enumerate(obj))

    return walk(layout, ())


def _same_form(want: Any, got: Any) -> bool:
    """Whether a stored plain leaf has the form of this run's: a sequence of the same length (item by item),
    a number for a number; other leaves (flags, names, None) may differ (e.g. ``fused`` on another device)."""
    if isinstance(want, (list, tuple)):
        return isinstance(got, list) and len(got) == len(want) and all(map(_same_form, want, got))
    if is_number(want, finite=False):
        return is_number(got, finite=False)
    return True


def writer_tag(tag: int | None = None) -> int:
    """The tag of a checkpoint's temporary directory: ``tag``, else rank 0's PID. Every rank must get the
    same one (each writes its shards into that directory and rank 0 publishes it), so under several
    processes it is rank 0's, broadcast to the others (a collective: all ranks call)."""
    if tag is not None:
        return tag
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return os.getpid()
    box = [os.getpid()]
    dist.broadcast_object_list(box, src=0)  # a PID between our own processes: nothing from a file is unpickled
    return int(box[0])


def save_checkpoint(out: Path, step: int, model: torch.nn.Module, optimizers: list, extra: dict,
                    tag: int | None = None, keep_window: int = 0) -> Path:
    """Write ``checkpoints/step_XXXXXXX`` atomically and point ``checkpoints/latest`` at it (all ranks call).

    ``model`` is the unwrapped model (FSDP2-sharded or plain; not the DDP wrapper). ``tag`` makes the
    temporary name unique to the writer (default: rank 0's PID, ``writer_tag``). Keeps the two newest
    checkpoints, every checkpoint newer than ``step - keep_window`` and the newest one at or before it
    (the health guard's look-back: the checkpoint from before a divergence must survive). A symbolic
    link named ``step_XXXXXXX`` is replaced, never written through. On an error the temporary directory
    is removed and the error re-raised: a failed write (a full disk) as an ``OSError`` naming the file,
    also when DCP or safetensors report it; ``RunDirError`` when ``checkpoints/`` is a symbolic link.
    """
    rundir.check_no_links(out)
    root = Path(out) / CKPT_DIR
    final = root / step_name(step)
    tmp = tmp_checkpoint(out, step, writer_tag(tag))
    lead = distributed.rank() == 0
    try:
        if lead:
            root.mkdir(exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        distributed.barrier()
        model_sd, optim_sd = get_state_dict(model, optimizers)
        aliases = tied_aliases(model)  # safetensors refuses two names for one storage: store the tensor once
        model_sd = {k: v for k, v in model_sd.items() if k not in aliases}
        tensors, plain = split_state({"model": model_sd, "optim": optim_sd})
        try:
            with _dcp_quiet():
                dcp.save(tensors, storage_writer=HuggingFaceStorageWriter(str(tmp / DCP_DIR), save_distributed=True),
                         no_dist=not dist.is_initialized())
        except CheckpointException as e:  # DCP gathers each rank's error into this BaseException
            raise write_error(_first_failure(e), tmp / DCP_DIR) from None
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if lead:
            save_consolidated(model, full, tmp / MODEL_FILE)
            integrity.write_train_state(tmp / TRAIN_STATE, step, torch.get_rng_state(),
                                     torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None,
                                     extra, plain)
            integrity.write_manifest(tmp, step)
            if final.is_symlink():
                final.unlink()
            elif final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            point_latest(out, final.name)
            _prune(root, step, keep_window)
    except BaseException:
        if lead:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    distributed.barrier()
    return final


def _prune(root: Path, step: int, keep_window: int) -> None:
    ckpts = checkpoint_dirs(root.parent)  # newest first
    keep = set(ckpts[:2]) | {c for c in ckpts if step_of(c) > step - keep_window}
    older = [c for c in ckpts if step_of(c) <= step - keep_window]
    keep |= set(older[:1])
    for c in ckpts:
        if c in keep:
            continue
        if c.is_symlink():
            c.unlink()  # the link, never what it points to
        else:
            shutil.rmtree(c, ignore_errors=True)


def point_latest(run_dir: str | Path, name: str) -> None:
    """Write ``checkpoints/latest``: the name of the newest checkpoint (the diverged run's: the one kept from
    before the trouble). Informative only: discovery lists the ``step_*`` folders."""
    rundir.write_atomic(Path(run_dir) / CKPT_DIR / LATEST, name)


def _first_failure(e: CheckpointException) -> BaseException:
    """The error of the lowest rank that failed inside DCP (DCP wraps each rank's error)."""
    failures = e.failures
    return failures[min(failures)][0] if failures else RuntimeError(str(e))


def write_error(e: BaseException, path: Path) -> BaseException:
    """A failed write as an ``OSError`` naming ``path`` (what the trainer's disk-full handler and ``scalevec
    export`` report in one line): an ``OSError`` without a file name gets ``path``, and a ``SafetensorError``
    from an I/O error (safetensors reports "No space left on device (os error 28)", not an ``OSError``)
    becomes the ``OSError`` of that errno. Any other error is returned as it is."""
    if isinstance(e, OSError):
        return e if e.filename else OSError(e.errno, e.strerror or str(e), str(path))
    if isinstance(e, SafetensorError):
        m = re.search(r"os error (\d+)", str(e))
        if m:
            code = int(m.group(1))
            return OSError(code, os.strerror(code), str(path))
        if "I/O error" in str(e):
            return OSError(errno.EIO, os.strerror(errno.EIO), str(path))
    return e


def tied_aliases(model: torch.nn.Module) -> dict[str, str]:
    """``{alias: first name}`` for every parameter registered under several names (tied embeddings)."""
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            aliases[name] = first[id(p)]
        else:
            first[id(p)] = name
    return aliases


def save_consolidated(model: torch.nn.Module, state: dict[str, torch.Tensor], path: Path) -> None:
    """Write a full state dict as one safetensors file; a parameter registered under several names (tied
    embeddings) is stored once, and its other names are recorded in the metadata (``save_model``'s format)."""
    aliases = tied_aliases(model)
    tensors = {k: v.detach().contiguous() for k, v in state.items() if k not in aliases}
    try:
        save_file(tensors, str(path), metadata={"format": "pt", **aliases})
    except SafetensorError as e:
        raise write_error(e, path) from None


class _DCPLogFilter(logging.Filter):
    """Drops the records DCP logs on the root logger (from its own files): a damaged checkpoint's metadata
    error comes with a traceback on stderr, although the error is raised and reported in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "torch/distributed/checkpoint" not in record.pathname.replace(os.sep, "/")


@contextmanager
def _dcp_quiet():
    """Silence DCP's warning that it runs without a process group (one process is a supported case here)
    and its root-logger records (``_DCPLogFilter``)."""
    root, log_filter = logging.getLogger(), _DCPLogFilter()
    root.addFilter(log_filter)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            yield
    finally:
        root.removeFilter(log_filter)


def load_checkpoint(ckpt: Path, model: torch.nn.Module, optimizers: list, device: torch.device,
                    verified: bool = False, check_extra: Callable[[dict], None] | None = None) -> dict:
    """Load a checkpoint into ``model`` and ``optimizers`` in place (all ranks call; any number of
    processes, resharded by DCP), restore the RNG states, and return the train state (``step``,
    ``extra``). Only safetensors and JSON are read; the files are checked against the manifest first
    unless ``verified`` (``integrity.resumable_checkpoint`` did it). Raises ``CorruptCheckpoint``
    for every checkpoint that does not load, also one that passes its manifest (malformed shards, a
    tensor of another shape, a train state of another form, or trainer extras that ``check_extra`` refuses with a
    ``ValueError``, checked before anything is loaded); ``model`` and ``optimizers`` may then hold part of it (load
    another checkpoint, or rebuild them)."""
    ckpt = Path(ckpt)
    if not verified:
        integrity.verify_checkpoint(ckpt)
    state = integrity.read_train_state(ckpt)
    if check_extra is not None:
        try:
            check_extra(state["extra"])
        except ValueError as e:
            raise CorruptCheckpoint(f"{ckpt / TRAIN_STATE}: {e} (damaged or edited)") from None
    model_sd, optim_sd = get_state_dict(model, optimizers)  # the layout to load into (sharded or not)
    aliases = tied_aliases(model)
    layout = {"model": {k: v for k, v in model_sd.items() if k not in aliases}, "optim": optim_sd}
    tensors, _ = split_state(layout)
    try:
        with _dcp_quiet():
            dcp.load(tensors, storage_reader=HuggingFaceStorageReader(str(ckpt / DCP_DIR)),
                     no_dist=not dist.is_initialized())
    except CheckpointException as e:  # DCP gathers each rank's error into this BaseException
        raise CorruptCheckpoint(f"{ckpt / DCP_DIR} does not load into this run's model and optimizer "
                                f"({rundir.one_line(_first_failure(e))[:300]})") from None
    restored = merge_state(layout, state["plain"], ckpt)
    for alias, name in aliases.items():  # a tied name gets the tensor its first name loaded
        if name in restored["model"]:
            restored["model"][alias] = restored["model"][name]
    try:
        set_state_dict(model, optimizers, model_state_dict=restored["model"], optim_state_dict=restored["optim"])
        torch.set_rng_state(state["rng_cpu"])
        if state["rng_cuda"] is not None and device.type == "cuda":
            torch.cuda.set_rng_state(state["rng_cuda"], device)
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as e:
        raise CorruptCheckpoint(f"{ckpt} does not load into this run ({rundir.one_line(e)[:300]})") from None
    return state


def resume_checkpoint(run_dir: Path, model: torch.nn.Module, optimizers: list, device: torch.device,
                      notice: Callable[[str], None] | None = None,
                      check_extra: Callable[[dict], None] | None = None) -> dict | None:
    """Load the newest checkpoint of ``run_dir`` that loads (all ranks call) and return its train state
    (``load_checkpoint``), or ``None`` when the run has no intact checkpoint (train it from step 0: nothing
    was loaded). Each checkpoint skipped (``integrity.checkpoint_candidates``: damaged, or one that does not
    load) is one line to ``notice``, and so is the one resumed from after a skip. The ranks agree on each
    attempt, so that they move on together. ``check_extra``: the trainer's check of the extras it wrote
    (``load_checkpoint``): a checkpoint whose extras it refuses is skipped as a damaged one, naming its train state.

    Raises ``rundir.RunDirError`` when a checkpoint failed to load part-way and no older one loads: the
    model and optimizer then hold part of it, so training from step 0 would not be a fresh run; the
    message names the checkpoints and the way on (delete them, or ``--overwrite``). Also, before anything is
    loaded, when a checkpoint is past the steps of the run's ``config.yaml`` (edited to fewer steps): resuming
    from an earlier one, or from step 0, would drop the metrics of the steps it holds.
    """
    from scalevec.config.run_budget import total_steps

    steps = total_steps(rundir.load_config(run_dir))
    past = sorted(c.name for c in checkpoint_dirs(run_dir) if integrity.step_of(c) > steps and not c.is_symlink())
    if past:  # resuming below them (or from step 0) would drop the metrics of the steps they hold
        raise rundir.RunDirError(f"{run_dir}'s checkpoints {', '.join(past)} are past the {steps} steps of its "
                                 f"{rundir.CONFIG} (were train.steps or train.tokens lowered?); restore the step count "
                                 f"to resume, branch with --init-from {run_dir}/{CKPT_DIR}/step_N, or pass --overwrite "
                                 f"(nothing was changed)")
    skipped, tried = 0, []
    for ckpt, problem in integrity.checkpoint_candidates(run_dir, steps=steps):
        if problem is None:
            try:
                state = load_checkpoint(ckpt, model, optimizers, device, verified=True, check_extra=check_extra)
            except CorruptCheckpoint as e:
                problem = str(e)
            if distributed.world_size() > 1:  # every rank tried the same checkpoint; one failure fails it for all
                failed = distributed.all_reduce_sum(torch.tensor(float(problem is not None), device=device)).item()
                problem = problem or ("it did not load on another process" if failed else None)
            if problem is None:
                if skipped and notice:
                    notice(f"resuming from {ckpt.name}, the newest intact checkpoint")
                return state
            tried.append(ckpt.name)
        skipped += 1
        if notice:
            notice(f"skipped checkpoint {ckpt.name}: {problem}")
    if tried:
        raise rundir.RunDirError(f"{run_dir} has no checkpoint that loads ({', '.join(tried)} failed part-way, see "
                                 f"the notes above); delete {run_dir / CKPT_DIR} to train it from step 0, or pass "
                                 f"--overwrite")
    return None
