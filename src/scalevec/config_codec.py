"""The config codec: dataclasses <-> plain data, YAML files, ``key=value`` overrides, diffs, field listings.

Generic over the schemas of ``config.py`` (DESIGN.md §12): ``to_dict`` / ``from_dict`` (typed, checked
keys), ``apply_overrides`` (``section.field=value``), ``load_yaml`` / ``save_yaml`` (a run directory's
``config.yaml``, ``--config FILE``), ``config_diff`` (resume and sweep refuse a non-empty one) and
``config_fields`` (every field with its type, default and description: ``scalevec train --help``),
and the type tests of parsed input (``is_int``, ``is_number``: a ``bool`` is no number) that every reader of
typed YAML or JSON shares (a Hugging Face config.json, a study section, a prepared manifest, a checkpoint's
train state, a metrics row).
This module defines no field and no rule about a field's value: those are the schemas' (``config.py``);
the one resolution of a run's inputs is ``resolve.py``.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import math
import os
import stat
import textwrap
import types
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from scalevec.config import EXECUTION_FIELDS, Derived, MoEConfig, RopeScalingConfig, RunConfig
from scalevec.outpath import replace_file  # a new file renamed over the path: a link there is never written through

# --------------------------------------------------------------------------------------------- dicts


def to_dict(cfg: Any) -> dict:
    """A dataclass as plain YAML-safe dicts, lists and scalars."""

    def plain(v: Any) -> Any:
        if isinstance(v, Derived):
            return None  # derived, not chosen: stays derived when the fields it comes from change
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in fields(v)}
        if isinstance(v, tuple):
            return [plain(x) for x in v]
        return v

    return plain(cfg)


def from_dict(cls: type, data: dict, where: str = "") -> Any:
    """Build dataclass ``cls`` from a dict, checking keys and types (an int field takes an int, never a
    float; a float field a number; a bool field a boolean; a str field a scalar). Raises ``ValueError``
    naming the key, its value and the value's type."""
    if not isinstance(data, dict):
        raise ValueError(f"{where.rstrip('.') or 'config'} must be a mapping, got {type(data).__name__}")
    hints = _type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        keys = ", ".join(sorted(where + short(k, 40).strip(chr(39)) for k in unknown))
        raise ValueError(f"unknown config key(s) {keys}; "
                         f"known: {', '.join(sorted(known))}")
    kwargs = {k: _coerce(hints[k], v, where + k) for k, v in data.items()}
    return cls(**kwargs)


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    # resolving the string annotations (``from __future__ import annotations``) compiles each one: it was
    # most of the time of a sweep's expansion (1,844 configs of the shipped sweep files), so once per class
    return typing.get_type_hints(cls)


def _coerce(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        return _coerce(options[0], value, key)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, key + ".")
    if origin is tuple:
        if isinstance(value, str):
            value = [v for v in value.replace(" ", "").split(",") if v] if value else []
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            value = [value]  # one number is a one-item list, as one word is: the section's validate judges its length
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{key}={short(value)} is not a list; write it as [a,b] or a,b")
        args = typing.get_args(tp)
        item = args[0]
        return tuple(_coerce(item, v, key) for v in value)
    try:
        if tp is bool:
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError
            if isinstance(value, bool) or (type(value) is int and value in (0, 1)):
                return bool(value)
            raise TypeError
        if tp is int:
            # an int field takes an int (or its digits): a float, even 8.0 or 1e+30, is refused rather than
            # truncated or turned into a 31-digit step count
            if isinstance(value, str):
                return int(value.strip())
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            raise TypeError
        if tp is float:
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise TypeError
            return float(value)
        if tp is str:
            if isinstance(value, (list, tuple, dict)) or value is None:
                raise TypeError
            return str(value)
    except (TypeError, ValueError):
        name = getattr(tp, "__name__", tp)
        hint = "; write a whole number" if tp is int and isinstance(value, (float, str)) else ""
        raise ValueError(f"{key}={short(value)} is not a valid {name} (it is a {type(value).__name__}){hint}") from None
    return value


def apply_overrides(cfg: RunConfig, overrides: list[str]) -> RunConfig:
    """Apply ``section.field=value`` overrides (e.g. ``model.d_model=256``, ``moe.n_experts=4``).

    ``moe.*`` edits ``model.moe`` (creating it with defaults if absent); ``model.rope_scaling.*``
    likewise. Raises ``ValueError`` for a
    malformed item or an unknown key.
    """
    data = to_dict(cfg)
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} is not key=value (example: model.d_model=256)")
        key, value = item.split("=", 1)
        path = key.strip().split(".")
        if path[0] == "moe":
            path = ["model", *path]
        node = data
        for part in path[:-1]:
            if part == "moe" and node.get("moe") is None:
                node["moe"] = to_dict(MoEConfig())
            if part == "rope_scaling" and node.get("rope_scaling", 0) is None:
                node["rope_scaling"] = to_dict(RopeScalingConfig())
            if part not in node or not isinstance(node[part], dict):
                sections = ", ".join(k for k, v in data.items() if isinstance(v, dict))
                raise ValueError(f"unknown config key {key!r}; sections: {sections}")
            node = node[part]
        if path[-1] not in node:
            raise ValueError(f"unknown config key {key!r}; known in this section: {', '.join(sorted(node))}")
        try:
            parsed = safe_load(value) if value.strip() else ""
        except YAMLBoundError as e:
            raise ValueError(f"{key.strip()}=... is refused: {e.problem}; write the value out") from None
        except yaml.YAMLError:
            parsed = value  # not YAML: the type check below names the key
        if isinstance(node[path[-1]], dict) and not isinstance(parsed, dict):
            raise ValueError(section_message(key.strip(), node[path[-1]]))
        # a string field keeps the text as given unless it is a YAML string ('"x"'): paths like
        # 'a: b', '#x', 'hf:', 'yes'
        node[path[-1]] = value if isinstance(node[path[-1]], str) and not isinstance(parsed, str) else parsed
    return from_dict(RunConfig, data)


