"""When a checkpoint may be used: its manifest, its train state, and the choice of one (DESIGN.md §8).

- *Integrity.* ``write_manifest`` records the size and SHA-256 of every file of a checkpoint, last;
  a checkpoint is used only when its manifest matches its files, its safetensors files parse, and what
  it says about itself agrees (folder, manifest and train state name one step, within the run's
  steps); otherwise the next older one is tried, and the caller is told which was skipped and why.
- *Nothing read runs code.* The train state is JSON (``write_train_state`` / ``read_train_state``);
  the tensors are safetensors (``save_load``).
- *Discovery.* ``resumable_checkpoint`` / ``checkpoint_candidates``: the newest intact checkpoint to
  resume from; ``model_checkpoint``: the checkpoint whose ``model.safetensors`` export and generate
  read (never an older one than asked for).

Every error is a ``CorruptCheckpoint`` or a ``rundir.RunDirError`` (``ValueError``), one line naming
the file and the fix.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from scalevec.config.files import JSONProblem, load_json
from scalevec.config.typed import is_int
from scalevec.training.checkpoint.layout import (
    CKPT_DIR,
    CKPT_FORMAT,
    DCP_DIR,
    MANIFEST,
    MODEL_FILE,
    TRAIN_STATE,
    checkpoint_dirs,
    is_legacy,
    is_step_name,
    step_of,
)
from scalevec.training.rundir import CONFIG, RunDirError, link_words, load_config, locked_by, one_line, read_diverged


class CorruptCheckpoint(RunDirError):
    """A checkpoint's files do not match its manifest (or cannot be read)."""


