"""The run directory's own files: create and recognize a run, its config, meta, metrics, markers, lock (DESIGN.md §8).

This module is the one that knows the run's files; ``train``, ``sweep``, ``compare``, ``report``,
``export``, ``generate`` and ``eval`` read and write them through it. The checkpoints (``checkpoints/``)
belong to the ``checkpoint`` package, the scores of ``scalevec eval`` to ``eval_results``, the trackers'
mirrors to ``tracking``; their names are listed here because ``--overwrite`` deletes them. Layout::

    RUN/config.yaml            the resolved RunConfig (YAML, read with safe_load)
    RUN/meta.json              the run format marker (``RUN_FORMAT``), versions, code version, host, start time
    RUN/optim_groups.txt       the optimizer group table
    RUN/metrics.jsonl          one JSON object per line (train / eval / probe rows)
    RUN/metrics.jsonl.damaged  a damaged metrics.jsonl that resume set aside (never deleted by it)
    RUN/summary.json           final figures (finished runs)
    RUN/eval.json              downstream scores of ``scalevec eval`` per task (``eval_results``)
    RUN/tokenizer/             tokenizer.json (+ tokenizer_config.json)
    RUN/DONE                   the run finished
    RUN/DIVERGED               the run stopped on its health guard: {"step", "first_bad_step", "reason", "checkpoint"}
    RUN/.lock                  the writer's OS lock (``fcntl.flock``); holds the writer's PID
    RUN/tensorboard/, RUN/wandb/, RUN/wandb_id   the trackers' mirrors (``tracking``)
    RUN/checkpoints/           the checkpoints (``checkpoint`` package: layout, integrity, save_load, run_model)

What this module guarantees (our choices, documented in README "Run directories"):

- *Nothing read from a run directory runs code.* Every file is JSON, YAML (``yaml.safe_load``) or
  safetensors; no pickle is ever loaded (the checkpoints: ``checkpoint/save_load.py``).
- *A run writes only into its own files*: a symbolic link in place of ``checkpoints/`` or
  ``metrics.jsonl`` is never written through (``check_no_links``).
- *Only scalevec's files are deleted.* A run is recognized by its ``meta.json`` (``is_run``), never by a
  file name alone; ``--overwrite`` deletes the entries scalevec writes (``RUN_ENTRIES``) and leaves, and
  names, anything else.
- *One writer.* A writer holds ``fcntl.flock`` on ``RUN/.lock`` (released by the kernel when the
  process dies, even by SIGKILL); a second writer is refused at once, naming the holder's PID.
- *Every read error is one line* (``RunDirError``, a ``ValueError``) naming the file and the fix.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scalevec.config.files import DuplicateKey, JSONProblem, load_json, parse_json
from scalevec.config.typed import is_int, is_number, short
from scalevec.hf_format.names import HF_CONFIG

# rundir's own messages use check_out_path, link_words and one_line too; open_owned and replace_file are the rule
# for every file written into in place or replaced whole, read_regular (no FIFO) for every file read
from scalevec.outpath import (
    check_out_path,
    link_words,
    one_line,
    open_owned,
    read_regular,
    refuse_temporary,
    replace_file,
)
from scalevec.training.checkpoint.layout import CKPT_DIR, checkpoint_dirs, owned_entry

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
TENSORBOARD = "tensorboard"  # the TensorBoard event files (tracking.py)
WANDB = "wandb"  # the Weights & Biases run folder (tracking.py)
WANDB_ID = "wandb_id"  # the W&B run id, kept for --resume (tracking.py)
RUN_FORMAT = "scalevec-run/1"  # meta.json's "format": the marker that scalevec train wrote the directory
# what meta.json has always held (runs written before RUN_FORMAT existed are recognized by these keys)
LEGACY_META_KEYS = ("scalevec", "torch", "python", "start_time")
DAMAGED = ".damaged"  # the suffix of a damaged file set aside (metrics.jsonl.damaged)
TRACKER_ENTRIES = (TENSORBOARD, WANDB, WANDB_ID)  # written by tracking.py
TAIL_BYTES = 1 << 18  # last_row: the last rows of metrics.jsonl are in its last 256 kB (a row of a big model is ~20 kB)
# every entry scalevec writes in a run directory: what --overwrite deletes (LOCK is kept: its holder is the caller)
RUN_ENTRIES = (CONFIG, META, GROUPS, METRICS, SUMMARY, EVAL, TOKENIZER, DONE, DIVERGED, CKPT_DIR, *TRACKER_ENTRIES)
# entries a resume writes into in place (appends, new checkpoints): a symbolic link there would send the
# writes into what it points to, e.g. another run's checkpoints
NO_LINKS = (CKPT_DIR, METRICS)
# the small files of a run that git keeps for a study's committed runs (.gitignore lists the same): enough for
# a sweep to count the run done and for its report (summary.json repeats the eval rows); the rest stays local
KEPT = (CONFIG, META, GROUPS, SUMMARY, DONE, DIVERGED)


# the fix named when a file a run writes into in place (metrics.jsonl) is a link or not a regular file
OWN_FIX = "give the run its own copy (cp FILE FILE.own && mv FILE.own FILE) or start a new --out"


class RunDirError(ValueError):
    """A run directory cannot be used as asked; the message is one line naming the file and the fix."""


class RunLocked(RunDirError):
    """Another process holds the run directory's lock."""


