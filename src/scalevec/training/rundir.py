"""The run directory: its layout, markers, metrics, lock, checkpoints and their integrity (DESIGN.md §8).

This module is the only one that knows where things live in a run directory; ``train``, ``sweep``,
``compare``, ``report``, ``export`` and ``generate`` go through it. Layout::

    RUN/config.yaml            the resolved RunConfig (YAML, read with safe_load)
    RUN/meta.json              the run format marker (``RUN_FORMAT``), versions, code version, host, start time
    RUN/optim_groups.txt       the optimizer group table
    RUN/metrics.jsonl          one JSON object per line (train / eval / probe rows)
    RUN/metrics.jsonl.damaged  a damaged metrics.jsonl that resume set aside (never deleted by it)
    RUN/summary.json           final figures (finished runs)
    RUN/eval.json              downstream scores of ``scalevec eval`` per task (also in an export directory)
    RUN/tokenizer/             tokenizer.json (+ tokenizer_config.json)
    RUN/DONE                   the run finished
    RUN/DIVERGED               the run stopped on its health guard: {"step", "first_bad_step", "reason", "checkpoint"}
    RUN/.lock                  the writer's OS lock (``fcntl.flock``); holds the writer's PID
    RUN/tensorboard/, RUN/wandb/, RUN/wandb_id   the trackers' mirrors (tracking.py)
    RUN/checkpoints/step_XXXXXXX/
        dcp/*.safetensors      model + optimizer tensors, one file per writing rank, in torch's
                               safetensors-backed DCP format (reshardable to any number of processes)
        model.safetensors      the consolidated model (export, generate)
        train_state.json       step, RNG states, trainer extras, the non-tensor optimizer state
        MANIFEST.json          size and SHA-256 of every file above; written last, before the rename
    RUN/checkpoints/latest     the name of the newest checkpoint (informative; discovery lists step_*)

What this module guarantees (our choices, documented in README "Run directories"):

- *Nothing read from a run directory runs code.* Every file is JSON, YAML (``yaml.safe_load``) or
  safetensors; no pickle is ever loaded, and the DCP reader used is torch's ``HuggingFaceStorageReader``,
  which builds its metadata from safetensors headers (the default DCP reader unpickles ``.metadata``).
- *Integrity.* A checkpoint is used only when its manifest matches its files, its safetensors files
  parse, and what it says about itself agrees (folder, manifest and train state name one step, within
  the run's steps); otherwise the next older one is tried, and the caller is told which was skipped and
  why. A run writes only into its own files: a symbolic link in place of ``checkpoints/``,
  ``metrics.jsonl`` or a ``step_*`` folder is never written through.
- *Only scalevec's files are deleted.* A run is recognized by its ``meta.json`` (``is_run``), never by a
  file name alone; ``--overwrite`` deletes the entries scalevec writes (``RUN_ENTRIES``) and leaves, and
  names, anything else.
- *One writer.* A writer holds ``fcntl.flock`` on ``RUN/.lock`` (released by the kernel when the
  process dies, even by SIGKILL); a second writer is refused at once, naming the holder's PID.
- *Every read error is one line* (``RunDirError``, a ``ValueError``) naming the file and the fix.
"""

from __future__ import annotations

import base64
import datetime
import errno
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

