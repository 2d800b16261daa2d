"""The names in a run's ``checkpoints/`` folder and how its checkpoints are found (DESIGN.md §8).

Pathlib only, importing no other scalevec module: it sits below ``rundir``, which names the folder
among a run's entries (``--overwrite``) and tells a run with a checkpoint from one without (``state``),
while the rest of the package builds on ``rundir``. What the files hold and when a checkpoint may be
used: ``integrity``; writing and loading them: ``save_load``.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

CKPT_DIR = "checkpoints"  # RUN/checkpoints/
LATEST = "latest"  # RUN/checkpoints/latest: the name of the newest checkpoint (informative; discovery lists step_*)
DCP_DIR = "dcp"  # the model and optimizer tensors, one safetensors file per writing rank
MODEL_FILE = "model.safetensors"  # the consolidated model (export, generate, load_model)
TRAIN_STATE = "train_state.json"  # step, RNG states, trainer extras, the non-tensor optimizer state
MANIFEST = "MANIFEST.json"  # size and SHA-256 of every other file; written last
CKPT_FORMAT = "scalevec-checkpoint/2"  # the "format" of MANIFEST.json and train_state.json
_STEP_RE = re.compile(r"step_(\d{7,})")
_TMP_PREFIX = ".tmp_"  # a checkpoint being written: checkpoints/.tmp_step_XXXXXXX.TAG
# what a checkpoint folder holds (train_state.pt: the pickled train state of older versions), for --overwrite
CHECKPOINT_FILES = (DCP_DIR, MODEL_FILE, TRAIN_STATE, MANIFEST, "train_state.pt")


def step_name(step: int) -> str:
    """The folder name of the checkpoint after ``step`` completed steps: ``step_XXXXXXX`` (7 digits at least)."""
    return f"step_{step:07d}"


def is_step_name(name: str) -> bool:
    """Whether ``name`` is a checkpoint folder's name (``step_name``)."""
    return _STEP_RE.fullmatch(name) is not None


def step_of(ckpt: str | Path) -> int:
    """The step of a checkpoint folder, read from its name. ``ValueError`` for another name."""
    m = _STEP_RE.fullmatch(Path(ckpt).name)
    if not m:
        raise ValueError(f"{ckpt} is not a checkpoint directory name (step_XXXXXXX)")
    return int(m.group(1))


def tmp_checkpoint(run_dir: str | Path, step: int, tag: int) -> Path:
    """The temporary folder a checkpoint is written into before its rename (``tag``: the writer's)."""
    return Path(run_dir) / CKPT_DIR / f"{_TMP_PREFIX}{step_name(step)}.{tag}"


def checkpoint_dirs(run_dir: str | Path) -> list[Path]:
    """Every ``checkpoints/step_*`` directory, newest first (temporary ``.tmp_*`` ones excluded; symbolic
    links to directories included, for the readers to refuse them by name)."""
    root = Path(run_dir) / CKPT_DIR
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if is_step_name(p.name) and p.is_dir()]
    return sorted(found, key=step_of, reverse=True)


def is_legacy(ckpt: Path) -> bool:
    """A checkpoint from an older scalevec (pickle-based DCP metadata, ``train_state.pt``), or one made by
    hand with only ``model.safetensors``: it has no manifest and no ``train_state.json``."""
    return not (ckpt / MANIFEST).exists() and not (ckpt / TRAIN_STATE).exists()


def _is_temporary(name: str) -> bool:
    """A checkpoint being written (``.tmp_*``), a ``rundir.write_atomic`` temporary (``.NAME.PID.tmp``: ``latest``)
    or the ``latest.tmp`` of older versions."""
    return name.startswith(_TMP_PREFIX) or (name.startswith(".") and name.endswith(".tmp")) or name == LATEST + ".tmp"


def owned_entry(name: str):
    """``--overwrite``'s rule for an entry of ``checkpoints/`` (``rundir.remove_run``): ``True`` for what scalevec
    writes whole (``latest``, temporaries), for a checkpoint folder the rule for its own entries
    (``CHECKPOINT_FILES``), ``False`` for anything else, which is kept."""
    if is_step_name(name):
        return lambda entry: entry in CHECKPOINT_FILES
    return name == LATEST or _is_temporary(name)


def clean_temporaries(run_dir: str | Path) -> list[str]:
    """Remove what dead writers left in ``checkpoints/`` (call with the run's lock held): checkpoints being
    written (``.tmp_*``), the temporaries of ``rundir.write_atomic`` (``.NAME.PID.tmp``: ``latest``) and
    the ``latest.tmp`` of older versions. Returns their names. A symbolic link in place of ``checkpoints/``
    is left alone (never another run's temporaries)."""
    root = Path(run_dir) / CKPT_DIR
    removed = []
    if not root.is_dir() or root.is_symlink():
        return removed
    for p in root.iterdir():
        if _is_temporary(p.name):
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
            removed.append(p.name)
    return removed


__all__ = [
    "CKPT_DIR", "CKPT_FORMAT", "DCP_DIR", "LATEST", "MANIFEST", "MODEL_FILE", "TRAIN_STATE", "checkpoint_dirs",
    "clean_temporaries", "is_legacy", "is_step_name", "step_name", "step_of", "tmp_checkpoint",
]
