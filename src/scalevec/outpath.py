"""Output paths every command writes (``--out``, ``--save``): the one check that a path can be created, before any
work (a broken symbolic link at or above it, a file where a folder must be), and the words for a symbolic link
and an error in one-line messages. The bottom layer (tests/test_layout.py): the standard library only, so that
data, training, experiments, hf and the CLI all share it (DESIGN.md: one home per rule)."""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import signal
import stat
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def one_line(e: BaseException) -> str:
    """An error's text on one line (an ``OSError``'s strerror; the type's name when there is no text)."""
    text = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return " ".join(str(text).split())


# the fix for an OSError that reached a command with no message of scalevec's ("[Errno N] text: 'path'")
_ERRNO_FIXES = {
    errno.EROFS: "the file system there is read-only: choose a path on a writable one",
    errno.EBUSY: "it is in use or a mount point, which cannot be replaced: choose a new folder inside it or elsewhere",
    errno.EEXIST: "something is already there (a file, or a link to one): remove it or choose another path",
    errno.EACCES: "this user may not write there: choose another path, or fix its permissions",
    errno.EPERM: "this user may not change it: choose another path, or fix its permissions",
    errno.ENOSPC: "the disk is full: free space there or choose another path",
    errno.EDQUOT: "the disk quota is used up: free space there or choose another path",
    errno.ENOTDIR: "a file stands where a folder must be: choose another path",
    errno.EISDIR: "a folder stands where a file must be: choose another path",
    errno.ENOTEMPTY: "the folder is not empty: choose a new or empty one",
    errno.ENOENT: "it does not exist: check the path",
}


def os_error_line(e: OSError) -> str:
    """A bare ``OSError`` (its text "[Errno 30] Read-only file system: 'PATH'") as one line naming the path, the
    problem and a fix (``_ERRNO_FIXES``); a message scalevec wrote (no "[Errno") is kept as it is. What ``cli.py``
    prints for every ``OSError`` that reached it."""
    text = str(e)
    if e.errno is None or not text.startswith("[Errno"):
        return one_line(e)
    where = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None) or "a file"
    fix = _ERRNO_FIXES.get(e.errno, "check the path and its file system")
    return f"{where}: {one_line(e)} ({errno.errorcode.get(e.errno, e.errno)}); {fix}"


def _named(path: str) -> str:
    """``path`` as an absolute path with its folders resolved (``os.path.realpath``) and its last name kept as
    written, so that a link shows as itself; as written (normalized) when the way there is broken or loops."""
    head, name = os.path.split(os.path.abspath(path))
    try:
        head = os.path.realpath(head, strict=True)
    except OSError:  # non-strict realpath would invent a path through a loop
        return os.path.abspath(path)
    return os.path.join(head, name)


def _hop(link: str) -> str:
    """Where the symbolic link ``link`` points (``_named``): its target read from the link's own folder (a
    relative target is relative to it, not to the working directory)."""
    return _named(os.path.join(os.path.dirname(link), os.readlink(link)))


def link_words(link: str | Path) -> str:
    """What the symbolic link ``link`` is, in words that are true for a message: ``a symbolic link to PATH`` (it
    resolves), ``a symbolic link that leads nowhere (to PATH)`` (nothing there: PATH is where it resolves to, absolute,
    through every link of a chain), ``a symbolic link loop (A -> B -> A)`` (following it never ends) or ``a symbolic
    link that cannot be followed (to PATH: why)``. Never a raw errno; a relative target is read from the link's own
    folder (``os.readlink`` alone would print it as if relative to the working directory)."""
    link = os.fspath(link)
    try:
        os.stat(link)
    except OSError as e:
        if e.errno == errno.ELOOP:
            chain = [_named(link)]
            while os.path.islink(chain[-1]) and len(chain) <= 8 and chain[-1] not in chain[:-1]:
                chain.append(_hop(chain[-1]))
            if chain[-1] in chain[:-1]:
                return f"a symbolic link loop ({' -> '.join(chain)})"
            if len(chain) == 1:  # not a link itself: the way to it loops
                return "a path through a symbolic link loop"
            return f"a symbolic link loop (to {chain[1]}, from where the links lead round in a circle)"
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return f"a symbolic link that leads nowhere (to {os.path.realpath(link)})"
        return f"a symbolic link that cannot be followed (to {os.path.realpath(link)}: {one_line(e).lower()})"
    return f"a symbolic link to {os.path.realpath(link)}"