CONFIG = "config.yaml"
META = "meta.json"
GROUPS = "optim_groups.txt"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
EVAL = "eval.json"
TOKENIZER = "tokenizer"
DONE = "DONE"
DIVERGED = "DIVERGED"
LOCK = ".lock"
CKPT_DIR = "checkpoints"
LATEST = "latest"
MANIFEST = "MANIFEST.json"
TRAIN_STATE = "train_state.json"
MODEL_FILE = "model.safetensors"
DCP_DIR = "dcp"
CKPT_FORMAT = "scalevec-checkpoint/2"
RUN_FORMAT = "scalevec-run/1"  # meta.json's "format": the marker that scalevec train wrote the directory
# what meta.json has always held (runs written before RUN_FORMAT existed are recognized by these keys)
LEGACY_META_KEYS = ("scalevec", "torch", "python", "start_time")
DAMAGED = ".damaged"  # the suffix of a damaged file set aside (metrics.jsonl.damaged)
TRACKER_ENTRIES = ("tensorboard", "wandb", "wandb_id")  # written by tracking.py
# every entry scalevec writes in a run directory: what --overwrite deletes (LOCK is kept: its holder is the caller)
RUN_ENTRIES = (CONFIG, META, GROUPS, METRICS, SUMMARY, EVAL, TOKENIZER, DONE, DIVERGED, CKPT_DIR, *TRACKER_ENTRIES)
# entries a resume writes into in place (appends, new checkpoints): a symbolic link there would send the
# writes into what it points to, e.g. another run's checkpoints
NO_LINKS = (CKPT_DIR, METRICS)
# the small files of a run that git keeps for a study's committed runs (.gitignore lists the same): enough for
# a sweep to count the run done and for its report (summary.json repeats the eval rows); the rest stays local
KEPT = (CONFIG, META, GROUPS, SUMMARY, DONE, DIVERGED)
_STEP_RE = re.compile(r"step_(\d{7,})")


class RunDirError(ValueError):
    """A run directory cannot be used as asked; the message is one line naming the file and the fix."""


class RunLocked(RunDirError):
    """Another process holds the run directory's lock."""


class CorruptCheckpoint(RunDirError):
    """A checkpoint's files do not match its manifest (or cannot be read)."""


def one_line(e: BaseException) -> str:
    """An error's text on one line (an ``OSError``'s strerror; the type's name when there is no text)."""
    text = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return " ".join(str(text).split())


# ----------------------------------------------------------------------------------------- plain files


def tmp_path(path: Path) -> Path:
    """A temporary name beside ``path``, unique per process: ``.NAME.PID.tmp``."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def write_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a per-process temporary file and a rename; on failure
    (a full disk) the temporary file is removed and the ``OSError`` re-raised."""
    path = Path(path)
    tmp = tmp_path(path)
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: str | Path, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=2, default=str))


def read_json(path: str | Path, fix: str = "restore it from a copy of the run or retrain the run") -> Any:
    """A JSON file; ``RunDirError`` naming the file and ``fix`` when it is missing, unreadable or invalid."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunDirError(f"{path} does not exist; {fix}") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise RunDirError(f"{path} cannot be read ({one_line(e)}); {fix}") from None


def write_meta(run_dir: str | Path, meta: dict) -> None:
    """Write ``meta.json``: ``meta`` (``environment.run_meta``) under the run format marker ``RUN_FORMAT``,
    what ``is_run`` recognizes a run by."""
    write_json(Path(run_dir) / META, {"format": RUN_FORMAT, **meta})


def _not_a_run(path: Path, config: bool = True) -> str | None:
    """Why ``path`` is not a scalevec run directory (for a message), or ``None`` when it is one. With
    ``config=False``, a ``meta.json`` with ``RUN_FORMAT`` is enough (what scalevec may empty: a set-up
    interrupted before ``config.yaml``); a legacy ``meta.json`` always needs ``config.yaml`` beside it."""
    meta = None
    if (path / META).is_file():  # a regular file: reading a FIFO there would wait forever
        try:
            meta = json.loads((path / META).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            pass
    if isinstance(meta, dict) and meta.get("format") == RUN_FORMAT and not config:
        return None
    if not (path / CONFIG).is_file():
        return f"no {CONFIG}"
    if not (path / META).exists():
        return f"no {META}"
    if isinstance(meta, dict) and "format" in meta:
        return None if meta["format"] == RUN_FORMAT else f"its {META} has format {meta['format']!r}, not {RUN_FORMAT!r}"
    if isinstance(meta, dict) and all(k in meta for k in LEGACY_META_KEYS):
        return None
    return f"its {META} is not one scalevec wrote"


def is_run(path: str | Path) -> bool:
    """True for a directory that ``scalevec train`` wrote: it holds ``config.yaml`` and a ``meta.json``
    with the run format marker (``RUN_FORMAT``), or, written before the marker existed, with the keys the
    trainer has always written (``LEGACY_META_KEYS``). A file name alone never makes a run (a project
    folder with its own ``config.yaml`` is none), since ``--overwrite`` empties runs."""
    return _not_a_run(Path(path)) is None


def load_config(run_dir: str | Path):
    """The ``RunConfig`` stored in ``run_dir/config.yaml`` (read with ``yaml.safe_load``).

    Raises ``RunDirError`` when it is missing, not YAML, or not a valid config.
    """
    from scalevec.config import RunConfig, from_dict, load_yaml

    path = Path(run_dir) / CONFIG
    if not path.is_file():
        raise RunDirError(f"{run_dir} is not a scalevec run directory (no {CONFIG}); pass a run directory")
    try:
        return from_dict(RunConfig, load_yaml(path))
    except (OSError, ValueError, TypeError) as e:
        raise RunDirError(f"{path} is not a valid run config ({one_line(e)}); restore it or retrain the run") from None


def load_tokenizer(run_dir: str | Path):
    """The run's tokenizer (``run_dir/tokenizer``); ``RunDirError`` when it is missing or invalid."""
    from scalevec.data.tokenizer import load_tokenizer_dir

    path = Path(run_dir) / TOKENIZER
    try:
        return load_tokenizer_dir(path)
    except Exception as e:  # the tokenizers library raises a bare Exception for a malformed tokenizer.json
        raise RunDirError(f"{path} cannot be read ({one_line(e)}); restore the run's tokenizer/ folder") from None


