"""The config codec: dataclasses <-> plain data, ``key=value`` overrides, diffs (DESIGN.md §12).

Generic over the schemas (``schema.py``): ``to_dict`` / ``from_dict`` (typed, checked keys), ``apply_overrides``
(``section.field=value``), ``save_yaml`` (a run directory's ``config.yaml``; reading one is ``files.load_yaml``
and ``from_dict``) and ``config_diff`` (resume and sweep refuse a non-empty one). This module defines no field and
no rule about a field's value: those are the schemas'; the one resolution of a run's inputs is ``resolve.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from scalevec.config.files import YAMLBoundError, safe_load
from scalevec.config.schema import EXECUTION_FIELDS, Derived, MoEConfig, RopeScalingConfig, RunConfig
from scalevec.config.typed import bad_input, is_int, is_number, short
from scalevec.outpath import replace_file  # a new file renamed over the path: a link there is never written through


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
    hints = type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        keys = ", ".join(sorted(where + short(k, 40).strip(chr(39)) for k in unknown))
        raise ValueError(f"unknown config key(s) {keys}; "
                         f"known: {', '.join(sorted(known))}")
    kwargs = {k: _coerce(hints[k], v, where + k) for k, v in data.items()}
    return cls(**kwargs)


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    """``{field: type}`` of dataclass ``cls``, its string annotations resolved; cached per class, because resolving
    compiles each annotation and that was most of a sweep's expansion (1,844 configs of the shipped sweep files)."""
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
        elif is_number(value, finite=False):
            value = [value]  # one number is a one-item list, as one word is: the section's validate judges its length
        if not isinstance(value, (list, tuple)):
            raise bad_input(key, "a list", value, like="[a,b] or a,b", show_type=True)
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
            if is_int(value):
                return value
            raise TypeError
        if tp is float:
            if not (isinstance(value, str) or is_number(value, finite=False)):
                raise TypeError
            return float(value)
        if tp is str:
            if isinstance(value, (list, tuple, dict)) or value is None:
                raise TypeError
            return str(value)
    except (TypeError, ValueError):
        raise bad_input(key, FIELD_RULES.get(tp, getattr(tp, "__name__", str(tp))), value, show_type=True) from None
    return value


# what each field type takes, in bad_input's words (an int field also takes its digits as text, a float field
# numeric text, a bool field yes/no/on/off/1/0: a command line's key=value is text)
FIELD_RULES = {int: "a whole number", float: "a number", bool: "true or false", str: "text"}


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


def save_yaml(cfg: Any, path: str | Path) -> None:
    """Write dataclass ``cfg`` to ``path`` as YAML (``to_dict``'s form, fields in declaration order)."""
    replace_file(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))


__all__ = ["to_dict", "from_dict", "type_hints", "apply_overrides", "section_message", "section_of", "config_diff",
           "format_diff", "save_yaml"]