# ----------------------------------------------------------------------------------------- plain files


def tmp_path(path: Path) -> Path:
    """A temporary name beside ``path``, unique per process: ``.NAME.PID.tmp``."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def write_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a new per-process temporary file (``tmp_path``) and a rename
    (``outpath.replace_file``: a link at ``path`` is replaced, never written through); on failure (a full disk)
    the temporary file is removed and the ``OSError`` re-raised."""
    replace_file(path, text)


def write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON through ``write_atomic`` (values JSON cannot hold written as ``str``)."""
    write_atomic(path, json.dumps(obj, indent=2, default=str))


def read_json(path: str | Path, fix: str = "restore it from a copy of the run or retrain the run") -> Any:
    """A JSON file of a run (``load_json``: bounded, one key once per object); ``RunDirError`` naming the file and
    ``fix`` when it is missing, unreadable or invalid."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise RunDirError(f"{path} does not exist; {fix}")
    try:
        return load_json(path, "run file", fix)
    except JSONProblem as e:
        raise RunDirError(f"{path} cannot be read ({e.problem}); {fix}") from None
    except ValueError as e:  # read_bounded: a folder, a FIFO, too large; it names the file and the fix
        raise RunDirError(str(e)) from None
    except OSError as e:
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
            meta = load_json(path / META, "run file", "")
        except (OSError, ValueError):
            pass
    if isinstance(meta, dict) and meta.get("format") == RUN_FORMAT and not config:
        return None
    if not (path / CONFIG).is_file():
        return f"its {CONFIG} is not a regular file" if (path / CONFIG).exists() else f"no {CONFIG}"
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
    from scalevec.config import RunConfig
    from scalevec.config.codec import from_dict
    from scalevec.config.files import load_yaml

    path = Path(run_dir) / CONFIG
    if not path.exists():  # a FIFO or a folder there is load_yaml's "not a regular file"
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


def has_config(path: str | Path) -> bool:
    """Whether ``path`` holds a ``config.yaml``: what export, generate, eval and report take for a run to read
    (as against an exported Hugging Face directory, with ``config.json``). Deleting asks more: ``is_run``."""
    return (Path(path) / CONFIG).is_file()


def model_dir_kind(path: str | Path) -> str:
    """What a model is read from at ``path``: ``"run"`` for a scalevec run directory (``has_config``),
    ``"hf"`` for a Hugging Face model directory (a ``config.json``, as ``scalevec export`` and transformers write
    it). A run is asked first: a run directory is never taken for an export. The one answer for the commands that
    take either (generate, eval); the directory's contents are checked by whoever loads it. ``train --init-from``
    asks its own question (``init_from.resolve``: a checkpoint folder too, and a Hugging Face config it can
    import). Raises ``FileNotFoundError`` naming both kinds when ``path`` is neither."""
    path = Path(path)
    refuse_temporary(path)  # an interrupted export's folder: complete maybe, but never verified
    if has_config(path):
        return "run"
    if (path / HF_CONFIG).is_file():
        return "hf"
    raise FileNotFoundError(f"{path} is neither a scalevec run directory ({CONFIG}) nor an exported Hugging Face "
                            f"directory ({HF_CONFIG}); pass one of those")