# ----------------------------------------------------------------------------------------- metrics


def _scan_metrics(path: Path) -> tuple[list[dict], str | None, str | None]:
    """``(rows, cut, damage)`` of a metrics file: every readable row; ``cut``, a note when the last line
    is cut off (what a kill or a full disk leaves: the start of a row, with no newline after it); and
    ``damage``, the first other bad line (``None`` when there is none). ``RunDirError`` when unreadable."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise RunDirError(f"{path} cannot be read ({one_line(e)}); check its permissions") from None
    rows, cut, damage, lines = [], None, None, text.split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or "kind" not in row or "step" not in row:
                raise ValueError("not a metrics row")
        except ValueError:
            # a cut-off write is a prefix of one JSON row on the last line; NUL bytes or undecodable bytes
            # (U+FFFD) are not what an append leaves, but a damaged file, and so is anything past a bad line
            if i == len(lines) - 1 and line.startswith("{") and "\x00" not in line and "\ufffd" not in line:
                cut = f"{path}: dropped a cut-off last line ({len(line)} bytes, left by an interrupted write)"
            elif damage is None:
                damage = f"line {i + 1} is not a metrics row"
            continue
        rows.append(row)
    return rows, cut, damage


def read_metrics(run_dir: str | Path, kind: str | None = None,
                 notice: Callable[[str], None] | None = None) -> list[dict]:
    """The rows of ``metrics.jsonl`` (all, or those of ``kind``); ``[]`` if the file is missing.

    A last line that is cut off (what a kill or a full disk leaves: the start of a row without its
    newline) is dropped, and ``notice`` is told; any other bad line (NUL bytes, a line that is no row)
    is an error (``RunDirError``).
    """
    path = Path(run_dir) / METRICS
    if not path.exists():
        return []
    rows, cut, damage = _scan_metrics(path)
    if damage:
        raise RunDirError(f"{path} {damage}; repair or delete that line")
    if cut and notice:
        notice(cut)
    return [r for r in rows if kind is None or r.get("kind") == kind]


def append_metrics(run_dir: str | Path, row: dict) -> None:
    """Append one row to ``metrics.jsonl`` with a single ``write`` (a kill leaves whole lines or one
    cut-off last line, which ``read_metrics`` drops)."""
    data = (json.dumps(row) + "\n").encode()
    fd = os.open(Path(run_dir) / METRICS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def rewrite_metrics(run_dir: str | Path, keep: Callable[[dict], bool],
                    notice: Callable[[str], None] | None = None) -> None:
    """Rewrite ``metrics.jsonl`` with the rows for which ``keep`` is true (resume drops the rows past
    its checkpoint, and a cut-off last line with a notice). A file damaged otherwise (``read_metrics``'s
    errors) is never destroyed: it is renamed to ``metrics.jsonl.damaged`` (``.damaged.1``, ... when
    that exists), ``notice`` is told, and its readable rows are kept."""
    path = Path(run_dir) / METRICS
    if not path.is_file():
        return
    rows, cut, damage = _scan_metrics(path)
    if damage:
        aside = path.with_name(path.name + DAMAGED)
        n = 0
        while aside.exists():
            n += 1
            aside = path.with_name(f"{path.name}{DAMAGED}.{n}")
        os.replace(path, aside)
        if notice:
            notice(f"{path} is damaged ({damage}); moved it to {aside.name} and kept its readable rows "
                   f"(the rows lost with the damage are missing from the new file)")
    elif cut and notice:
        notice(cut)
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in rows if keep(r)))


# ----------------------------------------------------------------------------------------- markers


def mark_done(run_dir: str | Path) -> None:
    write_atomic(Path(run_dir) / DONE, time.strftime("%Y-%m-%dT%H:%M:%S%z") + "\n")


def is_done(run_dir: str | Path) -> bool:
    return (Path(run_dir) / DONE).is_file()


def mark_diverged(run_dir: str | Path, step: int, first_bad_step: int, reason: str, checkpoint: str | None) -> None:
    """Write ``DIVERGED``: the step the guard stopped at, the first step of the trouble, the reason and
    the checkpoint kept from before it (``None`` when none was written before the trouble)."""
    write_json(Path(run_dir) / DIVERGED, {"step": step, "first_bad_step": first_bad_step, "reason": reason,
                                          "checkpoint": checkpoint,
                                          "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")})


def read_diverged(run_dir: str | Path) -> dict | None:
    """The ``DIVERGED`` record, or ``None`` when the run did not diverge."""
    path = Path(run_dir) / DIVERGED
    if not path.exists():
        return None
    data = read_json(path, fix="delete it to treat the run as not diverged")
    if not isinstance(data, dict) or not isinstance(data.get("first_bad_step"), int):
        raise RunDirError(f"{path} is not a DIVERGED record; delete it to treat the run as not diverged")
    return data


def is_diverged(run_dir: str | Path) -> bool:
    """True when the run stopped on its health guard: ``DIVERGED`` is present or, for runs trained before
    that marker existed, the last attempt in the sweep's log beside it (``NAME.log``) says "non-finite"."""
    d = Path(run_dir)
    if (d / DIVERGED).exists():
        return True
    log = d.with_name(d.name + ".log")
    try:
        last = log.read_text(errors="replace").rsplit("\n$ ", 1)[-1] if log.is_file() else ""
    except OSError:
        return False
    return "non-finite" in last