def section_message(key: str, section: dict) -> str:
    """The error for ``key=value`` where ``key`` names a whole section (``optim=adamw``): set one of its fields."""
    field = "name" if "name" in section else min(section, default="name")
    return (f"{key} is a section, not a field; set one of its fields, e.g. {key}.{field}=... "
            f"(its fields: {', '.join(sorted(section))})")


def section_of(key: str) -> dict | None:
    """The default mapping of ``RunConfig``'s section named by ``key`` (``optim``, ``train``), else None."""
    node: Any = to_dict(RunConfig())
    for part in key.strip().split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node if isinstance(node, dict) else None


def config_diff(a: Any, b: Any) -> dict[str, tuple[Any, Any]]:
    """The fields that differ between two configs (``RunConfig`` or their ``to_dict`` mappings), execution
    fields (``config.EXECUTION_FIELDS``) excepted: ``{dotted name: (value in a, value in b)}``, sorted by name.

    A section that is a mapping on one side and not on the other (``model.moe: None`` vs experts) is one
    entry under the section's name. Resuming a run and rerunning a sweep both refuse a non-empty diff."""
    da = a if isinstance(a, dict) else to_dict(a)
    db = b if isinstance(b, dict) else to_dict(b)
    out: dict[str, tuple[Any, Any]] = {}

    def walk(x: dict, y: dict, prefix: str) -> None:
        for k in sorted(set(x) | set(y)):
            vx, vy = x.get(k), y.get(k)
            if isinstance(vx, dict) and isinstance(vy, dict):
                walk(vx, vy, f"{prefix}{k}.")
            elif vx != vy and f"{prefix}{k}" not in EXECUTION_FIELDS:
                out[f"{prefix}{k}"] = (vx, vy)

    walk(da, db, "")
    return out


def format_diff(diff: dict[str, tuple[Any, Any]]) -> str:
    """``config_diff``'s result as one line: ``optim.lr: 0.003 -> 0.01, train.steps: 10 -> 20``."""
    return ", ".join(f"{k}: {short(va)} -> {short(vb)}" for k, (va, vb) in diff.items())


# --------------------------------------------------------------------------------------------- typed input


def is_int(value: Any, least: int | None = None, most: int | None = None) -> bool:
    """Whether ``value``, as YAML or JSON parsing gives it, is a whole number in ``[least, most]`` (either bound
    optional): an ``int`` and not a ``bool`` (``True`` is an ``int`` to Python, and ``true`` in a file is no
    count), not a float (``2.0``) or text. Each reader keeps its own message; the rule lives here."""
    return (isinstance(value, int) and not isinstance(value, bool) and (least is None or value >= least)
            and (most is None or value <= most))


