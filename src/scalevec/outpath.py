"""Output paths every command writes (``--out``, ``--save``): the one check that a path can be created, before any
work (a broken symbolic link at or above it, a file where a folder must be), and the words for a symbolic link
and an error in one-line messages. The bottom layer (tests/test_layout.py): the standard library only, so that
data, training, experiments, hf and the CLI all share it (DESIGN.md: one home per rule)."""

from __future__ import annotations

import errno
import os
from pathlib import Path


def one_line(e: BaseException) -> str:
    """An error's text on one line (an ``OSError``'s strerror; the type's name when there is no text)."""
    text = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return " ".join(str(text).split())


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
    nothing is touched."""
    out = Path(out)
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


__all__ = ["check_out_path", "link_words", "one_line"]
