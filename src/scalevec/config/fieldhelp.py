"""Field help: every config field with its type, default and description (``scalevec train --help``).

The descriptions are the attribute docstrings of the schemas (``schema.py``), read from their source
(``field_docs``); ``config_fields`` walks ``RunConfig`` into one row per field.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import typing
from dataclasses import dataclass, fields
from typing import Any

from scalevec.config.codec import to_dict, type_hints
from scalevec.config.schema import RunConfig


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
        docs, hints = field_docs(cls), type_hints(cls)
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


__all__ = ["FieldDoc", "config_fields", "field_docs"]
