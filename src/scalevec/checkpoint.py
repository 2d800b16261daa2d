"""Checkpoints: atomic, exact resume, resumable with any number of processes (DESIGN.md §8).

A checkpoint is a directory ``RUN/checkpoints/step_XXXXXXX`` holding

- ``dcp/``: model and optimizer states written with ``torch.distributed.checkpoint`` (DCP) from
  ``get_state_dict``: each rank writes its own shards (FSDP2) or one copy of replicated tensors (DDP,
  one process), keyed by parameter name. DCP reshards on load, so a run saved by N processes resumes
  on M, with DDP, FSDP2 or none;
- ``model.safetensors``: the consolidated model (full tensors, gathered to rank 0), what
  ``train.load_run_model``, export and generate read; tied weights are stored once, as
  ``safetensors.torch.save_model`` does;
- ``train_state.pt``: the number of completed steps, rank 0's RNG states and trainer extras.

``RUN/checkpoints/latest`` names the newest. Everything is written into a temporary directory and
renamed into place by rank 0, so a killed run never leaves a half-written checkpoint. Every rank
calls ``save_checkpoint`` and ``load_checkpoint`` (they hold collectives). Under several nodes the
run directory must be on a filesystem that every node sees.
"""

from __future__ import annotations

import os
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_state_dict)

from . import distributed

CKPT_DIR = "checkpoints"


def save_checkpoint(out: Path, step: int, model: torch.nn.Module, optimizers: list, extra: dict) -> Path:
    """Write ``checkpoints/step_XXXXXXX`` atomically and point ``checkpoints/latest`` at it (all ranks call).

    ``model`` is the unwrapped model (FSDP2-sharded or plain; not the DDP wrapper). Keeps the two
    newest checkpoints.
    """
    root = Path(out) / CKPT_DIR
    final = root / f"step_{step:07d}"
    tmp = root / f".tmp_step_{step:07d}"
    lead = distributed.rank() == 0
    if lead:
        root.mkdir(exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    distributed.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizers)
    with _single_process_quiet():
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=tmp / "dcp", no_dist=not dist.is_initialized())
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if lead:
        save_consolidated(model, full, tmp / "model.safetensors")
        torch.save({
            "step": step,
            "rng_cpu": torch.get_rng_state(),
            "rng_cuda": torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None,
            "extra": extra,
        }, tmp / "train_state.pt")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        latest_tmp = root / "latest.tmp"
        latest_tmp.write_text(final.name)
        os.replace(latest_tmp, root / "latest")
        for old in sorted(root.glob("step_*"))[:-2]:
            shutil.rmtree(old, ignore_errors=True)
    distributed.barrier()
    return final


def save_consolidated(model: torch.nn.Module, state: dict[str, torch.Tensor], path: Path) -> None:
    """Write a full state dict as one safetensors file; a parameter registered under several names (tied
    embeddings) is stored once, and its other names are recorded in the metadata (``save_model``'s format)."""
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            aliases[name] = first[id(p)]
        else:
            first[id(p)] = name
    tensors = {k: v.detach().contiguous() for k, v in state.items() if k not in aliases}
    save_file(tensors, str(path), metadata={"format": "pt", **aliases})


@contextmanager
def _single_process_quiet():
    """Silence DCP's warning that it runs without a process group: one process is a supported case here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def latest_checkpoint(run_dir: Path) -> Path:
    """The directory named by ``checkpoints/latest``; ``FileNotFoundError`` if there is none."""
    latest = Path(run_dir) / CKPT_DIR / "latest"
    if not latest.is_file():
        raise FileNotFoundError(f"{run_dir} has no checkpoint (no {CKPT_DIR}/latest); is it a scalevec run directory?")
    path = latest.parent / latest.read_text().strip()
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"checkpoint {path} is incomplete (no model.safetensors)")
    return path


def load_checkpoint(ckpt: Path, model: torch.nn.Module, optimizers: list, device: torch.device) -> dict:
    """Load a checkpoint into ``model`` and ``optimizers`` in place (all ranks call; any number of processes,
    resharded by DCP), restore the RNG states, and return the train state (``step``, ``extra``)."""
    ckpt = Path(ckpt)
    if not (ckpt / "dcp" / ".metadata").is_file():
        raise FileNotFoundError(f"checkpoint {ckpt} has no dcp/ model and optimizer state (written by an older "
                                f"scalevec?); it can be exported or sampled, but not resumed")
    state = torch.load(ckpt / "train_state.pt", map_location="cpu", weights_only=True)
    model_sd, optim_sd = get_state_dict(model, optimizers)  # the layout to load into (sharded or not)
    with _single_process_quiet():
        dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=ckpt / "dcp", no_dist=not dist.is_initialized())
    set_state_dict(model, optimizers, model_state_dict=model_sd, optim_state_dict=optim_sd)
    torch.set_rng_state(state["rng_cpu"])
    if state["rng_cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["rng_cuda"], device)
    return state