def tokenizer_dir(run_dir: str | Path) -> Path:
    """Where the run's tokenizer lives (``RUN/tokenizer/``, ``tokenizer.json`` inside; it may be missing)."""
    return Path(run_dir) / TOKENIZER


def write_run_files(run_dir: str | Path, meta: dict, cfg, groups: str, tokenizer) -> None:
    """Write a new run's files: ``meta.json`` first (``write_meta``: its format marker makes a set-up
    interrupted after it a recognized run, which ``--overwrite`` may empty), then ``config.yaml`` (``cfg``,
    the resolved ``RunConfig``), ``optim_groups.txt`` (``groups``: the optimizer group table, a newline
    added) and ``tokenizer/`` (``tokenizer.save``). An ``OSError`` (read-only, full disk) is raised as it is."""
    from scalevec.config.codec import save_yaml

    run_dir = Path(run_dir)
    write_meta(run_dir, meta)
    save_yaml(cfg, run_dir / CONFIG)  # replace_file: a restart rewrites it
    write_atomic(run_dir / GROUPS, groups + "\n")
    tokenizer.save(tokenizer_dir(run_dir))


def read_meta(run_dir: str | Path) -> dict:
    """The run's ``meta.json`` as a mapping; ``{}`` when it is missing, unreadable or no mapping (what a
    report reads from it, the CPU or a branch's parent, is informative: a damaged file costs that only)."""
    path = Path(run_dir) / META
    try:
        meta = load_json(path, "run file", "") if path.is_file() else {}
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def write_summary(run_dir: str | Path, summary: dict) -> None:
    """Write ``summary.json`` (the final figures of a finished run), atomically."""
    write_json(Path(run_dir) / SUMMARY, summary)


def read_summary(run_dir: str | Path, fix: str = "restore it from a copy of the run or retrain the run") -> dict:
    """The run's ``summary.json``; ``RunDirError`` naming the file and ``fix`` when it is missing,
    unreadable, not a mapping, or its ``final_val_loss`` (what reports and studies rank runs by) is not a
    finite number: ``true`` or ``"2.0"`` was ranked as a loss, null raised a TypeError in the report."""
    path = Path(run_dir) / SUMMARY
    data = read_json(path, fix)
    if not isinstance(data, dict):
        raise RunDirError(f"{path} is not a summary (a JSON object); {fix}")
    if not is_number(data.get("final_val_loss")):
        raise RunDirError(f"{path}: final_val_loss is {short(data.get('final_val_loss'))}, not a finite number; "
                          f"{fix}")
    return data


# ----------------------------------------------------------------------------------------- metrics