# ----------------------------------------------------------------------------------------- the manifest


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO in a checkpoint must not hang the check
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CorruptCheckpoint(f"{path} is not a regular file (a FIFO, socket or device)")
    os.set_blocking(fd, True)
    with os.fdopen(fd, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(ckpt: Path, step: int) -> None:
    """Write ``MANIFEST.json`` (size and SHA-256 of every other file of ``ckpt``), fsynced. Call it last,
    before the rename that publishes the checkpoint."""
    files = {}
    for p in sorted(ckpt.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            rel = p.relative_to(ckpt).as_posix()
            files[rel] = {"bytes": p.stat().st_size, "sha256": _sha256(p)}
    path = ckpt / MANIFEST
    with open(path, "w") as f:
        json.dump({"format": CKPT_FORMAT, "step": step, "files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def _load(path: Path) -> Any:
    """A checkpoint's JSON file (``load_json``). Raises ``ValueError``, for its text with the problem alone (the
    caller names the file): not JSON, nested too deeply, a key twice in one object; and for a FIFO, folder or
    oversized file."""
    try:
        return load_json(path, "checkpoint file", "it is damaged")
    except JSONProblem as e:
        raise ValueError(e.problem) from None


def verify_checkpoint(ckpt: str | Path, only: tuple[str, ...] | None = None) -> dict:
    """Check ``ckpt`` against its manifest (all files, or those named in ``only``) and return the manifest.

    Raises ``CorruptCheckpoint`` naming the first problem: no or unreadable manifest, a missing, resized
    or changed file, or (for a full check) a file in ``dcp/`` the manifest does not list or a
    ``.safetensors`` file whose header does not parse (a manifest rewritten over a damaged file).
    """
    ckpt = Path(ckpt)
    path = ckpt / MANIFEST
    if not path.exists() and not path.is_symlink():
        raise CorruptCheckpoint(f"{ckpt} has no {MANIFEST} (incomplete or damaged)")
    try:
        manifest = _load(path)
        files = manifest["files"]
        if manifest.get("format") != CKPT_FORMAT or not isinstance(files, dict):
            raise ValueError(f"unknown format {manifest.get('format')!r}")
        if is_step_name(ckpt.name) and manifest.get("step") != step_of(ckpt):
            raise ValueError(f"it describes step {manifest.get('step')!r}, not {step_of(ckpt)}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CorruptCheckpoint(f"{path} cannot be read ({one_line(e)})") from None
    names = list(files) if only is None else list(only)
    for name in names:
        if name not in files:
            raise CorruptCheckpoint(f"{ckpt}/{name} is not listed in its {MANIFEST}")
        p, want = ckpt / name, files[name]
        try:
            size = p.stat().st_size
        except OSError as e:
            raise CorruptCheckpoint(f"{p} cannot be read ({one_line(e)})") from None
        if size != want.get("bytes"):
            raise CorruptCheckpoint(f"{p} has {size} bytes, its manifest says {want.get('bytes')} (truncated or "
                                    "damaged)")
        if _sha256(p) != want.get("sha256"):
            raise CorruptCheckpoint(f"{p} does not match the SHA-256 of its manifest (damaged)")
    if only is None and (ckpt / DCP_DIR).is_dir():
        extra = [p.relative_to(ckpt).as_posix() for p in (ckpt / DCP_DIR).iterdir()
                 if p.relative_to(ckpt).as_posix() not in files]
        if extra:
            raise CorruptCheckpoint(f"{ckpt} holds {extra[0]}, which its manifest does not list (not written by this "
                                    "checkpoint)")
    if only is None:
        for name in names:
            if name.endswith(".safetensors"):
                _check_safetensors(ckpt / name)
    return manifest


def _check_safetensors(path: Path) -> None:
    """``CorruptCheckpoint`` unless ``path`` is a safetensors file whose header parses (safetensors checks
    the dtypes, shapes and offsets of every tensor against the file; nothing is loaded)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            f.keys()
    except (SafetensorError, OSError, ValueError) as e:
        raise CorruptCheckpoint(f"{path} is not a safetensors file ({one_line(e)})") from None


# ----------------------------------------------------------------------------------------- train state


def _b64(t) -> str | None:
    return None if t is None else base64.b64encode(t.numpy().tobytes()).decode()


def _unb64(s: str | None):
    import torch

    return None if s is None else torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def write_train_state(path: Path, step: int, rng_cpu, rng_cuda, extra: dict, plain: list) -> None:
    """``train_state.json``: step, RNG states (base64 bytes), trainer extras and the non-tensor leaves of
    the model and optimizer state (``plain``: ``[path, value]`` pairs)."""
    with open(path, "w") as f:
        json.dump({"format": CKPT_FORMAT, "step": step, "rng_cpu": _b64(rng_cpu), "rng_cuda": _b64(rng_cuda),
                   "extra": extra, "plain": plain}, f, allow_nan=True)
        f.flush()
        os.fsync(f.fileno())


def read_train_state(ckpt: Path) -> dict:
    """The train state of a checkpoint, with RNG states as uint8 tensors. ``CorruptCheckpoint`` when it
    is missing or malformed: not a JSON object; a step that is not a count, or (in a ``step_N`` folder)
    not N; ``plain`` not a list of ``[path, value]`` pairs; ``extra`` not a mapping; ``rng_cpu`` not the
    size of torch's CPU generator state."""
    import torch

    path = Path(ckpt) / TRAIN_STATE
    if not path.exists() and not path.is_symlink():
        raise CorruptCheckpoint(f"{path} does not exist")
    try:
        state = _load(path)
        if not isinstance(state, dict):
            raise ValueError("not a JSON object")
        step = state.get("step")
        if not is_int(step, least=0):
            raise ValueError(f"step {step!r} is not a step count")
        if is_step_name(Path(ckpt).name) and step != step_of(ckpt):
            raise ValueError(f"it describes step {step}, not {step_of(ckpt)}")
        plain = state.get("plain")
        if not isinstance(plain, list) or not all(isinstance(x, list) and len(x) == 2 and isinstance(x[0], list)
                                                  for x in plain):
            raise ValueError("its plain state is not a list of [path, value] pairs")
        state.setdefault("extra", {})
        if not isinstance(state["extra"], dict):
            raise ValueError(f"extra is a {type(state['extra']).__name__}, not a mapping")
        state["rng_cpu"], state["rng_cuda"] = _unb64(state["rng_cpu"]), _unb64(state.get("rng_cuda"))
        size = torch.get_rng_state().numel()
        if state["rng_cpu"] is None or state["rng_cpu"].numel() != size:
            raise ValueError(f"rng_cpu is not a CPU generator state ({size} bytes)")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CorruptCheckpoint(f"{path} cannot be read ({one_line(e)})") from None
    return state


# ----------------------------------------------------------------------------------------- discovery


def checkpoint_candidates(run_dir: str | Path, before: int | None = None,
                          steps: int | None = None) -> Iterator[tuple[Path, str | None]]:
    """Every checkpoint of ``run_dir`` (step < ``before`` when given), newest first, with ``None`` when it
    is intact or the reason it must not be used: a symbolic link (another run's checkpoint), an older
    pickle-based format, a step past the run's ``steps`` (default: ``config.yaml``'s), a manifest that does
    not match its files (``verify_checkpoint``) or a malformed train state (``read_train_state``, which
    also requires the step of the folder). Raises ``RunDirError`` when ``steps`` is needed and the run's
    config cannot be read."""
    if steps is None:
        from scalevec.config.run_budget import total_steps

        steps = total_steps(load_config(run_dir))
    for ckpt in checkpoint_dirs(run_dir):
        if before is not None and step_of(ckpt) >= before:
            continue
        yield ckpt, _unusable(ckpt, steps)


def _unusable(ckpt: Path, steps: int) -> str | None:
    """Why ``ckpt`` must not be resumed from (``checkpoint_candidates``), or ``None``."""
    if ckpt.is_symlink():
        return f"it is {link_words(ckpt)}, not a checkpoint of this run; it is never read or " \
               "written through"
    if is_legacy(ckpt):
        return "written by an older scalevec in a pickle-based format, which is never loaded (it could run code); " \
               "export it with that version"
    if step_of(ckpt) > steps:
        return f"its step is past the {steps} steps of the run's {CONFIG} (renamed or written by something else)"
    try:
        verify_checkpoint(ckpt)
        read_train_state(ckpt)
    except RunDirError as e:
        return str(e)
    return None


def resumable_checkpoint(run_dir: str | Path, before: int | None = None,
                         steps: int | None = None) -> tuple[Path | None, list[str]]:
    """The newest intact checkpoint to resume from (step < ``before`` when given; ``checkpoint_candidates``)
    and one line per newer checkpoint skipped, with the reason. ``(None, skipped)`` when there is none."""
    skipped = []
    for ckpt, problem in checkpoint_candidates(run_dir, before, steps):
        if problem is None:
            return ckpt, skipped
        skipped.append(f"{ckpt.name}: {problem}")
    return None, skipped


def model_checkpoint(run_dir: str | Path) -> tuple[Path, list[str]]:
    """The checkpoint whose ``model.safetensors`` export and generate read: the newest one (for a diverged
    run, the newest from before the trouble), its model verified against the manifest. It never falls
    back to an older model (that would give other weights than the user asked for): a damaged newest
    model is an error. Returns ``(checkpoint, [])``.

    Raises ``RunDirError`` when there is none or its model is damaged.
    """
    run_dir = Path(run_dir)
    div = read_diverged(run_dir)
    before = div["first_bad_step"] if div else None
    ckpts = [c for c in checkpoint_dirs(run_dir) if before is None or step_of(c) < before]
    if not ckpts:
        if div:
            raise RunDirError(f"{run_dir} diverged at step {div['step']} ({div['reason']}) and has no checkpoint "
                              f"from before step {before}; there is no healthy model to use, retrain with a lower lr")
        holder = locked_by(run_dir)
        if holder:  # training now, before its first checkpoint: waiting is the fix, not training it
            raise RunDirError(f"{run_dir} is being trained by process {holder} and has no checkpoint yet; wait for "
                              f"its first one (train.ckpt_every) or for the run to finish")
        raise RunDirError(f"{run_dir} has no checkpoint (no {CKPT_DIR}/step_*); train it first (or --resume it)")
    ckpt = ckpts[0]
    if ckpt.is_symlink():
        raise RunDirError(f"{ckpt} is {link_words(ckpt)}, not a checkpoint of this run; "
                          f"refusing to use it: replace it by a copy, or remove it")
    if not (ckpt / MODEL_FILE).is_file():
        raise RunDirError(f"{ckpt} has no {MODEL_FILE} (incomplete or damaged); restore the checkpoint or retrain the "
                          "run")
    if not is_legacy(ckpt):
        try:
            verify_checkpoint(ckpt, only=(MODEL_FILE,))
        except CorruptCheckpoint as e:
            raise RunDirError(f"{e}; refusing to use it: restore the checkpoint, or retrain the run") from None
    return ckpt, []


__all__ = [
    "CorruptCheckpoint", "checkpoint_candidates", "model_checkpoint", "read_train_state", "resumable_checkpoint",
    "verify_checkpoint", "write_manifest", "write_train_state",
]