def state(run_dir: str | Path) -> str:
    """``new`` (nothing there), ``done``, ``diverged``, ``resume`` (a checkpoint to continue from) or
    ``restart`` (a partial run without one: ``--resume`` starts it from step 0)."""
    d = Path(run_dir)
    if not d.exists() or not any(p.name != LOCK for p in d.iterdir()):
        return "new"
    if is_done(d):
        return "done"
    if is_diverged(d):
        return "diverged"
    return "resume" if checkpoint_dirs(d) else "restart"


def check_out_dir(out: Path, resume: bool, overwrite: bool) -> None:
    """May a run be written into ``out``? Refuses to clobber an existing run (``FileExistsError`` naming
    ``--resume``/``--overwrite``) and a non-empty directory that is not a run (``FileExistsError``: only
    runs are overwritten, ``is_run``), to resume what is not a run (``FileNotFoundError``), a diverged run
    (``ValueError``) or one whose ``checkpoints/`` or ``metrics.jsonl`` is a symbolic link (``RunDirError``,
    ``check_no_links``), and a path under a file (``NotADirectoryError``). The trainer checks it before
    its work and again under the run's lock before anything is written (``Trainer.setup_run_dir``)."""
    if resume and overwrite:
        raise ValueError("--resume and --overwrite exclude each other; pick one")
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out} exists and is not a directory; choose another --out")
    parent = next((p for p in out.absolute().parents if p.exists()), None)
    if not out.exists() and parent is not None and not parent.is_dir():
        raise NotADirectoryError(f"{parent} is a file, so --out {out} cannot be created; choose another --out")
    existing = out.is_dir() and any(p.name != LOCK for p in out.iterdir())
    why = _not_a_run(out, config=resume) if existing else None
    if resume:
        if not existing or why:
            raise FileNotFoundError(f"{out} is not a scalevec run directory ({why or 'it is empty or missing'}), so "
                                    f"there is nothing to resume; drop --resume to start a new run")
        check_no_links(out)
        div = read_diverged(out)
        if div:
            raise ValueError(f"{out} diverged at step {div['step']} ({div['reason']}); it is kept as a result "
                             f"(DIVERGED); start a new --out with a lower lr, or --overwrite it")
    elif why:
        # --overwrite empties the directory: never do that to one that scalevec did not write
        raise FileExistsError(f"{out} is not empty and is not a scalevec run directory ({why}); choose a new or "
                              f"empty --out")
    elif existing and not overwrite:
        raise FileExistsError(f"{out} already holds a run; pass --resume to continue it (from its last checkpoint, "
                              f"or step 0 when it has none) or --overwrite to replace it")