def check_out_path(out: str | Path, flag: str = "--out") -> None:
    """Refuse an output path that cannot be created: ``out`` itself or a folder above it, up to the first that
    exists, that is a symbolic link leading nowhere, a link loop or a link that cannot be followed (``link_words``;
    ``FileNotFoundError``), a first existing path above ``out`` that is a file, not a folder
    (``NotADirectoryError``), or one this user may not create anything in (``PermissionError``, ``os.access``);
    creating the folders would fail with a bare errno from ``mkdir`` or ``open`` ("[Errno 17] File exists",
    "[Errno 20] Not a directory", "[Errno 13] Permission denied"), for some commands only after their work. The
    one check of it for every command that writes an ``--out`` (train, convert, export, sweep, compare, study,
    prepare-data, theory; plot's figure file and bench's ``--save`` file, ``flag`` naming the option); what ``out``
    itself is, when it exists, is the caller's question. Raises one line naming the path, what it is and the fix;
    nothing is touched. A last name starting with ``-`` is refused too (``ValueError``): a shell command given the
    folder (``rm -rf``, ``ls``) would read it as options."""
    out = Path(out)
    if out.name.startswith("-"):
        raise ValueError(f"{flag} {out}: a name starting with '-' is read as options by shell commands given it "
                         f"(rm {out.name}); choose a name that starts with a letter or digit")
    for p in (out, *out.parents):
        try:
            exists = p.exists()  # follows links: the first that exists ends the walk (what is above it is fine)
            folder = exists and p.is_dir()
            broken = not exists and p.is_symlink()
        except OSError:  # a folder that cannot be searched (permission): the callers' own checks name it
            return
        if exists:
            if p != out and not folder:  # mkdir: "[Errno 17] File exists", open: "[Errno 20] Not a directory"
                what = (f"{link_words(p)}, not a folder" if p.is_symlink() else
                        "a file, not a folder" if p.is_file() else "not a folder")
                raise NotADirectoryError(f"{flag} {out}: {p} is {what}; choose another {flag}")
            if p != out and not os.access(p, os.W_OK | os.X_OK):  # mkdir: a bare "[Errno 13]", maybe after the work
                raise PermissionError(f"{flag} {out}: this user may not create anything in {p}; choose another "
                                      f"{flag}, or make {p} writable")
            return
        if broken:
            where = f"{flag} {out} is" if p == out else f"{flag} {out}: {p} is"
            raise FileNotFoundError(f"{where} {link_words(p)}; remove {'the link' if p == out else 'it'} or "
                                    f"choose another {flag}")