def is_number(value: Any, above: float | None = None, least: float | None = None, finite: bool = True) -> bool:
    """Whether ``value`` is a number as YAML or JSON parsing gives it (an ``int`` or a ``float``, not a ``bool``),
    finite (``finite=False``: NaN and infinities pass, for a reader that tests them after), ``> above`` and
    ``>= least`` when given. Text is not a number here: YAML 1.1's ``1e-3`` string is the caller's to convert."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if finite and not math.isfinite(value):
        return False
    return (above is None or value > above) and (least is None or value >= least)


# --------------------------------------------------------------------------------------------- files


# Bounds on what one YAML document may expand to. A config, sweep or study file is a few KB; an
# alias bomb of 369 bytes (nine levels of nine aliases) expands to 9**9 nodes, which every later walk of the
# value (validation, an error message's repr) would visit. The bounds count the document as its readers see it:
# every alias expanded in place.
MAX_YAML_BYTES = 1 << 20  # a file's size
MAX_YAML_NODES = 100_000  # scalars, lists and mappings, aliases expanded
MAX_YAML_DEPTH = 50  # nesting of lists and mappings, aliases expanded
MAX_YAML_CHARS = 4 << 20  # the text of every scalar, aliases expanded
SHORT = 60  # the most characters of a value an error message quotes


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
    ``MAX_YAML_DEPTH`` levels or ``MAX_YAML_CHARS`` characters, or whose aliases refer to themselves. Raises
    ``YAMLBoundError``."""

    _depth = 0

    def compose_node(self, parent, index):  # noqa: D102 (PyYAML's hook)
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise YAMLBoundError(f"it nests deeper than {MAX_YAML_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node):  # noqa: D102 (PyYAML's hook)
        check_expansion(node)
        return super().construct_document(node)


# a date or time is text to every reader here (a name, a tag): never a datetime object that JSON and the configs'
# number fields would trip over (`lr: 2024-01-01` is then refused as "not a valid float", one line)
BoundedLoader.add_constructor("tag:yaml.org,2002:timestamp", yaml.SafeLoader.construct_yaml_str)


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


def short(value: Any, limit: int = SHORT) -> str:
    """``repr(value)`` cut to ``limit`` characters (with ``...``): what an error message quotes of a value that
    came from a file or the command line. Never walks more of a large value than a bounded prefix."""
    if isinstance(value, (list, tuple, dict)):
        text = _short_container(value, limit)
    else:
        text = repr(value if not isinstance(value, str) else value[: limit + 1])
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short_container(value: Any, limit: int) -> str:
    # reprs the first few items only: a list of 100,000 values (or a DAG of shared lists) is never walked whole
    if isinstance(value, dict):
        items = [f"{_short_container(k, limit) if isinstance(k, (list, tuple, dict)) else repr(k)[:limit]}: "
                 f"{_short_container(v, limit) if isinstance(v, (list, tuple, dict)) else repr(v)[:limit]}"
                 for k, v in list(value.items())[:4]]
        return "{" + ", ".join(items)[:limit + 1] + ("" if len(value) <= 4 else ", ...") + "}"
    items = [_short_container(v, limit) if isinstance(v, (list, tuple, dict)) else repr(v)[:limit]
             for v in list(value[:4])]
    return "[" + ", ".join(items)[:limit + 1] + ("" if len(value) <= 4 else ", ...") + "]"


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
        raise ValueError(f"{what} {p} must hold a mapping")
    check_plain(data, str(p))
    return data


def save_yaml(cfg: Any, path: str | Path) -> None:
    """Write dataclass ``cfg`` to ``path`` as YAML (``to_dict``'s form, fields in declaration order)."""
    replace_file(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))


# --------------------------------------------------------------------------------------------- help


@dataclass(frozen=True)
class FieldDoc:
    """One row of ``config_fields``: a field's dotted ``name`` (``model.moe.n_experts``), its ``type`` as
    annotated (``float | None``), its ``default`` as YAML-safe data (``to_dict``'s form) and ``doc``, the
    first line of its description (``field_docs``; "" where it has none)."""

    name: str
    type: str
    default: Any
    doc: str


def config_fields(cfg: RunConfig | None = None) -> list[FieldDoc]:
    """Every field of ``RunConfig``, derived from the dataclasses (what ``scalevec train --help``
    lists), in declaration order. A section (``model``, ``scale``, ...) is no row of its own; an optional
    one (``model.moe``, ``model.rope_scaling``: None or a section) is a row, followed by its fields.

    ``default``: the value in ``cfg`` (default ``RunConfig()``); the fields of an optional section that is
    None there take their class's defaults (what ``moe.n_experts=4`` starts from)."""
    rows: list[FieldDoc] = []

    def walk(cls: type, values: dict, prefix: str) -> None:
        docs, hints = field_docs(cls), _type_hints(cls)
        for f in fields(cls):
            tp = hints[f.name]
            section = next((a for a in (tp, *typing.get_args(tp)) if dataclasses.is_dataclass(a)), None)
            value = values[f.name]
            if section is not None and section is tp:  # a section that is always there: only its fields
                walk(section, value, f"{prefix}{f.name}.")
                continue
            rows.append(FieldDoc(prefix + f.name, str(f.type), value, docs.get(f.name, "").split("\n", 1)[0]))
            if section is not None:
                walk(section, value if isinstance(value, dict) else to_dict(section()), f"{prefix}{f.name}.")

    walk(RunConfig, to_dict(RunConfig() if cfg is None else cfg), "")
    return rows


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """``{field: description}`` of dataclass ``cls``: the string literal that follows the field in the class
    body (an attribute docstring, as torchtitan's job config writes them), dedented; a field without one
    is absent (so is every field of a class whose source cannot be read). Fields inherited from a dataclass
    base take their description from the base. The first line is what ``scalevec train --help`` shows."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            node = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0]
        except (OSError, TypeError):  # defined where no source file is (an interactive session)
            continue
        for stmt, after in zip(node.body, node.body[1:]):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                out[stmt.target.id] = inspect.cleandoc(after.value.value)
    return out


__all__ = ["to_dict", "from_dict", "apply_overrides", "config_diff", "format_diff", "load_yaml", "save_yaml",
           "BoundedLoader", "YAMLBoundError", "check_expansion", "check_plain", "read_bounded", "safe_load", "short",
           "FieldDoc", "config_fields", "field_docs", "is_int", "is_number"]