def _scan_metrics(path: Path) -> tuple[list[dict], str | None, str | None]:
    """``(rows, cut, damage)`` of a metrics file: every readable row; ``cut``, a note when the last line
    is cut off (what a kill or a full disk leaves: the start of a row, with no newline after it); and
    ``damage``, the first other bad line (``None`` when there is none). ``RunDirError`` when unreadable."""
    try:
        text = read_regular(path, "delete it or move it away, then retry").decode("utf-8", errors="replace")
    except RunDirError:
        raise
    except ValueError as e:
        raise RunDirError(str(e)) from None
    except OSError as e:
        raise RunDirError(f"{path} cannot be read ({one_line(e)}); check its permissions") from None
    rows, cut, damage, lines = [], None, None, text.split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = parse_json(line)
            if not isinstance(row, dict) or "kind" not in row or "step" not in row:
                raise ValueError("not a metrics row")
        except ValueError as e:
            # a cut-off write is a prefix of one JSON row on the last line; NUL bytes or undecodable bytes
            # (U+FFFD) are not what an append leaves, but a damaged file, and so is anything past a bad line, and a
            # row that sets one key twice (edited: whole, but which value is meant?)
            whole = isinstance(e, DuplicateKey)
            last = i == len(lines) - 1
            if not whole and last and line.startswith("{") and "\x00" not in line and "\ufffd" not in line:
                cut = f"{path}: dropped a cut-off last line ({len(line)} bytes, left by an interrupted write)"
            elif damage is None:
                damage = f"line {i + 1} {e.problem if whole else 'is not a metrics row'}"
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
    if not path.exists() and not path.is_symlink():
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
    path = Path(run_dir) / METRICS
    fd = open_own(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
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


def last_row(run_dir: str | Path, kind: str, tail_bytes: int = TAIL_BYTES) -> dict | None:
    """The last complete row of ``kind`` in ``metrics.jsonl``, read from its last ``tail_bytes`` only, or
    ``None`` (no such row there, or no readable file). For a live view of a run being written, without its
    lock (a sweep's progress line): a line that is no row is skipped, not an error, since the window cuts
    the first one and the writer may be appending the last."""
    try:
        fd = os.open(Path(run_dir) / METRICS, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO never hangs it
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        os.set_blocking(fd, True)
        size = os.fstat(fd).st_size
        f.seek(max(0, size - tail_bytes))
        tail = f.read().decode("utf-8", errors="replace")
    for line in reversed(tail.split("\n")):
        try:
            row = parse_json(line)
        except ValueError:
            continue  # empty, cut off by the tail window, or being written (or edited: a key twice)
        if isinstance(row, dict) and row.get("kind") == kind:
            return row
    return None


# ----------------------------------------------------------------------------------------- markers


def mark_done(run_dir: str | Path) -> None:
    """Write ``DONE`` (the time the run finished): the marker that the run is complete."""
    write_atomic(Path(run_dir) / DONE, time.strftime("%Y-%m-%dT%H:%M:%S%z") + "\n")


def is_done(run_dir: str | Path) -> bool:
    """True when the run finished (``DONE`` is a file in it)."""
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
    if not isinstance(data, dict) or not is_int(data.get("first_bad_step")):
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
        last = read_regular(log).decode(errors="replace").rsplit("\n$ ", 1)[-1] if log.is_file() else ""
    except (OSError, ValueError):
        return False
    return "non-finite" in last


def state(run_dir: str | Path) -> str:
    """``new`` (nothing there), ``done``, ``diverged``, ``resume`` (a checkpoint to continue from) or
    ``restart`` (a partial run without one: ``--resume`` starts it from step 0).

    Raises ``RunDirError`` for ``DONE`` without ``summary.json`` (the trainer writes the summary first, so its
    result was lost): a sweep would skip it as finished while a report cannot read it."""
    d = Path(run_dir)
    if not d.exists() or not any(p.name != LOCK for p in d.iterdir()):
        return "new"
    if is_done(d):
        if not (d / SUMMARY).is_file():  # with DIVERGED too, deleting DONE alone would make it a diverged result
            marks = [m for m in (DONE, DIVERGED) if (d / m).exists()]
            raise RunDirError(f"{d} has {DONE} but no {SUMMARY}: its result is lost; delete "
                              f"{' and '.join(str(d / m) for m in marks)} to train it again")
        return "done"
    if is_diverged(d):
        return "diverged"
    return "resume" if checkpoint_dirs(d) else "restart"


def check_out_dir(out: Path, resume: bool, overwrite: bool) -> None:
    """May a run be written into ``out``? Refuses to clobber an existing run (``FileExistsError`` naming
    ``--resume``/``--overwrite``) and a non-empty directory that is not a run (``FileExistsError``: only
    runs are overwritten, ``is_run``), to resume what is not a run (``FileNotFoundError``), a diverged run
    (``ValueError``) or one whose ``checkpoints/`` or ``metrics.jsonl`` is a symbolic link (``RunDirError``,
    ``check_no_links``), an ``out`` that is a file (``NotADirectoryError``), and, from ``check_out_path``, a path
    under a file (``NotADirectoryError``) and a symbolic link that leads nowhere or loops, as ``out`` or a folder
    above it (``FileNotFoundError``; a link to a directory is written through). The trainer checks it before its
    work and again under the run's lock before anything is written (``Trainer.setup_run_dir``)."""
    if resume and overwrite:
        raise ValueError("--resume and --overwrite exclude each other; pick one")
    check_out_path(out)  # a dangling link or a file above out: mkdir's bare "[Errno 17]" / "[Errno 20]"
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out} exists and is not a directory; choose another --out")
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
    would let two writers lock two different files). It is opened without following a symbolic link and must
    be a regular file (``RunDirError`` otherwise, ``_open_lock``): a ``.lock`` linking to a user's file would be
    truncated, a FIFO would hang.
    """

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / LOCK
        self.fd: int | None = None

    def acquire(self) -> RunLock:
        if self.fd is not None:
            return self
        fd = _open_lock(self.path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _holder_fd(fd)
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise RunLocked(f"{self.path.parent} is in use by process {holder} (it holds {self.path}); "
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


def _open_lock(path: Path, flags: int) -> int:
    """Open the lock file by the rule for every file written in place (``open_own``): it is truncated to hold the
    PID, which would destroy a file outside the run linked in its place."""
    return open_own(path, flags, fix=f"a run's lock file must be its own: delete it (rm {path}) and retry")


def open_own(path: Path, flags: int, fix: str = "") -> int:
    """``outpath.open_owned`` for a run's files: never through a symbolic link, never a FIFO or other non-regular
    file, never a hard link (``st_nlink`` > 1). Raises ``RunDirError`` naming the file and ``fix`` (by default
    ``OWN_FIX``); ``OSError`` for the rest."""
    try:
        return open_owned(path, flags, fix=fix or OWN_FIX)
    except ValueError as e:
        raise RunDirError(str(e)) from None


def _holder_fd(fd: int) -> str:
    """The PID written in the open lock file ``fd`` (at most 64 bytes read), ``?`` when unreadable."""
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    except OSError:
        return "?"
    return text if text.isdigit() else "?"


def locked_by(run_dir: str | Path) -> str | None:
    """The PID (as text) of the process holding the run's lock, or ``None`` when nobody does. A ``.lock`` that
    is a symbolic link or not a regular file is never opened through (``RunDirError``: see ``_open_lock``)."""
    path = Path(run_dir) / LOCK
    try:
        fd = _open_lock(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return _holder_fd(fd)
    finally:
        os.close(fd)  # closing drops our probe lock
    return None


def clean_temporaries(run_dir: str | Path) -> list[str]:
    """Remove the temporary files that dead writers left in the run directory (``write_atomic``'s
    ``.NAME.PID.tmp``; call with the lock held) and return their names. The checkpoints' own:
    ``checkpoint.layout.clean_temporaries``."""
    removed = []
    for p in Path(run_dir).iterdir() if Path(run_dir).is_dir() else ():
        if p.name.startswith(".") and p.name.endswith(".tmp"):
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
            removed.append(p.name)
    return removed


def _written_by_scalevec(name: str) -> bool:
    """An entry of a run directory that scalevec writes: ``RUN_ENTRIES``, a damaged file set aside
    (``NAME.damaged*``) and the temporaries of ``write_atomic`` (``.NAME.PID.tmp``)."""
    if name in RUN_ENTRIES or name.startswith(METRICS + DAMAGED):
        return True
    m = re.fullmatch(r"\.(.+?)(\.\d+)?\.tmp", name)
    return bool(m) and m.group(1) in RUN_ENTRIES


def _remove_owned(folder: Path, owned, key=None) -> list[str]:
    """Delete what ``owned(name)`` claims among ``folder``'s entries (in ``sorted`` order by ``key``): ``True``
    deletes the entry whole (a symbolic link itself, never its target), a function empties that folder by the
    same rule and removes it when nothing is left, ``False`` keeps it. Returns what is kept, as paths relative to
    ``folder``."""
    left = []
    for p in sorted(folder.iterdir(), key=key):
        rule = owned(p.name)
        if rule is False:
            left.append(p.name)
        elif callable(rule) and p.is_dir() and not p.is_symlink():
            kept = _remove_owned(p, rule)
            left += [f"{p.name}/{k}" for k in kept]
            if not kept:
                p.rmdir()
        elif p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    return left


def remove_run(path: str | Path, notice: Callable[[str], None] | None = None) -> list[str]:
    """Empty a scalevec run directory for ``--overwrite``: delete what scalevec writes there (``RUN_ENTRIES``,
    damaged files set aside, temporaries; inside ``checkpoints/`` and ``tokenizer/`` only the files scalevec
    writes there, ``layout.owned_entry`` and ``tokenizer.SAVED_FILES``; a symbolic link is removed, never what it
    points to), keep its lock file (which the caller holds) and leave everything else. Returns the paths left
    (relative to ``path``), which ``notice`` is told. Raises ``RunDirError`` when ``path`` is not a run directory
    (``is_run``, or a ``meta.json`` with ``RUN_FORMAT`` alone: a set-up interrupted before ``config.yaml``): nothing
    is deleted."""
    path = Path(path)
    why = _not_a_run(path, config=False)
    if why:
        raise RunDirError(f"{path} is not a scalevec run directory ({why}); --overwrite deletes only runs, "
                          f"choose a new or empty --out")
    from scalevec.data.tokenizer import SAVED_FILES

    folders = {CKPT_DIR: owned_entry, TOKENIZER: lambda name: name in SAVED_FILES}  # emptied entry by entry

    def owned(name: str):  # the lock is kept (its holder is the caller) and so left out of what is named
        return name != LOCK and (folders.get(name) or _written_by_scalevec(name))

    # the DONE and DIVERGED markers first (a reader meanwhile sees an unfinished run, never DONE without its
    # summary.json) and meta.json last (an interrupted removal leaves a directory still recognized as a run)
    order = {DONE: 0, DIVERGED: 0, META: 2}
    left = [name for name in _remove_owned(path, owned, key=lambda p: order.get(p.name, 1)) if name != LOCK]
    if left and notice:
        notice(f"--overwrite left {len(left)} file(s) in {path} that scalevec did not write: {', '.join(sorted(left))}")
    return sorted(left)


def check_no_links(run_dir: str | Path) -> None:
    """Refuse a run directory whose ``checkpoints/`` or ``metrics.jsonl`` (``NO_LINKS``) is a symbolic link, or
    whose ``metrics.jsonl`` is a hard link or not a regular file (a FIFO): resuming would write the new checkpoints
    and rows into what it points to (another run, a user's file) or hang on the FIFO. Raises ``RunDirError``
    naming the file, what it is and the fix."""
    for name in NO_LINKS:
        link = Path(run_dir) / name
        if link.is_symlink():
            raise RunDirError(f"{link} is {link_words(link)}; a run writes only into its own files: replace the "
                              f"link by a copy of what it points to, or start a new --out")
    metrics = Path(run_dir) / METRICS
    if metrics.exists():
        os.close(open_own(metrics, os.O_RDONLY))


__all__ = [
    "CONFIG", "DIVERGED", "DONE", "EVAL", "GROUPS", "KEPT", "LOCK", "META", "METRICS", "RUN_ENTRIES", "RUN_FORMAT",
    "SUMMARY", "TOKENIZER", "TRACKER_ENTRIES", "WANDB_ID", "RunDirError", "RunLock", "RunLocked", "append_metrics",
    "check_no_links", "check_out_dir", "clean_temporaries", "has_config", "is_diverged", "is_done",
    "is_run", "last_row", "load_config", "load_tokenizer", "locked_by", "mark_diverged", "mark_done",
    "model_dir_kind",
    "one_line", "open_own", "read_diverged",
    "read_json", "read_meta", "read_metrics", "read_summary", "remove_run", "rewrite_metrics", "state",
    "tokenizer_dir", "write_atomic", "write_json", "write_meta", "write_run_files", "write_summary",
]
