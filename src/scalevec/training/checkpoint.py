"""Checkpoints: atomic, verified, exact resume, resumable with any number of processes (DESIGN.md §8).

A checkpoint is a directory ``RUN/checkpoints/step_XXXXXXX`` (layout in ``rundir``) holding

- ``dcp/``: the model and optimizer tensors from ``get_state_dict``, written by
  ``torch.distributed.checkpoint`` (DCP) through torch's safetensors storage
  (``HuggingFaceStorageWriter(save_distributed=True)``): each rank writes one safetensors file with its
  shards (FSDP2) or one copy of replicated tensors (DDP, one process), and records each shard's offsets
  in the file's JSON header. ``HuggingFaceStorageReader`` rebuilds DCP's metadata from those headers,
  so a run saved by N processes resumes on M, with DDP, FSDP2 or none, and nothing is unpickled (DCP's
  default ``FileSystemReader`` unpickles ``.metadata`` and loads non-tensor items with
  ``weights_only=False``; our choice, DESIGN.md §8);
- ``train_state.json``: the step, rank 0's RNG states, trainer extras and every non-tensor leaf of the
  model and optimizer state (param groups: lr, betas, parameter names), as JSON;
- ``model.safetensors``: the consolidated model (full tensors, gathered to rank 0), what export and
  generate read; tied weights are stored once, as ``safetensors.torch.save_model`` does;
- ``MANIFEST.json``: size and SHA-256 of every file above, written last.

Everything is written into a temporary directory (unique per writer) and renamed into place by rank
0, so a killed run never leaves a half-written checkpoint; a failure (a full disk) removes the
temporary directory. Every rank calls ``save_checkpoint`` and ``load_checkpoint`` (they hold
collectives). Under several nodes the run directory must be on a filesystem that every node sees.
"""

from __future__ import annotations

import os
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from scalevec.training import distributed, rundir
from scalevec.training.rundir import CKPT_DIR, DCP_DIR, LATEST, MODEL_FILE, TRAIN_STATE, CorruptCheckpoint

__all__ = ["CKPT_DIR", "latest_checkpoint", "load_checkpoint", "save_checkpoint", "save_consolidated",
           "split_state", "merge_state"]


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


def save_checkpoint(out: Path, step: int, model: torch.nn.Module, optimizers: list, extra: dict,
                    tag: int | None = None, keep_window: int = 0) -> Path:
    """Write ``checkpoints/step_XXXXXXX`` atomically and point ``checkpoints/latest`` at it (all ranks call).

    ``model`` is the unwrapped model (FSDP2-sharded or plain; not the DDP wrapper). ``tag`` makes the
    temporary name unique to the writer (default: this process's PID). Keeps the two newest
    checkpoints, every checkpoint newer than ``step - keep_window`` and the newest one at or before it
    (the health guard's look-back: the checkpoint from before a divergence must survive). On an error
    the temporary directory is removed and the error re-raised.
    """
    root = Path(out) / CKPT_DIR
    final = root / f"step_{step:07d}"
    tmp = root / f".tmp_step_{step:07d}.{tag if tag is not None else os.getpid()}"
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
        with _single_process_quiet():
            dcp.save(tensors, storage_writer=HuggingFaceStorageWriter(str(tmp / DCP_DIR), save_distributed=True),
                     no_dist=not dist.is_initialized())
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if lead:
            save_consolidated(model, full, tmp / MODEL_FILE)
            rundir.write_train_state(tmp / TRAIN_STATE, step, torch.get_rng_state(),
                                     torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None,
                                     extra, plain)
            rundir.write_manifest(tmp, step)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            rundir.write_atomic(root / LATEST, final.name)
            _prune(root, step, keep_window)
    except BaseException:
        if lead:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    distributed.barrier()
    return final


def _prune(root: Path, step: int, keep_window: int) -> None:
    ckpts = rundir.checkpoint_dirs(root.parent)  # newest first
    keep = set(ckpts[:2]) | {c for c in ckpts if rundir.step_of(c) > step - keep_window}
    older = [c for c in ckpts if rundir.step_of(c) <= step - keep_window]
    keep |= set(older[:1])
    for c in ckpts:
        if c not in keep:
            shutil.rmtree(c, ignore_errors=True)


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
    save_file(tensors, str(path), metadata={"format": "pt", **aliases})


@contextmanager
def _single_process_quiet():
    """Silence DCP's warning that it runs without a process group: one process is a supported case here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def latest_checkpoint(run_dir: Path) -> Path:
    """The checkpoint whose model export and generate read (``rundir.model_checkpoint``); ``RunDirError``
    (a ``ValueError``) when there is none."""
    return rundir.model_checkpoint(run_dir)[0]


def load_checkpoint(ckpt: Path, model: torch.nn.Module, optimizers: list, device: torch.device,
                    verified: bool = False) -> dict:
    """Load a checkpoint into ``model`` and ``optimizers`` in place (all ranks call; any number of
    processes, resharded by DCP), restore the RNG states, and return the train state (``step``,
    ``extra``). Only safetensors and JSON are read; the files are checked against the manifest first
    unless ``verified`` (``rundir.resumable_checkpoint`` did it). Raises ``rundir.CorruptCheckpoint``."""
    ckpt = Path(ckpt)
    if not verified:
        rundir.verify_checkpoint(ckpt)
    state = rundir.read_train_state(ckpt)
    model_sd, optim_sd = get_state_dict(model, optimizers)  # the layout to load into (sharded or not)
    aliases = tied_aliases(model)
    layout = {"model": {k: v for k, v in model_sd.items() if k not in aliases}, "optim": optim_sd}
    tensors, _ = split_state(layout)
    with _single_process_quiet():
        dcp.load(tensors, storage_reader=HuggingFaceStorageReader(str(ckpt / DCP_DIR)),
                 no_dist=not dist.is_initialized())
    restored = merge_state(layout, state["plain"], ckpt)
    for alias, name in aliases.items():  # a tied name gets the tensor its first name loaded
        if name in restored["model"]:
            restored["model"][alias] = restored["model"][name]
    set_state_dict(model, optimizers, model_state_dict=restored["model"], optim_state_dict=restored["optim"])
    torch.set_rng_state(state["rng_cpu"])
    if state["rng_cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["rng_cuda"], device)
    return state
