"""The config codec: dataclasses <-> plain data, YAML files, ``key=value`` overrides, diffs, field listings.

Generic over the schemas of ``config.py`` (DESIGN.md §12): ``to_dict`` / ``from_dict`` (typed, checked
keys), ``apply_overrides`` (``section.field=value``), ``load_yaml`` / ``save_yaml`` (a run directory's
``config.yaml``, ``--config FILE``), ``config_diff`` (resume and sweep refuse a non-empty one) and
``config_fields`` (every field with its type, default and description: ``scalevec train --help``, issue 26).
This module defines no field and no rule about a field's value: those are the schemas' (``config.py``);
the one resolution of a run's inputs is ``resolve.py``.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import types
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from scalevec.config import EXECUTION_FIELDS, Derived, MoEConfig, RopeScalingConfig, RunConfig

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
        raise ValueError(f"unknown config key(s) {', '.join(sorted(where + k for k in unknown))}; "
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
            raise ValueError(f"{key}={value!r} is not a list; write it as [a,b] or a,b")
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
        raise ValueError(f"{key}={value!r} is not a valid {name} (it is a {type(value).__name__}){hint}") from None
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
            parsed = yaml.safe_load(value) if value.strip() else ""
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
    return ", ".join(f"{k}: {va!r} -> {vb!r}" for k, (va, vb) in diff.items())


# --------------------------------------------------------------------------------------------- files


def load_yaml(path: str | Path) -> dict:
    """Read a YAML mapping; ``ValueError`` with the path if it is missing or malformed."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"config file {p} is a directory; pass a YAML file")
    if not p.is_file():
        raise ValueError(f"config file {p} does not exist")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"config file {p} is not UTF-8 text; save it as UTF-8 YAML") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"config file {p} is not valid YAML{where} ({problem}); fix the syntax there") from None
    if not isinstance(data, dict):
        raise ValueError(f"config file {p} must hold a mapping")
    return data


def save_yaml(cfg: Any, path: str | Path) -> None:
    """Write dataclass ``cfg`` to ``path`` as YAML (``to_dict``'s form, fields in declaration order)."""
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


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
    """Every field of ``RunConfig``, derived from the dataclasses (issue 26: what ``scalevec train --help``
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
           "FieldDoc", "config_fields", "field_docs"]
