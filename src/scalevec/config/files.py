"""Bounded YAML and JSON and file reading: what a config, sweep, study, manifest or run file may be before it is
parsed.

``read_bounded`` opens a regular file of bounded size without blocking on a FIFO; ``safe_load`` parses YAML with
``BoundedLoader`` (plain data, aliases counted as expanded, nesting bounded); ``load_yaml`` is the two together for
a YAML mapping (``--config FILE``, a sweep or study file, a run's ``config.yaml``), with one-line errors naming the
file and the fix; ``check_plain`` refuses values that are not plain data. ``parse_json`` / ``load_json`` are the
one JSON reader of every file a user or an earlier run wrote (a Hugging Face ``config.json``, a prepared-data
manifest, a run's meta, summary and checkpoint files, ``eval.json``): UTF-8, nesting bounded by Python's recursion
limit (one line, never a traceback) and, as for YAML, no object that sets one key twice (``json.loads`` keeps the
last silently). Nothing here knows a config field.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from scalevec.config.typed import bad_input, short

# Bounds on what one YAML document may expand to. A config, sweep or study file is a few KB; an
# alias bomb of 369 bytes (nine levels of nine aliases) expands to 9**9 nodes, which every later walk of the
# value (validation, an error message's repr) would visit. The bounds count the document as its readers see it:
# every alias expanded in place.
MAX_YAML_BYTES = 1 << 20  # a file's size
MAX_YAML_NODES = 100_000  # scalars, lists and mappings, aliases expanded
MAX_YAML_DEPTH = 50  # nesting of lists and mappings, aliases expanded
MAX_YAML_CHARS = 4 << 20  # the text of every scalar, aliases expanded


class YAMLBoundError(yaml.YAMLError):
    """A YAML document exceeds ``MAX_YAML_NODES`` / ``MAX_YAML_DEPTH`` / ``MAX_YAML_CHARS`` once its aliases are
    expanded, or nests deeper than ``MAX_YAML_DEPTH`` as written."""

    def __init__(self, problem: str):
        super().__init__(problem)
        self.problem = problem


class BoundedLoader(yaml.SafeLoader):
    """PyYAML's ``SafeLoader`` (plain data only, no tags that build objects) that refuses, before any value is
    constructed, a document nesting deeper than ``MAX_YAML_DEPTH`` (5,000 nested ``[`` would exhaust Python's
    recursion) and, once composed, one whose alias-expanded size passes ``MAX_YAML_NODES`` nodes,
    ``MAX_YAML_DEPTH`` levels or ``MAX_YAML_CHARS`` characters, or whose aliases refer to themselves
    (``YAMLBoundError``), a mapping that sets one key twice (``check_unique_keys``: ``ComposerError``) and a plain
    number YAML 1.1 reads in base 8 or 60 (``construct_unambiguous``: ``ConstructorError``)."""

    _depth = 0

    def compose_node(self, parent, index):  # noqa: D102 (PyYAML's hook)
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise YAMLBoundError(f"it nests deeper than {MAX_YAML_DEPTH} levels")
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if isinstance(node, yaml.MappingNode):
            check_unique_keys(node)
        return node

    def construct_document(self, node):  # noqa: D102 (PyYAML's hook)
        check_expansion(node)
        return super().construct_document(node)


# a date or time is text to every reader here (a name, a tag): never a datetime object that JSON and the configs'
# number fields would trip over (`lr: 2024-01-01` is then refused as "must be a number", one line)
BoundedLoader.add_constructor("tag:yaml.org,2002:timestamp", yaml.SafeLoader.construct_yaml_str)


# YAML 1.1 reads `010` as 8 (octal) and `1:30` as 90 (base 60), where YAML 1.2, JSON and every reader's eye read 10
# and text: `steps: 010` trained 8 steps. Such a plain scalar is refused (ConstructorError, with its line); `0x10`,
# `0o10` and `1_000` have one reading and stay numbers, and quoted text stays text
AMBIGUOUS_NUMBER = re.compile(r"[-+]?(0[0-9_]+|[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?)")


def construct_unambiguous(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    """PyYAML's int or float of ``node``, refused when YAML 1.1 reads it as base 8 or 60 (``AMBIGUOUS_NUMBER``)."""
    if AMBIGUOUS_NUMBER.fullmatch(node.value):
        raise yaml.constructor.ConstructorError(None, None, f"{short(node.value, 40)[1:-1]} is a base-8 or base-60 "
                                                f"number in YAML 1.1; write it without the leading zero or colon, or "
                                                f"quote it as text", node.start_mark)
    if node.tag.endswith(":int"):
        return loader.construct_yaml_int(node)
    return loader.construct_yaml_float(node)


BoundedLoader.add_constructor("tag:yaml.org,2002:int", construct_unambiguous)
BoundedLoader.add_constructor("tag:yaml.org,2002:float", construct_unambiguous)


MERGE_TAG = "tag:yaml.org,2002:merge"  # `<<: *base`: its keys may be set again below it, as YAML's merge means


def check_unique_keys(node: yaml.MappingNode) -> None:
    """Raise ``yaml.composer.ComposerError`` (with the line) when a mapping as written sets one key twice: PyYAML
    keeps the last value silently, so `lr: 0.01` above a forgotten `lr: 0.003` would train at 0.003. Keys
    brought in by a merge (``<<``) are not written keys and may be overridden."""
    seen: set[tuple[str, str]] = set()
    for key, _ in node.value:
        if not isinstance(key, yaml.ScalarNode) or key.tag == MERGE_TAG:
            continue
        if (key.tag, key.value) in seen:
            raise yaml.composer.ComposerError(None, None, f"the key {short(key.value, 40)} is set twice in one "
                                              f"mapping (the last would win silently); keep one", key.start_mark)
        seen.add((key.tag, key.value))


def check_expansion(root: yaml.Node) -> None:
    """Raise ``YAMLBoundError`` when ``root`` (a composed YAML node graph, where an alias is the anchored node
    itself) expands past ``MAX_YAML_NODES`` nodes, ``MAX_YAML_DEPTH`` levels or ``MAX_YAML_CHARS`` characters, or
    holds an alias inside its own anchor. Linear in the composed graph: each node's expanded size is computed once."""
    sizes: dict[int, tuple[int, int, int]] = {}  # id(node) -> (nodes, characters, levels) once expanded
    open_: set[int] = set()

    def walk(node: yaml.Node, depth: int) -> tuple[int, int, int]:
        key = id(node)
        if key not in sizes:
            if depth > MAX_YAML_DEPTH:
                raise YAMLBoundError(f"it nests deeper than {MAX_YAML_DEPTH} levels once its aliases are expanded")
            if key in open_:
                raise YAMLBoundError("an alias refers to the node that contains it (a recursive document)")
            open_.add(key)
            n, chars, levels = 1, 0, 1
            if isinstance(node, yaml.ScalarNode):
                chars = len(node.value)
            else:
                children = node.value if isinstance(node, yaml.SequenceNode) else [x for kv in node.value for x in kv]
                for child in children:
                    cn, cc, cl = walk(child, depth + 1)
                    n, chars, levels = n + cn, chars + cc, max(levels, cl + 1)
                    if n > MAX_YAML_NODES or chars > MAX_YAML_CHARS:
                        raise YAMLBoundError(f"it expands to more than {MAX_YAML_NODES:,} values or "
                                             f"{MAX_YAML_CHARS:,} characters (aliases repeat what they name)")
            open_.discard(key)
            sizes[key] = (n, chars, levels)
        if depth - 1 + sizes[key][2] > MAX_YAML_DEPTH:  # a node met again, deeper than before
            raise YAMLBoundError(f"it nests deeper than {MAX_YAML_DEPTH} levels once its aliases are expanded")
        return sizes[key]

    walk(root, 1)


def safe_load(text: str) -> Any:
    """``yaml.safe_load`` with the bounds of ``BoundedLoader``: plain data, at most ``MAX_YAML_NODES`` values and
    ``MAX_YAML_DEPTH`` levels with aliases expanded. Raises ``yaml.YAMLError`` (``YAMLBoundError`` past a bound)."""
    if len(text) > MAX_YAML_BYTES:
        raise YAMLBoundError(f"it is longer than {MAX_YAML_BYTES:,} characters")
    return yaml.load(text, Loader=BoundedLoader)  # noqa: S506 (a SafeLoader subclass)


PLAIN = (str, int, float, bool, type(None), list, dict)


def check_plain(data: Any, where: str) -> None:
    """Raise ``ValueError`` naming the key path when ``data`` holds anything but strings, numbers, booleans, null,
    lists and mappings (YAML's ``!!binary`` bytes, ``!!set``): what every reader of a config, sweep or study file
    expects. ``data`` must come from ``safe_load`` (its expanded size is bounded)."""
    stack = [(data, where)]
    while stack:
        value, at = stack.pop()
        if not isinstance(value, PLAIN):
            raise ValueError(f"{at} is a {type(value).__name__} ({short(value)}); write a number, text, a list or "
                             f"a mapping")
        if isinstance(value, dict):
            stack.extend((v, f"{at}.{short(k, 40).strip(chr(39))}") for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(value))



def read_bounded(path: str | Path, what: str, limit: int, fix: str, devices: bool = False) -> bytes:
    """The bytes of ``path``, a regular file (a symbolic link to one is fine) of at most ``limit`` bytes; with
    ``devices`` also a character device, read up to ``limit + 1`` bytes (``/dev/null`` is empty, ``/dev/zero``
    too long).

    Opens without blocking, so a FIFO never hangs the command: ``ValueError`` (one line naming the path, ``what``
    it should be and ``fix``) for a missing path, a directory, a FIFO, socket or (without ``devices``) device, or
    more than ``limit`` bytes; ``OSError`` for the rest (permissions)."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ValueError(f"{what} {p} does not exist; {fix}") from None
    except IsADirectoryError:
        raise ValueError(f"{what} {p} is a directory; {fix}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ValueError(f"{what} {p} is a directory; {fix}")
        device = devices and stat.S_ISCHR(st.st_mode)
        if not stat.S_ISREG(st.st_mode) and not device:
            raise ValueError(f"{what} {p} is not a regular file (a FIFO, socket or device); {fix}")
        if device:
            os.set_blocking(fd, True)
        if st.st_size > limit:
            raise ValueError(f"{what} {p} is {st.st_size:,} bytes, more than the {limit:,} such a file may be; {fix}")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{what} {p} is more than {limit:,} bytes; {fix}")
    return data


def load_yaml(path: str | Path, what: str = "config file") -> dict:
    """Read a YAML mapping from a regular file of at most ``MAX_YAML_BYTES``, with the bounds of ``BoundedLoader``
    on its expansion (size and depth, aliases expanded) checked before any value is built.

    Raises ``ValueError`` (one line with the path and the fix) if it is missing, a directory, not a regular file,
    too large, not UTF-8, malformed, past a bound, or not a mapping."""
    p = Path(path)
    raw = read_bounded(p, what, MAX_YAML_BYTES, "pass a YAML file")
    try:
        data = safe_load(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{what} {p} is not UTF-8 text; save it as UTF-8 YAML") from None
    except YAMLBoundError as e:
        raise ValueError(f"{what} {p} is refused: {e.problem}; write plain values (no deep nesting, no aliases "
                         f"of aliases)") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"{what} {p} is not valid YAML{where} ({short(problem, 120)[1:-1]}); fix the syntax "
                         f"there") from None
    except RecursionError:  # a bound above should come first; never a traceback
        raise ValueError(f"{what} {p} nests too deeply; flatten it") from None
    if not isinstance(data, dict):
        raise bad_input(f"{what} {p}", "a mapping of keys to values", data, like="train: {steps: 100}",
                        fix="write key: value lines")
    check_plain(data, str(p))
    return data


# ------------------------------------------------------------------------------------------------------ JSON

MAX_JSON_BYTES = 1 << 28  # the default bound of load_json: far above any run or model file; readers of
# smaller kinds pass their own (a config.json, a manifest, eval.json)


class JSONProblem(ValueError):
    """What is wrong with a JSON text (``parse_json``) or file (``load_json``): the message in one line, and
    ``problem``, the clause without the file (``is not valid JSON (...)``, ``sets the key
    'lr' twice in one object ...``) for a caller that words its own error around it."""

    def __init__(self, message: str, problem: str):
        super().__init__(message)
        self.problem = problem


class DuplicateKey(JSONProblem):
    """A JSON object sets one key twice (``parse_json``): the file was edited or damaged, never cut off."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    """``json``'s ``object_pairs_hook``: the object as a dict, or ``JSONProblem`` naming the first key it sets
    twice (without the hook the last value would win silently, as PyYAML's does: ``check_unique_keys``)."""
    obj = dict(pairs)
    if len(obj) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                problem = f"sets the key {short(key, 40)} twice in one object (the last would win silently); keep one"
                raise DuplicateKey(problem, problem)
            seen.add(key)
    return obj


def parse_json(data: bytes | str) -> Any:
    """The value of the JSON text ``data`` (bytes are UTF-8), as ``json.loads`` gives it for a valid file with
    distinct keys (``NaN`` and ``Infinity`` included: a run's train state writes them).

    Raises ``JSONProblem`` whose message is the clause ``problem`` (no file: ``load_json`` adds it): not UTF-8 or
    not JSON (an integer of more than 4,300 digits too), nested past Python's recursion limit (the C scanner recurses
    once per level: 100,000 ``[`` was a ``RecursionError``), or an object that sets one key twice."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        return json.loads(text, object_pairs_hook=_unique_keys)
    except JSONProblem:
        raise
    except RecursionError:
        problem = "is not valid JSON (it nests too deeply for Python's parser)"
    except UnicodeDecodeError:
        problem = "is not valid JSON (it is not UTF-8 text)"
    except ValueError as e:  # JSONDecodeError; an integer of more than 4,300 digits
        problem = f"is not valid JSON ({' '.join(str(e).split())[:200]})"
    raise JSONProblem(problem, problem)


def load_json(path: str | Path, what: str, fix: str, limit: int = MAX_JSON_BYTES) -> Any:
    """The JSON value in ``path``, a regular file of at most ``limit`` bytes (``read_bounded``), read by
    ``parse_json``. ``what`` names the kind of file in a message (``config.json``, ``manifest``).

    Raises ``ValueError`` in one line naming ``what``, the path and ``fix``: for the file (missing, a directory or
    FIFO, too large: ``read_bounded``) or, as ``JSONProblem`` (``problem`` holds the clause alone), for its text;
    ``OSError`` for the rest (permissions). What the value must be is the caller's to check."""
    p = Path(path)
    raw = read_bounded(p, what, limit, fix)
    try:
        return parse_json(raw)
    except JSONProblem as e:
        raise type(e)(f"{what} {p} {e.problem}; {fix}", e.problem) from None


__all__ = ["MAX_YAML_BYTES", "MAX_YAML_NODES", "MAX_YAML_DEPTH", "MAX_YAML_CHARS", "YAMLBoundError", "BoundedLoader",
           "check_expansion", "safe_load", "PLAIN", "check_plain", "read_bounded", "load_yaml", "MAX_JSON_BYTES",
           "JSONProblem", "DuplicateKey", "parse_json", "load_json"]