def open_owned(path: str | Path, flags: int, fix: str = "delete it and retry") -> int:
    """Open ``path`` (``os.open`` ``flags``; ``O_CREAT`` creates it) as a file a command may write into in place:
    never through a symbolic link (``O_NOFOLLOW``), never blocking on a FIFO (``O_NONBLOCK`` while opening), and only
    a regular file with one name (``st_nlink == 1``): a symbolic or hard link would send the writes into a file
    outside, a FIFO would hang. The one rule for every file scalevec appends to or rewrites in place (a run's lock,
    ``metrics.jsonl``, a sweep's logs); a file replaced whole goes through ``replace_file``. Returns the file
    descriptor, blocking again. Raises ``ValueError`` naming the file, what it is and ``fix``; ``OSError`` for the
    rest (a missing folder, no permission)."""
    path = Path(path)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValueError(f"{path} is {link_words(path)}; scalevec writes only into its own files: {fix}") from None
        if e.errno == errno.ENXIO:  # a FIFO with no reader, opened write-only
            raise ValueError(f"{path} is not a regular file; {fix}") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path} is not a regular file; {fix}")
        if st.st_nlink != 1:  # a hard link: the same file has another name, maybe outside
            raise ValueError(f"{path} is a hard link ({st.st_nlink} names for one file); scalevec writes only into "
                             f"its own files: {fix}")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def replace_file(path: str | Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` whole: into a new file beside it, ``.NAME.PID.tmp``, then renamed over ``path``.
    What was under the temporary name (a dead writer's leftover, a planted link) is unlinked first and the new
    file is created with ``O_EXCL``, so nothing existing is written through; whatever ``path`` was (a symbolic or
    hard link to a user's file) is replaced as a name. A reader sees the old file or the new one, never a part.
    On failure (a full disk) the new file is removed and the ``OSError`` re-raised. Text is written as UTF-8."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    body = data.encode("utf-8") if isinstance(data, str) else data
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_figure(fig, path: str | Path, dpi: int = 110) -> None:
    """Write the matplotlib figure ``fig`` to ``path`` in the format its suffix names (``.png`` when it has none),
    through ``replace_file``: a symbolic or hard link at ``path`` is replaced as a name, never written through
    (``savefig(path)`` opens ``path`` and writes into whatever file it names)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format=Path(path).suffix.lstrip(".").lower() or "png", dpi=dpi)
    replace_file(path, buf.getvalue())


def read_regular(path: str | Path, fix: str = "delete it and retry") -> bytes:
    """The bytes of ``path``, read only when it is a regular file (a symbolic link to one is fine): opened without
    blocking, so a FIFO never hangs the command. The one check for every file a command reads from a run directory
    or a model folder (its config, meta, metrics, lock holder, checkpoint files, tokenizer). Raises
    ``FileNotFoundError`` when it is missing; ``ValueError`` naming the file and ``fix`` for a FIFO, socket, device
    or folder; ``OSError`` for the rest (permissions)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except IsADirectoryError:
        raise ValueError(f"{path} is a folder, not a file; {fix}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path} is not a regular file (a FIFO, socket or device); {fix}")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        return f.read()


TEMP_TAG = ".tmp-"  # .NAME.tmp-PID-HEX: a folder being written by process PID, renamed to NAME once whole
_TEMP = re.compile(r"\.(?P<name>.+)\.tmp-(?P<pid>\d+)-[0-9a-f]+")


class Terminated(KeyboardInterrupt):
    """SIGTERM while ``temporary_folder`` was being written: raised in the main thread so that the folder is
    removed and the command ends as after Ctrl-C (a ``KeyboardInterrupt``: ``cli.py`` prints one line)."""


def is_temporary(path: str | Path) -> bool:
    """Whether ``path`` is a folder being written (``.NAME.tmp-PID-HEX``, ``temporary_folder``), never a model or
    data set to read: it may be incomplete or unverified."""
    return bool(_TEMP.fullmatch(Path(path).name))


def refuse_temporary(path: str | Path, what: str = "a model") -> None:
    """Raise ``ValueError`` when ``path`` is a temporary folder (``is_temporary``): a reader never takes one for
    ``what``. The fix names the finished name."""
    path = Path(path)
    m = _TEMP.fullmatch(path.name)
    if m:
        raise ValueError(f"{path} is the temporary folder of an unfinished write (process {m['pid']}), not {what}: "
                         f"it may be incomplete or unverified; use {path.with_name(m['name'])} once written, or "
                         f"delete it")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    except OverflowError:  # no PID this machine gives: not a writer's folder, so never judged gone and removed
        return True
    return True


def clean_stale_temporaries(path: str | Path, notice: Callable[[str], None]) -> list[str]:
    """Remove the temporary folders of ``path`` (``.NAME.tmp-PID-HEX`` beside it) whose writer is gone (no process
    ``PID``: killed by SIGKILL or a crash, which no handler sees), telling ``notice`` each; a live writer's is kept.
    Returns the names removed."""
    path = Path(path)
    removed = []
    try:
        siblings = list(path.parent.iterdir()) if path.parent.is_dir() else []
    except OSError:
        return removed
    for p in siblings:
        m = _TEMP.fullmatch(p.name)
        if not m or m["name"] != path.name or _alive(int(m["pid"])) or p.is_symlink() or not p.is_dir():
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p.name)
        notice(f"removed {p}, the temporary folder of an interrupted write (process {m['pid']} is gone)")
    return removed


def _note(msg: str) -> None:
    print(f"note: {msg}", file=sys.stderr, flush=True)


def _default_sigterm_in_child() -> None:
    # a forked worker (prepare-data's pool) must die on SIGTERM as the pool expects, even blocked in C code where
    # a Python handler never runs: the handler belongs to the writer, not to its children
    if getattr(signal.getsignal(signal.SIGTERM), "scalevec_temporary", False):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


os.register_at_fork(after_in_child=_default_sigterm_in_child)


@contextmanager
def temporary_folder(path: str | Path, what: str, signals: bool = True) -> Iterator[Path]:
    """A new folder beside ``path``, ``.NAME.tmp-PID-HEX``, that the caller fills and renames to ``path`` once
    whole (``what`` it holds, for the notes: "export", "prepared data"). Before it is made, the stale temporary
    folders of ``path`` are removed with a note (``clean_stale_temporaries``). While it exists, with ``signals``,
    SIGTERM raises ``Terminated`` in the main thread (the previous handler is restored after; without, a caller
    that owns SIGTERM, the trainer, keeps it); on SIGTERM or Ctrl-C the folder is removed and a note says so; on
    any other failure it is removed silently, the error re-raised. Raises ``OSError`` when the folder cannot be
    made."""
    path = Path(path)
    clean_stale_temporaries(path, _note)
    tmp = path.with_name(f".{path.name}{TEMP_TAG}{os.getpid()}-{secrets.token_hex(4)}")
    tmp.mkdir()
    previous = None
    if signals and threading.current_thread() is threading.main_thread():
        def on_term(signum, frame):
            raise Terminated()

        on_term.scalevec_temporary = True  # _default_sigterm_in_child recognizes it

        previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield tmp
    except KeyboardInterrupt as e:
        shutil.rmtree(tmp, ignore_errors=True)
        _note(f"removed {tmp}, the unfinished {what} ({'SIGTERM' if isinstance(e, Terminated) else 'interrupted'})")
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if tmp.exists() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)


__all__ = ["TEMP_TAG", "Terminated", "check_out_path", "clean_stale_temporaries", "is_temporary", "link_words",
           "one_line", "open_owned", "os_error_line", "read_regular", "refuse_temporary", "replace_file",
           "temporary_folder"]
