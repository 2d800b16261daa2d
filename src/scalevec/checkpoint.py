"""Checkpoints: atomic writes, exact resume, loadable with ``weights_only`` (DESIGN.md §8).

A checkpoint is a directory ``RUN/checkpoints/step_XXXXXXX`` holding ``model.safetensors`` (the full,
consolidated model state) and ``train_state.pt`` (optimizer states, completed steps, RNG states and
trainer extras); ``RUN/checkpoints/latest`` names the newest. Each is written into a temporary
directory and renamed into place, so a killed run never leaves a half-written checkpoint.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model

CKPT_DIR = "checkpoints"


def save_checkpoint(out: Path, step: int, model: torch.nn.Module, optimizers: list, extra: dict) -> Path:
    """Write ``checkpoints/step_XXXXXXX`` atomically and point ``checkpoints/latest`` at it.

    Holds ``model.safetensors`` (the consolidated model) and ``train_state.pt`` (optimizer states, the
    number of completed steps, RNG states, ``extra``). Keeps the two newest checkpoints.
    """
    root = out / CKPT_DIR
    root.mkdir(exist_ok=True)
    final = root / f"step_{step:07d}"
    tmp = root / f".tmp_step_{step:07d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_model(model, str(tmp / "model.safetensors"))
    state = {
        "step": step,
        "optimizers": [o.state_dict() for o in optimizers],
        "rng_cpu": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "extra": extra,
    }
    torch.save(state, tmp / "train_state.pt")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = root / "latest.tmp"
    latest_tmp.write_text(final.name)
    os.replace(latest_tmp, root / "latest")
    for old in sorted(root.glob("step_*"))[:-2]:
        shutil.rmtree(old, ignore_errors=True)
    return final


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
    """Load a checkpoint into ``model`` and ``optimizers`` (in place), restore the RNG states, and return
    the train state (``step``, ``extra``)."""
    load_model(model, str(ckpt / "model.safetensors"), device=str(device))
    state = torch.load(ckpt / "train_state.pt", map_location=device, weights_only=True)
    for opt, sd in zip(optimizers, state["optimizers"], strict=True):
        opt.load_state_dict(sd)
    torch.set_rng_state(state["rng_cpu"].cpu())
    if state["rng_cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["rng_cuda"]])
    return state