# ----------------------------------------------------------------------------------------- the lock


class RunLock:
    """An exclusive ``fcntl.flock`` on ``RUN/.lock`` (the file holds the holder's PID).

    ``acquire()`` raises ``RunLocked`` at once (never waits) when another process holds it; the kernel
    releases it when the holder exits, however it dies. The lock file is never deleted (deleting it
    would let two writers lock two different files).
    """

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / LOCK
        self.fd: int | None = None

    def acquire(self) -> RunLock:
        if self.fd is not None:
            return self
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise RunLocked(f"{self.path.parent} is in use by process {_holder(self.path)} (it holds {self.path}); "
                            f"wait for it to finish or stop it, then retry") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            self.release()
        except OSError:
            pass


def _holder(lock_file: Path) -> str:
    try:
        return lock_file.read_text().strip() or "?"
    except OSError:
        return "?"


def locked_by(run_dir: str | Path) -> str | None:
    """The PID (as text) of the process holding the run's lock, or ``None`` when nobody does."""
    path = Path(run_dir) / LOCK
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return _holder(path)
    finally:
        os.close(fd)  # closing drops our probe lock
    return None


def _written_by_scalevec(name: str) -> bool:
    """An entry of a run directory that scalevec writes: ``RUN_ENTRIES``, a damaged file set aside
    (``NAME.damaged*``) and the temporaries of ``write_atomic`` (``.NAME.PID.tmp``) and ``write_eval``."""
    if name in RUN_ENTRIES or name.startswith(METRICS + DAMAGED):
        return True
    m = re.fullmatch(r"\.(.+?)(\.\d+)?\.tmp", name)
    return bool(m) and m.group(1) in RUN_ENTRIES


def remove_run(path: str | Path, notice: Callable[[str], None] | None = None) -> list[str]:
    """Empty a scalevec run directory for ``--overwrite``: delete what scalevec writes there (``RUN_ENTRIES``,
    damaged files set aside, temporaries; a symbolic link is removed, never what it points to), keep its
    lock file (which the caller holds) and leave everything else. Returns the names left, which ``notice``
    is told. Raises ``RunDirError`` when ``path`` is not a run directory (``is_run``, or a ``meta.json``
    with ``RUN_FORMAT`` alone: a set-up interrupted before ``config.yaml``): nothing is deleted."""
    path = Path(path)
    why = _not_a_run(path, config=False)
    if why:
        raise RunDirError(f"{path} is not a scalevec run directory ({why}); --overwrite deletes only runs, "
                          f"choose a new or empty --out")
    left = []
    # meta.json last: an interrupted removal leaves a directory that is still recognized as a run
    for p in sorted(path.iterdir(), key=lambda p: p.name == META):
        if p.name == LOCK:
            continue
        if not _written_by_scalevec(p.name):
            left.append(p.name)
        elif p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    if left and notice:
        notice(f"--overwrite left {len(left)} file(s) in {path} that scalevec did not write: {', '.join(sorted(left))}")
    return sorted(left)


def check_no_links(run_dir: str | Path) -> None:
    """Refuse a run directory whose ``checkpoints/`` or ``metrics.jsonl`` (``NO_LINKS``) is a symbolic link:
    resuming would write the new checkpoints and rows into what it points to (another run). Raises
    ``RunDirError`` naming the link and its target."""
    for name in NO_LINKS:
        link = Path(run_dir) / name
        if link.is_symlink():
            raise RunDirError(f"{link} is a symbolic link (to {os.readlink(link)}); a run writes only into its own "
                              f"files: replace the link by a copy of what it points to, or start a new --out")


# ----------------------------------------------------------------------------------------- checkpoints


def step_of(ckpt: Path) -> int:
    m = _STEP_RE.fullmatch(Path(ckpt).name)
    if not m:
        raise ValueError(f"{ckpt} is not a checkpoint directory name (step_XXXXXXX)")
    return int(m.group(1))


def checkpoint_dirs(run_dir: str | Path) -> list[Path]:
    """Every ``checkpoints/step_*`` directory, newest first (temporary ``.tmp_*`` ones excluded; symbolic
    links to directories included, for the readers to refuse them by name)."""
    root = Path(run_dir) / CKPT_DIR
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP_RE.fullmatch(p.name) and p.is_dir()]
    return sorted(found, key=step_of, reverse=True)


def clean_temporaries(run_dir: str | Path) -> list[str]:
    """Remove the temporary checkpoints and files left by dead writers (call with the lock held)."""
    removed = []
    root = Path(run_dir) / CKPT_DIR
    for base in (Path(run_dir), root):
        if not base.is_dir() or (base is root and root.is_symlink()):  # never another run's temporaries
            continue
        for p in base.iterdir():
            if p.name.startswith(".tmp_") or (p.name.startswith(".") and p.name.endswith(".tmp")) \
                    or p.name == "latest.tmp":
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
                removed.append(p.name)
    return removed


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
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


def is_legacy(ckpt: Path) -> bool:
    """A checkpoint from an older scalevec (pickle-based DCP metadata, ``train_state.pt``), or one made by
    hand with only ``model.safetensors``: it has no manifest and no ``train_state.json``."""
    return not (ckpt / MANIFEST).exists() and not (ckpt / TRAIN_STATE).exists()


def verify_checkpoint(ckpt: str | Path, only: tuple[str, ...] | None = None) -> dict:
    """Check ``ckpt`` against its manifest (all files, or those named in ``only``) and return the manifest.

    Raises ``CorruptCheckpoint`` naming the first problem: no or unreadable manifest, a missing, resized
    or changed file, or (for a full check) a file in ``dcp/`` the manifest does not list or a
    ``.safetensors`` file whose header does not parse (a manifest rewritten over a damaged file).
    """
    ckpt = Path(ckpt)
    path = ckpt / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        files = manifest["files"]
        if manifest.get("format") != CKPT_FORMAT or not isinstance(files, dict):
            raise ValueError(f"unknown format {manifest.get('format')!r}")
        if _STEP_RE.fullmatch(ckpt.name) and manifest.get("step") != step_of(ckpt):
            raise ValueError(f"it describes step {manifest.get('step')!r}, not {step_of(ckpt)}")
    except FileNotFoundError:
        raise CorruptCheckpoint(f"{ckpt} has no {MANIFEST} (incomplete or damaged)") from None
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


def checkpoint_candidates(run_dir: str | Path, before: int | None = None,
                          steps: int | None = None) -> Iterator[tuple[Path, str | None]]:
    """Every checkpoint of ``run_dir`` (step < ``before`` when given), newest first, with ``None`` when it
    is intact or the reason it must not be used: a symbolic link (another run's checkpoint), an older
    pickle-based format, a step past the run's ``steps`` (default: ``config.yaml``'s), a manifest that does
    not match its files (``verify_checkpoint``) or a malformed train state (``read_train_state``, which
    also requires the step of the folder). Raises ``RunDirError`` when ``steps`` is needed and the run's
    config cannot be read."""
    if steps is None:
        from scalevec.config import total_steps

        steps = total_steps(load_config(run_dir))
    for ckpt in checkpoint_dirs(run_dir):
        if before is not None and step_of(ckpt) >= before:
            continue
        yield ckpt, _unusable(ckpt, steps)


def _unusable(ckpt: Path, steps: int) -> str | None:
    """Why ``ckpt`` must not be resumed from (``checkpoint_candidates``), or ``None``."""
    if ckpt.is_symlink():
        return f"it is a symbolic link (to {os.readlink(ckpt)}), not a checkpoint of this run; it is never read or " \
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
        raise RunDirError(f"{run_dir} has no checkpoint (no {CKPT_DIR}/step_*); train it first (or --resume it)")
    ckpt = ckpts[0]
    if ckpt.is_symlink():
        raise RunDirError(f"{ckpt} is a symbolic link (to {os.readlink(ckpt)}), not a checkpoint of this run; "
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
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(state, dict):
            raise ValueError("not a JSON object")
        step = state.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step {step!r} is not a step count")
        if _STEP_RE.fullmatch(Path(ckpt).name) and step != step_of(ckpt):
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
    except FileNotFoundError:
        raise CorruptCheckpoint(f"{path} does not exist") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CorruptCheckpoint(f"{path} cannot be read ({one_line(e)})") from None
    return state


# ----------------------------------------------------------------------------------------- eval.json
# Written by `scalevec eval` (hf/evaluation.py), read by `scalevec report` (experiments/report.py).


def write_eval(directory: Path, results: dict, num_fewshot: int | None, limit: int | float | None) -> Path:
    """Merge ``results`` into ``directory/eval.json`` (``{"tasks": {task: {...}}}``; other tasks kept),
    written atomically. Each task records its metrics, ``num_fewshot``, ``limit``, lm-eval's version, date."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        lm_eval_version = version("lm_eval")
    except PackageNotFoundError:  # scores handed in by a caller, not computed here
        lm_eval_version = None
    file = directory / EVAL
    data = json.loads(file.read_text()) if file.is_file() else {}
    tasks = data.setdefault("tasks", {})
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    for task, metrics in results.items():
        tasks[task] = {"metrics": metrics, "num_fewshot": num_fewshot, "limit": limit,
                       "lm_eval_version": lm_eval_version, "date": stamp}
    tmp = file.with_name(f".{EVAL}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(file)
    return file


def eval_columns(directory: str | Path) -> dict[str, float]:
    """``{"eval.<task>.<metric>": value}`` from ``directory/eval.json`` (``write_eval``), standard errors left
    out; ``{}`` when the file is absent or unreadable. ``scalevec report`` puts them in runs.csv."""
    file = Path(directory) / EVAL
    try:
        tasks = json.loads(file.read_text())["tasks"]
        return {f"eval.{task}.{name}": value for task, entry in sorted(tasks.items())
                for name, value, _ in main_metrics(entry["metrics"])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def main_metrics(metrics: dict) -> list[tuple[str, float, float | None]]:
    """``[(metric, value, stderr or None)]`` of one task's lm-eval metrics (``"acc,none"`` -> ``"acc"``)."""
    rows = []
    for key, value in metrics.items():
        name, _, flt = key.partition(",")
        if name.endswith("_stderr") or not isinstance(value, (int, float)):
            continue
        stderr = metrics.get(f"{name}_stderr,{flt}")
        rows.append((name if flt in ("none", "") else f"{name},{flt}", float(value),
                     float(stderr) if isinstance(stderr, (int, float)) else None))
    return rows


# ----------------------------------------------------------------------------------------- models


def load_model(run_dir: str | Path, device: str = "cpu", check_alive: bool = True, quiet: bool = False):
    """``(config, model, checkpoint)`` of a run: weights from ``model_checkpoint`` (verified against its
    manifest), and, with ``check_alive``, refused when the model is dead (``assert_alive``).

    Raises ``RunDirError`` for every problem with the run directory: no config, no intact checkpoint,
    a damaged or mismatched ``model.safetensors``, a dead model.
    """
    import sys

    from safetensors import SafetensorError
    from safetensors.torch import load_model as st_load_model

    from scalevec.model.transformer import build_model

    run_dir = Path(run_dir)
    cfg = load_config(run_dir)
    ckpt, skipped = model_checkpoint(run_dir)
    if not quiet:
        for line in skipped:
            print(f"note: skipped checkpoint {line}", file=sys.stderr)
        if is_legacy(ckpt):
            print(f"note: {ckpt} has no {MANIFEST} (older scalevec or made by hand); its integrity is not checked",
                  file=sys.stderr)
    model = build_model(cfg.model, cfg.scale, device=device)
    path = ckpt / MODEL_FILE
    try:
        st_load_model(model, str(path), device=str(device))
    except (SafetensorError, OSError, RuntimeError, ValueError, KeyError) as e:
        raise RunDirError(f"{path} does not hold this run's model ({one_line(e).split('. ')[0][:200]}); "
                          f"restore the checkpoint or retrain the run") from None
    if check_alive:
        assert_alive(model, cfg, path)
    return cfg, model, ckpt


def assert_alive(model, cfg, path: Path | str = "the model") -> None:
    """Refuse a dead model: non-finite weights, or logits that do not depend on the token (every
    position gives the same distribution over the vocabulary: the uniform-loss state of a run whose lr
    blew it up). One forward of 2 × 16 fixed tokens. Raises ``RunDirError``."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if not torch.isfinite(p).all():
                raise RunDirError(f"{path} holds non-finite weights ({name}); it is not a usable model, "
                                  f"use an earlier checkpoint or retrain with a lower lr")
        g = torch.Generator().manual_seed(0)
        n = min(16, cfg.model.max_seq_len)
        x = torch.randint(0, cfg.model.vocab_size, (2, n), generator=g).to(next(model.parameters()).device)
        was_training = model.training
        model.eval()
        logits = model(x).float()
        model.train(was_training)
    if not torch.isfinite(logits).all():
        raise RunDirError(f"{path} gives non-finite logits; it is not a usable model, retrain with a lower lr")
    spread = (logits - logits[..., :1]).abs().amax().item()
    if spread <= 1e-6 * max(1.0, logits.abs().amax().item()):
        raise RunDirError(f"{path} is a dead model (its logits are equal over the whole vocabulary: loss ln(vocab)); "
                          f"use an earlier checkpoint or retrain with a lower lr")


def uniform_loss(vocab_size: int) -> float:
    """The cross-entropy of a uniform prediction over ``vocab_size`` tokens, ``ln(vocab_size)`` nats."""
    return math.log(vocab_size)


__all__ = [
    "CKPT_DIR", "CONFIG", "DIVERGED", "DONE", "EVAL", "LOCK", "MANIFEST", "METRICS", "SUMMARY", "TOKENIZER",
    "CorruptCheckpoint", "RUN_ENTRIES", "RUN_FORMAT", "RunDirError", "RunLock", "RunLocked", "append_metrics",
    "assert_alive", "check_no_links", "checkpoint_candidates", "checkpoint_dirs", "clean_temporaries",
    "eval_columns", "is_diverged", "is_done", "is_run", "load_config",
    "load_model", "load_tokenizer", "locked_by", "main_metrics", "mark_diverged", "mark_done", "model_checkpoint",
    "one_line",
    "read_diverged", "read_json", "read_metrics", "read_train_state", "remove_run", "resumable_checkpoint",
    "rewrite_metrics", "state", "verify_checkpoint", "write_atomic", "write_eval", "write_json", "write_manifest",
    "write_meta", "write_train_state",
]
